"""The fused q/k normalization, rotation and FP8 cast (fused-qk-norm-rope) on the CPU: what it needs and says when it
cannot run, the shapes compiled blocks see for its op, and its Triton kernel run by Triton's interpreter against
GhostEdit's unfused computation (DiffSynth's RMSNorm, the real-rope rotation, the FP8 attention's cast). Its speed
and the DiT's output with it on the GPU: qk_norm_rope_probe.py (lab/probes/README.md) and the bench (lab/LOG.md)."""

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from triton_interpreter import run_interpreted
from ghostedit import OptimizationConfig
from ghostedit.kernels import qk_norm_rope as fp8_qk
from ghostedit.optimize import registry


def test_it_needs_the_fp8_attention_and_real_rope_and_says_why_it_cannot_run_on_a_cpu():
    with pytest.raises(ValueError, match="needs attention set to cudnn-fp8"):
        OptimizationConfig(rewrites=("fused-qk-norm-rope", "real-rope"))
    with pytest.raises(ValueError, match="needs real-rope set to on"):
        OptimizationConfig(attention="cudnn-fp8", rewrites=("fused-qk-norm-rope",))
    assert OptimizationConfig(attention="fa3-fp8", rewrites=("fused-qk-norm-rope", "real-rope"))  # either FP8 kernel
    available = registry.options("cpu")["rewrites"]["fused-qk-norm-rope"]
    assert not available.ok and "CUDA" in available.reason


def test_the_fp8_attention_output_rewrite_needs_the_fused_path_and_torchao_and_refuses_runtime_loras():
    from ghostedit.config import LoraChoice
    best_fused = "best,rewrites=real-rope+joint-layout+inductor-multi-kernel+fused-gelu-quant+fused-qk-norm-rope"
    with pytest.raises(ValueError, match="needs fused-qk-norm-rope set to on"):
        OptimizationConfig.parse("best,rewrites=real-rope+joint-layout+fp8-attention-out")
    with pytest.raises(ValueError, match="needs attention set to cudnn-fp8"):  # FlashAttention-3 writes bf16
        OptimizationConfig.parse(best_fused + "+fp8-attention-out,attention=fa3-fp8")
    with pytest.raises(ValueError, match="needs fp8 set to torchao"):
        OptimizationConfig.parse(best_fused + "+fp8-attention-out,fp8=off,rewrites=real-rope+joint-layout+"
                                 "fused-qk-norm-rope+fp8-attention-out")
    config = OptimizationConfig.parse(best_fused + "+fp8-attention-out")
    without_gelu = config.replace(rewrites=tuple(set(config.flags("rewrites")) - {"fused-gelu-quant"}))
    with pytest.raises(ValueError, match="fp8-attention-out needs fused LoRAs"):
        without_gelu.replace(loras=(LoraChoice("a.safetensors", "0" * 64, 1.0, "runtime"),))
    assert "fp8-attention-out" not in config.for_runtime_loras().flags("rewrites")
    available = registry.options("cpu")["rewrites"]["fp8-attention-out"]
    assert not available.ok and "CUDA" in available.reason


def test_compiled_blocks_see_both_streams_joined_in_fp8():
    with FakeTensorMode():
        parts = [torch.empty(2, seq, 3, 128, dtype=torch.bfloat16) for seq in (5, 11)]
        freqs = [torch.empty(seq, 128) for seq in (5, 11)]
        q8, k8 = fp8_qk.qk_norm_rope_fp8(parts, parts, [torch.empty(128)] * 2, [torch.empty(128)] * 2, freqs, freqs,
                                         torch.empty(()), torch.empty(()), 1e-6)
    assert (q8.shape, q8.dtype) == (k8.shape, k8.dtype) == ((2, 16, 3, 128), torch.float8_e4m3fn)


def test_compiled_blocks_see_each_fp8_kernel_return_the_joined_sequence_in_its_own_dtype():
    """What torch.compile traces for the two FP8 kernels' ops: cuDNN's output in FP8, FlashAttention-3's in bf16."""
    from ghostedit.kernels import fp8_attention
    with FakeTensorMode():
        parts = [torch.empty(2, seq, 3, 128, dtype=torch.float8_e4m3fn) for seq in (5, 11)]
        descale = torch.empty(1, 1, 1, 1)
        cudnn = fp8_attention.cudnn_fp8_attention(parts, parts, parts, descale, descale, descale)
        fa3 = fp8_attention.fa3_fp8_attention(parts, parts, parts, descale, descale, descale)
    assert cudnn.shape == fa3.shape == (2, 16, 3, 128)
    assert (cudnn.dtype, fa3.dtype) == (torch.float8_e4m3fn, torch.bfloat16)


KERNEL_CHECK = """
import torch
from diffsynth.models.general_modules import RMSNorm
from ghostedit.kernels import fp8_attention, qk_norm_rope as fp8_qk
from ghostedit.models import rotary
generator = torch.Generator().manual_seed(0)
batch, heads, dim = 2, 3, 128
streams = []
for seq in (5, 9):  # text, then image: tokens that fill no whole tile of the kernel
    # one projection for q, k and v (fused-qkv): q and k are views whose tokens lie 3 heads' widths apart
    qkv = (torch.randn(batch, seq, 3 * heads * dim, generator=generator) * 2).to(torch.bfloat16)
    q, k, _ = (t.unflatten(-1, (heads, dim)) for t in qkv.chunk(3, -1))
    norms = [RMSNorm(dim, eps=1e-6) for _ in range(2)]
    for norm in norms:
        norm.weight.data = (1 + 0.3 * torch.randn(dim, generator=generator)).to(torch.bfloat16)
    angles = torch.randn(seq, dim // 2, generator=generator)
    cos, sin = rotary.cos_sin(torch.polar(torch.ones_like(angles), angles))
    streams.append({"q": q, "k": k, "norms": norms, "cos": cos, "sin": sin})
scales = [fp8_attention.fp8_scale(torch.stack([s["norms"][i].weight.float().abs().amax() for s in streams]).amax()
                                  * dim ** 0.5) for i in (0, 1)]
q8, k8 = fp8_qk.qk_norm_rope_fp8_launch(
    [s["q"] for s in streams], [s["k"] for s in streams], [s["norms"][0].weight for s in streams],
    [s["norms"][1].weight for s in streams], [s["cos"] for s in streams], [s["sin"] for s in streams], *scales, 1e-6)
def unfused(x, norm, cos, sin, scale):  # in float32 throughout, as the compiled blocks compute it
    x = x.float()
    normed = x * torch.rsqrt(x.square().mean(-1, keepdim=True) + norm.eps) * norm.weight.float()
    swapped = normed.unflatten(-1, (-1, 2)).flip(-1).flatten(-2)
    return (normed * cos.unsqueeze(1) + swapped * sin.unsqueeze(1)) * scale
for i, (name, joined) in enumerate((("q", q8), ("k", k8))):
    expected = torch.cat([unfused(s[name], s["norms"][i], s["cos"], s["sin"], scales[i]) for s in streams], dim=1)
    assert joined.shape == expected.shape and joined.dtype == torch.float8_e4m3fn, (joined.shape, joined.dtype)
    # within one FP8 step (3 mantissa bits: an eighth of the value), and each value's sign, in its place in the
    # joined tensor; the interpreter's FP8 rounding drops the carry of a value just below a power of two (31.8
    # becomes 16)
    error = (joined.float() - expected).abs()
    power = 2 ** torch.ceil(torch.log2(expected.abs()))
    carry_dropped = (expected.abs() > power * 15 / 16) & (joined.float() == expected.sign() * power / 2)
    assert ((error <= expected.abs() / 8 + 2 ** -9) | carry_dropped).all(), (name, error.max())
    assert carry_dropped.float().mean() < 0.05
    large = expected.abs() > 1
    assert torch.equal(joined.float()[large].sign(), expected[large].sign())
    assert joined.float().abs().max() <= fp8_qk.FP8_MAX and expected.abs().amax() > 16
print("ok")
"""


def test_the_kernel_normalizes_rotates_casts_and_joins_both_streams_in_tritons_interpreter():
    """Strided rows (a fused q/k/v projection's view), a batch of two, rows that fill no whole tile; run on the CPU
    by Triton's interpreter, whose FP8 rounding is not the GPU's, so the check is each value within one FP8 step of
    the unfused computation, in its place."""
    assert run_interpreted(KERNEL_CHECK).strip() == "ok"


def test_an_output_projection_reads_each_fp8_kernels_output_as_it_means():
    """cuDNN's output is FP8 with a factor (dequantized before a bf16 projection); FlashAttention-3's is real values
    (no factor), projected as it is."""
    from ghostedit.kernels import fp8_attention
    from ghostedit.models.seams import out_projection
    linear = torch.nn.Linear(2 * 8, 4, dtype=torch.bfloat16).requires_grad_(False)
    real = torch.randn(1, 5, 2, 8, dtype=torch.bfloat16)
    assert torch.equal(out_projection(linear, real, None, in_fp8=False), linear(real.flatten(2)))
    scale = fp8_attention.fp8_scale(real.abs().max())
    as_fp8, descale = fp8_attention._scaled_fp8(real, scale)
    projected = out_projection(linear, as_fp8, descale, in_fp8=False)
    assert torch.equal(projected, linear(fp8_attention.dequantized(as_fp8, descale).flatten(2)))
    assert float((projected - linear(real.flatten(2))).norm() / linear(real.flatten(2)).norm()) < 0.05
