"""SwiGLU's silu(gate) * up and its rowwise FP8 quantization in one Triton kernel (the `fused-swiglu-quant` rewrite;
the forward that calls it: models/qwen_image_21/dit.py, Qwen-Image-2.1's feed-forward).

Under `fp8=torchao` each of 2.1's feed-forward layers runs: the gate and up projections (FP8 GEMMs, bf16 out),
silu(gate) * up, then torchao quantizes that per row for the down projection before the next FP8 GEMM. Eager PyTorch
rounds the SiLU to bf16 and the product to bf16; torchao then takes the row's largest magnitude (bf16), divides it by
448 in bf16 (on CUDA, a product with float32's 1 / 448: PyTorch's division by a Python number) for the row's scale,
divides the row by that scale in float32, clamps it to +-448 and casts it to float8_e4m3fn.

The kernel gives each row to one program, which holds the gate's row and the up projection's in registers (the GELU
quantization's layout, kernels/gelu_quant.py) and computes every one of those steps with the same roundings: the SiLU
as PyTorch's CUDA kernel computes it (x / (1 + expf(-x)) in float32, CUDA's expf from libdevice, an IEEE division),
the product, the bf16 scale and an IEEE division by it. A row of zeros gets a tiny scale instead of torchao's zero
scale (whose division gives NaN). The down projection then runs on torchao's FP8 weight tensors through the same
torch._scaled_mm call torchao makes (kernels/fp8.py), so a fused LoRA written into those tensors stays in effect.
"""
from __future__ import annotations

import torch

from .fp8 import FP8, FP8_MAX, SMALLEST_AMAX

# the GELU quantization's choice for its 12288-wide rows (kernels/gelu_quant.py); not measured for this kernel
WARPS = 8


def swiglu_rowwise_fp8_launch(gate: torch.Tensor, up: torch.Tensor, warps: int = WARPS):
    """silu(gate) * up of the contiguous bf16 matrices `gate` and `up` (the same shape) quantized per row:
    (float8_e4m3fn values, float32 scales [rows, 1])."""
    import triton
    from . import triton_code
    n_rows, n_columns = gate.shape
    out = torch.empty((n_rows, n_columns), dtype=FP8, device=gate.device)
    scale = torch.empty((n_rows, 1), dtype=torch.float32, device=gate.device)
    triton_code.swiglu_rowwise_fp8[(n_rows,)](gate, up, out, scale, FP8_MAX, 1.0 / FP8_MAX, SMALLEST_AMAX,
                                              n_columns=n_columns, BLOCK=triton.next_power_of_2(n_columns),
                                              LIBDEVICE_EXP=gate.is_cuda, num_warps=warps)
    return out, scale


# An opaque op to compiled blocks, as the GELU quantization's (gelu_quant.py says why not a triton_op)
@torch.library.custom_op("ghostedit::swiglu_rowwise_fp8", mutates_args=())
def swiglu_rowwise_fp8(gate: torch.Tensor, up: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return swiglu_rowwise_fp8_launch(gate.contiguous(), up.contiguous())


@swiglu_rowwise_fp8.register_fake
def _(gate, up):
    return gate.new_empty(gate.shape, dtype=FP8), gate.new_empty((gate.shape[0], 1), dtype=torch.float32)
