"""The preparation steps of the lossless rewrites, each declared in its own toggle file: what a rewrite changes in
a prepared DiT before the forward takes its path (the forward's paths are named in the family's file, e.g.
models/qwen_image/dit.py, and chosen by the run's options), and the checks that its path can run on this DiT.

The steps work through what a family's DiT offers: `attention_layers()` (each with `fuse_qkv()`, `fp8_scales()`,
`qk_norms()` and `output_projections()`) and `feed_forwards()` (each with `projections()`: the Edit DiT's up and
down, Qwen-Image-2.1's gate, up and down).
"""
from __future__ import annotations

import torch

from ..kernels.fp8 import is_torchao_fp8


def fuse_qkv(dit: torch.nn.Module) -> int:
    """fused-qkv: each attention layer's q/k/v projections joined into one per stream; returns how many layers. On
    plain linear layers, before quantization (fused LoRAs are written into the joined rows later: engine/loras.py)."""
    layers = dit.attention_layers()
    for layer in layers:
        layer.fuse_qkv()
    return len(layers)


def fp8_scales(dit: torch.nn.Module) -> int:
    """For an FP8 attention: each attention layer's FP8 scales of q and k, from their bounds; returns how many."""
    layers = dit.attention_layers()
    for layer in layers:
        layer.fp8_scales()
    return len(layers)


def check_qk_norm_rope(dit: torch.nn.Module) -> int:
    """fused-qk-norm-rope: the kernel takes one RMSNorm eps for q and k of every stream; returns how many layers."""
    layers = dit.attention_layers()
    for layer in layers:
        if len({norm.eps for norm in layer.qk_norms()}) != 1:
            raise ValueError("the fused q/k kernel needs one RMSNorm eps for q and k of both streams")
    return len(layers)


def check_fp8_attention_out(dit: torch.nn.Module) -> int:
    """fp8-attention-out: every attention output projection is torchao's FP8 linear; returns how many layers."""
    return _torchao_fp8(dit.attention_layers(), lambda layer: layer.output_projections(),
                        "attention layers' output projections", "the FP8 attention output")


def check_feed_forward_quant(dit: torch.nn.Module, path: str) -> int:
    """fused-gelu-quant, fused-swiglu-quant: every projection of every feed-forward layer is torchao's FP8 linear
    (the down projection takes the kernel's FP8 rows; `path` names the kernel in the refusal); returns how many."""
    return _torchao_fp8(dit.feed_forwards(), lambda layer: layer.projections(), "feed-forward layers", path)


def _torchao_fp8(layers: list, projections, what: str, path: str) -> int:
    """How many `layers` there are, each of whose `projections(layer)` must be torchao's FP8 linear for `path`."""
    unfit = [layer for layer in layers if not all(map(is_torchao_fp8, projections(layer)))]
    if unfit:
        raise ValueError(f"{len(unfit)} of {len(layers)} {what} are not torchao FP8 linears: {path} needs "
                         "fp8=torchao")
    return len(layers)
