"""The fused GELU quantization (fused-gelu-quant) on the CPU: what it needs and says when it cannot run, the shapes
compiled blocks see for its op, and its Triton kernel run by Triton's interpreter against torchao's scales. Its
speed and its output against torchao's on the GPU: gelu_quant_probe.py (lab/probes/README.md; lab/LOG.md, section 6)."""

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from dit_helpers import dit_engine
from triton_interpreter import run_interpreted
from ghostedit import OptimizationConfig
from ghostedit.engine.prepare import clone_sharing_weights
from ghostedit.kernels import gelu_quant as fp8_mlp
from ghostedit.optimize import registry, rewrites


def test_it_needs_torchao_fp8_and_says_why_it_cannot_run_on_a_cpu():
    with pytest.raises(ValueError, match="needs fp8 set to torchao"):
        OptimizationConfig(rewrites=("fused-gelu-quant",))
    available = registry.options("cpu")["rewrites"]["fused-gelu-quant"]
    assert not available.ok and "needs a CUDA GPU" in available.reason


def test_it_refuses_feed_forward_layers_that_are_not_torchao_fp8():
    dit = clone_sharing_weights(dit_engine().load().dit)
    with pytest.raises(ValueError, match="are not torchao FP8 linears"):
        rewrites.check_feed_forward_quant(dit, "the fused GELU quantization")


def test_compiled_blocks_see_fp8_values_and_a_scale_per_row():
    with FakeTensorMode():
        values, scales = fp8_mlp.gelu_rowwise_fp8(torch.empty(7, 96, dtype=torch.bfloat16))
    assert (values.shape, values.dtype) == ((7, 96), torch.float8_e4m3fn)
    assert (scales.shape, scales.dtype) == ((7, 1), torch.float32)


KERNEL_CHECK = """
import math
import torch
from torchao.quantization.quant_primitives import _choose_scale_float8
from ghostedit.kernels import gelu_quant as fp8_mlp
x = (torch.randn(5, 3000, generator=torch.Generator().manual_seed(0)) * 3).to(torch.bfloat16)
x[3] = 0
x[4] = -torch.linspace(1, 3, 3000)  # where DiffSynth's x * sigmoid(1.702 x) is 3% away from the model's GELU
values, scales = fp8_mlp.gelu_rowwise_fp8_launch(x)
gelu = torch.nn.functional.gelu(x.float(), approximate="tanh").to(torch.bfloat16)  # the model's GELU
expected = _choose_scale_float8(gelu, [1, x.shape[1]], torch.float8_e4m3fn)
rows = [0, 1, 2, 4]
# the interpreter rounds float32 to bf16 and FP8 toward zero (the GPU rounds to nearest): scales within a bf16 step
assert torch.allclose(scales[rows], expected[rows], rtol=1e-2), (scales, expected)
assert math.isclose(scales[3].item(), fp8_mlp.SMALLEST_AMAX / fp8_mlp.FP8_MAX, rel_tol=1e-6)
assert values[3].float().abs().max() == 0
dequantized = values[rows].float() * scales[rows]
large = gelu[rows].float().abs() > 0.1 * gelu[rows].float().abs().amax(dim=1, keepdim=True)
assert torch.equal(dequantized[large].sign(), gelu[rows].float()[large].sign())
assert values.float().abs().max() <= fp8_mlp.FP8_MAX
print("ok")
"""


def test_the_kernel_quantizes_each_row_with_torchaos_scale_in_tritons_interpreter():
    """The model's GELU (tanh approximation) quantized per row with torchao's scale: a row length that is no power of
    two (masked lanes), a row of zeros, a row of negative values (where another GELU's scale would be off); run on
    the CPU by Triton's interpreter, whose float conversions truncate, so the check is the scales and the layout, not
    the FP8 rounding."""
    assert run_interpreted(KERNEL_CHECK).strip() == "ok"
