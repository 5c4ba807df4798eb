"""Where GhostEdit keeps generated models, hub downloads, compile caches and measured timings."""
import os
from pathlib import Path


def ghostedit_home() -> Path:
    return Path(os.environ.get("GHOSTEDIT_HOME") or Path.home() / ".cache" / "ghostedit")
