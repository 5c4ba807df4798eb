"""Byte accounting that sees through tensor subclasses (torchao's FP8 tensors hold data and scales inside)."""
from __future__ import annotations

import torch


def plain_tensors(tensor: torch.Tensor):
    """The plain tensors that hold a (possibly subclassed) tensor's data."""
    if hasattr(tensor, "__tensor_flatten__"):
        names, _ = tensor.__tensor_flatten__()
        for name in names:
            yield from plain_tensors(getattr(tensor, name))
    else:
        yield tensor


def module_tensors(module: torch.nn.Module):
    for tensor in [*module.parameters(), *module.buffers()]:
        yield from plain_tensors(tensor)


def storage_bytes(module: torch.nn.Module, exclude: set[int] = frozenset()) -> int:
    """Bytes of the distinct storages a module holds, leaving out storages listed in `exclude` (data pointers)."""
    seen, total = set(exclude), 0
    for tensor in module_tensors(module):
        pointer = tensor.untyped_storage().data_ptr()
        if pointer not in seen:
            seen.add(pointer)
            total += tensor.untyped_storage().nbytes()
    return total


def storage_pointers(module: torch.nn.Module) -> set[int]:
    return {tensor.untyped_storage().data_ptr() for tensor in module_tensors(module)}


def linear_weight_bytes(module: torch.nn.Module) -> int:
    """Bytes of the weights of every linear layer (FP8 storage halves this; scales included)."""
    return sum(t.numel() * t.element_size()
               for m in module.modules() if isinstance(m, torch.nn.Linear)
               for t in plain_tensors(m.weight))
