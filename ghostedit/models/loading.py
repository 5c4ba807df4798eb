"""Loading a model source's base pipeline: DiffSynth's loader (through GhostEdit's model table entries) or the
synthetic model's builder, each component in its dtype, the pipeline made to compute as the family's reference."""
from __future__ import annotations

import torch

from ..diffsynth_patches import quiet_loader
from ..pinned import pin_module
from ..quiet import quiet_library_warnings
from . import ModelSpec
from .dtypes import apply_component_dtypes
from .exact import ExactPipeline, float32_rotary
from .family import QWEN_IMAGE_21_DIT, exact_pipeline
from .hub import load_pretrained_pipeline
from .qwen_image_21 import load_embedded_pipeline
from .synthetic import build_synthetic_dit, build_synthetic_pipeline
from .tiny import load_tiny_pipeline


def load_base_pipeline(spec: ModelSpec, device: str, dtypes: dict[str, torch.dtype], base_dit_on_gpu: bool = True,
                       dit_only: bool = False, text_encoder_on_gpu: bool = True, on_download=None):
    """The unmodified pipeline every prepared configuration derives from, each component in its dtype (see
    dtypes.py; the pipeline's own dtype is the DiT's), the DiT in pinned host memory unless `base_dit_on_gpu`.
    `dit_only`: the DiT alone (the DiT-level bench); the synthetic model then builds nothing else. `on_download`: a
    hub repo's download plan and progress (downloads.py)."""
    quiet_loader()
    quiet_library_warnings()
    torch_dtype = dtypes["dit"]
    if spec.kind in ("tiny", "synthetic") and spec.family.dit == QWEN_IMAGE_21_DIT:
        pipe = load_embedded_pipeline(spec, device, torch_dtype, base_dit_on_gpu, dit_only, text_encoder_on_gpu)
        if not dit_only:
            apply_component_dtypes(pipe, dtypes)
        return pipe
    if spec.kind == "synthetic" and dit_only:
        pipe = ExactPipeline(device=device, torch_dtype=torch_dtype)
        pipe.use_family(spec.family)
        pipe.dit = build_synthetic_dit(device, torch_dtype, in_host_memory=not base_dit_on_gpu)
        return pipe
    if spec.kind == "tiny":
        pipe = exact_pipeline(load_tiny_pipeline(device, torch_dtype), spec.family)
    elif spec.kind == "synthetic":
        pipe = exact_pipeline(build_synthetic_pipeline(device, torch_dtype, dit_in_host_memory=not base_dit_on_gpu,
                                                   text_encoder_in_host_memory=not text_encoder_on_gpu), spec.family)
    else:
        pipe = load_pretrained_pipeline(spec, device, torch_dtype, on_download)
        if not base_dit_on_gpu and device.startswith("cuda"):
            # DiffSynth's loader puts every weight on the device first
            pin_module(pipe.dit, end_to_end=pipe.dit.joinable_parts())
    apply_component_dtypes(pipe, dtypes)
    float32_rotary(pipe.text_encoder)
    if dit_only:
        pipe.text_encoder = pipe.vae = None
    return pipe
