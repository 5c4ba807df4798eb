"""GhostEdit: instruction-based image editing with Qwen-Image-Edit on DiffSynth, with every speed toggle measured."""
import os

from .paths import ghostedit_home

# Inductor's compiled graphs and kernels on disk, where a restarted process finds them (its default is in /tmp).
# Set before torch is imported: importing torchao, PEFT or DiffSynth fixes Inductor's cache folder for the process.
os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(ghostedit_home() / "inductor-cache"))

from .config import EditRequest, LoraChoice, OptimizationConfig  # noqa: E402

__all__ = ["EditRequest", "LoraChoice", "OptimizationConfig"]
