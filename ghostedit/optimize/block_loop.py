"""The DiT's block loop as the engine's run-time rewrites take it over: DiffSynth's model_fn loops over
`dit.transformer_blocks`, and a rewrite of the loop (carried-residual's hand-on) puts a block
list of one entry there for the length of a forward, an entry that runs the whole loop its own way and returns what
the loop would: (text, image)."""
from __future__ import annotations

import contextlib
import functools
from typing import Callable

import torch


@contextlib.contextmanager
def one_entry(pipe, entry_for: Callable[[torch.nn.ModuleList], torch.nn.Module]):
    """Every DiT forward of `pipe` (DiffSynth calls `pipe.model_fn`) runs its blocks through `entry_for(blocks)`."""
    model_fn = pipe.model_fn

    @functools.wraps(model_fn)  # its signature is DiffSynth's (cuda_graphs.graph_inputs reads it)
    def model_fn_with_entry(dit=None, **inputs):
        blocks = dit.transformer_blocks
        dit.transformer_blocks = torch.nn.ModuleList([entry_for(blocks)])
        try:
            return model_fn(dit=dit, **inputs)
        finally:
            dit.transformer_blocks = blocks

    pipe.model_fn = model_fn_with_entry
    try:
        yield
    finally:
        pipe.model_fn = model_fn
