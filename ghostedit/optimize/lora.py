"""LoRA for the Qwen DiT: read a safetensors file, match it to the DiT's linear layers, then either fuse it into the
weights (no runtime cost) or attach it as PEFT adapter layers (the scale changes per run with no reload).

Key styles understood: PEFT/diffusers (`<layer>.lora_A.weight` / `.lora_B.weight`, optional `.default`, optional
`transformer.` or `diffusion_model.` prefix) and kohya (`lora_unet_<layer_with_underscores>.lora_down.weight` /
`.lora_up.weight` / `.alpha`). The update of a layer is delta W = scale * factor * B @ A, with factor = alpha / rank
when the file gives an alpha and 1 otherwise (DiffSynth's and diffusers' convention for files without alpha).
Nothing here changes a tensor in place that the base model owns: fused weights are new tensors.
"""
from __future__ import annotations

import re
import struct
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file

from ..errors import GhostEditError

ADAPTER_NAME = "ghostedit"
MAX_LORA_BYTES = 4 * 1024**3      # the largest Qwen-Image LoRAs in use are under 2 GB
MAX_HEADER_BYTES = 100 * 1024**2  # the safetensors library's own limit
# How other files that people call LoRAs begin: refused by content with a reason, whatever their name says
_FOREIGN_MAGIC = {b"PK\x03\x04": "a zip archive (PyTorch .pt/.ckpt/.bin files are zipped pickles)",
                  b"\x80\x02": "a Python pickle", b"\x80\x03": "a Python pickle", b"\x80\x04": "a Python pickle",
                  b"\x80\x05": "a Python pickle", b"GGUF": "a GGUF file"}
_KEY = re.compile(r"^(?P<layer>.+?)\.(?P<kind>lora_A|lora_B|lora_down|lora_up)(?:\.default)?\.weight$")
_ALPHA = re.compile(r"^(?P<layer>.+?)\.alpha$")
_KOHYA_PREFIXES = ("lora_unet_", "lora_transformer_")


class LoraError(GhostEditError, ValueError):
    """A LoRA file that cannot be read or applied to this model; the message says why."""


@dataclass
class LoraLayer:
    down: torch.Tensor   # A: [rank, in_features]
    up: torch.Tensor     # B: [out_features, rank]
    factor: float        # alpha / rank, or 1

    def delta(self, scale: float, device: torch.device | str = "cpu") -> torch.Tensor:
        """scale * factor * up @ down, computed on `device` (where the weight it is added to lives)."""
        up, down = self.up.to(device, torch.float32), self.down.to(device, torch.float32)
        return (scale * self.factor) * (up @ down)


@dataclass
class MatchedLora:
    layers: dict[str, LoraLayer]
    unmatched: list[str] = field(default_factory=list)

    @property
    def report(self) -> str:
        text = f"{len(self.layers)} layers matched"
        if self.unmatched:
            text += f", {len(self.unmatched)} LoRA layers matched nothing in this model"
        return text


def check_lora_file(path: str | Path, display_name: str | None = None) -> int:
    """Checks by content, whatever the file is named, that it is a complete safetensors file holding LoRA layers;
    returns how many. Only the header is read. Pickle-based files (.pt, .ckpt, .bin) are refused: unpickling an
    untrusted file runs whatever code it carries. Messages name the file `display_name` (default: its name)."""
    path = Path(path)
    name = display_name or path.name
    if not path.is_file():
        raise LoraError(f"{name} is not a file")
    size = path.stat().st_size
    if size > MAX_LORA_BYTES:
        raise LoraError(f"{name} is {size / 1024**3:.1f} GiB; a LoRA file may be at most "
                        f"{MAX_LORA_BYTES / 1024**3:.0f} GiB")
    with open(path, "rb") as f:
        start = f.read(8)
    for magic, kind in _FOREIGN_MAGIC.items():
        if start.startswith(magic):
            raise LoraError(f"{name} is {kind}, not a safetensors file. GhostEdit only reads .safetensors LoRAs "
                            "(loading a pickle runs the code inside it): convert it to safetensors first")
    header_bytes = struct.unpack("<Q", start)[0] if len(start) == 8 else 0
    if not 2 <= header_bytes <= MAX_HEADER_BYTES:
        raise LoraError(f"{name} is not a safetensors file (it does not begin with a safetensors header)")
    if header_bytes > size - 8:
        raise LoraError(f"{name} is truncated: it ends inside its header (an interrupted upload?)")
    try:
        with safe_open(str(path), framework="pt") as lora:  # validates the header against the file's size
            keys = list(lora.keys())
    except SafetensorError as error:
        raise LoraError(_safetensors_problem(name, error)) from error
    layers = {found["layer"] for key in keys if (found := _KEY.match(key))}
    if not layers:
        raise LoraError(f"{name} is a safetensors file but holds no LoRA layers (no lora_A/lora_B or "
                        f"lora_down/lora_up weights among its {len(keys)} tensors)")
    return len(layers)


def _safetensors_problem(name: str, error: SafetensorError) -> str:
    text = str(error).removeprefix("Error while deserializing header: ")
    if "not fully covered" in text:
        return (f"{name} is damaged: its size does not match what its header describes "
                "(truncated by an interrupted upload?)")
    return f"{name} has an invalid safetensors header ({text})"


def read_lora_file(path: str | Path) -> dict[str, torch.Tensor]:
    """Reads tensors from a safetensors file only, after check_lora_file: its header is parsed, no code in the file
    is ever run."""
    check_lora_file(path)
    try:
        return load_file(str(path), device="cpu")
    except (SafetensorError, OSError, ValueError) as error:
        raise LoraError(f"{Path(path).name} is not a readable safetensors LoRA file ({error})") from error


def match_lora(model: torch.nn.Module, state_dict: dict[str, torch.Tensor]) -> MatchedLora:
    """Pairs each LoRA layer with a linear layer of `model`, checking shapes; zero matches is an error."""
    linears = {name: module for name, module in model.named_modules() if isinstance(module, torch.nn.Linear)}
    by_underscored = {name.replace(".", "_"): name for name in linears}
    pieces: dict[str, dict] = {}
    for key, tensor in state_dict.items():
        if found := _KEY.match(key):
            kind = {"lora_A": "down", "lora_down": "down", "lora_B": "up", "lora_up": "up"}[found["kind"]]
            pieces.setdefault(found["layer"], {})[kind] = tensor
        elif found := _ALPHA.match(key):
            pieces.setdefault(found["layer"], {})["alpha"] = tensor
    matched, unmatched = {}, []
    for lora_name, parts in pieces.items():
        target = _resolve_layer_name(lora_name, linears, by_underscored)
        if target is None or "down" not in parts or "up" not in parts:
            unmatched.append(lora_name)
            continue
        matched[target] = _checked_layer(target, linears[target], parts)
    if not matched:
        raise LoraError(f"the LoRA matched 0 layers of this model ({len(pieces)} LoRA layers, e.g. "
                        f"{next(iter(pieces), 'none')!r}): it was made for another model")
    return MatchedLora(matched, sorted(unmatched))


def _resolve_layer_name(lora_name: str, linears: dict, by_underscored: dict) -> str | None:
    for prefix in _KOHYA_PREFIXES:
        if lora_name.startswith(prefix):
            return by_underscored.get(lora_name[len(prefix):])
    parts = lora_name.split(".")
    for start in range(len(parts)):  # drop wrapper prefixes such as "transformer." or "diffusion_model."
        candidate = ".".join(parts[start:])
        if candidate in linears:
            return candidate
    return None


def _checked_layer(name: str, linear: torch.nn.Linear, parts: dict) -> LoraLayer:
    down, up = parts["down"], parts["up"]
    if down.dim() != 2 or up.dim() != 2 or down.shape[0] != up.shape[1]:
        raise LoraError(f"LoRA layer for {name} has inconsistent shapes: A {tuple(down.shape)}, B {tuple(up.shape)}")
    if down.shape[1] != linear.in_features or up.shape[0] != linear.out_features:
        raise LoraError(f"LoRA layer for {name} has shape {up.shape[0]}x{down.shape[1]} but the model's layer is "
                        f"{linear.out_features}x{linear.in_features}: it was made for another model size")
    rank = down.shape[0]
    if rank == 0:
        raise LoraError(f"LoRA layer for {name} has rank 0")
    if not (torch.isfinite(down).all() and torch.isfinite(up).all()):
        raise LoraError(f"LoRA layer for {name} holds NaN or infinite values")
    return LoraLayer(down, up, _alpha(name, parts["alpha"]) / rank if "alpha" in parts else 1.0)


def _alpha(name: str, alpha: torch.Tensor) -> float:
    if alpha.numel() != 1 or not torch.isfinite(alpha).all():
        raise LoraError(f"LoRA layer for {name} has an alpha that is not a single finite number")
    return float(alpha)


def fuse_lora(model: torch.nn.Module, lora: MatchedLora, scale: float) -> int:
    """Merges the LoRA into the linear weights, as new tensors (the model's old weights stay untouched)."""
    for name, layer in lora.layers.items():
        linear = model.get_submodule(name)
        merged = linear.weight.float() + layer.delta(scale, linear.weight.device)
        linear.weight = torch.nn.Parameter(merged.to(linear.weight.dtype), requires_grad=False)
    return len(lora.layers)


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
        from .fp8 import quantized_like
        from ..tensors import plain_tensors
        for held, new in zip(plain_tensors(target), plain_tensors(quantized_like(linear, weight))):
            held.copy_(new)
    elif type(target) in (torch.Tensor, torch.nn.Parameter):
        target.data.copy_(weight.to(target.dtype))
    else:  # Transformer Engine's FP8 weight quantizes what it is copied (as te.convert does)
        target.copy_(weight)


def has_runtime_lora(model: torch.nn.Module) -> bool:
    return hasattr(model, "ghostedit_runtime_lora")
