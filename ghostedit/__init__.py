"""GhostEdit: instruction-based image editing with Qwen-Image-Edit on DiffSynth, with every speed toggle measured.

The package's layers, bottom to top; a module imports only from its own layer and those below
(tests/unit/project/test_layers.py):
base        errors, paths, device, tensors, pinned, images, masks, pillow_resize, metrics, telemetry, quiet, downloads,
            lora_files, lora_formats
kernels     compute that knows no model: attention backends, FP8 attention, GhostEdit's Triton kernels
diffsynth_patches  what DiffSynth's pipeline and loader need
models      the model sources and each DiT family's forward with its seams (models/seams.py)
parallel    the process mesh, CFG parallel, the sequence split a forward calls
optimize    the toggles: preparation steps and the run's options
config      a run's request and configuration, the LoRA folder, the committed figures
engine      prepared pipelines and runs
arguments   the requests the command line, the bench and the page build
bench, cli, ui   what people and scripts run
"""
import os

from .paths import ghostedit_home

# Inductor's compiled graphs and kernels on disk, where a restarted process finds them (its default is in /tmp),
# and Triton's builds of GhostEdit's own kernels (the VAE's fused norms, FP8 casts; its default is ~/.triton, which a
# new machine given only GHOSTEDIT_HOME, a Space's persistent storage, does not keep).
# Set before torch is imported: importing torchao, PEFT or DiffSynth fixes Inductor's cache folder for the process.
os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(ghostedit_home() / "inductor-cache"))
os.environ.setdefault("TRITON_CACHE_DIR", str(ghostedit_home() / "triton-cache"))

__all__ = ["EditRequest", "LoraChoice", "OptimizationConfig"]


def __getattr__(name: str):
    """The request and configuration types, imported on first use: `ghostedit --help` loads no torch."""
    if name in __all__:
        from . import config
        return getattr(config, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
