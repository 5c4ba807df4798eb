"""The GELU of a feed-forward layer and its output's rowwise FP8 quantization in one Triton kernel (the
`fused-gelu-quant` rewrite; the forward that calls it: models/qwen_image/dit.py).

Under `fp8=torchao` each feed-forward layer runs: up projection (FP8 GEMM, bf16 out), GELU with the tanh
approximation (the trained model's, models/qwen_image/dit.py), then torchao quantizes the GELU's output per row for
the down projection (the row's largest magnitude / 448, then divided and cast to float8_e4m3fn) before the next FP8
GEMM. Inductor fuses GELU and
quantization into one persistent reduction that keeps each 12288-wide row in registers; the profile in
lab/LOG.md (section 6) measured it as the largest kernel outside the GEMMs and the attention, at about
half the memory bandwidth that reading the bf16 rows and writing the FP8 ones takes.

The kernel here gives each row to one program, which holds the row in registers and computes its GELU once
(measured against other layouts by lab/probes: gelu_quant_probe.py): 0.5 x (1 + tanh(u)) as x * sigmoid(2u), the
same function in float32 (until 2026-11 it computed DiffSynth's x * sigmoid(1.702 x), not the model's GELU). It
computes what torchao's quantization computes (the GELU rounded to bf16, torchao's scale and division, the same
cast); a row of zeros gets a tiny scale instead
of torchao's zero scale (whose division gives NaN). The down projection then runs on torchao's FP8 weight tensors
through the same torch._scaled_mm call torchao makes (kernels/fp8.py), so a fused LoRA written into those tensors
stays in effect.
"""
from __future__ import annotations

import torch

from .fp8 import FP8, FP8_MAX, SMALLEST_AMAX

# the fastest of gelu_quant_probe.py's candidates on an H100 (lab/results/gelu-quant/)
WARPS = 8


def gelu_rowwise_fp8_launch(x: torch.Tensor, warps: int = WARPS):
    """GELU of the contiguous bf16 matrix `x` quantized per row: (float8_e4m3fn values, float32 scales [rows, 1])."""
    import triton
    from . import triton_code
    n_rows, n_columns = x.shape
    out = torch.empty((n_rows, n_columns), dtype=FP8, device=x.device)
    scale = torch.empty((n_rows, 1), dtype=torch.float32, device=x.device)
    triton_code.gelu_rowwise_fp8[(n_rows,)](x, out, scale, FP8_MAX, SMALLEST_AMAX, n_columns=n_columns,
                                        BLOCK=triton.next_power_of_2(n_columns), num_warps=warps)
    return out, scale


# An opaque op to compiled blocks: Inductor's own compilation of this user-defined kernel (torch.library.triton_op)
# failed in Triton's LLVM lowering on the H100 with torch 2.11, while Triton's JIT compiles it (gelu_quant_probe).
@torch.library.custom_op("ghostedit::gelu_rowwise_fp8", mutates_args=())
def gelu_rowwise_fp8(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return gelu_rowwise_fp8_launch(x.contiguous())


@gelu_rowwise_fp8.register_fake
def _(x):
    return x.new_empty(x.shape, dtype=FP8), x.new_empty((x.shape[0], 1), dtype=torch.float32)
