"""Byte accounting and placement that see through tensor subclasses (torchao's FP8 tensors hold data and scales
inside)."""
from __future__ import annotations

import itertools

import torch

# the attribute of a module under which what is derived from it is kept (kept_with, kept_while_placed): it lives and
# dies with the module; a copy of the module (engine/prepare.py) starts without it
KEPT = "_ghostedit_kept"


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


def placement_mark(module: torch.nn.Module) -> tuple | None:
    """Where `module`'s first tensor lies (device and address), None for a module without tensors. The engine moves
    a component whole (engine/store.py), never part of it, so a move changes the mark."""
    first = next(itertools.chain(module.parameters(), module.buffers()), None)
    if first is None:
        return None
    plain = next(plain_tensors(first))
    return plain.device, plain.data_ptr()


def kept_with(module: torch.nn.Module, what: str, make):
    """`make()`, made once and kept with `module` under `what`."""
    kept = module.__dict__.setdefault(KEPT, {})
    if what not in kept:
        kept[what] = make()
    return kept[what]


def first_time(module: torch.nn.Module, what: str) -> bool:
    """True the first time this is asked of `module` for `what`, False after."""
    kept = module.__dict__.setdefault(KEPT, {})
    first = what not in kept
    kept[what] = True
    return first


def kept_while_placed(module: torch.nn.Module, what: str, compute):
    """`compute(module)`, kept with the module under `what` while its placement mark stays (a moved or reloaded
    module is read afresh): for what each edit would otherwise derive again from thousands of tensors."""
    mark = placement_mark(module)
    kept = module.__dict__.setdefault(KEPT, {})
    if what not in kept or kept[what][0] != mark:
        kept[what] = (mark, compute(module))
    return kept[what][1]


def devices(module: torch.nn.Module) -> frozenset[torch.device]:
    """The devices that hold `module`'s parameters and buffers (walking them at every edit cost it milliseconds:
    FP8 weights answer through torchao's Python code)."""
    return kept_while_placed(module, "devices",
                             lambda held: frozenset(tensor.device for tensor in module_tensors(held)))


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
