"""Images on their way to the page and the API. What is looked at (the before/after view, the galleries) travels as
JPEG at quality 95 (WebP where it has transparency): a few milliseconds to encode a 1024x1024 picture, where
Gradio's PNG took tens of times longer and brought megabytes per image to every client. What is kept (the
download, `/comparison`'s file) is the lossless PNG, encoded once per run after the picture is shown (ui/handlers.py's
follow-up event), never on an edit's way."""
from __future__ import annotations

import time
import uuid
from pathlib import Path

from PIL import Image

VIEW_QUALITY = 95


def _saved(image: Image.Image, path: Path, **options) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    image.save(path, **options)
    return str(path)


def view_file(image: Image.Image, folder: Path) -> str:
    """The image as the page shows it, in `folder`: JPEG at quality 95; an image with transparency (a
    Qwen-Image-2.1 output, the empty "before" of text-to-image) WebP at quality 95 with its alpha kept whole, which
    JPEG cannot hold (the quickest WebP method: tens of milliseconds at 1024x1024)."""
    name = uuid.uuid4().hex
    if image.mode in ("RGBA", "LA", "PA") or "transparency" in image.info:
        return _saved(image.convert("RGBA"), folder / f"{name}.webp", format="WEBP", quality=VIEW_QUALITY, method=0)
    return _saved(image.convert("RGB"), folder / f"{name}.jpg", format="JPEG", quality=VIEW_QUALITY)


def png_file(image: Image.Image, folder: Path, name: str = "edited") -> str:
    """The image at full quality, for keeping: `name`.png (the name a download gets) in a new folder in `folder`."""
    return _saved(image, folder / uuid.uuid4().hex / f"{name}.png", format="PNG")


class Stopwatch:
    """Seconds spent inside `with watch:` blocks, summed (the encoding of a run's images, outside the engine)."""

    def __init__(self):
        self.seconds = 0.0

    def __enter__(self):
        self._start = time.perf_counter()
        return self

    def __exit__(self, *exc):
        self.seconds += time.perf_counter() - self._start
