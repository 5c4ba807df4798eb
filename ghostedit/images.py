"""Input images: converted to RGB and sized for the model (multiples of 16 pixels, near a target area)."""
from __future__ import annotations

import math

from PIL import Image, ImageOps

MULTIPLE = 16


def to_rgb(image: Image.Image) -> Image.Image:
    image = ImageOps.exif_transpose(image)
    if image.mode in ("RGBA", "LA", "PA") or (image.mode == "P" and "transparency" in image.info):
        background = Image.new("RGB", image.size, (255, 255, 255))
        background.paste(image.convert("RGBA"), mask=image.convert("RGBA").getchannel("A"))
        return background
    return image.convert("RGB")


def size_for_area(width: int, height: int, area: int) -> tuple[int, int]:
    """The size with the image's aspect ratio and about `area` pixels, each side a multiple of 16 (at least 16)."""
    scale = math.sqrt(area / (width * height))
    return (max(MULTIPLE, round(width * scale / MULTIPLE) * MULTIPLE),
            max(MULTIPLE, round(height * scale / MULTIPLE) * MULTIPLE))


def fit(image: Image.Image, size: tuple[int, int]) -> Image.Image:
    image = to_rgb(image)
    return image if image.size == size else image.resize(size, Image.LANCZOS)
