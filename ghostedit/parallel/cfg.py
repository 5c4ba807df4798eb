"""CFG parallel: the conditional and unconditional DiT passes of a true-CFG step on the two halves of the "cfg"
mesh dimension at once. Each half runs its pass, the two predictions are exchanged with an all-gather, and every
rank combines them with the pipeline's own `guidance` (models/guidance.py: as the family's reference combines, the
function one process runs), so the next latent is the same on every rank. Each half encodes only its own side's
prompt."""
from __future__ import annotations

import contextlib
import copy

import torch
from torch.distributed import _functional_collectives as collectives

from .mesh import ParallelMesh

# DiffSynth inputs that swap LoRAs around one side's pass (not something GhostEdit sends)
ONE_SIDED_LORAS = ("positive_only_lora", "negative_only_lora")


def exchange(prediction: torch.Tensor, mesh: ParallelMesh) -> tuple[torch.Tensor, torch.Tensor]:
    """(conditional, unconditional) predictions, from this rank's own and its CFG partner's."""
    both = collectives.all_gather_tensor(prediction.contiguous(), 0, mesh.group("cfg"))
    conditional, unconditional = torch.chunk(collectives.wait_tensor(both), 2, dim=0)
    return conditional, unconditional


def split_guidance(mesh: ParallelMesh, guidance):
    """A drop-in for DiffSynth's `cfg_guided_model_fn` that runs one side per CFG rank and combines the two
    predictions with `guidance` (the pipeline's)."""
    def cfg_guided_model_fn(model_fn, cfg_scale, inputs_shared, inputs_posi, inputs_nega, **inputs_others):
        if cfg_scale == 1.0:
            raise RuntimeError("CFG parallel ran a step without true CFG (cfg 1): the mesh should have no CFG split")
        if any(inputs_shared.get(name) is not None for name in ONE_SIDED_LORAS):
            raise RuntimeError("CFG parallel does not support DiffSynth's one-sided LoRAs")
        side = inputs_posi if mesh.cfg_rank == 0 else inputs_nega
        prediction = model_fn(**side, **inputs_shared, **inputs_others)
        conditional, unconditional = exchange(prediction, mesh)
        return guidance(conditional, unconditional, cfg_scale)  # the reference's combination, as on one GPU
    return cfg_guided_model_fn


def own_side_units(unit_runner, mesh: ParallelMesh):
    """A wrapper of DiffSynth's unit runner: units that encode each CFG side apart (the prompt embedder) encode
    this rank's side only, as the runner would with CFG 1; the other side's inputs stay unused here."""
    def run_unit(unit, pipe, inputs_shared, inputs_posi, inputs_nega):
        if unit.take_over or not unit.seperate_cfg:  # DiffSynth's spelling
            return unit_runner(unit, pipe, inputs_shared, inputs_posi, inputs_nega)
        one_side = {**inputs_shared, "cfg_scale": 1.0}
        if mesh.cfg_rank == 0:
            unit_runner(unit, pipe, one_side, inputs_posi, {})
        else:
            negative = copy.copy(unit)
            negative.input_params_posi = unit.input_params_nega  # the runner's one side, read from the negative
            unit_runner(negative, pipe, one_side, inputs_nega, {})
        return inputs_shared, inputs_posi, inputs_nega
    return run_unit


@contextlib.contextmanager
def guiding_in_parallel(pipe, mesh: ParallelMesh):
    """Inside this block each rank encodes its CFG side's prompt only and the pipeline's CFG steps run split over
    the CFG dimension."""
    unit_runner = pipe.unit_runner
    pipe.cfg_guided_model_fn = split_guidance(mesh, pipe.guidance)
    pipe.unit_runner = own_side_units(unit_runner, mesh)
    try:
        yield
    finally:
        del pipe.cfg_guided_model_fn  # the class's own method again
        pipe.unit_runner = unit_runner
