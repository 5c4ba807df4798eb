"""Where GhostEdit keeps generated models, hub downloads, compile caches and measured timings."""
import os
import tempfile
from collections.abc import Callable
from pathlib import Path


def ghostedit_home() -> Path:
    return Path(os.environ.get("GHOSTEDIT_HOME") or Path.home() / ".cache" / "ghostedit")


def write_atomically(path: Path, write: Callable[[str], None]) -> None:
    """`write(temporary)` writes the content to a temporary file beside `path`, which is then renamed over `path`:
    readers never see half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        write(temporary)
        os.replace(temporary, path)
    except BaseException:
        os.unlink(temporary)
        raise
