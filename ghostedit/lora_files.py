"""A LoRA file, checked by its content and read: only safetensors files holding LoRA layers (lora_formats.py says
which keys are), never a pickle, whatever the file is named; the check reads the header alone. What applies a LoRA
to a model is optimize/lora.py's."""
from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open

from . import lora_formats
from .errors import GhostEditError

MAX_LORA_BYTES = 4 * 1024**3      # the largest Qwen-Image LoRAs in use are under 2 GB
MAX_HEADER_BYTES = 100 * 1024**2  # the safetensors library's own limit
# How other files that people call LoRAs begin: refused by content with a reason, whatever their name says
_FOREIGN_MAGIC = {b"PK\x03\x04": "a zip archive (PyTorch .pt/.ckpt/.bin files are zipped pickles)",
                  b"\x80\x02": "a Python pickle", b"\x80\x03": "a Python pickle", b"\x80\x04": "a Python pickle",
                  b"\x80\x05": "a Python pickle", b"GGUF": "a GGUF file"}


class LoraError(GhostEditError, ValueError):
    """A LoRA file that cannot be read or applied to this model; the message says why."""


@dataclass
class LoraFile:
    tensors: dict[str, torch.Tensor]
    metadata: dict[str, str]          # the safetensors header's metadata, kept (diffusers stores alpha there)


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
    roles = [role for key in keys if not isinstance(role := lora_formats.key_role(key), str)]
    layers = {role.layer for role in roles}
    if not layers:
        raise LoraError(f"{name} is a safetensors file but holds no LoRA layers (no lora_A/lora_B, lora_down/lora_up, "
                        f".diff, LoKr or LoHa weights among its {len(keys)} tensors)")
    return len(layers)


def _safetensors_problem(name: str, error: SafetensorError) -> str:
    text = str(error).removeprefix("Error while deserializing header: ")
    if "not fully covered" in text:
        return (f"{name} is damaged: its size does not match what its header describes "
                "(truncated by an interrupted upload?)")
    return f"{name} has an invalid safetensors header ({text})"


def read_lora_file(path: str | Path) -> LoraFile:
    """Reads tensors and the header's metadata from a safetensors file only, after check_lora_file: its header is
    parsed, no code in the file is ever run."""
    check_lora_file(path)
    try:
        with safe_open(str(path), framework="pt", device="cpu") as lora:
            return LoraFile({key: lora.get_tensor(key) for key in lora.keys()}, dict(lora.metadata() or {}))
    except (SafetensorError, OSError, ValueError) as error:
        raise LoraError(f"{Path(path).name} is not a readable safetensors LoRA file ({error})") from error
