"""FP8 modes for the DiT's linear layers.

storage  FP8 weights with per-row scales, dequantized to bf16 inside each layer: halves weight memory, computes in
         bf16 (torchao Float8WeightOnlyConfig). Costs time, saves memory.
torchao  FP8 weights and dynamically quantized FP8 activations with per-row scales, multiplied by FP8 tensor cores
         (torchao Float8DynamicActivationFloat8WeightConfig, PerRow): real FP8 compute.
te       NVIDIA Transformer Engine Linear layers under FP8 autocast, current scaling (see optimize/te.py);
te-delayed  the same with delayed scaling (scales from an amax history).
Only linears whose both dimensions are multiples of 16 (the FP8 GEMM's requirement) are converted, and never a
LoRA adapter's own small layers.
"""
from __future__ import annotations

import contextlib
import functools
import re
from dataclasses import dataclass, field

import torch

from ..device import Availability, needs_cuda
from ..pinned import moved_in_turn
from . import te

TE_SCALING = {"te": "current", "te-delayed": "delayed"}


@dataclass
class Fp8Report:
    mode: str
    converted: int = 0
    kept_bf16: list[str] = field(default_factory=list)

    @property
    def text(self) -> str:
        if self.mode == "off":
            return "bf16 weights"
        text = f"{self.converted} linear layers in FP8 ({self.mode})"
        if self.kept_bf16:
            kinds = sorted({re.sub(r"\.\d+\.", ".*.", name) for name in self.kept_bf16})
            text += f", {len(self.kept_bf16)} kept in bf16: {', '.join(kinds)}"
        return text


def availability(mode: str, device: str) -> Availability:
    if mode in ("off", "storage"):
        return Availability.yes()
    if mode == "torchao":
        gpu = needs_cuda(device, "torchao FP8 compute", min_capability=(8, 9))
        if not gpu.ok:
            return gpu
        try:
            import torchao  # noqa: F401
        except ImportError as error:
            return Availability.no(f"torchao is not installed ({error})")
        return Availability.yes()
    return te.availability(device)


def _eligible(module: torch.nn.Linear) -> bool:
    return module.in_features % 16 == 0 and module.out_features % 16 == 0


def apply_fp8(model: torch.nn.Module, mode: str, device: str) -> Fp8Report:
    """Converts `model`'s linear layers in place (new weight tensors; shared old ones are left alone), each on
    `device`: layers in host memory are moved over in turn, the next ones' copies overlapping a layer's quantizing."""
    report = Fp8Report(mode)
    if mode == "off":
        return report
    linears = {name: m for name, m in model.named_modules() if isinstance(m, torch.nn.Linear) and ".lora_" not in f".{name}"}
    eligible = {name: m for name, m in linears.items() if _eligible(m)}
    report.kept_bf16 = sorted(set(linears) - set(eligible))
    report.converted = len(eligible)
    if mode.startswith("te"):
        te.convert(model, eligible, report, device, scaling=TE_SCALING[mode])
        return report
    targets = list(eligible.values())
    from torchao.quantization import (Float8DynamicActivationFloat8WeightConfig, Float8WeightOnlyConfig, PerRow,
                                      quantize_)
    _answer_kernel_package_check_once()
    # set_inductor_config=False: torchao would otherwise switch on Inductor's coordinate-descent tuning for the
    # whole process, which multiplies compile time; GhostEdit offers it as its own measured toggle (inductor-cdt).
    config = (Float8WeightOnlyConfig(set_inductor_config=False) if mode == "storage"
              else Float8DynamicActivationFloat8WeightConfig(granularity=PerRow(), set_inductor_config=False))
    for linear in moved_in_turn(targets, device):  # the device holds a few bf16 layers at most, beside FP8 ones
        quantize_(linear, config)
        linear.ghostedit_fp8_config = config  # how to quantize new values written in place (a fused LoRA)
    return report


@functools.cache
def _answer_kernel_package_check_once() -> None:
    """torchao's FP8 linear asks importlib at every call whether its optional `mslk` kernels are installed (a search
    of the import path: milliseconds of CPU per edit in the DiT's layers outside the blocks, profile_edit.py
    --python-profile); the answer cannot change within a process, so it is kept after the first."""
    from torchao.quantization.quantize_.workflows.float8 import float8_tensor
    float8_tensor._is_mslk_available = functools.cache(float8_tensor._is_mslk_available)


def quantized_like(linear: torch.nn.Module, weight: torch.Tensor) -> torch.Tensor:
    """`weight` quantized as the torchao layer's own weight was (same config, same device)."""
    from torchao.quantization import quantize_
    fresh = torch.nn.Linear(weight.shape[1], weight.shape[0], bias=False, device="meta")  # no initialisation
    fresh.weight = torch.nn.Parameter(weight.to(linear.weight.dtype), requires_grad=False)
    quantize_(fresh, linear.ghostedit_fp8_config)
    return fresh.weight


def forward_context(model: torch.nn.Module, mode: str):
    """The context a forward of an FP8 model runs under (TE's FP8 autocast; nothing for the other modes)."""
    if mode.startswith("te"):
        return te.autocast(model)
    return contextlib.nullcontext()
