"""Compiled-code packages: what torch.compile made for one configuration (AOTAutograd, Inductor and its kernels,
autotuning; `torch.compiler` mega-cache), kept per configuration, torch build and device under
$GHOSTEDIT_HOME/compiled, each with a manifest saying what it is for. A process that finds its configuration's
package loads it instead of compiling. Packages travel: `export` writes them to a folder, `install` takes them from
a folder or a Hub repo (a machine that never compiled the configuration then starts from the package), refusing a
package made for another torch build or device, with the reason: compiled code runs only where it was made for.
A package is code (loading it runs what the compiler wrote): install packages only from a source you trust."""
from __future__ import annotations

import datetime
import hashlib
import json
import shutil
from dataclasses import dataclass
from pathlib import Path

import torch

from ..device import device_name
from ..downloads import DownloadError, hub_snapshot, printer
from ..paths import ghostedit_home, write_atomically

SUFFIX, MANIFEST = ".bin", ".json"


@dataclass(frozen=True)
class Package:
    configuration: str   # the configuration's label (OptimizationConfig.prepared_label)
    torch: str
    device: str          # the GPU's name, or "CPU"
    saved: str           # the date it was last written
    path: Path

    def words(self) -> str:
        size = self.path.stat().st_size / 2**20
        return f"{self.configuration}: torch {self.torch}, {self.device}, {size:.1f} MiB, saved {self.saved}"


def folder() -> Path:
    return ghostedit_home() / "compiled"


def package_path(configuration: str, torch_version: str, device: str) -> Path:
    key = hashlib.sha256(f"{configuration}|{torch_version}|{device}".encode()).hexdigest()[:24]
    return folder() / f"{key}{SUFFIX}"


def load(configuration: str, device: str) -> bool:
    """Loads the configuration's package into the compile caches, so that its first call finds its code there
    instead of compiling it; whether one was found."""
    path = package_path(configuration, torch.__version__, device_name(device))
    if not path.is_file():
        return False
    return torch.compiler.load_cache_artifacts(path.read_bytes()) is not None


def save(configuration: str, device: str) -> None:
    """Writes everything this process compiled so far as the configuration's package, replacing an older one, with
    its manifest: called after each first call at a new shape, so that the package holds every shape's code."""
    saved = torch.compiler.save_cache_artifacts()
    if saved is None:
        return
    path = package_path(configuration, torch.__version__, device_name(device))
    write_atomically(path, lambda temporary: Path(temporary).write_bytes(saved[0]))
    manifest = {"configuration": configuration, "torch": torch.__version__, "device": device_name(device),
                "saved": datetime.date.today().isoformat()}
    write_atomically(path.with_suffix(MANIFEST), lambda temporary: Path(temporary).write_text(json.dumps(manifest)))


def listed(where: Path | None = None) -> list[Package]:
    """The packages in a folder (default: this machine's), each from its manifest."""
    where = where or folder()
    found = []
    for manifest in sorted(where.glob(f"*{MANIFEST}")):
        try:
            fields = json.loads(manifest.read_text())
            fields = {name: fields[name] for name in ("configuration", "torch", "device", "saved")}
        except (ValueError, KeyError, TypeError) as error:
            raise ValueError(f"{manifest} is not a compiled-package manifest ({type(error).__name__}: {error})")
        binary = manifest.with_suffix(SUFFIX)
        if binary.is_file():
            found.append(Package(fields["configuration"], fields["torch"], fields["device"], fields["saved"], binary))
    return found


def export(destination: Path) -> list[Package]:
    """Copies this machine's packages and their manifests into `destination` (a folder to upload or copy)."""
    destination.mkdir(parents=True, exist_ok=True)
    for package in listed():
        for path in (package.path, package.path.with_suffix(MANIFEST)):
            shutil.copy2(path, destination / path.name)
    return listed(destination)


def refusal(package: Package, device: str) -> str | None:
    """Why a package cannot run on this machine's `device`, or None."""
    here = device_name(device)
    if package.torch != torch.__version__:
        return f"made with torch {package.torch}, this machine has {torch.__version__}"
    if package.device != here:
        return f"made for {package.device}, this machine runs on {here}"
    return None


def install(source: str, device: str, on_progress=None) -> list[tuple[Package, str | None]]:
    """Takes the packages of a folder or a Hub repo (owner/name, fetched with progress) into this machine's, each
    with None or the reason it was refused."""
    where = Path(source)
    if where.is_dir() and where.resolve() == folder().resolve():
        raise ValueError(f"{source} is this machine's own package folder")
    if not where.is_dir():
        where = hub_snapshot(source, [f"*{SUFFIX}", f"*{MANIFEST}"], on_progress, on_progress)
    outcomes = []
    for package in listed(where):
        reason = refusal(package, device)
        if reason is None:
            target = package_path(package.configuration, package.torch, package.device)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(package.path, target)
            shutil.copy2(package.path.with_suffix(MANIFEST), target.with_suffix(MANIFEST))
        outcomes.append((package, reason))
    return outcomes


class InstallError(Exception):
    """The source could not be read: not a folder, a Hub repo that could not be fetched, this machine's own folder."""


def install_and_tell(source: str, device: str) -> tuple[list[str], bool]:
    """`install` with its progress printed, for the command line and `serve --compiled-from`: what it did, a line per
    package, and whether any package was installed. Raises InstallError with the reason."""
    try:
        outcomes = install(source, device, printer())
    except (DownloadError, ValueError) as error:
        raise InstallError(str(error)) from None
    if not outcomes:
        return [f"no compiled packages in {source}"], False
    lines = [f"{'installed' if reason is None else 'refused'} {package.words()}"
             + ("" if reason is None else f": {reason}") for package, reason in outcomes]
    return lines, any(reason is None for _, reason in outcomes)
