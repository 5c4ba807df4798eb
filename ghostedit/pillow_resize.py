"""Pillow's LANCZOS resize of an 8-bit RGB image, computed on the device with Pillow's own integer arithmetic, so
that the result equals `image.resize(size, Image.LANCZOS)` bit for bit (tests/unit/base/test_pillow_resize.py).

The reference (diffusers' VaeImageProcessor) resizes each input image with Pillow on the CPU, where an upscale to
the VAE's 1024x1024 takes tens of milliseconds while the GPU waits for the VAE's input. Pillow resamples in two
passes, horizontal then vertical, each output value a sum of at most `ksize` input values times fixed-point
weights (22 fraction bits) plus a half, shifted and clipped to 8 bits; the horizontal pass covers only the input
rows the vertical one reads. The weights are computed here as Pillow computes them, in double precision with the C
library's sin (Python's math.sin), once per pair of sizes; the sums are exact integers on any device, so the order
in which the device adds them does not matter.
"""
from __future__ import annotations

import functools
import math

import numpy as np
import torch
from PIL import Image

from .images import fit

PRECISION_BITS = 32 - 8 - 2   # Pillow's Resample.c for 8-bit images
LANCZOS_SUPPORT = 3.0


def _sinc(x: float) -> float:
    if x == 0.0:
        return 1.0
    x *= math.pi
    return math.sin(x) / x


def _lanczos(x: float) -> float:
    return _sinc(x) * _sinc(x / 3) if -3.0 <= x < 3.0 else 0.0


SIZES_KEPT = 64   # pairs of sizes whose weights are kept (a server sees many input sizes)


@functools.lru_cache(maxsize=SIZES_KEPT)
def _taps(in_size: int, out_size: int) -> tuple[np.ndarray, np.ndarray]:
    """Pillow's precompute_coeffs and normalize_coeffs_8bpc: for each output position, the input indices it reads
    and their fixed-point weights, both [out_size, ksize] (unused taps read the last index with weight 0)."""
    scale = in_size / out_size
    filter_scale = max(scale, 1.0)
    support = LANCZOS_SUPPORT * filter_scale
    inverse = 1.0 / filter_scale
    ksize = int(math.ceil(support)) * 2 + 1
    indices = np.full((out_size, ksize), in_size - 1, dtype=np.int64)
    weights = np.zeros((out_size, ksize), dtype=np.int64)
    for out in range(out_size):
        center = (out + 0.5) * scale
        low = max(int(center - support + 0.5), 0)
        count = min(int(center + support + 0.5), in_size) - low
        taps = [_lanczos((x + low - center + 0.5) * inverse) for x in range(count)]
        total = 0.0
        for tap in taps:  # left to right, as Pillow adds them (Python's sum() compensates since 3.12)
            total += tap
        for x, tap in enumerate(taps):
            normalized = tap / total if total != 0.0 else tap
            weights[out, x] = int(normalized * (1 << PRECISION_BITS) + (0.5 if normalized >= 0 else -0.5))
        indices[out, :count] = np.arange(low, low + count)
    return indices, weights


@functools.lru_cache(maxsize=SIZES_KEPT)
def _taps_on(device: torch.device, in_size: int, out_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    return tuple(torch.from_numpy(table).to(device) for table in _taps(in_size, out_size))


def _pass(pixels: torch.Tensor, out_size: int, dim: int) -> torch.Tensor:
    """One of Pillow's passes along `dim` of [H, W, C] uint8 pixels (0: vertical, 1: horizontal)."""
    indices, weights = _taps_on(pixels.device, pixels.shape[dim], out_size)
    taps = pixels.long().index_select(dim, indices.flatten()).unflatten(dim, indices.shape)
    weights = weights[:, :, None, None] if dim == 0 else weights[None, :, :, None]
    sums = (taps * weights).sum(dim=dim + 1) + (1 << (PRECISION_BITS - 1))
    return torch.clamp(sums >> PRECISION_BITS, 0, 255).to(torch.uint8)


def resize(image: Image.Image, size: tuple[int, int], device) -> torch.Tensor:
    """`image` (RGB) resized to `size` (width, height) as Pillow's LANCZOS resizes it: [height, width, 3] uint8 on
    `device`. On a CPU, Pillow's own C code computes it (the same bits, sooner there)."""
    if torch.device(device).type == "cpu":
        return torch.from_numpy(np.array(fit(image, size)))
    return resampled(torch.from_numpy(np.array(image)).to(device), size)


def resampled(pixels: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    """[H, W, 3] uint8 `pixels` resampled to `size` (width, height) on their device, as Pillow's LANCZOS resamples.
    Pillow's horizontal pass covers only the rows its vertical pass reads; here it covers all of them, which
    changes none of the rows read."""
    width, height = size
    if width != pixels.shape[1]:
        pixels = _pass(pixels, width, dim=1)
    if height != pixels.shape[0]:
        pixels = _pass(pixels, height, dim=0)
    return pixels
