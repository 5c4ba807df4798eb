"""Masks and strength: ghostedit/masks.py's pieces against the functions of diffusers' QwenImageEditInpaintPipeline
and its VaeImageProcessors (0.42.1), reading masks (OpenAI's transparency rule, luminance otherwise), the request's
checks, and edits on the tiny model (2509's computation, 1 to 3 images): the image's own pixels outside the mask
with paste_back, the first image as the edited one, strength's steps, and no recompile between a masked and a
plain edit. Whole masked edits are held against the reference pipeline in test_reference.py."""
from __future__ import annotations

import io
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from PIL import Image

from ghostedit import masks
from ghostedit.config import EditRequest, OptimizationConfig
from ghostedit.errors import InputImageError, InvalidRequestError
from ghostedit.masks import first_step


def _smooth(size, phase=0.0) -> Image.Image:
    width, height = size
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    channels = [np.sin(x / 11 + c + phase) * np.cos(y / 7 - c) for c in (0.0, 1.3, 2.6)]
    return Image.fromarray(((np.stack(channels, -1) * 0.5 + 0.5) * 255).astype(np.uint8))


def _box(size, box, mode="L", soft=0) -> Image.Image:
    """White inside `box` (x1, y1, x2, y2 as fractions), with a grey ramp `soft` pixels wide; L or RGB."""
    width, height = size
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    x1, y1, x2, y2 = box
    inside = np.minimum.reduce([x - x1 * width, x2 * width - x, y - y1 * height, y2 * height - y])
    values = np.where(inside >= 0, 255, 0) if not soft else np.clip(inside / soft * 255 + 128, 0, 255)
    grey = Image.fromarray(values.astype(np.uint8), "L")
    return grey if mode == "L" else grey.convert(mode)


@pytest.fixture(scope="module")
def processors():
    """The image and mask processors as QwenImageEditInpaintPipeline makes them (vae_scale_factor 8, x2 patches)."""
    from diffusers.image_processor import VaeImageProcessor
    return SimpleNamespace(
        image=VaeImageProcessor(vae_scale_factor=16),
        mask=VaeImageProcessor(vae_scale_factor=16, vae_latent_channels=16, do_normalize=False, do_binarize=True,
                               do_convert_grayscale=True))


# ---- the pieces, against diffusers' functions ----

BOXES = [(0.1, 0.2, 0.3, 0.4), (0.0, 0.0, 0.2, 0.9), (0.7, 0.6, 1.0, 1.0), (0.45, 0.1, 0.55, 0.2),
         (0.05, 0.45, 0.95, 0.55)]


@pytest.mark.parametrize("size", [(288, 224), (160, 320), (256, 256)])
@pytest.mark.parametrize("pad", [0, 7, 32])
def test_crop_region_is_the_references(processors, size, pad):
    for box in BOXES:
        mask = _box(size, box)
        for target in (size, (size[1], size[0]), (512, 128)):
            assert masks.crop_region(mask, *target, pad) == processors.image.get_crop_region(mask, *target, pad=pad)


@pytest.mark.parametrize("source, target", [((100, 60), (64, 64)), ((60, 100), (64, 48)), ((90, 90), (96, 48)),
                                            ((77, 33), (160, 64))])
def test_resizes_with_fill_and_crop_are_the_references(processors, source, target):
    for image in (_smooth(source), _box(source, BOXES[0]), _box(source, BOXES[1], "RGB", soft=5)):
        ours, theirs = masks.resize_and_fill(image, *target), processors.image._resize_and_fill(image, *target)
        assert np.array_equal(np.asarray(ours), np.asarray(theirs))
        ours, theirs = masks.resize_and_crop(image, *target), processors.image._resize_and_crop(image, *target)
        assert np.array_equal(np.asarray(ours), np.asarray(theirs))


@pytest.mark.parametrize("mode, soft, pad", [("L", 0, None), ("RGB", 9, None), ("L", 0, 10), ("RGB", 6, 0)])
def test_latent_mask_is_the_references(processors, mode, soft, pad):
    """As the pipeline computes its mask: preprocess (crop, fill, grey, binarize), then prepare_mask_latents."""
    from diffusers import QwenImageEditInpaintPipeline

    size = (288, 224)
    for box in BOXES:
        mask = _box(size, box, mode, soft)
        crop = None if pad is None else masks.crop_region(mask, *size, pad)
        ours = masks.latent_mask(mask, crop, (size[0] // 8, size[1] // 8), "cpu", torch.float32)
        condition = processors.mask.preprocess(mask, height=size[1], width=size[0], crops_coords=crop,
                                               resize_mode="default" if crop is None else "fill")
        pipe = SimpleNamespace(vae_scale_factor=8, latent_channels=16,
                               _pack_latents=QwenImageEditInpaintPipeline._pack_latents)
        packed, _ = QwenImageEditInpaintPipeline.prepare_mask_latents(
            pipe, condition, torch.zeros(1, 16, size[1] // 8, size[0] // 8), 1, 16, 1, size[1], size[0],
            torch.float32, "cpu", None)
        assert torch.equal(QwenImageEditInpaintPipeline._pack_latents(ours.repeat(1, 16, 1, 1), 1, 16,
                                                                       size[1] // 8, size[0] // 8), packed)


def test_the_cropped_image_is_what_the_reference_encodes(processors):
    size, image = (288, 224), _smooth((288, 224))
    mask = _box(size, BOXES[0])
    crop = masks.crop_region(mask, *size, 12)
    theirs = processors.image.preprocess(image, height=size[1], width=size[0], crops_coords=crop, resize_mode="fill")
    ours = np.asarray(masks.cropped(image, crop, size)).astype(np.float32) / 255.0 * 2.0 - 1.0
    assert np.array_equal(ours, theirs[0].permute(1, 2, 0).numpy())


@pytest.mark.parametrize("crop_pad", [None, 5])
def test_overlay_is_the_references(processors, crop_pad):
    size = (160, 128)
    original, edited = _smooth(size), _smooth(size, phase=2.0)
    for mask in (_box(size, BOXES[2]), _box(size, BOXES[3], "RGB", soft=4)):
        crop = None if crop_pad is None else masks.crop_region(mask, *size, crop_pad)
        ours = masks.overlay(mask, original, edited, crop)
        theirs = processors.image.apply_overlay(mask, original, edited, crop)
        assert np.array_equal(np.asarray(ours), np.asarray(theirs))


# ---- reading masks ----

def _png(image: Image.Image) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


def test_a_mask_with_transparency_follows_openais_rule():
    """Transparent = change (alpha 0 white, opaque black, grey between), whatever the colours."""
    rgba = Image.new("RGBA", (64, 32), (255, 255, 255, 255))
    rgba.paste((0, 0, 0, 0), (10, 5, 30, 20))
    rgba.paste((200, 10, 10, 100), (40, 5, 50, 20))
    mask = masks.load_mask(_png(rgba))
    assert mask.mode == "L"
    assert mask.getpixel((15, 10)) == 255 and mask.getpixel((5, 5)) == 0 and mask.getpixel((45, 10)) == 155


@pytest.mark.parametrize("mode, expected", [("L", "L"), ("RGB", "RGB"), ("1", "L"), ("P", "RGB"), ("LA", "L"),
                                            ("RGBA", "RGB"), ("I;16", "L")])
def test_a_mask_without_transparency_is_read_by_its_luminance_in_its_mode(mode, expected):
    grey = _box((64, 48), BOXES[0])
    image = (Image.fromarray(np.asarray(grey).astype(np.uint16) * 257, "I;16") if mode == "I;16"
             else grey.convert(mode))
    mask = masks.load_mask(_png(image))
    assert mask.mode == expected
    assert np.array_equal(np.asarray(mask.convert("L")) >= 128, np.asarray(grey) >= 128)


def test_a_request_refuses_masks_that_do_not_fit_and_bad_values(house):
    mask = _box(house.size, BOXES[0])
    with pytest.raises(InputImageError, match="aspect ratio"):
        EditRequest(images=[house], prompt="x", mask=_box((house.width, house.height // 2), BOXES[0]))
    with pytest.raises(InputImageError, match="marks nothing"):
        EditRequest(images=[house], prompt="x", mask=Image.new("L", house.size, 100))
    with pytest.raises(InputImageError, match="the mask: the file is not an image"):
        EditRequest(images=[house], prompt="x", mask=b"not an image")
    for bad in (0, 0.0, -0.5, 1.5, float("nan"), "0.5", True):
        with pytest.raises(InvalidRequestError, match="strength"):
            EditRequest(images=[house], prompt="x", strength=bad)
    with pytest.raises(InvalidRequestError, match="give a mask"):
        EditRequest(images=[house], prompt="x", paste_back=True)
    with pytest.raises(InvalidRequestError, match="give a mask"):
        EditRequest(images=[house], prompt="x", padding_mask_crop=8)
    with pytest.raises(InvalidRequestError, match="paste_back must be"):
        EditRequest(images=[house], prompt="x", mask=mask, paste_back="yes")
    with pytest.raises(InvalidRequestError, match="padding_mask_crop"):
        EditRequest(images=[house], prompt="x", mask=mask, padding_mask_crop=-1)
    half = EditRequest(images=[house], prompt="x", mask=mask.resize((house.width // 2, house.height // 2)))
    assert half.starts_from_image and half.mask.size == (house.width // 2, house.height // 2)
    plain = EditRequest(images=[house], prompt="x")
    assert not plain.starts_from_image and plain.strength == 1.0 and plain.mask is None


@pytest.mark.parametrize("steps, strength, first", [(4, 1.0, 0), (4, 0.75, 1), (4, 0.6, 1), (50, 0.3, 35),
                                                    (3, 0.34, 1), (4, 0.01, 3)])
def test_first_step_is_diffusers_get_timesteps(steps, strength, first):
    from diffusers import QwenImageEditInpaintPipeline
    scheduler = SimpleNamespace(timesteps=torch.arange(steps), order=1)
    _, left = QwenImageEditInpaintPipeline.get_timesteps(SimpleNamespace(scheduler=scheduler), steps, strength, "cpu")
    assert first_step(steps, strength) == first == steps - left


# ---- edits on the tiny model ----

def test_paste_back_keeps_the_images_own_pixels_outside_the_mask(engine, house):
    size = (256, 192)
    image = house.resize((400, 300), Image.LANCZOS)
    mask = _box(image.size, (0.3, 0.2, 0.7, 0.6))
    request = dict(images=[image], prompt="add a red door", steps=3, seed=5, width=size[0], height=size[1],
                   mask=mask, strength=0.9)
    kept = engine.run(EditRequest(**request, paste_back=True)).image
    raw = engine.run(EditRequest(**request)).image
    original = np.asarray(image.resize(size, Image.LANCZOS))
    grey = np.asarray(mask.resize(size, Image.LANCZOS))
    outside, inside = grey == 0, grey == 255
    assert np.array_equal(np.asarray(kept)[outside], original[outside])
    assert np.array_equal(np.asarray(kept)[inside], np.asarray(raw)[inside])
    assert not np.array_equal(np.asarray(raw)[outside], original[outside])  # without it, the model's pixels
    between = (grey > 0) & (grey < 255)  # the resized mask's edge: blended as the reference's overlay blends
    assert between.any()


def test_the_mask_edits_the_first_image_whose_aspect_ratio_the_output_takes(engine, house):
    """2509's computation with three images: the first is edited (its pixels pasted back outside the mask); without
    a mask the default size follows the last image (as 2509 does), with one the first."""
    first, second, third = house.resize((300, 200)), _smooth((120, 180)), _smooth((160, 160), phase=1.0)
    mask = _box(first.size, (0.1, 0.1, 0.5, 0.5))
    masked = engine.run(EditRequest(images=[first, second, third], prompt="x", steps=2, mask=mask, paste_back=True))
    plain = engine.run(EditRequest(images=[first, second, third], prompt="x", steps=2))
    assert plain.width == plain.height                          # from the last, square
    assert abs(masked.width / masked.height - 1.5) < 0.1        # from the first, 3:2
    original = np.asarray(first.resize(masked.image.size, Image.LANCZOS))
    outside = np.asarray(mask.resize(masked.image.size, Image.LANCZOS)) == 0
    assert np.array_equal(np.asarray(masked.image)[outside], original[outside])


def test_strength_runs_the_last_steps_from_the_image(engine, house):
    full = engine.run(EditRequest(images=[house], prompt="x", steps=4, seed=3))
    again = engine.run(EditRequest(images=[house], prompt="x", steps=4, seed=3, strength=1.0))
    assert np.array_equal(np.asarray(full.image), np.asarray(again.image))  # strength 1, no mask: the plain edit
    light = engine.run(EditRequest(images=[house], prompt="x", steps=4, seed=3, strength=0.5))
    assert len(light.telemetry.summary()["step_s"]) == 2  # the last two of four (the reference test holds the start)
    assert not np.array_equal(np.asarray(light.image), np.asarray(full.image))


def test_a_masked_edit_after_a_plain_one_of_the_same_size_compiles_nothing(house):
    """Regional compile on the tiny model: the mask, the strength and the paste-back change no DiT input's shape,
    so nothing is compiled again (Dynamo's frame count), and no run after the first has a compile warm-up."""
    from torch._dynamo.utils import counters

    from ghostedit.engine import Engine

    engine = Engine("tiny", device="cpu")
    config = OptimizationConfig(compile="regional")
    mask = _box(house.size, (0.2, 0.2, 0.6, 0.6))
    request = dict(images=[house], prompt="x", steps=2, seed=1)
    engine.run(EditRequest(**request), config)
    frames = counters["frames"]["total"]
    for start in (dict(mask=mask), dict(mask=mask, strength=0.5, paste_back=True), dict(strength=0.5),
                  dict(mask=mask, padding_mask_crop=16)):
        result = engine.run(EditRequest(**request, **start), config)
        assert "compile warm-up" not in result.telemetry.summary()["stages_s"], start
    assert counters["frames"]["total"] == frames, dict(counters["frames"])


@pytest.mark.parametrize("settings", ["fp8=storage", "lora-fused", "lora-runtime"])
def test_a_masked_edit_runs_under_each_toggle_a_cpu_can_run(engine, house, settings):
    """FP8 weights and fused or runtime LoRAs change the DiT, never what a mask keeps (compile: the test above; CUDA
    graphs replay model_fn's own inputs, which a mask leaves as a plain edit's: the GPU bench's e2e-4-mask row runs
    the best configuration, graphs included)."""
    from ghostedit.config import LoraChoice
    from ghostedit.models.tiny import ensure_tiny_lora

    if settings.startswith("lora-"):
        config = OptimizationConfig(loras=[LoraChoice.from_file(ensure_tiny_lora("peft"), 0.7,
                                                                settings.removeprefix("lora-"))])
    else:
        config = OptimizationConfig.parse(settings)
    mask = _box(house.size, (0.25, 0.3, 0.75, 0.7))
    result = engine.run(EditRequest(images=[house], prompt="x", steps=2, seed=2, width=128, height=128, mask=mask,
                                    strength=0.8, paste_back=True), config)
    plain = engine.run(EditRequest(images=[house], prompt="x", steps=2, seed=2, width=128, height=128, mask=mask,
                                   strength=0.8, paste_back=True))
    grey = np.asarray(mask.resize((128, 128), Image.LANCZOS))
    original = np.asarray(house.resize((128, 128), Image.LANCZOS))
    for edited in (result.image, plain.image):
        assert np.array_equal(np.asarray(edited)[grey == 0], original[grey == 0])
    assert not np.array_equal(np.asarray(result.image)[grey == 255], np.asarray(plain.image)[grey == 255])
