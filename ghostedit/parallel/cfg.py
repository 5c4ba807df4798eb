"""CFG parallel: the conditional and unconditional DiT passes of a true-CFG step on the two halves of the "cfg"
mesh dimension at once. Each half runs its pass, the two predictions are exchanged with an all-gather, and every
rank combines them with DiffSynth's formula, so the next latent is the same on every rank."""
from __future__ import annotations

import contextlib

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


def split_guidance(mesh: ParallelMesh):
    """A drop-in for DiffSynth's `cfg_guided_model_fn` that runs one side per CFG rank."""
    def cfg_guided_model_fn(model_fn, cfg_scale, inputs_shared, inputs_posi, inputs_nega, **inputs_others):
        if cfg_scale == 1.0:
            raise RuntimeError("CFG parallel ran a step without true CFG (cfg 1): the mesh should have no CFG split")
        if any(inputs_shared.get(name) is not None for name in ONE_SIDED_LORAS):
            raise RuntimeError("CFG parallel does not support DiffSynth's one-sided LoRAs")
        side = inputs_posi if mesh.cfg_rank == 0 else inputs_nega
        prediction = model_fn(**side, **inputs_shared, **inputs_others)
        conditional, unconditional = exchange(prediction, mesh)
        return unconditional + cfg_scale * (conditional - unconditional)  # DiffSynth's own combination
    return cfg_guided_model_fn


@contextlib.contextmanager
def guiding_in_parallel(pipe, mesh: ParallelMesh):
    """Inside this block the pipeline's CFG steps run split over the CFG dimension."""
    pipe.cfg_guided_model_fn = split_guidance(mesh)
    try:
        yield
    finally:
        del pipe.cfg_guided_model_fn  # the class's own method again
