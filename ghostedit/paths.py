"""Where GhostEdit keeps generated models, hub downloads, compile caches and measured timings."""
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path


def ghostedit_home() -> Path:
    return Path(os.environ.get("GHOSTEDIT_HOME") or Path.home() / ".cache" / "ghostedit")


def generated_once(folder: Path, generate: Callable[[Path], None]) -> Path:
    """`folder`, made by `generate(staging)` on first use: written to a temporary folder that is then renamed, so an
    existing folder is a complete one and concurrent processes are safe (the first rename wins; the others discard
    their copy)."""
    folder = Path(folder)
    if folder.is_dir():
        return folder
    folder.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=folder.parent, prefix=f".{folder.name}."))
    staging.chmod(0o755)  # mkdtemp makes it private; the cache is not secret
    try:
        generate(staging)
        os.rename(staging, folder)
    except OSError:
        if not folder.is_dir():  # only losing the race to another process leaves the folder in place
            raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return folder


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
