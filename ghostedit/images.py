"""Input images: read safely from whatever a user sends, converted to RGB, and sized for the model (multiples of
16 pixels, near a target area).

Files are untrusted. They are opened as one of FORMATS only (Pillow knows more, EPS among them, which runs
Ghostscript), their size is checked from the header before any pixel is decoded, PNG checksums are verified, and
any decoder failure becomes an InputImageError that says what is wrong. Pillow's own decompression-bomb limit
(Image.MAX_IMAGE_PIXELS, process-wide) is left as it is: GhostEdit's limit is lower and checked first, and the
bombs Pillow refuses outright (over twice its limit) become the same clear error. Between Pillow's limit and
twice it, Pillow also logs a DecompressionBombWarning before ours refuses the image.

Decisions: an image with a side under MIN_INPUT_SIDE (such as 1x1) is refused, not upscaled: it holds nothing to
edit. An aspect ratio over MAX_ASPECT_RATIO is refused, not cropped: cropping would silently drop what the person
meant to edit. Animated images and multi-page files give their first frame, with a note saying so.
"""
from __future__ import annotations

import contextlib
import functools
import io
import math
import os
from typing import BinaryIO, Union

import numpy as np
from PIL import Image, ImageOps, UnidentifiedImageError

from .errors import InputImageError

MULTIPLE = 16
MAX_INPUT_PIXELS = 40_000_000    # 40 MP: common camera photos (12-24 MP) with room to spare; 160 MB as RGBA
MIN_INPUT_SIDE = 16              # one latent patch
MAX_ASPECT_RATIO = 8.0
FORMATS = ("PNG", "JPEG", "MPO", "WEBP", "GIF", "BMP", "TIFF", "AVIF")
# Where load_image leaves its notes (such as "first frame only") on the image it returns
NOTES_KEY = "ghostedit_notes"
HIGH_BIT_DEPTH_MODES = ("I;16", "I;16L", "I;16B", "I;16N", "I", "F")

ImageSource = Union[str, os.PathLike, bytes, bytearray, BinaryIO, Image.Image]


def load_image(source: ImageSource, keep_alpha: bool = False, convert=None) -> Image.Image:
    """An RGB image from a path, bytes, a binary file object or a PIL image, checked and converted as described
    above (`keep_alpha`: RGBA where the image has transparency, for a model that reads alpha; `convert`: another
    conversion than to_rgb, a mask's). Raises InputImageError with a message for the person who sent it."""
    convert = convert or functools.partial(to_rgb, keep_alpha=keep_alpha)
    if isinstance(source, Image.Image):
        return _checked(source, convert)
    with _open_verified(source) as image:
        return _checked(image, convert)


def image_notes(image: Image.Image) -> list[str]:
    """What load_image did to this image that the person should know about."""
    return list(image.info.get(NOTES_KEY, []))


def check_image_size(width: int, height: int) -> None:
    """Refuses sizes GhostEdit does not take, with what to do instead."""
    if width * height > MAX_INPUT_PIXELS:
        raise InputImageError(f"the image is {width}x{height} pixels ({width * height / 1e6:.0f} megapixels); "
                              f"GhostEdit accepts up to {MAX_INPUT_PIXELS / 1e6:.0f} megapixels: downscale it first")
    short, long = sorted((width, height))
    if short and long > MAX_ASPECT_RATIO * short:
        raise InputImageError(f"the image is {width}x{height} pixels, an aspect ratio of "
                              f"{long / short:.0f}:1; GhostEdit accepts up to "
                              f"{MAX_ASPECT_RATIO:g}:1: crop it first")
    if short < MIN_INPUT_SIDE:
        raise InputImageError(f"the image is {width}x{height} pixels; each side must be at least "
                              f"{MIN_INPUT_SIDE} pixels")


def to_rgb(image: Image.Image, keep_alpha: bool = False) -> Image.Image:
    """RGB for the model: oriented_8bit, transparency composited on white (`keep_alpha`: kept, as RGBA)."""
    image = oriented_8bit(image)
    if image.has_transparency_data:
        rgba = image.convert("RGBA")
        if keep_alpha:
            return rgba
        background = Image.new("RGB", image.size, (255, 255, 255))
        background.paste(rgba, mask=rgba.getchannel("A"))
        return background
    return image.convert("RGB")


def oriented_8bit(image: Image.Image) -> Image.Image:
    """EXIF orientation applied, high bit depths scaled (not clipped) to 8 bits."""
    image = ImageOps.exif_transpose(image)
    return _to_8bit_gray(image) if image.mode in HIGH_BIT_DEPTH_MODES else image


def size_for_area(width: int, height: int, area: int, max_side: int | None = None) -> tuple[int, int]:
    """The size with the image's aspect ratio and about `area` pixels, each side a multiple of 16 (at least 16) and,
    given `max_side`, no longer than that."""
    scale = math.sqrt(area / (width * height))
    if max_side is not None:
        scale = min(scale, max_side / max(width, height))
    return (max(MULTIPLE, round(width * scale / MULTIPLE) * MULTIPLE),
            max(MULTIPLE, round(height * scale / MULTIPLE) * MULTIPLE))


def fit(image: Image.Image, size: tuple[int, int]) -> Image.Image:
    """An RGB image (from load_image) resized to `size`."""
    return image if image.size == size else image.resize(size, Image.LANCZOS)


# ---- reading untrusted files ----

def _checked(image: Image.Image, convert) -> Image.Image:
    check_image_size(*image.size)
    notes = [*image_notes(image), *_first_frame(image)]
    with _as_input_image_error("could not be decoded; the file may be corrupt or truncated"):
        image.load()
        converted = convert(image)
    if notes:
        converted.info[NOTES_KEY] = notes
    return converted


def _open_verified(source) -> Image.Image:
    """The image opened lazily (header read, no pixels decoded) after its size and, for PNG, its checksums and
    completeness were checked."""
    reopenable = _reopenable(source)
    with _opened(reopenable) as probe:
        check_image_size(*probe.size)
        with _as_input_image_error("is corrupt or truncated"):
            probe.verify()  # verify() leaves the image unusable: open it again
    return _opened(reopenable)


def _reopenable(source):
    """A path, or the bytes in memory: verifying and decoding each need a fresh open."""
    if isinstance(source, (str, os.PathLike)):
        return source
    if isinstance(source, (bytes, bytearray, memoryview)):
        return io.BytesIO(source)
    if hasattr(source, "read"):
        return io.BytesIO(source.read())
    raise InputImageError(f"expected an image file, got {type(source).__name__}")


def _opened(reopenable) -> Image.Image:
    if isinstance(reopenable, io.BytesIO):
        reopenable.seek(0)
    try:
        return Image.open(reopenable, formats=_readable_formats())
    except Image.DecompressionBombError as error:
        raise InputImageError(f"the image is too large to open safely (its header declares over "
                              f"{2 * (Image.MAX_IMAGE_PIXELS or 0) / 1e6:.0f} megapixels); GhostEdit accepts up to "
                              f"{MAX_INPUT_PIXELS / 1e6:.0f} megapixels: downscale it first") from error
    except UnidentifiedImageError as error:
        raise InputImageError("the file is not an image GhostEdit can read (it takes PNG, JPEG, WebP, GIF, BMP, "
                              "TIFF or AVIF)") from error
    except FileNotFoundError as error:
        raise InputImageError(f"the image file {os.fspath(reopenable)!r} does not exist") from error
    except OSError as error:
        raise InputImageError(f"the image file could not be read ({error})") from error


@functools.lru_cache(maxsize=None)
def _readable_formats() -> tuple[str, ...]:
    """FORMATS that this Pillow build can open (AVIF needs libavif)."""
    Image.init()
    return tuple(name for name in FORMATS if name in Image.OPEN)


def _first_frame(image: Image.Image) -> list[str]:
    """Moves a multi-frame image to its first frame; the note that says so."""
    frames = getattr(image, "n_frames", 1)
    if frames <= 1:
        return []
    with _as_input_image_error("could not be decoded; the file may be corrupt or truncated"):
        image.seek(0)
    return [f"the {image.format or 'image'} has {frames} frames (animation or pages): only the first is used"]


@contextlib.contextmanager
def _as_input_image_error(problem: str):
    """Pillow's decoders raise many kinds of exceptions on hostile data (OSError, SyntaxError, ValueError,
    struct.error, EOFError...); all of them mean the same thing to the person who sent the file."""
    try:
        yield
    except InputImageError:
        raise
    except Exception as error:
        raise InputImageError(f"the image {problem} ({type(error).__name__}: {error})") from error


def _to_8bit_gray(image: Image.Image) -> Image.Image:
    values = np.nan_to_num(np.asarray(image, dtype=np.float64))
    full_scale = 65535.0 if image.mode.startswith("I;16") else _full_scale(image.mode, values)
    return Image.fromarray(np.clip(np.rint(values * (255.0 / full_scale)), 0, 255).astype(np.uint8))


def _full_scale(mode: str, values: np.ndarray) -> float:
    """The white level of a 32-bit integer or float image, which the mode alone does not say: the smallest usual
    range (0-1 for floats, 8 bits, 16 bits) that holds every value, else the largest value."""
    top = float(values.max(initial=0.0))
    for scale in ((1.0,) if mode == "F" else ()) + (255.0, 65535.0):
        if top <= scale:
            return scale
    return top
