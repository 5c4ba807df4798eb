"""The DiT's block loop as the engine's run-time rewrites take it over: DiffSynth's model_fn loops over
`dit.transformer_blocks`, and a rewrite of the loop (carried-residual's hand-on) puts a block
list of one entry there for the length of a forward, an entry that runs the whole loop its own way and returns what
the loop would: (text, image). `wrapped_model_fn` is how every run-time wrapper of DiffSynth's model_fn goes in
(the step cache's and cuda-graph's too)."""
from __future__ import annotations

import contextlib
import functools
from typing import Callable

import torch


@contextlib.contextmanager
def wrapped_model_fn(pipe, wrap: Callable):
    """Every DiT forward of `pipe` (DiffSynth calls `pipe.model_fn`) through `wrap(model_fn)` for the length of the
    context. The wrapper keeps model_fn's name and signature (functools.wraps): cuda_graphs.graph_inputs reads
    DiffSynth's through any wrappers around it."""
    model_fn = pipe.model_fn
    pipe.model_fn = functools.wraps(model_fn)(wrap(model_fn))
    try:
        yield
    finally:
        pipe.model_fn = model_fn


def one_entry(pipe, entry_for: Callable[[torch.nn.ModuleList], torch.nn.Module]):
    """Every DiT forward of `pipe` runs its blocks through `entry_for(blocks)` (a context)."""
    def with_entry(model_fn):
        def model_fn_with_entry(dit=None, **inputs):
            blocks = dit.transformer_blocks
            dit.transformer_blocks = torch.nn.ModuleList([entry_for(blocks)])
            try:
                return model_fn(dit=dit, **inputs)
            finally:
                dit.transformer_blocks = blocks
        return model_fn_with_entry
    return wrapped_model_fn(pipe, with_entry)
