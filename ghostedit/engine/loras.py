"""Fused LoRAs on a prepared pipeline, written into its weights in place. Switching LoRAs recomputes only the layers
that the old and the new LoRAs touch (base weight + the sum of each LoRA's scaled delta, on the device, layer by
layer from the base's weights wherever they live; biases likewise where a file has `.diff_b`), re-quantizes FP8
layers, and writes the result into the tensors the prepared (and compiled) DiT already holds: nothing is prepared
again and nothing recompiles.

A layer whose weight is still the base's own tensor (a bf16 DiT built on the base's weights) gets a tensor of its own
when a LoRA first touches it and the base's tensor back when no LoRA does any more, so the base never changes.
Where fused-qkv joined q, k and v into one projection, a LoRA's q, k or v layer is written into its rows: the three
parts merged one by one and written together (torchao's rowwise FP8 scales are per output row, so the joined weight
quantizes row for row as its parts would).
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import torch

from ..lora_files import read_lora_file
from ..optimize import lora as lora_layers
from ..telemetry import RunRecorder

CACHED_FILES = 8


@dataclass(frozen=True)
class FusedLoras:
    applied: tuple[tuple[str, float], ...] = ()   # (sha256, scale), in stack order
    layers: frozenset = frozenset()              # the layers that carry a delta now
    biases: frozenset = frozenset()              # the layers whose bias carries a delta now (.diff_b)


class LoraFiles:
    """LoRA files read and matched against the base DiT, kept by content hash (the most recent few)."""

    def __init__(self):
        self._matched: OrderedDict[str, lora_layers.MatchedLora] = OrderedDict()

    def __contains__(self, lora) -> bool:
        """Whether the LoRA's file was read and matched already (matched() then costs nothing)."""
        return lora.sha256 in self._matched

    def matched(self, lora, base_dit, device: str = "cpu") -> lora_layers.MatchedLora:
        """The LoRA's layers; for a GPU in pinned memory, so that fusing copies them without waiting."""
        if lora.sha256 not in self._matched:
            found = lora_layers.match_lora(base_dit, read_lora_file(lora.path))
            if device.startswith("cuda"):
                found.layers = {name: layer.pinned() for name, layer in found.layers.items()}
            self._matched[lora.sha256] = found
            while len(self._matched) > CACHED_FILES:
                self._matched.popitem(last=False)
        self._matched.move_to_end(lora.sha256)
        return self._matched[lora.sha256]


def switch_fused_loras(prepared, loras, base_dit, files: LoraFiles, recorder: RunRecorder, device: str) -> bool:
    """Makes `loras` (LoraChoices in stack order, fused mode) the ones written into the prepared DiT; False where
    they already were."""
    wanted = tuple((lora.sha256, lora.scale) for lora in loras)
    current = prepared.loras or FusedLoras()
    if current.applied == wanted:
        return False
    matched = [(lora, files.matched(lora, base_dit, device)) for lora in loras]
    layers = frozenset(name for _, found in matched for name, layer in found.layers.items() if layer.kind != "bias")
    biases = frozenset(name for _, found in matched for name, layer in found.layers.items() if layer.bias is not None)
    touched = sorted(current.layers | layers)
    with recorder.stage("LoRA switch", f"fusing {len(loras)} LoRA(s): {len(touched)} layers rewritten"):
        with torch.no_grad():
            for target, parts in _write_targets(prepared.dit, touched):
                _write_layer(prepared.dit, target, [base_dit.get_submodule(part).weight for part in parts],
                             [[(found.layers[part], lora.scale) for lora, found in matched if part in found.layers]
                              for part in parts], device)
            for target, parts in _write_targets(prepared.dit, sorted(current.biases | biases)):
                _write_bias(_linear(prepared.dit, target), [base_dit.get_submodule(part).bias for part in parts],
                            [[(found.layers[part].bias, lora.scale) for lora, found in matched
                              if part in found.layers and found.layers[part].bias is not None] for part in parts],
                            device)
    prepared.loras = FusedLoras(wanted, layers, biases)
    for key in [key for key in prepared.report if key.startswith("LoRA ") and key.endswith("(fused)")]:
        del prepared.report[key]
    for lora, found in matched:
        prepared.report[f"LoRA {lora.name} (fused)"] = f"{found.report}, fused at scale {lora.scale:g}"
    return True


def _write_targets(dit, names: list[str]) -> list[tuple[str, tuple[str, ...]]]:
    """The layers of the prepared DiT that hold the weights of the base's layers `names`, each with the base layers
    it holds in the order of its rows: a layer itself, or fused-qkv's projection with its three parts."""
    targets = {}
    for name in names:
        parent, _, leaf = name.rpartition(".")
        fused = next((fused for fused, parts in dit.fused_projections.items()
                      if leaf in parts and not hasattr(dit.get_submodule(parent), leaf)), None)
        if fused is None:
            targets[name] = (name,)
        else:
            targets[f"{parent}.{fused}"] = tuple(f"{parent}.{part}" for part in dit.fused_projections[fused])
    return sorted(targets.items())


def _merged(base_weight: torch.Tensor, deltas, device: str) -> torch.Tensor:
    """The base weight plus the scaled deltas, in float32 on the device (a copy: never the base itself)."""
    # copies without waiting (pinned sources): the host queues layer after layer while the GPU works
    weight = base_weight.to(device, non_blocking=True, copy=True).float()
    for layer, scale in deltas:
        layer.add_to(weight, scale, device)
    return weight


def _merged_bias(base_bias: torch.Tensor, deltas, device: str) -> torch.Tensor:
    bias = base_bias.to(device, non_blocking=True, copy=True).float()
    for delta, scale in deltas:
        bias.add_(delta.to(device, non_blocking=True).float(), alpha=scale)
    return bias


def _write_layer(dit, name: str, base_weights: list[torch.Tensor], deltas: list, device: str) -> None:
    """The layer's weight: its base parts (one, or fused-qkv's three, in the order of its rows) each plus its scaled
    deltas."""
    linear = _linear(dit, name)
    base = base_weights[0]
    plain = type(linear.weight) is torch.nn.Parameter and linear.weight.dtype == base.dtype
    if len(base_weights) == 1 and not deltas[0] and plain and base.device == torch.device(device):
        linear.weight = torch.nn.Parameter(base, requires_grad=False)  # the base's own tensor again
        return
    weight = _rows([_merged(part, part_deltas, device) for part, part_deltas in zip(base_weights, deltas)])
    if _shares_storage(linear.weight, base):  # the base's tensor, or a view of its parts (seams.fused_linear)
        linear.weight = torch.nn.Parameter(weight.to(base.dtype), requires_grad=False)
    else:
        lora_layers.write_weight_in_place(linear, weight)


def _write_bias(linear, base_biases: list[torch.Tensor], deltas: list, device: str) -> None:
    """The bias as the weight: the base's own tensor when no LoRA changes it, else base + the scaled deltas."""
    base = base_biases[0]
    if len(base_biases) == 1 and not deltas[0] and type(linear.bias) is torch.nn.Parameter and \
            base.device == torch.device(device):
        linear.bias = torch.nn.Parameter(base, requires_grad=False)
        return
    bias = _rows([_merged_bias(part, part_deltas, device) for part, part_deltas in zip(base_biases, deltas)])
    if _shares_storage(linear.bias, base):
        linear.bias = torch.nn.Parameter(bias.to(base.dtype), requires_grad=False)
    else:
        linear.bias.data.copy_(bias.to(linear.bias.dtype))


def _rows(parts: list[torch.Tensor]) -> torch.Tensor:
    """A layer's parts one under another: a layer's own tensor, or fused-qkv's three joined."""
    return parts[0] if len(parts) == 1 else torch.cat(parts)


def _linear(dit, name: str) -> torch.nn.Module:
    """The layer that holds `name`'s weight in the prepared DiT: a runtime LoRA's PEFT wrapper holds it in its
    base layer."""
    module = dit.get_submodule(name)
    return getattr(module, "base_layer", module)


def _shares_storage(weight: torch.Tensor, base: torch.Tensor) -> bool:
    return type(weight) is torch.nn.Parameter and weight.device == base.device and \
        weight.untyped_storage().data_ptr() == base.untyped_storage().data_ptr()
