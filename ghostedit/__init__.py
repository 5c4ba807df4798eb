"""GhostEdit: instruction-based image editing with Qwen-Image-Edit on DiffSynth, with every speed toggle measured."""
import os

from .paths import ghostedit_home

# Inductor's compiled graphs and kernels on disk, where a restarted process finds them (its default is in /tmp).
# Set before torch is imported: importing torchao, PEFT or DiffSynth fixes Inductor's cache folder for the process.
os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(ghostedit_home() / "inductor-cache"))

__all__ = ["EditRequest", "LoraChoice", "OptimizationConfig"]


def __getattr__(name: str):
    """The request and configuration types, imported on first use: `ghostedit --help` loads no torch."""
    if name in __all__:
        from . import config
        return getattr(config, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
