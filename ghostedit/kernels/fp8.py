"""FP8 as GhostEdit's kernels use it: the format (float8_e4m3fn, largest value 448), the rowwise quantizing kernels'
floor for a row's largest magnitude, and torchao's FP8 linear layers fed values that are already FP8 (the fused GELU
and SwiGLU quantizations' and the FP8 attention's output)."""
from __future__ import annotations

import torch

FP8 = torch.float8_e4m3fn   # the FP8 format of GhostEdit's own kernels (the FP8 attention, the fused quantizations)
FP8_MAX = torch.finfo(FP8).max  # 448
# a row of zeros: any positive scale quantizes it to zeros (torchao's scale 0 would divide it into NaN)
SMALLEST_AMAX = 1e-12


def is_torchao_fp8(layer: torch.nn.Module) -> bool:
    """True when `layer` is a plain linear holding torchao's rowwise FP8 weight (fp8=torchao, no runtime LoRA
    wrapped around it)."""
    from torchao.quantization import Float8Tensor  # torchao loads with a run, not with the app
    return type(layer) is torch.nn.Linear and isinstance(layer.weight, Float8Tensor)


def torchao_fp8_linear(layer: torch.nn.Linear, values: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """A torchao FP8 linear layer applied to input already in FP8: `values` [rows, in] float8_e4m3fn and their
    float32 `scales` [rows, 1], multiplied by the layer's own FP8 weight tensors (qdata [out, in], scale [out, 1])
    through the torch._scaled_mm call torchao makes, so a fused LoRA written into them stays in effect."""
    weight = layer.weight
    return torch._scaled_mm(values, weight.qdata.t(), scale_a=scales, scale_b=weight.scale.t(), bias=layer.bias,
                            out_dtype=torch.bfloat16, use_fast_accum=weight.mm_config.use_fast_accum)
