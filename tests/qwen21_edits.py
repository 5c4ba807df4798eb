"""Qwen-Image-2.1 edits whose DiT predictions a test compares, run on a prepared pipeline (the CUDA-graph tests: the
CPU's stand-in capture in tests/unit/optimize/test_cuda_graphs.py, the GPU's real graphs in tests/gpu/qwen21_graphs.py)."""
from __future__ import annotations

import contextlib
from pathlib import Path

import torch
from PIL import Image, ImageOps

from ghostedit.models.seams import DitOptions
from ghostedit.telemetry import RunRecorder

HOUSE = Path(__file__).resolve().parent.parent / "assets" / "examples" / "house.png"


def references(count: int, variant: int) -> list:
    """`count` references of one size; another `variant` gives other pictures of the same sizes."""
    house = Image.open(HOUSE).convert("RGB")
    pictures = [house, ImageOps.mirror(house), ImageOps.flip(house), house.rotate(180)]
    return [pictures[(index + variant) % len(pictures)] for index in range(count)]


def predictions(prepared, images: list, seed: int, prefix_cache: bool, graphs=None, side: int = 64,
                device: str = "cpu") -> list:
    """Every DiT prediction of a four-step edit of `side` px (text-to-image without references), from `graphs`
    where given (each kept as computed: a replay's output tensor is the graph's, written again by the next)."""
    pipe, found = prepared.pipe, []
    model_fn = pipe.model_fn
    pipe.model_fn = lambda **inputs: found.append(model_fn(**inputs).clone()) or found[-1]
    try:
        with torch.no_grad(), (graphs.running(("stock", None), RunRecorder(device)) if graphs else
                               contextlib.nullcontext()):
            pipe(prompt="a ghostly house", edit_image=images or None, height=side, width=side, seed=seed,
                 num_inference_steps=4, dit_options=DitOptions(graphs=graphs), prefix_cache=prefix_cache)
    finally:
        pipe.model_fn = model_fn
    return found
