"""The text encoder's layers replayed as CUDA graphs (`text-encoder=graphed`, with the vision windows joined).

An H100 profile of a warm edit had the GPU idle most of the text-encoding stage while Python launched the 7B text
encoder's small kernels one by one (lab/LOG.md, section 6). Each decoder layer and vision block is captured as
a graph of its own per input shape (cuda_graphs.ShapeGraphs), so a layer costs one replay and the copies of its
inputs instead of dozens of launches. Layers, not the whole encoder: the code between them reads values back from
the GPU (the rotary positions, the window boundaries), which a graph cannot hold. The text encoder runs once per
prompt and edit, so a new shape (a prompt length, an image size) is captured right after its warm-up, in the edit
that first brings it, and replayed from the next edit on; each layer keeps its last few shapes.
"""
from __future__ import annotations

import contextlib

import torch

from .. import tensors
from .cuda_graphs import ShapeGraphs

SHAPES_PER_LAYER = 8   # prompt lengths (and image sizes) held per layer, the least recently used dropped


def regions(text_encoder) -> list:
    """The repeated layers of DiffSynth's Qwen2.5-VL text encoder: the language model's and the vision tower's."""
    model = text_encoder.model
    return [*model.language_model.layers, *model.visual.blocks]


def graphs_of(text_encoder) -> ShapeGraphs:
    """The text encoder's graphs, kept with it (every configuration shares the text encoder, and its graphs)."""
    return tensors.kept_with(text_encoder, "layer graphs", lambda: ShapeGraphs(
        what="text-encoder layer calls replayed", capture_at_first_call=True,
        limit=SHAPES_PER_LAYER * len(regions(text_encoder))))


def _graphed_forward(layer: torch.nn.Module, index: int, graphs: ShapeGraphs):
    def released(inputs: dict):
        return type(layer).forward(layer, *inputs["args"], **inputs["kwargs"])

    def forward(*args, **kwargs):
        return graphs.run(released, {"args": args, "kwargs": kwargs}, name=index)
    return forward


@contextlib.contextmanager
def graphed_layers(text_encoder, graphs: ShapeGraphs):
    """Every layer of `text_encoder` called through `graphs` for the length of the context."""
    layers = regions(text_encoder)
    for index, layer in enumerate(layers):
        layer.forward = _graphed_forward(layer, index, graphs)
    try:
        yield
    finally:
        for layer in layers:
            del layer.forward
