"""DiffSynth's Qwen DiT attention routed through the active backend (kernels/attention.py computes each): replaced
by the attention seam of GhostEdit's own forward (models/seams.py)."""
from __future__ import annotations

import contextlib

import torch
from einops import rearrange

from ..kernels import fp8_attention
from ..kernels.attention import (CONCRETE_BACKENDS, EXTERNAL_BACKENDS, FP8_BACKENDS, LOSSY_BACKENDS,  # noqa: F401
                                 SDPA_BACKENDS, EXTERNAL, attend, availability, diffsynth_default,
                                 fastest_backend, fp8_availability, resolve)
from ..parallel import ulysses

_active_backend = "diffsynth"
_diffsynth_attention = None  # DiffSynth's own function, kept for the "diffsynth" backend


def refuse_masks(backend: str, attention_mask, enable_fp8_attention) -> None:
    if attention_mask is not None or enable_fp8_attention:
        raise RuntimeError(f"attention backend {backend} does not take masks or FP8 attention; "
                           "use the 'diffsynth' backend for entity-masked prompts")


def _dispatching_attention(q, k, v, num_heads, attention_mask=None, enable_fp8_attention=False):
    """Drop-in for DiffSynth's `qwen_image_flash_attention`: the same signature, output [b, s, h*d]. Under
    sequence parallel (parallel/ulysses.py) the joined text and image go through its all-to-all first."""
    if ulysses.active():
        return joint_attention(ulysses.split_joined(q, k, v), num_heads, attention_mask, enable_fp8_attention)
    return _local_attention(q, k, v, num_heads, attention_mask, enable_fp8_attention)


def _local_attention(q, k, v, num_heads, attention_mask=None, enable_fp8_attention=False):
    """Attention of joined q, k, v in [b, h, s, d] with the active backend, on this process's heads and tokens."""
    backend = _active_backend
    if backend == "diffsynth":
        return _diffsynth_attention(q, k, v, num_heads, attention_mask=attention_mask,
                                    enable_fp8_attention=enable_fp8_attention)
    refuse_masks(backend, attention_mask, enable_fp8_attention)
    if backend in SDPA_BACKENDS:
        return rearrange(attend(q, k, v, backend), "b n s d -> b s (n d)")
    return EXTERNAL[backend](q, k, v).flatten(2)


def joint_attention(streams, num_heads: int, attention_mask=None, enable_fp8_attention=False, q_scale=None,
                    k_scale=None) -> torch.Tensor:
    """Attention over streams joined along the sequence, in order, each stream's (q, k, v) in
    [batch, seq, heads, head_dim]; output [batch, seq, heads * head_dim]. The FP8 backend quantizes each stream
    before the join, q and k with the given FP8 scales (from rewrites.qk_bounds); the others get the joined
    tensors. Under sequence parallel, streams are (text, this rank's image shard), redistributed by Ulysses'
    all-to-all around the attention."""
    def attend(local_streams, local_heads):
        return _local_joint_attention(local_streams, local_heads, attention_mask, enable_fp8_attention, q_scale,
                                      k_scale)
    if ulysses.active():
        if attention_mask is not None:
            raise RuntimeError("sequence parallel does not take attention masks (entity prompts)")
        return ulysses.joint_attention(streams, attend)
    return attend(streams, num_heads)


def _local_joint_attention(streams, num_heads: int, attention_mask, enable_fp8_attention, q_scale, k_scale):
    if _active_backend in FP8_BACKENDS:
        refuse_masks(_active_backend, attention_mask, enable_fp8_attention)
        return fp8_attention.joint_attention(streams, q_scale, k_scale, _active_backend).flatten(2)
    q, k, v = (torch.cat(parts, dim=1).transpose(1, 2) for parts in zip(*streams))
    return _local_attention(q, k, v, num_heads, attention_mask, enable_fp8_attention)


def install() -> None:
    """Route DiffSynth's Qwen DiT attention through the dispatcher (idempotent)."""
    global _diffsynth_attention
    from ..diffsynth_patches import replace
    _diffsynth_attention = replace("attention dispatcher", _dispatching_attention)


@contextlib.contextmanager
def active(backend: str):
    """Make `backend` (a concrete one, or "diffsynth") the one the DiT uses inside this block."""
    global _active_backend
    install()
    previous, _active_backend = _active_backend, backend
    try:
        yield
    finally:
        _active_backend = previous


def active_backend() -> str:
    """The backend the DiT runs now (a concrete one, or "diffsynth")."""
    return _active_backend
