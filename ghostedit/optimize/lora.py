"""LoRA for the Qwen DiT: a file read (lora_files.py: its tensors and its header's metadata), match each layer it
changes to a linear layer of the DiT, then either fuse it into the weights (no runtime cost) or attach it as PEFT
adapter layers (the scale changes per run with no reload).

Formats are recognized by ghostedit/lora_formats.py. A layer's update is one of: low rank, delta W = scale * alpha / rank *
up @ down (alpha / rank = 1 when the file gives no alpha: diffusers' and DiffSynth's convention); a full-weight
delta (`.diff`, and `.diff_b` for the bias); LoKr or LoHa (fused only). Every key that is not applied is reported
with the reason. Nothing here changes a tensor in place that the base model owns: fused weights are new tensors.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch
from .. import lora_formats
from ..lora_files import LoraError, LoraFile
from ..tensors import plain_tensors
from .fp8 import quantized_like

ADAPTER_NAME = "ghostedit"
@dataclass
class LoraLayer:
    """One layer's update. `kind`: low-rank (down, up), full (diff), lokr or loha (factors in `parts`), or bias (a
    bias delta alone); any kind may carry a bias delta. `factor` is alpha / rank for low rank."""
    kind: str = "low-rank"
    down: torch.Tensor | None = None   # A: [rank, in_features]
    up: torch.Tensor | None = None     # B: [out_features, rank]
    factor: float = 1.0
    diff: torch.Tensor | None = None
    bias: torch.Tensor | None = None   # .diff_b
    parts: dict = field(default_factory=dict)
    alpha: float | None = None

    def add_to(self, weight: torch.Tensor, scale: float, device) -> None:
        """weight += scale * delta W, in float32 on `device` (copies from pinned memory do not wait)."""
        if self.kind == "low-rank":
            up, down = (f.to(device, non_blocking=True).float() for f in (self.up, self.down))
            weight.addmm_(up, down, alpha=scale * self.factor)
        elif self.kind != "bias":
            weight.add_(self._dense(device), alpha=scale)

    def delta(self, scale: float, device: torch.device | str = "cpu") -> torch.Tensor:
        """scale * delta W as a new float32 tensor on `device`."""
        if self.kind == "low-rank":
            return (scale * self.factor) * (self.up.to(device).float() @ self.down.to(device).float())
        return scale * self._dense(device)

    def _dense(self, device) -> torch.Tensor:
        if self.kind == "full":
            return self.diff.to(device, non_blocking=True).float()
        if self.kind == "lokr":
            return lora_formats.kronecker_delta(self.parts, self.alpha, device)
        return lora_formats.hadamard_delta(self.parts, self.alpha, device)

    def pinned(self) -> "LoraLayer":
        """The same layer with its tensors in pinned host memory (copies to the GPU then do not wait)."""
        return LoraLayer(self.kind, _pinned(self.down), _pinned(self.up), self.factor, _pinned(self.diff),
                         _pinned(self.bias), {name: _pinned(t) for name, t in self.parts.items()}, self.alpha)


def _pinned(tensor: torch.Tensor | None) -> torch.Tensor | None:
    return tensor.pin_memory() if tensor is not None else None


@dataclass
class MatchedLora:
    layers: dict[str, LoraLayer]
    not_applied: dict[str, str] = field(default_factory=dict)   # key -> reason
    formats: tuple[str, ...] = ()
    metadata: dict[str, str] = field(default_factory=dict)

    @property
    def report(self) -> str:
        text = f"{', '.join(self.formats)}: {len(self.layers)} layers matched"
        if self.not_applied:
            text += f", {len(self.not_applied)} keys not applied ({'; '.join(self._reasons())})"
        return text

    def _reasons(self) -> list[str]:
        counts: dict[str, int] = {}
        for reason in self.not_applied.values():
            counts[reason] = counts.get(reason, 0) + 1
        return [f"{count} x {reason}" for reason, count in counts.items()]

    def describe(self) -> dict:
        """For telemetry and the API: the formats, the layers matched and every key not applied with why."""
        return {"formats": list(self.formats), "layers_matched": len(self.layers),
                "kinds": sorted({layer.kind for layer in self.layers.values()}),
                "keys_not_applied": len(self.not_applied), "not_applied": dict(sorted(self.not_applied.items())),
                "not_applied_reasons": self._reasons()}


def match_lora(model: torch.nn.Module, lora: LoraFile | dict[str, torch.Tensor]) -> MatchedLora:
    """Pairs each layer the file changes with a linear layer of `model`, checking shapes; every key not applied
    is kept with the reason. Zero matches is an error."""
    if not isinstance(lora, LoraFile):
        lora = LoraFile(lora, {})
    parsed = lora_formats.parse_lora(lora.tensors, lora.metadata)
    linears = {name: module for name, module in model.named_modules() if isinstance(module, torch.nn.Linear)}
    by_underscored = {name.replace(".", "_"): name for name in linears}
    modules = dict(model.named_modules())
    matched, not_applied = {}, dict(parsed.not_applied)
    for lora_name, parts in parsed.layers.items():
        target = _resolve_layer_name(lora_name, linears, by_underscored, lora_name in parsed.underscored)
        keys = parsed.keys[lora_name]
        if target is None:
            reason = "matched no linear layer of this model"
            other = _resolve_layer_name(lora_name, modules, {}, False)
            if other is not None:
                reason = f"{other} is a {type(modules[other]).__name__}, not a linear layer: not applied"
            not_applied.update({key: reason for key in keys})
            continue
        if target in matched:
            not_applied.update({key: f"{target} is changed by other keys of this file already: not applied twice"
                                for key in keys})
            continue
        try:
            matched[target] = _checked_layer(target, linears[target], parts, parsed.alphas.get(lora_name))
        except _Incomplete as missing:
            not_applied.update({key: str(missing) for key in keys})
    if not matched:
        raise LoraError(f"the LoRA matched 0 layers of this model ({len(parsed.layers)} LoRA layers, e.g. "
                        f"{next(iter(parsed.layers), 'none')!r}): it was made for another model")
    return MatchedLora(matched, not_applied, tuple(sorted(parsed.formats)), lora.metadata)


class _Incomplete(Exception):
    """A layer whose file gives only part of an update (B without A...): reported, not applied."""


def _resolve_layer_name(lora_name: str, modules: dict, by_underscored: dict, underscored: bool) -> str | None:
    if underscored:
        return by_underscored.get(lora_name)
    parts = lora_name.split(".")
    for start in range(len(parts)):  # drop wrapper prefixes such as "model." or "base_model.model."
        candidate = ".".join(parts[start:])
        if candidate in modules:
            return candidate
    return None


def _checked_layer(name: str, linear: torch.nn.Linear, parts: dict, metadata_alpha: float | None) -> LoraLayer:
    for part, tensor in parts.items():
        if part != "alpha" and not torch.isfinite(tensor).all():  # an alpha is checked by _alpha
            raise LoraError(f"LoRA layer for {name} holds NaN or infinite values")
    alpha = _alpha(name, parts["alpha"]) if "alpha" in parts else metadata_alpha
    bias = _checked_bias(name, linear, parts.get("diff_b"))
    if "down" in parts or "up" in parts:
        layer = _low_rank(name, linear, parts, alpha)
    elif "diff" in parts:
        layer = LoraLayer("full", diff=_checked_full(name, linear, parts["diff"]))
    elif any(part.startswith("lokr_") for part in parts):
        layer = LoraLayer("lokr", parts={k: v for k, v in parts.items() if k.startswith("lokr_")}, alpha=alpha)
    elif any(part.startswith("hada_") for part in parts):
        layer = LoraLayer("loha", parts={k: v for k, v in parts.items() if k.startswith("hada_")}, alpha=alpha)
    elif bias is not None:
        layer = LoraLayer("bias")
    else:
        raise _Incomplete(f"{name}: an alpha with no weights: not applied")
    if layer.kind in ("lokr", "loha"):
        _checked_product(name, linear, layer)
    layer.bias = bias
    return layer


def _low_rank(name: str, linear: torch.nn.Linear, parts: dict, alpha: float | None) -> LoraLayer:
    if "down" not in parts or "up" not in parts:
        raise _Incomplete(f"{name}: {'up (B)' if 'up' in parts else 'down (A)'} without its pair: not applied")
    down, up = parts["down"], parts["up"]
    if down.dim() == 4 and down.shape[2:] == (1, 1) and up.dim() == 4:  # 1x1-convolution layout of some trainers
        down, up = down.flatten(1), up.flatten(1)
    if down.dim() != 2 or up.dim() != 2 or down.shape[0] != up.shape[1]:
        raise LoraError(f"LoRA layer for {name} has inconsistent shapes: A {tuple(down.shape)}, B {tuple(up.shape)}")
    if down.shape[1] != linear.in_features or up.shape[0] != linear.out_features:
        raise LoraError(f"LoRA layer for {name} has shape {up.shape[0]}x{down.shape[1]} but the model's layer is "
                        f"{linear.out_features}x{linear.in_features}: it was made for another model size")
    rank = down.shape[0]
    if rank == 0:
        raise LoraError(f"LoRA layer for {name} has rank 0")
    return LoraLayer("low-rank", down, up, alpha / rank if alpha is not None else 1.0)


def _checked_full(name: str, linear: torch.nn.Linear, diff: torch.Tensor) -> torch.Tensor:
    if tuple(diff.shape) != tuple(linear.weight.shape):
        raise LoraError(f"the .diff of {name} has shape {tuple(diff.shape)} but the model's weight is "
                        f"{tuple(linear.weight.shape)}: it was made for another model size")
    return diff


def _checked_bias(name: str, linear: torch.nn.Linear, bias: torch.Tensor | None) -> torch.Tensor | None:
    if bias is None:
        return None
    if linear.bias is None or tuple(bias.shape) != tuple(linear.bias.shape):
        raise LoraError(f"the .diff_b of {name} has shape {tuple(bias.shape)} but the model's layer has "
                        f"{'no bias' if linear.bias is None else f'a bias of {tuple(linear.bias.shape)}'}")
    return bias


def _checked_product(name: str, linear: torch.nn.Linear, layer: LoraLayer) -> None:
    try:
        shape = tuple(layer.delta(1.0).shape)
    except (KeyError, RuntimeError, ValueError) as error:
        raise LoraError(f"the {layer.kind} layer for {name} cannot be applied: "
                        f"{error if not isinstance(error, KeyError) else f'factor {error} is missing'}") from error
    if shape != tuple(linear.weight.shape):
        raise LoraError(f"the {layer.kind} layer for {name} makes a {shape} update but the model's weight is "
                        f"{tuple(linear.weight.shape)}: it was made for another model size")


def _alpha(name: str, alpha: torch.Tensor) -> float:
    if alpha.numel() != 1 or not torch.isfinite(alpha).all():
        raise LoraError(f"LoRA layer for {name} has an alpha that is not a single finite number")
    return float(alpha)


def check_runtime(lora: MatchedLora, name: str) -> None:
    """Runtime mode attaches low-rank PEFT layers: a file with any other kind of update is refused with why."""
    other = sorted({layer.kind for layer in lora.layers.values() if layer.kind != "low-rank"} |
                   ({"bias"} if any(layer.bias is not None for layer in lora.layers.values()) else set()))
    if other:
        kinds = ", ".join("bias deltas (.diff_b)" if kind == "bias" else kind for kind in other)
        raise LoraError(f"{name} cannot run in runtime mode: it holds {kinds} updates, and runtime mode attaches "
                        "low-rank (A/B) layers only. Use the fused mode for this LoRA")


def attach_runtime_loras(model: torch.nn.Module, loras: list[tuple[str, MatchedLora]]) -> int:
    """Wraps the matched layers in PEFT LoRA layers, one adapter per (name, LoRA), all active at scale 0 until
    set_runtime_scales. Layers of lower rank are zero-padded to the adapter's highest rank, which leaves B @ A
    unchanged and lets one LoraConfig describe every layer of an adapter."""
    from peft import LoraConfig, inject_adapter_in_model

    units = {}
    for name, lora in loras:
        adapter = _adapter_name(name)
        rank = max(layer.down.shape[0] for layer in lora.layers.values())
        config = LoraConfig(r=rank, lora_alpha=rank, target_modules=list(lora.layers), lora_dropout=0.0)
        inject_adapter_in_model(config, model, adapter_name=adapter)
        for layer_name, layer in lora.layers.items():
            peft_layer = model.get_submodule(layer_name)
            down, up = _pad_rank(layer, rank)
            a, b = peft_layer.lora_A[adapter].weight, peft_layer.lora_B[adapter].weight
            with torch.no_grad():
                a.copy_(down)
                b.zero_()
            units[(adapter, layer_name)] = (up * layer.factor).to(device=b.device, dtype=b.dtype)
    for module in model.modules():  # PEFT activates only the last injected adapter; every one is meant to run
        if hasattr(module, "set_adapter") and hasattr(module, "lora_A"):
            module.set_adapter([_adapter_name(name) for name, _ in loras])
    model.ghostedit_runtime_lora = units
    return len(units)


def _adapter_name(name: str) -> str:
    return f"{ADAPTER_NAME}_{name[:16]}"


def _pad_rank(layer: LoraLayer, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    missing = rank - layer.down.shape[0]
    down = torch.nn.functional.pad(layer.down, (0, 0, 0, missing))
    up = torch.nn.functional.pad(layer.up, (0, missing))
    return down, up


def set_runtime_scales(model: torch.nn.Module, scales: dict[str, float]) -> None:
    """Sets each runtime LoRA's strength ({name given to attach_runtime_loras: scale}) by rewriting its small B
    matrices: no reload, and no recompile of a compiled model (a weight's values change, not the traced program)."""
    by_adapter = {_adapter_name(name): scale for name, scale in scales.items()}
    with torch.no_grad():
        for adapter, scale in by_adapter.items():
            units = [(unit, model.get_submodule(layer).lora_B[adapter].weight)
                     for (unit_adapter, layer), unit in model.ghostedit_runtime_lora.items() if unit_adapter == adapter]
            torch._foreach_copy_([b for _, b in units], torch._foreach_mul([unit for unit, _ in units], scale))


def write_weight_in_place(linear: torch.nn.Module, weight: torch.Tensor) -> None:
    """Writes new values into the weight tensor a layer already holds (compiled code keeps reading that tensor)."""
    target = linear.weight
    if hasattr(linear, "ghostedit_fp8_config"):  # torchao FP8: quantized as the layer was, into its own tensors
        for held, new in zip(plain_tensors(target), plain_tensors(quantized_like(linear, weight))):
            held.copy_(new)
    elif type(target) in (torch.Tensor, torch.nn.Parameter):
        target.data.copy_(weight.to(target.dtype))
    else:  # Transformer Engine's FP8 weight quantizes what it is copied (as te.convert does)
        target.copy_(weight)


def has_runtime_lora(model: torch.nn.Module) -> bool:
    return hasattr(model, "ghostedit_runtime_lora")
