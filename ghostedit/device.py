"""The compute device GhostEdit runs on, and what it can do."""
from __future__ import annotations

import ctypes
import functools
import glob
import importlib.util
import os
from dataclasses import dataclass

import torch

from .errors import GhostEditError


@dataclass(frozen=True)
class Availability:
    """Whether an option can run here; when it cannot, the reason a user can act on."""
    ok: bool
    reason: str = ""

    @classmethod
    def yes(cls) -> "Availability":
        return cls(True)

    @classmethod
    def no(cls, reason: str) -> "Availability":
        return cls(False, reason)


class UnavailableOptionError(GhostEditError, RuntimeError):
    """Raised when a run asks for an option this machine cannot run; the message is the reason."""


def package_version(name: str) -> str | None:
    """An installed distribution's version; None if it is not installed."""
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version(name)
    except PackageNotFoundError:
        return None


def cpu_model() -> str:
    """The host CPU's model name (Linux's /proc/cpuinfo; what platform says elsewhere): a first use's compile and a
    process's imports run on it, so figures of those name it."""
    cpuinfo = "/proc/cpuinfo"
    if os.path.exists(cpuinfo):
        with open(cpuinfo) as found:
            for line in found:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    import platform
    return platform.processor() or platform.machine()


def cpu_cores() -> int:
    """The CPU cores this process may run on (a container's limit, not the host's count, where Linux says so)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()


def default_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def device_name(device: str) -> str:
    """The GPU's name (what compiled code and measured times are made for), or "CPU"."""
    return torch.cuda.get_device_name(torch.device(device)) if device.startswith("cuda") else "CPU"


@functools.lru_cache(maxsize=None)
def compute_capability(device: str) -> tuple[int, int] | None:
    if not device.startswith("cuda"):
        return None
    return torch.cuda.get_device_capability(torch.device(device))


def needs_cuda(device: str, what: str, min_capability: tuple[int, int] | None = None,
               max_capability: tuple[int, int] | None = None) -> Availability:
    """The common check for GPU-only options: a CUDA device, optionally of a given architecture range."""
    capability = compute_capability(device)
    if capability is None:
        return Availability.no(f"{what} needs a CUDA GPU; this machine runs on the CPU")
    name = torch.cuda.get_device_name(torch.device(device))
    if min_capability and capability < min_capability:
        return Availability.no(f"{what} needs a CUDA GPU with compute capability "
                               f"{min_capability[0]}.{min_capability[1]} or newer; {name} has {capability[0]}.{capability[1]}")
    if max_capability and capability > max_capability:
        return Availability.no(f"{what} supports compute capability up to {max_capability[0]}.{max_capability[1]}; "
                               f"{name} has {capability[0]}.{capability[1]}")
    return Availability.yes()


def gpu_capacity_bytes(device: str) -> int:
    """The memory this process may use on the card: its size, or less under set_per_process_memory_fraction (the
    bench's --gpu-memory emulates a smaller card that way)."""
    index = torch.device(device).index or 0
    total = torch.cuda.get_device_properties(index).total_memory
    fraction = torch.cuda.get_per_process_memory_fraction(index)
    return int(total * fraction)


def synchronize(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize(torch.device(device))


def empty_cache(device: str) -> None:
    """Gives memory that is free but kept for reuse back: torch's CUDA cache, and on the host glibc's malloc arenas
    (each thread that ran an edit may hold one, tens of MiB, otherwise kept for the process's life)."""
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
    _trim_host_heap()


@functools.cache
def _libc():
    import ctypes
    import ctypes.util
    name = ctypes.util.find_library("c")
    library = ctypes.CDLL(name) if name else None
    return library if library is not None and hasattr(library, "malloc_trim") else None  # glibc only


def _trim_host_heap() -> None:
    libc = _libc()
    if libc is not None:
        libc.malloc_trim(0)


@functools.cache
def load_torch_cudnn() -> str | None:
    """Loads the cuDNN libraries that PyTorch ships (graph library first) into the process, once; returns their
    folder, or None where PyTorch has no bundled cuDNN.

    Libraries that call cuDNN themselves (Transformer Engine, cudnn-frontend) look for it on the system first, and
    cuDNN finds its sub-libraries by name. On a machine whose system cuDNN is older than PyTorch's (the GPU image
    here: 9.14 against 9.19) they either load the system one first, and PyTorch then turns its own cuDNN kernels
    off (SDPA fell back to FlashAttention-2: every configuration ran 16% slower), or fail on mixed versions. With
    PyTorch's libraries loaded first, every user in the process gets the same cuDNN."""
    spec = importlib.util.find_spec("nvidia.cudnn")
    if spec is None or not spec.submodule_search_locations:
        return None
    folder = os.path.join(spec.submodule_search_locations[0], "lib")
    for library in sorted(glob.glob(os.path.join(folder, "libcudnn*.so*")), key=lambda path: ("_graph" not in path, path)):
        ctypes.CDLL(library, mode=ctypes.RTLD_GLOBAL)
    return folder
