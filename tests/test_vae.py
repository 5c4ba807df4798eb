"""The VAE as an image network (`vae=image`): the released function without the causal padding's zero frames; and
the VAE's input, computed on the device with the reference's bits."""
import copy

import numpy as np
import pytest
import torch
from PIL import Image

from ghostedit import EditRequest, OptimizationConfig
from ghostedit.engine import Engine
from ghostedit.models import exact
from ghostedit.optimize import vae_frames


@pytest.fixture(scope="module")
def vae64():
    """The tiny model's VAE in float64, where rounding leaves only the float32 RMS norms' ulps (the reference's,
    models/exact.py) between two computations of the same function."""
    vae = Engine("tiny", device="cpu").load().vae
    return copy.deepcopy(getattr(vae, "vae", vae)).double()   # inside GhostEdit's dtype wrapper, if any


def test_the_vae_as_an_image_network_encodes_and_decodes_as_released_without_a_3d_convolution(vae64, monkeypatch):
    image = torch.rand(1, 3, 64, 96, dtype=torch.float64, generator=torch.Generator().manual_seed(0)) * 2 - 1
    conv3d_calls = []
    conv3d = torch.nn.functional.conv3d
    monkeypatch.setattr(torch.nn.functional, "conv3d", lambda *a, **k: conv3d_calls.append(1) or conv3d(*a, **k))
    with torch.no_grad():
        latents = vae64.encode(image)
        decoded = vae64.decode(latents)
        released_calls = len(conv3d_calls)
        conv3d_calls.clear()
        with vae_frames.image_convolutions(vae64) as count:
            image_latents = vae64.encode(image)
            image_decoded = vae64.decode(image_latents)
    assert released_calls > 0 and conv3d_calls == [] and count > 0
    assert float((image_latents - latents).norm() / latents.norm()) < 1e-6
    assert float((image_decoded - decoded).norm() / decoded.norm()) < 1e-6
    assert not any("forward" in vars(module) for module in vae64.modules())   # put back after the context


def test_the_vae_as_an_image_network_still_runs_a_video_as_released(vae64):
    """More than one frame, or cached frames, is not the lone zero-padded frame: those convolutions run as released."""
    video = torch.rand(1, 3, 5, 32, 32, dtype=torch.float64, generator=torch.Generator().manual_seed(1)) * 2 - 1
    with torch.no_grad():
        released = vae64.encode_video(video)
        with vae_frames.image_convolutions(vae64):
            as_image = vae64.encode_video(video)
    assert float((as_image - released).norm() / released.norm()) < 1e-6


def test_an_edit_with_the_vae_as_an_image_network_says_so_and_gives_the_same_image(engine, house):
    request = EditRequest(images=[house], prompt="make it a haunted house", width=128, height=128, steps=2)
    released = engine.run(request)
    as_image = engine.run(request, OptimizationConfig(vae="image"))
    assert "image: " in as_image.prepared_report["vae"] and "vae" not in released.prepared_report
    difference = np.abs(np.asarray(as_image.image, dtype=np.int16) - np.asarray(released.image, dtype=np.int16))
    assert difference.max() <= 2   # bf16 on a CPU: another summation order, a rounding step at most here and there


def test_the_vae_input_has_the_bits_of_the_references_float32_preprocessing():
    """exact.to_tensor looks the pixels up on the device; the reference computes x / 255 * 2 - 1 in float32."""
    pixels = np.random.default_rng(0).integers(0, 256, (48, 64, 3), dtype=np.uint8)
    reference = torch.from_numpy(pixels.astype(np.float32) / 255.0 * 2.0 - 1.0).permute(2, 0, 1).unsqueeze(0)
    for dtype in (torch.float32, torch.bfloat16):
        assert torch.equal(exact.to_tensor(Image.fromarray(pixels), dtype, "cpu"), reference.to(dtype))


def test_the_edited_image_has_the_bits_of_the_references_8_bit_postprocessing(engine):
    """ExactPipeline.vae_output_to_image rounds where the VAE's output is; diffusers rounds numpy's float32."""
    output = torch.rand(1, 3, 40, 56, generator=torch.Generator().manual_seed(2)) * 2.2 - 1.1   # a little clamped
    output[0, 0, 0, :4] = torch.tensor([-1.0, 1.0, 0.5 / 255 * 2 - 1, 1.5 / 255 * 2 - 1])      # ends, halves
    for dtype in (torch.float32, torch.bfloat16):
        vae_output = output.to(dtype)
        unit = (vae_output[0] * 0.5 + 0.5).clamp(0, 1).float()
        reference = (unit.permute(1, 2, 0).numpy() * 255).round().astype(np.uint8)
        image = engine.load().vae_output_to_image(vae_output)
        assert np.array_equal(np.asarray(image), reference)
