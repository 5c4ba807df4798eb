"""The fused SwiGLU quantization (fused-swiglu-quant) on the CPU: what it needs and says when it cannot run, where it
applies (Qwen-Image-2.1's DiT alone), the shapes compiled blocks see for its op, its Triton kernel run by Triton's
interpreter against torchao's quantization of eager silu(gate) * up, and the 2.1 DiT's forward on its path with
torchao's FP8 GEMMs emulated (tests/cpu_fp8.py). Its values and scales against torchao's on the GPU, bit for bit, and
the full-size 2.1 DiT's prediction with it: tests/gpu/test_qwen21_swiglu_quant.py."""
import json
from pathlib import Path

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from triton_interpreter import run_interpreted
from ghostedit import OptimizationConfig
from ghostedit.config import LoraChoice
from ghostedit.engine import Engine
from ghostedit.engine.prepare import clone_sharing_weights
from ghostedit.kernels import swiglu_quant
from ghostedit.models.family import QWEN_IMAGE_21_DIT, QWEN_IMAGE_DIT
from ghostedit.optimize import registry, rewrites

ROOT = Path(__file__).parents[3]


def test_it_needs_torchao_fp8_and_says_why_it_cannot_run_on_a_cpu():
    with pytest.raises(ValueError, match="needs fp8 set to torchao"):
        OptimizationConfig(rewrites=("fused-swiglu-quant",))
    available = registry.options("cpu")["rewrites"]["fused-swiglu-quant"]
    assert not available.ok and "needs a CUDA GPU" in available.reason
    config = OptimizationConfig.parse("fp8=torchao,rewrites=fused-swiglu-quant")
    with pytest.raises(ValueError, match="fused-swiglu-quant needs fused LoRAs"):
        config.replace(loras=(LoraChoice("a.safetensors", "0" * 64, 1.0, "runtime"),))
    assert "fused-swiglu-quant" not in config.for_runtime_loras().flags("rewrites")


def test_it_applies_to_2_1_alone_and_the_gelu_quantization_to_the_edit_dit_alone():
    swiglu, gelu = registry.get("fused-swiglu-quant"), registry.get("fused-gelu-quant")
    assert registry.family_availability(swiglu, "on", QWEN_IMAGE_21_DIT).ok
    refused = registry.family_availability(swiglu, "on", QWEN_IMAGE_DIT)
    assert not refused.ok and "fused-gelu-quant" in refused.reason
    assert registry.family_availability(gelu, "on", QWEN_IMAGE_DIT).ok
    assert not registry.family_availability(gelu, "on", QWEN_IMAGE_21_DIT).ok


def test_it_refuses_feed_forward_layers_that_are_not_torchao_fp8():
    dit = clone_sharing_weights(Engine("tiny-2.1", device="cpu", dit_only=True).load().dit)
    assert [len(layer.projections()) for layer in dit.feed_forwards()] == [3] * len(dit.blocks)  # gate, up, down
    with pytest.raises(ValueError, match="are not torchao FP8 linears: the fused SwiGLU quantization needs"):
        rewrites.check_feed_forward_quant(dit, "the fused SwiGLU quantization")


def test_compiled_blocks_see_fp8_values_and_a_scale_per_row():
    with FakeTensorMode():
        values, scales = swiglu_quant.swiglu_rowwise_fp8(torch.empty(7, 96, dtype=torch.bfloat16),
                                                         torch.empty(7, 96, dtype=torch.bfloat16))
    assert (values.shape, values.dtype) == ((7, 96), torch.float8_e4m3fn)
    assert (scales.shape, scales.dtype) == ((7, 1), torch.float32)


KERNEL_CHECK = """
import math
import torch
from torchao.quantization.quant_primitives import _choose_scale_float8
from ghostedit.kernels import swiglu_quant
generator = torch.Generator().manual_seed(0)
gate = (torch.randn(6, 3000, generator=generator) * 3).to(torch.bfloat16)
up = torch.randn(6, 3000, generator=generator).to(torch.bfloat16)
gate[3], up[3] = 0, 0
gate[4] = -torch.linspace(1, 100, 3000)  # SiLU near zero from below, and past float32's exp range
gate[5] = torch.linspace(-8, 8, 3000)
values, scales = swiglu_quant.swiglu_rowwise_fp8_launch(gate, up)
swiglu = torch.nn.functional.silu(gate) * up   # eager: the SiLU rounded to bf16, the product rounded to bf16
expected = _choose_scale_float8(swiglu, [1, gate.shape[1]], torch.float8_e4m3fn)
rows = [0, 1, 2, 4, 5]
# torchao's scale is a bf16 value (the bf16 amax / 448 in bf16), and so is the kernel's
assert torch.equal(scales, scales.to(torch.bfloat16).float()), scales
# the interpreter rounds float32 to bf16 toward zero (the GPU to nearest): the SiLU, the product and the scale each
# at most a bf16 step below eager's
assert bool(((scales[rows] <= expected[rows]) & (scales[rows] >= expected[rows] * (1 - 3 * 2 ** -7))).all()), \\
    (scales, expected)
assert math.isclose(scales[3].item(), swiglu_quant.SMALLEST_AMAX / swiglu_quant.FP8_MAX, rel_tol=2 ** -7)
assert values[3].float().abs().max() == 0
dequantized = values[rows].float() * scales[rows]
large = swiglu[rows].float().abs() > 0.1 * swiglu[rows].float().abs().amax(dim=1, keepdim=True)
assert torch.equal(dequantized[large].sign(), swiglu[rows].float()[large].sign())
assert values.float().abs().max() <= swiglu_quant.FP8_MAX
print("ok")
"""


def test_the_kernel_quantizes_each_row_with_torchaos_scale_in_tritons_interpreter():
    """silu(gate) * up quantized per row with torchao's scale of eager's bf16 product: a row length that is no power
    of two (masked lanes), a row of zeros, a row of negative gates (the SiLU's tail, where exp(-x) overflows) and one
    across zero; run on the CPU by Triton's interpreter, whose float conversions truncate, so the check is the scales
    (bf16 values, as torchao's) and the layout, not the rounding, which the GPU test checks bit for bit."""
    assert run_interpreted(KERNEL_CHECK).strip() == "ok"


DIT_CHECK = """
import json, sys, torch
sys.path.insert(0, "tests")
import cpu_fp8
from qwen21_forwards import inputs, predictions
from ghostedit.engine import Engine
from ghostedit.models import seams
from ghostedit.models.qwen_image_21 import dit

calls = {"kernel": 0, "fp8_linear": 0}
kernel, fp8_linear, forward = dit.swiglu_rowwise_fp8, dit.fp8_linear, dit.FeedForward.forward
feed_forward_outputs = []

def counted(name, function):
    def call(*arguments):
        calls[name] += 1
        return function(*arguments)
    return call

def recorded(self, x, options=seams.DitOptions()):
    out = forward(self, x, options)
    feed_forward_outputs.append(out.float())
    return out
dit.swiglu_rowwise_fp8, dit.fp8_linear = counted("kernel", kernel), counted("fp8_linear", fp8_linear)
dit.FeedForward.forward = recorded

engine = Engine("tiny-2.1", device="cpu", dtype="bfloat16", dit_only=True)
report = {"blocks": len(engine.load().dit.blocks)}
with cpu_fp8.gpu_paths_on_the_cpu():
    given = inputs(engine.load().dit, 1, dtype=torch.bfloat16)
    outputs, first = {}, {}
    for name, text in (("without", "fp8=torchao"), ("with", "fp8=torchao,rewrites=fused-swiglu-quant")):
        calls.update(kernel=0, fp8_linear=0)
        feed_forward_outputs.clear()
        outputs[name], words = predictions(engine, text, given)
        report[name] = {"calls": dict(calls), "words": words}
        first[name] = feed_forward_outputs[0]   # the first block's at the filling step: the same input either way
report["first_feed_forward"] = float((first["with"] - first["without"]).norm() / first["without"].norm())
report["errors"] = [float((ours - theirs).norm() / theirs.norm())
                    for ours, theirs in zip(outputs["with"], outputs["without"])]
print(json.dumps(report))
"""
FIRST_FEED_FORWARD = 0.1  # relative: FP8 values truncated by the interpreter against torchao's rounded to nearest
LOSSY = 0.15               # a prediction, relative: as the 2.1 rewrites' CPU tests allow (test_qwen_image_21_rewrites)


def test_the_2_1_dit_takes_the_kernels_path_at_every_step_in_tritons_interpreter():
    """Qwen-Image-2.1's tiny DiT in bf16 with torchao's FP8 GEMMs emulated, three steps with the prefix cache on (the
    first fills it): with the rewrite the kernel and the FP8 down projection run once per block at every step (each
    step's tokens all pass the feed-forward), none without it; the first block's feed-forward output (the same input
    either way) and each prediction stay within the interpreter's rounding of the path without it."""
    report = json.loads(run_interpreted(DIT_CHECK, timeout=600).strip().splitlines()[-1])
    every_block_and_step = report["blocks"] * len(report["errors"])
    assert report["without"]["calls"] == {"kernel": 0, "fp8_linear": 0}, report
    assert report["with"]["calls"] == {"kernel": every_block_and_step, "fp8_linear": every_block_and_step}, report
    assert "fused-swiglu-quant" not in report["with"]["words"], report
    assert 0 < report["first_feed_forward"] < FIRST_FEED_FORWARD, report
    assert all(0 < error <= LOSSY for error in report["errors"]), report
