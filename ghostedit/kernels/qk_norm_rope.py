"""The FP8 attention's inputs and output in GhostEdit's own code: q and k normalized, rotated and cast to FP8 in one
Triton kernel that writes each stream straight into the joined tensor (the `fused-qk-norm-rope` rewrite), and
cuDNN's FP8 output handed to the output projections' FP8 GEMMs as it is (the `fp8-attention-out` rewrite).

With an FP8 attention (`cudnn-fp8`, `fa3-fp8`) each block computes, for q and for k of both streams: the per-head
RMSNorm, the rotary embedding (real cos/sin, the real-rope rewrite), the multiplication by the FP8 scale worked out
from the bound of rewrites.qk_bounds, the cast to float8_e4m3fn, and then a byte copy that joins text and image
along the sequence for the kernel. Inductor fuses the first part into one reduction kernel per stream that reads
each row several times, and the join is a kernel of its own: the profile in docs/benchmarks.md (section 6)
measured them as the largest glue around the attention.

The kernel here gives each program a few tokens, and for each token loads all its heads of q and of k once, and
its rotary cos and sin once for both. It splits each head's RoPE pairs apart in registers and computes in float32
what the compiled code computes: x * rsqrt(mean(x^2) + eps) * weight, rotated as x * cos + x_swapped * sin, times
the scale, clamped to FP8's range and cast. Each stream's tokens land at their place in the joined
[batch, text + image, heads, head_dim] tensors, so no join is left to do.
"""
from __future__ import annotations

import torch

from . import fp8_attention
from .fp8 import FP8, FP8_MAX, torchao_fp8_linear

# tokens per program and warps: the fastest setting of the probe's sweep on the H100
# (scripts/gpu/qk_norm_rope_probe.py, docs/benchmarks.md section 6)
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


def joint_attention(module, streams, freqs,
                    backend: str = "cudnn-fp8") -> tuple[torch.Tensor, torch.Tensor | None]:
    """The FP8 joint attention (the FP8 `backend`) of a JointAttention `module` (rewrites.py) over its streams' raw
    q (before RMSNorm and RoPE), k and v, each [batch, seq, heads, head_dim], with each stream's (cos, sin)
    [seq, head_dim]: q and k through the kernel, v as fp8_attention quantizes it. The output as the kernel writes
    it and the factor that gives its real values (fp8_attention.attend_as_written)."""
    (text_q, text_k, text_v), (image_q, image_k, image_v) = streams
    cos, sin = zip(*freqs)
    q8, k8 = qk_norm_rope_fp8([text_q, image_q], [text_k, image_k], [module.norm_added_q.weight, module.norm_q.weight],
                              [module.norm_added_k.weight, module.norm_k.weight], list(cos), list(sin),
                              module.q_scale, module.k_scale, module.norm_q.eps)
    return fp8_attention.attend_as_written([q8], fp8_attention.descale(module.q_scale), [k8],
                                           fp8_attention.descale(module.k_scale), (text_v, image_v), backend)


def out_projection(linear: torch.nn.Linear, output: torch.Tensor, descale: torch.Tensor | None,
                   in_fp8: bool) -> torch.Tensor:
    """An output projection of the FP8 attention's `output` ([batch, seq, heads, head_dim]: FP8 with real values
    output * descale, or real values where descale is None). in_fp8 (the fp8-attention-out rewrite): the torchao
    FP8 GEMM takes the FP8 values as they are, with `descale` as every row's scale; else they are dequantized to
    bf16 and the layer quantizes them again per row."""
    if descale is None:
        return linear(output.flatten(2))
    if not in_fp8:
        return linear(fp8_attention.dequantized(output, descale).flatten(2))
    rows = output.flatten(2)
    flat = rows.reshape(-1, rows.shape[-1])
    projected = torchao_fp8_linear(linear, flat, descale.reshape(1, 1).expand(flat.shape[0], 1).contiguous())
    return projected.reshape(*rows.shape[:-1], projected.shape[-1])
