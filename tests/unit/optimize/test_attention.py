"""Attention backends on the CPU: what cannot run says why, "auto" stays exact, the FP8 attention's scaling
(everything around the cuDNN kernel) computes attention, and the lossless rewrites keep the DiT's output."""
import math
import time

import pytest
import torch

from dit_helpers import dit_engine, dit_output, inputs_for
from ghostedit import OptimizationConfig
from ghostedit.bench.dit import relative_error
from ghostedit.engine.prepare import clone_sharing_weights
from ghostedit.kernels import attention as backends, fp8_attention
from ghostedit.models import rotary
from ghostedit.models.qwen_image import dit as qwen_image
from ghostedit.models.seams import DitOptions


@pytest.fixture(scope="module")
def tiny_engine():
    return dit_engine()


@pytest.fixture(scope="module")
def tiny_dit(tiny_engine):
    return tiny_engine.load().dit


def test_fp8_attention_is_unavailable_on_a_cpu_with_the_reason():
    available = backends.availability("cudnn-fp8", "cpu")
    assert not available.ok and "needs a CUDA GPU" in available.reason


def test_auto_never_picks_a_lossy_backend(monkeypatch):
    """Every backend made available, the lossy ones instant and the exact ones slow: auto still picks an exact
    one and never times a lossy one."""
    monkeypatch.setattr(backends, "availability", lambda backend, device: backends.Availability.yes())
    monkeypatch.setattr(backends, "attend",
                        lambda q, k, v, backend: None if backend in backends.LOSSY_BACKENDS else time.sleep(0.002))
    backends.fastest_backend.cache_clear()
    try:
        winner, timings = backends.fastest_backend("cpu", 2, 16, 32)
    finally:
        backends.fastest_backend.cache_clear()
    assert winner not in backends.LOSSY_BACKENDS
    assert set(timings) == set(backends.CONCRETE_BACKENDS) - set(backends.LOSSY_BACKENDS)


def test_probing_and_timing_backends_leave_the_random_state_alone():
    """A probe drew from the process's random state once, so the synthetic model's weights, made after it,
    depended on which probes had run: two processes of one multi-GPU edit held different weights."""
    backends.availability.cache_clear()
    backends.fastest_backend.cache_clear()
    before = torch.get_rng_state()
    try:
        assert backends.availability("sdpa-math", "cpu").ok  # a real call of the backend
        backends.fastest_backend("cpu", 2, 16, 32)
    finally:
        backends.availability.cache_clear()
        backends.fastest_backend.cache_clear()
    assert torch.equal(torch.get_rng_state(), before)


def test_fp8_scaling_round_trips_and_saturates_instead_of_overflowing():
    x = torch.randn(1, 4, 64, 32) * 3
    x8, descale = fp8_attention.to_fp8(x, fp8_attention.largest_magnitude(x))
    assert x8.dtype == torch.float8_e4m3fn and descale.shape == (1, 1, 1, 1)
    assert x8.float().abs().max() == fp8_attention.FP8_MAX  # the largest value maps onto FP8's largest
    assert float((x8.float() * descale - x).norm() / x.norm()) < 0.05
    bounded, bound_descale = fp8_attention.to_fp8(x, x.abs().max() * 2)
    assert float((bounded.float() * bound_descale - x).norm() / x.norm()) < 0.05
    too_small, _ = fp8_attention.to_fp8(x, x.abs().max() / 2)  # a wrong bound clamps, never NaN
    assert torch.isfinite(too_small.float()).all() and too_small.float().abs().max() == fp8_attention.FP8_MAX


def _reference_fp8_kernel(q, k, v, q_descale, k_descale, v_descale):
    """cuDNN's op, computed on the CPU: lists of FP8 parts in [batch, seq, heads, head_dim] joined along the
    sequence and descales in, the output in FP8 scaled as v is, in [batch, seq, heads, head_dim]."""
    q, k, v = (torch.cat([part.float() for part in parts], dim=1).transpose(1, 2) for parts in (q, k, v))
    out = torch.nn.functional.scaled_dot_product_attention(q * q_descale, k * k_descale, v * v_descale)
    return (out / v_descale).transpose(1, 2).to(torch.float8_e4m3fn)


def _reference_fa3_fp8_kernel(q, k, v, q_descale, k_descale, v_descale):
    """FlashAttention-3's FP8 op, computed on the CPU: the same inputs as cuDNN's, the output's real values in bf16."""
    return (_reference_fp8_kernel(q, k, v, q_descale, k_descale, v_descale).float() * v_descale).to(torch.bfloat16)


def test_fp8_parts_join_as_bytes_along_the_sequence():
    text, image = (torch.randn(1, tokens, 2, 8).to(torch.float8_e4m3fn) for tokens in (3, 5))
    joined = fp8_attention._joined([text, image])
    assert joined.dtype == torch.float8_e4m3fn
    assert torch.equal(joined.float(), torch.cat([text.float(), image.float()], dim=1))


@pytest.mark.parametrize("backend", backends.FP8_BACKENDS)
@pytest.mark.parametrize("bounds", [False, True])
def test_fp8_joint_attention_scaling_computes_attention(monkeypatch, bounds, backend):
    """Two streams of unequal scale, each cast to FP8 before the join with the joined tensor's one scale; each FP8
    kernel's output (cuDNN's in FP8 scaled as v is, FlashAttention-3's real values in bf16) read as it means."""
    monkeypatch.setattr(fp8_attention, "cudnn_fp8_attention", _reference_fp8_kernel)
    monkeypatch.setattr(fp8_attention, "fa3_fp8_attention", _reference_fa3_fp8_kernel)
    generator = torch.Generator().manual_seed(0)
    text, image = ([torch.randn(1, tokens, 2, 64, generator=generator) for _ in range(3)] for tokens in (16, 112))
    text[2] = text[2] * 8  # the text's v dominates the joined v's scale
    for stream in (text, image):
        stream[0], stream[1] = stream[0] * 4, stream[1] * 0.5  # peaked attention: scaling mistakes show
    q, k, v = (torch.cat(parts, dim=1) for parts in zip(text, image))
    scales = {"q_scale": fp8_attention.fp8_scale(q.abs().max() * 1.5),
              "k_scale": fp8_attention.fp8_scale(k.abs().max() * 3)} if bounds else {}
    out = fp8_attention.joint_attention([text, image], **scales, backend=backend)
    expected = torch.nn.functional.scaled_dot_product_attention(*(t.transpose(1, 2) for t in (q, k, v)))
    expected = expected.transpose(1, 2)
    assert out.shape == expected.shape == (1, 128, 2, 64)
    assert float((out - expected).norm() / expected.norm()) < 0.08
    one_stream = fp8_attention.attention(*(t.transpose(1, 2) for t in (q, k, v)), backend)  # [b, h, s, d] in
    assert float((one_stream - expected).norm() / expected.norm()) < 0.08


def test_the_joint_layout_computes_the_released_layouts_attention_and_its_bounds_hold(tiny_dit):
    joint = clone_sharing_weights(tiny_dit).blocks[0].attn
    generator = torch.Generator().manual_seed(1)
    image = torch.randn(1, 32, joint.to_q.in_features, generator=generator)
    text = torch.randn(1, 8, joint.add_q_proj.in_features, generator=generator)
    angles = [torch.randn(tokens, joint.head_dim // 2, generator=generator) for tokens in (32, 8)]
    freqs = tuple(torch.polar(torch.ones_like(a), a) for a in angles)
    with torch.no_grad():
        for expected, got in zip(joint(image, text, freqs, DitOptions()),
                                 joint(image, text, freqs, DitOptions(joint_layout=True))):
            assert torch.equal(expected, got)
        for norm in (joint.norm_q, joint.norm_added_q):
            norm.weight = torch.nn.Parameter(torch.rand(norm.weight.shape, generator=generator) * 3,
                                             requires_grad=False)
        bounds = joint.qk_bounds()
        # RMSNorm of large, spiky rows, then a RoPE rotation: still within the bound
        rows = torch.randn(1, 2, 64, joint.head_dim, generator=generator) * 50
        rows[..., 0] = 1e4
        angles = torch.rand(64, joint.head_dim // 2, generator=generator) * 2 * math.pi
        for norm in (joint.norm_q, joint.norm_added_q):
            cos_sin = rotary.cos_sin(torch.polar(torch.ones_like(angles), angles))
            rotated = rotary.real_rotation(norm(rows), cos_sin)
            assert rotated.abs().max() <= bounds["q"]
        assert rotated.abs().max() > 0.5 * bounds["q"]  # and the bound is not loose


@pytest.mark.parametrize("rewrites", [("real-rope",), ("joint-layout",), ("fused-qkv",), ("real-rope", "joint-layout")])
def test_lossless_rewrites_keep_the_dits_output(tiny_engine, rewrites):
    inputs = inputs_for(tiny_engine)
    stock = dit_output(tiny_engine, OptimizationConfig(), inputs)
    changed = dit_output(tiny_engine, OptimizationConfig(rewrites=rewrites), inputs)
    assert relative_error(changed, stock) < 1e-5


def test_the_fp8_attention_refuses_a_backend_it_does_not_compute():
    q8 = [torch.zeros(1, 4, 2, 8, dtype=torch.float8_e4m3fn)]
    with pytest.raises(ValueError, match="'sage' is not an FP8 attention"):
        fp8_attention.attend(q8, torch.ones(1, 1, 1, 1), q8, torch.ones(1, 1, 1, 1), (torch.zeros(1, 4, 2, 8),), "sage")
