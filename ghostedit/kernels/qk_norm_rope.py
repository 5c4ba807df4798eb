"""The FP8 attention's q and k in GhostEdit's own kernel: normalized, rotated and cast to FP8 in one Triton kernel
that writes each stream straight into the joined tensor (the `fused-qk-norm-rope` rewrite; the forwards that call it:
models/qwen_image/dit.py, both streams; models/qwen_image_21/dit.py, its one stream's target at a step from the
prefix cache).

With an FP8 attention (`cudnn-fp8`, `fa3-fp8`) each block computes, for q and for k of both streams: the per-head
RMSNorm, the rotary embedding (real cos/sin, the real-rope rewrite), the multiplication by the FP8 scale worked out
from a bound on q or k (the attention layer's qk_bounds, models/qwen_image/dit.py), the cast to float8_e4m3fn, and
then a byte copy that joins text and image along the sequence for the kernel. Inductor fuses the first part into one
reduction kernel per stream that reads each row several times, and the join is a kernel of its own: the profile in
lab/LOG.md (section 6)
measured them as the largest glue around the attention.

The kernel here gives each program a few tokens, and for each token loads all its heads of q and of k once, and
its rotary cos and sin once for both. It splits each head's RoPE pairs apart in registers and computes in float32
what the compiled code computes: x * rsqrt(mean(x^2) + eps) * weight, rotated as x * cos + x_swapped * sin, times
the scale, clamped to FP8's range and cast. Each stream's tokens land at their place in the joined
[batch, text + image, heads, head_dim] tensors, so no join is left to do.
"""
from __future__ import annotations

import torch

from .fp8 import FP8, FP8_MAX

# tokens per program and warps: the fastest setting of the probe's sweep on the H100
# (qk_norm_rope_probe.py in lab/probes/README.md, lab/LOG.md section 6)
TOKENS, WARPS = 1, 2


def _check(part: torch.Tensor, cos: torch.Tensor) -> None:
    _, seq, _, head_dim = part.shape
    if part.stride(-1) != 1 or part.stride(-2) != head_dim:
        raise ValueError(f"q and k must have contiguous heads; got strides {part.stride()}")
    if cos.shape != (seq, head_dim) or not cos.is_contiguous():
        raise ValueError(f"the rotary cos and sin must be contiguous [seq, head_dim]; got {tuple(cos.shape)}")


def qk_norm_rope_fp8_launch(q: list[torch.Tensor], k: list[torch.Tensor], q_weights: list[torch.Tensor],
                            k_weights: list[torch.Tensor], cos: list[torch.Tensor], sin: list[torch.Tensor],
                            q_scale: torch.Tensor, k_scale: torch.Tensor, eps: float, tokens: int = TOKENS,
                            warps: int = WARPS) -> tuple[torch.Tensor, torch.Tensor]:
    """The streams' q and k (bf16 [batch, seq, heads, head_dim] each) normalized with their RMSNorm weights,
    rotated by the stream's real `cos` and `sin` ([seq, head_dim], float32), multiplied by their scale and cast to
    float8_e4m3fn, each joined along the sequence in stream order: [batch, total seq, heads, head_dim] twice."""
    import triton
    from . import triton_code
    batch, _, heads, head_dim = q[0].shape
    out_seq = sum(part.shape[1] for part in q)
    q8, k8 = (torch.empty((batch, out_seq, heads, head_dim), dtype=FP8, device=q[0].device) for _ in range(2))
    first_token = 0
    for stream_q, stream_k, q_weight, k_weight, stream_cos, stream_sin in zip(q, k, q_weights, k_weights, cos, sin):
        for part in (stream_q, stream_k):
            _check(part, stream_cos)
        seq = stream_q.shape[1]
        n_tokens = batch * seq
        triton_code.qk_norm_rope_fp8[(triton.cdiv(n_tokens, tokens),)](
            stream_q, stream_k, q_weight, k_weight, stream_cos, stream_sin, q_scale, k_scale, q8, k8, n_tokens, seq,
            heads, stream_q.stride(0), stream_q.stride(1), stream_k.stride(0), stream_k.stride(1), first_token,
            out_seq, eps, FP8_MAX, HEAD_DIM=head_dim, HEADS_BLOCK=triton.next_power_of_2(heads), TOKENS=tokens,
            num_warps=warps)
        first_token += seq
    return q8, k8


# An opaque op to compiled blocks, as the GELU quantization's (fp8_mlp.py says why not a triton_op)
@torch.library.custom_op("ghostedit::qk_norm_rope_fp8", mutates_args=())
def qk_norm_rope_fp8(q: list[torch.Tensor], k: list[torch.Tensor], q_weights: list[torch.Tensor],
                     k_weights: list[torch.Tensor], cos: list[torch.Tensor], sin: list[torch.Tensor],
                     q_scale: torch.Tensor, k_scale: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    return qk_norm_rope_fp8_launch(q, k, q_weights, k_weights, cos, sin, q_scale, k_scale, eps)


@qk_norm_rope_fp8.register_fake
def _(q, k, q_weights, k_weights, cos, sin, q_scale, k_scale, eps):
    batch, _, heads, head_dim = q[0].shape
    shape = (batch, sum(part.shape[1] for part in q), heads, head_dim)
    return q[0].new_empty(shape, dtype=FP8), q[0].new_empty(shape, dtype=FP8)
