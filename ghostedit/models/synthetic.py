"""The real Qwen-Image-Edit architecture at full size (GhostEdit's DiT and VAE classes and DiffSynth's text encoder:
20.4 B-parameter DiT, 7 B Qwen2.5-VL text encoder, VAE) with random weights, created directly on the GPU, for
benchmarks with nothing to download.

Random weights give real shapes and real costs, not meaningful images. The tokenizer is GhostEdit's own (see
processor.py) with Qwen's pixel limits, so the text encoder's special-token ids are set to that tokenizer's.
"""
from __future__ import annotations

import contextlib

import torch
from diffsynth.models.qwen_image_text_encoder import QwenImageTextEncoder
from diffsynth.pipelines.qwen_image import QwenImagePipeline

from ..paths import ghostedit_home
from ..pinned import PinnedArena, pin_module
from . import seams
from .exact import ReferenceScaledVAE
from .processor import QWEN_MAX_PIXELS, QWEN_MIN_PIXELS, load_processor, special_token_ids, write_processor
from .qwen_image.dit import FUSED_PROJECTIONS, QwenImageDiT, TransformerBlock

# GPT-style init: with PyTorch's default (Kaiming) init the modulation gates come out near zero and the blocks barely
# change the residual stream, so quantization errors would be measured on a near-identity network.
INIT_STD = 0.02
# The released DiT's shape (diffsynth's QwenImageDiT hardcodes it too)
DIT_LAYERS, DIT_WIDTH, DIT_HEADS = 60, 3072, 24
@contextlib.contextmanager
def _created_on(device: str, dtype: torch.dtype):
    """Modules built inside get their parameters allocated and initialised on `device` in `dtype`."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            yield
    finally:
        torch.set_default_dtype(previous)


@contextlib.contextmanager
def _seeded(device: str, seed: int):
    """Random weights made inside are the same in every process (the torchrun ranks and a single process alike),
    whatever that process drew before; the random state outside is left as it was."""
    with torch.random.fork_rng(devices=[torch.device(device)] if device.startswith("cuda") else []):
        torch.manual_seed(seed)
        yield


def processor_folder():
    folder = ghostedit_home() / "synthetic-processor"
    if not (folder / "tokenizer_config.json").exists():
        write_processor(folder, QWEN_MIN_PIXELS, QWEN_MAX_PIXELS)
    return folder


def build_synthetic_pipeline(device: str, torch_dtype: torch.dtype, dit_in_host_memory: bool = False,
                             text_encoder_in_host_memory: bool = False):
    """The whole pipeline, with the same random weights in every process. A text encoder kept in host memory is
    made there (slower: its initialisation runs on the CPU), so that a small card never holds it: DiffSynth's class
    builds all of it at once, its vision tower in float32."""
    folder = processor_folder()
    dit = build_synthetic_dit(device, torch_dtype, in_host_memory=dit_in_host_memory)
    with _seeded(device, 1), _created_on("cpu" if text_encoder_in_host_memory else device, torch_dtype):
        text_encoder = QwenImageTextEncoder().eval().to(torch_dtype)
    with _seeded(device, 2), _created_on(device, torch_dtype):
        vae = ReferenceScaledVAE().eval()
    _use_token_ids(text_encoder, special_token_ids(folder))
    pipe = QwenImagePipeline(device=device, torch_dtype=torch_dtype)
    pipe.dit, pipe.text_encoder, pipe.vae = dit, text_encoder, vae
    pipe.processor = load_processor(folder)
    pipe.tokenizer = pipe.processor.tokenizer
    return pipe


def build_synthetic_dit(device: str, torch_dtype: torch.dtype, in_host_memory: bool = False):
    """The full-size DiT, with the same random weights every time. `in_host_memory`: each of its 60 blocks is made
    on the device and copied into pinned host memory at once (ghostedit/pinned.py), so the device never holds more
    than one block."""
    arena = PinnedArena() if in_host_memory else None
    with _seeded(device, 0):
        with _created_on(device, torch_dtype):
            dit = QwenImageDiT(num_layers=0).eval()
        _init_like_trained(dit)
        for _ in range(DIT_LAYERS):
            with _created_on(device, torch_dtype):
                block = TransformerBlock(DIT_WIDTH, DIT_HEADS, DIT_WIDTH // DIT_HEADS).eval()
            _init_like_trained(block)
            dit.transformer_blocks.append(pin_module(block, arena, seams.joinable_parts(block, FUSED_PROJECTIONS))
                                          if in_host_memory else block)
    return pin_module(dit, arena) if in_host_memory else dit


@torch.no_grad()
def _init_like_trained(module) -> None:
    for linear in module.modules():
        if isinstance(linear, torch.nn.Linear):
            linear.weight.normal_(std=INIT_STD)
            if linear.bias is not None:
                linear.bias.zero_()


def _use_token_ids(text_encoder, ids: dict) -> None:
    for config in (text_encoder.model.config, text_encoder.model.config.text_config):
        for name in ("image_token_id", "video_token_id", "vision_start_token_id", "vision_end_token_id"):
            setattr(config, name, ids[name])
