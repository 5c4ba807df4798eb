"""The text encoder's layers replayed as CUDA graphs (`text-encoder=graphed`), for either family's Qwen-VL: the Edit
models' Qwen2.5-VL (its vision windows joined) and Qwen-Image-2.1's Qwen3-VL, whose layers are found by structure.

An H100 profile of a warm edit had the GPU idle most of the text-encoding stage while Python launched the 7B text
encoder's small kernels one by one (lab/LOG.md, section 6). Each decoder layer and vision block is captured as
a graph of its own per input shape (cuda_graphs.ShapeGraphs), so a layer costs one replay and the copies of its
inputs instead of dozens of launches. Layers, not the whole encoder: the code between them reads values back from
the GPU (the rotary positions, the window boundaries), which a graph cannot hold. The text encoder runs once per
prompt and edit, so a new shape (a prompt length, an image size) is captured right after its warm-up, in the edit
that first brings it, and replayed from the next edit on; each layer keeps its last few shapes.

Two inputs of a layer are handed to its graph otherwise than the model hands them, to the same result:
- a vision block whose attention is transformers' SDPA path (Qwen3-VL's, which has no windows to join) reads each
  image's length back from the GPU to split its attention per image, which a graph cannot hold: it is handed the
  boundaries on the host, read once per vision forward, and they become part of its shape (the same split, the same
  calls);
- a decoder layer is called without the key/value cache transformers opens for a forward that does not say
  `use_cache=False` (DiffSynth's Qwen-Image-2.1 prompt embedder): an encoder never reads it back, an empty cache
  hands its layer the keys it is given, and a graph would replay its update on a cache of the capture's.
"""
from __future__ import annotations

import contextlib

import torch

from .. import tensors
from .cuda_graphs import ShapeGraphs

SHAPES_PER_LAYER = 8   # prompt lengths (and image sizes) held per layer, the least recently used dropped


def _one_with(text_encoder, attribute: str) -> torch.nn.Module:
    """The one module of `text_encoder` with a submodule `attribute`, found once (every run asks) and kept with it."""
    def find() -> torch.nn.Module:
        found = [module for module in text_encoder.modules()
                 if isinstance(getattr(module, attribute, None), torch.nn.Module)]
        if len(found) != 1:
            raise ValueError(f"{type(text_encoder).__name__} has {len(found)} modules with a `{attribute}`, not one: "
                             "the text-encoder toggle serves a Qwen-VL text encoder (a language model and a vision "
                             "tower)")
        return found[0]
    return tensors.kept_with(text_encoder, f"the module with {attribute}", find)


def language_model(text_encoder) -> torch.nn.Module:
    """A Qwen-VL text encoder's language model: the module that embeds the tokens (its decoder layers: `layers`)."""
    return _one_with(text_encoder, "embed_tokens")


def vision_tower(text_encoder) -> torch.nn.Module:
    """A Qwen-VL text encoder's vision tower: the module that embeds the image patches (its blocks: `blocks`)."""
    return _one_with(text_encoder, "patch_embed")


def regions(text_encoder) -> list:
    """The repeated layers of a Qwen-VL text encoder (Qwen2.5-VL, Qwen3-VL): the language model's decoder layers,
    then the vision tower's blocks."""
    return [*language_model(text_encoder).layers, *vision_tower(text_encoder).blocks]


def graphs_of(text_encoder) -> ShapeGraphs:
    """The text encoder's graphs, kept with it (every configuration shares the text encoder, and its graphs)."""
    return tensors.kept_with(text_encoder, "layer graphs", lambda: ShapeGraphs(
        what="text-encoder layer calls replayed", capture_at_first_call=True,
        limit=SHAPES_PER_LAYER * len(regions(text_encoder))))


def _graphed_forward(layer: torch.nn.Module, index: int, graphs: ShapeGraphs, handed=lambda kwargs: kwargs):
    """`layer`'s forward through `graphs`, its keyword arguments as `handed` gives them."""
    def released(inputs: dict):
        return type(layer).forward(layer, *inputs["args"], **inputs["kwargs"])

    def forward(*args, **kwargs):
        return graphs.run(released, {"args": args, "kwargs": handed(kwargs)}, name=index)
    return forward


def _without_cache(kwargs: dict) -> dict:
    return {name: value for name, value in kwargs.items() if name != "past_key_values"}


def _boundaries_on_host(config):
    """A vision block's keyword arguments with the images' boundaries (`cu_seqlens`) on the host where its attention
    reads them there (SDPA: not a flash-named function, which takes them on the device), copied once per forward
    (every block is handed the same tensor)."""
    from transformers.utils.generic import is_flash_attention_requested
    copied = {}

    def handed(kwargs: dict) -> dict:
        boundaries = kwargs.get("cu_seqlens")
        if boundaries is None or boundaries.device.type == "cpu" or is_flash_attention_requested(config):
            return kwargs
        if copied.get("from") is not boundaries:
            copied.update({"from": boundaries, "host": boundaries.cpu()})
        return {**kwargs, "cu_seqlens": copied["host"]}
    return handed


@contextlib.contextmanager
def graphed_layers(text_encoder, graphs: ShapeGraphs):
    """Every layer of `text_encoder` called through `graphs` for the length of the context."""
    decoder_layers, vision = list(language_model(text_encoder).layers), vision_tower(text_encoder)
    on_host = _boundaries_on_host(vision.config)
    layers = [*decoder_layers, *vision.blocks]
    for index, layer in enumerate(layers):
        layer.forward = _graphed_forward(layer, index, graphs,
                                         _without_cache if index < len(decoder_layers) else on_host)
    try:
        yield
    finally:
        for layer in layers:
            del layer.forward
