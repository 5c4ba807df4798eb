"""The text encoder's vision tower with each block's windowed attention in one call (`text-encoder=joined-windows`).

Qwen2.5-VL's vision tower attends within windows of image patches (over all of them in a few full-attention blocks).
With PyTorch's SDPA, transformers reads the window sizes back from the GPU at every block (a synchronization) and
makes one attention call per window, so on a GPU the tower mostly waits for Python to launch small kernels (py-spy
samples of warm edits, lab/probes/cpu_stacks.py). Here a block's windows are one call: each patch attends to the
patches of its own window through a block-diagonal mask built on the device from the window boundaries. That is the
same attention, up to floating-point rounding.

transformers hands the window boundaries (`cu_seq_lens_q`) only to an attention function whose name says "flash",
hence the name this one is registered under. The tower then reads its longest window back twice per forward
(transformers' `get_max_seqlen`), not once per block.

Qwen-Image-2.1's Qwen3-VL has no windows: each of its vision blocks attends over each image's patches whole
(`has_windows` tells them apart).
"""
from __future__ import annotations

import contextlib
import functools

import torch

from .text_encoder_graphs import vision_tower

NAME = "ghostedit_windowed_sdpa_flash_interface"


def windowed_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, is_causal=False,
                       cu_seq_lens_q=None, **kwargs):
    """transformers' attention-function interface: q, k, v [1, heads, patches, head_dim], the windows' boundaries
    in `cu_seq_lens_q`; returns ([1, patches, heads, head_dim], None) as its flash functions do."""
    if cu_seq_lens_q is None or attention_mask is not None or is_causal:
        raise ValueError("the windowed attention takes window boundaries, no mask and no causal attention (it serves "
                         "the vision tower)")
    patches = torch.arange(query.shape[2], device=query.device, dtype=cu_seq_lens_q.dtype)
    window = torch.searchsorted(cu_seq_lens_q[1:].contiguous(), patches, right=True)
    same_window = window[:, None] == window[None, :]
    output = torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=same_window,
                                                              dropout_p=dropout, scale=scaling)
    return output.transpose(1, 2), None


@functools.cache
def install() -> None:
    from transformers import AttentionInterface
    AttentionInterface.register(NAME, windowed_attention)


def has_windows(text_encoder) -> bool:
    """Whether the text encoder's vision tower attends within windows (Qwen2.5-VL's has a `window_size`: its blocks
    but `fullatt_block_indexes` attend within windows; Qwen3-VL's has none)."""
    return getattr(vision_tower(text_encoder), "window_size", None) is not None


@contextlib.contextmanager
def joined_windows(text_encoder):
    """A Qwen2.5-VL text encoder (the Edit models') with its vision tower's windows joined, for the length of the
    context."""
    if not has_windows(text_encoder):
        raise ValueError(f"{type(text_encoder).__name__}'s vision tower has no windowed attention to join")
    install()
    config = vision_tower(text_encoder).config
    previous = config._attn_implementation
    config._attn_implementation = NAME
    try:
        yield
    finally:
        config._attn_implementation = previous
