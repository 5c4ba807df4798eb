"""The preparation recipe: from the base DiT to the DiT a configuration runs, as a short sequence of named steps
read from the toggle registry: runtime LoRA layers and the lossless rewrites first, then the lossy FP8 step, then
the move to the device, then compile (which compiles what the steps before produced).

Works on a copy that shares the base's tensors and only ever replaces them, so the base is never modified and a
failure anywhere leaves it (and whatever else holds it) as it was. Fused LoRAs are not a step: they are written
into a prepared DiT's weights in place (see loras.py), so that switching them needs no new preparation.
"""
from __future__ import annotations

import copy
from collections import OrderedDict
from dataclasses import dataclass, field

import torch

from .. import tensors
from ..lora_files import read_lora_file
from ..optimize import cuda_graphs, lora as lora_layers, registry
from ..telemetry import RunRecorder

# Where the DiT moves to the device: after the steps that change weights (FP8 moves each layer as it quantizes it),
# before compile
TO_DEVICE_ORDER = 80


@dataclass
class PreparedPipeline:
    key: tuple                        # OptimizationConfig.cache_key
    config: object                    # the configuration it was prepared for (its fused LoRAs may since differ)
    pipe: object                      # a DiffSynth pipeline sharing the base's encoders and VAE
    owned_bytes: int                  # memory this configuration adds to the base weights
    report: dict[str, str]            # what each toggle did, in words
    prepare_seconds: dict[str, float]
    warnings: list[str] = field(default_factory=list)
    warmed_shapes: set = field(default_factory=set)
    loras: object = None              # the fused LoRAs written into its weights now (loras.FusedLoras)
    graphs: cuda_graphs.ShapeGraphs = field(default_factory=cuda_graphs.dit_graphs)  # its DiT's CUDA graphs

    @property
    def dit(self):
        return self.pipe.dit

    @property
    def label(self) -> str:
        return self.config.prepared_label


def clone_sharing_weights(module: torch.nn.Module) -> torch.nn.Module:
    """A copy of the module tree whose parameters are new Parameter objects over the same storage: replacing a
    weight in the copy (quantizing, fusing) leaves the original untouched, and unchanged weights cost nothing.
    Buffers are shared; everything else is copied as copy.deepcopy copies it."""
    memo = {id(p): torch.nn.Parameter(p.data, requires_grad=False) for p in module.parameters()}
    memo.update({id(b): b for b in module.buffers()})
    return _clone_module(module, memo)


def _clone_module(module: torch.nn.Module, memo: dict) -> torch.nn.Module:
    """copy.deepcopy(module, memo), module by module: deepcopy's generic walk spends most of a copy of the DiT on
    each module's dozen hook dictionaries and its set of non-persistent buffers, empty in a DiT (its 2,236 modules
    hold some 29,000 of them). A module whose class copies itself its own way goes through deepcopy."""
    if id(module) in memo:
        return memo[id(module)]
    if not _plain_module(type(module)):
        return copy.deepcopy(module, memo)
    clone = memo[id(module)] = object.__new__(type(module))
    state = module.__getstate__()  # nn.Module's: its __dict__ less the compiled call, as deepcopy takes it
    for name, value in state.items():
        if name == tensors.KEPT:  # derived from the original: the copy derives its own
            continue
        if name == "_modules":
            value = type(value)((key, None if child is None else _clone_module(child, memo))
                                for key, child in value.items())
        elif name in ("_parameters", "_buffers"):
            value = type(value)((key, None if tensor is None else memo[id(tensor)]) for key, tensor in value.items())
        elif type(value) in (dict, OrderedDict, set) and not value:
            value = type(value)()
        elif type(value) not in _ATOMS:
            value = copy.deepcopy(value, memo)
        clone.__dict__[name] = value
    return clone


_ATOMS = (type(None), bool, int, float, str, torch.dtype, torch.device)


def _plain_module(cls: type) -> bool:
    """Whether deepcopy copies `cls`'s instances as it copies an nn.Module: through its __dict__, its state."""
    return (getattr(cls, "__deepcopy__", None) is None and cls.__reduce_ex__ is object.__reduce_ex__
            and cls.__reduce__ is object.__reduce__ and cls.__getstate__ is torch.nn.Module.__getstate__
            and cls.__setstate__ is torch.nn.Module.__setstate__ and "__slots__" not in vars(cls))


def prepare_dit(base_dit: torch.nn.Module, config, recorder: RunRecorder, device: str):
    """The prepared DiT on `device` and a report of what each step did, in words. A base kept in host memory is
    brought over as the steps go: FP8 layers one at a time, so the device never holds the bf16 DiT."""
    report: dict[str, str] = {}

    def stage(name, words):
        return recorder.stage(name, words, into_prepare=True)

    with stage("copy", "copying the DiT (weights shared)"):
        dit = clone_sharing_weights(base_dit)
    context = registry.PrepareContext(dit, config, device, stage, report)
    for toggle in registry.toggles():
        if toggle.begin is not None and toggle.changes == registry.PREPARED:
            toggle.begin(context, config.value(toggle.name))
    if config.runtime_loras:
        _attach_runtime_loras(context)
    moved = False
    for toggle in registry.toggles():
        if toggle.order >= TO_DEVICE_ORDER and not moved:
            _to_device(context)
            moved = True
        if toggle.prepare is not None and toggle.changes == registry.PREPARED:
            toggle.prepare(context, config.value(toggle.name))
    if not moved:
        _to_device(context)
    return dit, report


def _attach_runtime_loras(context: registry.PrepareContext) -> None:
    """Lossless: PEFT layers beside the linears, one adapter per LoRA, at scale 0 until a run sets its scales."""
    loras = context.config.runtime_loras
    with context.stage("attach LoRA", "attaching runtime LoRA layers"):
        matched = [(lora.sha256, lora_layers.match_lora(context.dit, read_lora_file(lora.path)))
                   for lora in loras]
        lora_layers.attach_runtime_loras(context.dit, matched)
    for lora, (_, found) in zip(loras, matched):
        context.report[f"LoRA {lora.name}"] = f"{found.report}, runtime"


def _to_device(context: registry.PrepareContext) -> None:
    with context.stage("to device", f"moving the DiT to {context.device}"):
        context.dit.to(context.device)
