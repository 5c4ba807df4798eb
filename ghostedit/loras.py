"""The LoRA folder: the names the app lists, resolves and stores uploads under.

Names come from users (a dropdown's value arrives through the public API; an upload brings its own file name), so
a name is a bare file name inside the folder and nothing else: no separators, no "..", no NUL, not hidden, and no
symlink leading out of the folder. Files are checked by content (lora_files.check_lora_file), whatever they are
named: only safetensors is ever read, never a pickle.
"""
from __future__ import annotations

import os
import re
import shutil
import tempfile
from pathlib import Path

from .config import file_sha256
from .lora_files import LoraError, check_lora_file

SUFFIX = ".safetensors"
MAX_STEM_CHARS = 80


def default_folder() -> Path:
    """Where the app keeps LoRA files unless told otherwise (app.py --lora-dir): `loras/` in the working directory,
    which on a Space is the app's own folder."""
    return Path("loras")


def list_loras(folder: str | Path) -> list[str]:
    """The LoRA names in `folder`, sorted; none if it does not exist. Contents are checked when one is resolved."""
    folder = Path(folder)
    if not folder.is_dir():
        return []
    names = []
    for entry in folder.iterdir():
        try:
            _path_in_folder(folder, entry.name)
        except LoraError:
            continue
        names.append(entry.name)
    return sorted(names, key=str.lower)


def resolve_lora(folder: str | Path, name: str) -> Path:
    """The file of the LoRA called `name` in `folder`, checked by content. Raises LoraError for a name that is not
    a plain file name in the folder, a missing file, or a file that is not a safetensors LoRA."""
    path = _path_in_folder(Path(folder), name)
    check_lora_file(path, display_name=name)
    return path


def save_uploaded_lora(folder: str | Path, uploaded_path: str | Path, original_name: str) -> str:
    """Checks an uploaded file by content and stores it in `folder` under a safe name made from `original_name`;
    returns that name (for resolve_lora). The same file uploaded again gets the same name back; another file with
    the same name is stored beside it with part of its hash added, never over it."""
    display_name = _base_name(original_name) or "the uploaded file"
    check_lora_file(uploaded_path, display_name=display_name)
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    stem, digest = _safe_stem(original_name), file_sha256(uploaded_path)
    for name in (f"{stem}{SUFFIX}", f"{stem}-{digest[:12]}{SUFFIX}"):
        target = folder / name
        if not target.exists() and _copy_unless_exists(Path(uploaded_path), target):
            return name
        if target.is_file() and not target.is_symlink() and file_sha256(target) == digest:
            return name
    raise LoraError(f"could not store {display_name}: a different file already uses its name")


def _path_in_folder(folder: Path, name: str) -> Path:
    if not isinstance(name, str) or not name or "\0" in name or "/" in name or "\\" in name or name.startswith("."):
        raise LoraError(f"{name!r} is not a LoRA name: use the name of a file in the LoRA folder")
    if not name.lower().endswith(SUFFIX):
        raise LoraError(f"{name!r} is not a LoRA name: LoRA files end in {SUFFIX}")
    root = folder.resolve()
    try:
        path = (root / name).resolve(strict=True)
    except FileNotFoundError:
        raise LoraError(f"there is no LoRA named {name!r}") from None
    except (OSError, RuntimeError) as error:  # a symlink loop raises RuntimeError before Python 3.13
        raise LoraError(f"the LoRA {name!r} cannot be opened ({error})") from None
    if not path.is_relative_to(root):
        raise LoraError(f"the LoRA {name!r} is a link to a file outside the LoRA folder; it is not used")
    if not path.is_file():
        raise LoraError(f"the LoRA {name!r} is not a file")
    return path


def _base_name(original_name: str) -> str:
    """The file name a browser or client sent, without any folder (either kind of separator)."""
    return re.split(r"[\\/]", str(original_name or ""))[-1].replace("\0", "")


def _safe_stem(original_name: str) -> str:
    base = _base_name(original_name)
    stem = base[:-len(SUFFIX)] if base.lower().endswith(SUFFIX) else os.path.splitext(base)[0]
    stem = re.sub(r"[^\w.-]+", "_", stem).strip("._-")[:MAX_STEM_CHARS].rstrip("._-")
    return stem or "lora"


def _copy_unless_exists(source: Path, target: Path) -> bool:
    """Copies through a hidden temporary file and a hard link, which fails if `target` exists: readers never see
    half a file, and two uploads never overwrite each other."""
    fd, temporary = tempfile.mkstemp(dir=target.parent, prefix=".upload-", suffix=".tmp")
    os.close(fd)
    try:
        shutil.copyfile(source, temporary)
        os.link(temporary, target)
        return True
    except FileExistsError:
        return False
    finally:
        os.unlink(temporary)
