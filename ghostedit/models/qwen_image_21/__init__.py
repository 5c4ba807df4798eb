"""Qwen-Image-2.1 and its Turbo: GhostEdit's own DiT (dit.py), the pipeline that computes as diffusers'
QwenImage21Pipeline (pipeline.py), the released folder layout loaded through DiffSynth (checkpoint.py), the Qwen3-VL
processor (processor.py) and the embedded models: tiny (tiny.py, CPUs and tests) and full-size synthetic
(synthetic.py, GPU benchmarks)."""
from __future__ import annotations

from dataclasses import replace

import torch
from diffsynth.pipelines.qwen_image_21 import QwenImage21Pipeline

from ..family import exact_pipeline
from .checkpoint import model_configs
from .synthetic import build_synthetic_pipeline
from .tiny import ensure_tiny_model


def load_embedded_pipeline(spec, device: str, torch_dtype: torch.dtype, base_dit_on_gpu: bool = True,
                           dit_only: bool = False, text_encoder_on_gpu: bool = True):
    """The tiny model (generated on first use, loaded as real weights are) or the synthetic one (built on the
    device), computing as `spec.family` (2.1 or Turbo) does."""
    if spec.kind == "synthetic":
        return build_synthetic_pipeline(spec.family, device, torch_dtype, dit_in_host_memory=not base_dit_on_gpu,
                                        text_encoder_in_host_memory=not text_encoder_on_gpu, dit_only=dit_only)
    family, weights, _, processor = model_configs(ensure_tiny_model(turbo=spec.family.sample_sigmas is not None))
    pipe = QwenImage21Pipeline.from_pretrained(torch_dtype=torch_dtype, device=device, model_configs=weights,
                                               processor_config=processor)
    return exact_pipeline(pipe, replace(spec.family, schedule=family.schedule))
