"""Inpainting masks (white = change): read from what a person sends, and brought to the output's size and the
latents' grid as diffusers' QwenImageEditInpaintPipeline (0.42.1) brings them, with its VaeImageProcessor's
functions (crop region, resize-and-fill, binarizing, the overlay that pastes the input back), and the step a
strength starts at (its get_timesteps: first_step), written here because diffusers belongs in the tests, which hold
each of these against it (tests/unit/base/test_masks.py).

Reading a mask: a file with transparent pixels follows OpenAI's images API (the transparent pixels are the ones to
change: white where alpha is 0, grey in between); any other is read by its luminance, white = change. A mask keeps
its mode (L or RGB) until it is resized, as the reference resizes it before its conversion to grey.
"""
from __future__ import annotations

import numpy as np
import torch
from PIL import Image, ImageOps

from .errors import InputImageError
from .images import ImageSource, load_image, oriented_8bit

KEPT_MODES = ("L", "RGB")      # resized in their own mode, as the reference does; others become one of them
ASPECT_TOLERANCE = 0.02        # a mask of the image's aspect ratio, give or take a rounded side
BINARY_THRESHOLD = 0.5         # the reference binarizes the resized mask at half white


def load_mask(source: ImageSource) -> Image.Image:
    """A mask, white = change, in mode L or RGB, from a path, bytes, a binary file object or a PIL image (checked
    as images.load_image checks an input image). A PIL image already in L or RGB is taken as it is."""
    return load_image(source, convert=white_is_change)


def white_is_change(image: Image.Image) -> Image.Image:
    image = oriented_8bit(image)
    if image.has_transparency_data:
        alpha = image.convert("RGBA").getchannel("A")
        if alpha.getextrema()[0] < 255:  # OpenAI's rule: transparent = change
            return ImageOps.invert(alpha)
        image = image.convert("RGBA" if image.mode != "LA" else "LA")
    if image.mode in KEPT_MODES:
        return image
    return image.convert("L" if image.mode in ("1", "LA") else "RGB")


def check_fits(mask: Image.Image, image: Image.Image) -> None:
    """A mask is drawn on the image it edits: its aspect ratio is the image's (any size: it is resized)."""
    (mask_w, mask_h), (image_w, image_h) = mask.size, image.size
    if abs(mask_w / mask_h - image_w / image_h) > ASPECT_TOLERANCE * image_w / image_h + 1 / min(mask_h, image_h):
        raise InputImageError(f"the mask is {mask_w}x{mask_h} pixels, the image it edits (the first input image) "
                              f"{image_w}x{image_h}: a mask must have the image's aspect ratio (the same size, or a "
                              "scaled copy)")
    if mask.convert("L").getextrema()[1] < 256 * BINARY_THRESHOLD:
        raise InputImageError("the mask marks nothing to change: paint white (or, in a file with transparency, "
                              "leave transparent) where the edit may change the image")


def at_size(mask: Image.Image, size: tuple[int, int]) -> Image.Image:
    """The mask at the output's size, in its mode, resized with LANCZOS as the reference's mask processor resizes."""
    return mask if mask.size == size else mask.resize(size, Image.LANCZOS)


def crop_region(mask: Image.Image, width: int, height: int, pad: int) -> tuple[int, int, int, int]:
    """The reference's `get_crop_region`: the box (x1, y1, x2, y2) around every non-black pixel of `mask`, `pad`
    pixels wider on each side, widened to the aspect ratio of width x height and kept inside the mask."""
    grey = np.array(mask.convert("L"))
    h, w = grey.shape
    columns, rows = np.flatnonzero(grey.any(axis=0)), np.flatnonzero(grey.any(axis=1))
    if not columns.size:
        raise InputImageError("the mask marks nothing at the output's size: paint a larger area")
    x1, x2 = max(int(columns[0]) - pad, 0), min(int(columns[-1]) + 1 + pad, w)
    y1, y2 = max(int(rows[0]) - pad, 0), min(int(rows[-1]) + 1 + pad, h)
    if (x2 - x1) / (y2 - y1) > width / height:
        y1, y2 = _widened(y1, y2, int((x2 - x1) / (width / height) - (y2 - y1)), h)
    else:
        x1, x2 = _widened(x1, x2, int((y2 - y1) * (width / height) - (x2 - x1)), w)
    return x1, y1, x2, y2


def _widened(low: int, high: int, more: int, limit: int) -> tuple[int, int]:
    """One axis of crop_region's widening, as the reference computes it (shifted back inside 0..limit)."""
    low, high = low - more // 2, high + more - more // 2
    if high >= limit:
        low, high = low - (high - limit), limit
    if low < 0:
        low, high = 0, high - low
    return low, min(high, limit)


def resize_and_fill(image: Image.Image, width: int, height: int) -> Image.Image:
    """The reference's resize mode "fill": the image fitted inside width x height with its aspect ratio, centred,
    the margins filled by stretching its edge rows or columns (RGB)."""
    ratio, source_ratio = width / height, image.width / image.height
    fit_w = width if ratio < source_ratio else image.width * height // image.height
    fit_h = height if ratio >= source_ratio else image.height * width // image.width
    resized = image.resize((fit_w, fit_h), resample=Image.LANCZOS)
    result = Image.new("RGB", (width, height))
    result.paste(resized, box=(width // 2 - fit_w // 2, height // 2 - fit_h // 2))
    if ratio < source_ratio:
        fill = height // 2 - fit_h // 2
        if fill > 0:
            result.paste(resized.resize((width, fill), box=(0, 0, width, 0)), box=(0, 0))
            result.paste(resized.resize((width, fill), box=(0, resized.height, width, resized.height)),
                         box=(0, fill + fit_h))
    elif ratio > source_ratio:
        fill = width // 2 - fit_w // 2
        if fill > 0:
            result.paste(resized.resize((fill, height), box=(0, 0, 0, height)), box=(0, 0))
            result.paste(resized.resize((fill, height), box=(resized.width, 0, resized.width, height)),
                         box=(fill + fit_w, 0))
    return result


def resize_and_crop(image: Image.Image, width: int, height: int) -> Image.Image:
    """The reference's resize mode "crop": the image covering width x height with its aspect ratio, centred."""
    ratio, source_ratio = width / height, image.width / image.height
    fit_w = width if ratio > source_ratio else image.width * height // image.height
    fit_h = height if ratio <= source_ratio else image.height * width // image.width
    result = Image.new("RGB", (width, height))
    result.paste(image.resize((fit_w, fit_h), resample=Image.LANCZOS),
                 box=(width // 2 - fit_w // 2, height // 2 - fit_h // 2))
    return result


def cropped(image: Image.Image, crop: tuple[int, int, int, int] | None, size: tuple[int, int]) -> Image.Image:
    """The image (at `size`) as the reference's preprocessing gives it to the VAE: the crop filled to `size`, or
    the image itself."""
    return image if crop is None else resize_and_fill(image.crop(crop), *size)


def latent_mask(mask: Image.Image, crop: tuple[int, int, int, int] | None, latent_size: tuple[int, int],
                device, dtype: torch.dtype) -> torch.Tensor:
    """[1, 1, H, W] of 0 and 1 on the latents' grid (1 = change) from the mask at the output's size: cropped and
    filled like the image, grey, binarized at half white, then sampled at the latents' grid by nearest neighbour,
    as the reference's mask processor and prepare_mask_latents compute it."""
    grey = np.array(cropped(mask, crop, mask.size).convert("L")).astype(np.float32) / 255.0
    binary = torch.from_numpy(np.where(grey < BINARY_THRESHOLD, 0.0, 1.0).astype(np.float32))[None, None]
    latent_w, latent_h = latent_size
    return torch.nn.functional.interpolate(binary, size=(latent_h, latent_w)).to(device=device, dtype=dtype)


def overlay(mask: Image.Image, original: Image.Image, image: Image.Image,
            crop: tuple[int, int, int, int] | None) -> Image.Image:
    """The reference's `apply_overlay`: the edit (put back in its crop's place, if cropped) with the original
    laid over it through the inverted mask: the original's pixels exactly where the mask is black, the edit's
    where it is white, blended where it is grey."""
    width, height = original.size
    kept = Image.new("RGBa", (width, height))
    kept.paste(original.convert("RGBA").convert("RGBa"), mask=ImageOps.invert(mask.convert("L")))
    kept = kept.convert("RGBA")
    if crop is not None:
        x, y, x2, y2 = crop
        placed = Image.new("RGBA", (width, height))
        placed.paste(resize_and_crop(image, x2 - x, y2 - y), (x, y))
        image = placed.convert("RGB")
    image = image.convert("RGBA")
    image.alpha_composite(kept)
    return image.convert("RGB")


def first_step(steps: int, strength: float) -> int:
    """The step a strength starts at, as diffusers' get_timesteps counts it (strength 1: the first)."""
    return int(max(steps - min(steps * strength, steps), 0))
