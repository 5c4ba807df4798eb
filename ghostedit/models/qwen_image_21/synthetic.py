"""The full-size Qwen-Image-2.1 architecture (and its Turbo: the same architecture with its fixed sigmas) with
random weights, created directly on the GPU, for benchmarks with nothing to download: GhostEdit's 7.1B DiT at the
released config (dit.py's defaults, those of diffusers' QwenImage21Transformer2DModel), Qwen3-VL-8B as DiffSynth
configures it (QwenImage21TextEncoder's config) and the RGBA VAE at DiffSynth's defaults. Real shapes and real
costs, not pictures. The tokenizer is GhostEdit's own (processor.py) with Qwen3-VL's pixel limits; the text
encoder's special-token ids are set to that tokenizer's.
"""
from __future__ import annotations

import copy

import torch
from diffsynth.models.qwen_image_21_text_encoder import QwenImage21TextEncoder
from diffsynth.models.qwen_image_21_vae import QwenImage21VAE
from diffsynth.pipelines.qwen_image_21 import QwenImage21Pipeline

from ...paths import ghostedit_home
from ...pinned import PinnedArena, pin_module
from ..family import exact_pipeline
from ..processor import special_token_ids
from ..synthetic import INIT_STD, _created_on, _seeded
from .checkpoint import ConfiguredTextEncoder
from .dit import QwenImage21DiT
from .processor import load_processor, write_processor

# an FP8 DiT (7 GiB) and room for the activations of a 1024x1024 edit; memory=low brings a 24 GB card under
MIN_GPU_GIB = 22


def processor_folder():
    folder = ghostedit_home() / "synthetic-2.1-processor"
    if not (folder / "chat_template.json").exists():
        write_processor(folder)
    return folder


def build_synthetic_pipeline(family, device: str, torch_dtype: torch.dtype, dit_in_host_memory: bool = False,
                             text_encoder_in_host_memory: bool = False, dit_only: bool = False):
    """The whole pipeline (or the DiT alone), with the same random weights in every process, computing as the
    family (2.1 or Turbo) does."""
    pipe = QwenImage21Pipeline(device=device, torch_dtype=torch_dtype)
    pipe.dit = build_synthetic_dit(device, torch_dtype, in_host_memory=dit_in_host_memory)
    if not dit_only:
        folder = processor_folder()
        config = copy.deepcopy(QwenImage21TextEncoder.QWEN_IMAGE_21_TEXT_ENCODER_CONFIG)
        config.update({name: value for name, value in special_token_ids(folder).items()
                       if name in ("image_token_id", "video_token_id", "vision_start_token_id",
                                   "vision_end_token_id")})
        with _seeded(device, 1), _created_on("cpu" if text_encoder_in_host_memory else device, torch_dtype):
            pipe.text_encoder = ConfiguredTextEncoder(config).eval().to(torch_dtype)
        with _seeded(device, 2), _created_on(device, torch_dtype):
            pipe.vae = QwenImage21VAE().eval()
        pipe.processor = load_processor(folder)
    return exact_pipeline(pipe, family)


def build_synthetic_dit(device: str, torch_dtype: torch.dtype, in_host_memory: bool = False):
    """The full-size DiT with GPT-style random weights (see ..synthetic.INIT_STD). `in_host_memory`: each block
    made on the device and copied into pinned host memory at once, so the device never holds more than one."""
    arena = PinnedArena() if in_host_memory else None
    with _seeded(device, 0):
        with _created_on(device, torch_dtype):
            dit = QwenImage21DiT().eval()
        blocks, dit.transformer_blocks = dit.transformer_blocks, torch.nn.ModuleList()
        _init_like_trained(dit)
        for block in blocks:
            _init_like_trained(block)
            dit.transformer_blocks.append(pin_module(block, arena) if in_host_memory else block)
    return pin_module(dit, arena) if in_host_memory else dit


@torch.no_grad()
def _init_like_trained(module: torch.nn.Module) -> None:
    for linear in module.modules():
        if isinstance(linear, torch.nn.Linear):
            linear.weight.normal_(std=INIT_STD)
