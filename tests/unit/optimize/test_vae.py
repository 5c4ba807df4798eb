"""The VAE as an image network (`vae=image`): the released function without the causal padding's zero frames; its
RMS norms fused with their SiLU (`vae=image-fused`), the kernel run by Triton's interpreter on the CPU (on the Edit
model's VAE and Qwen-Image-2.1's); and the VAE's input, computed on the device with the reference's bits. The fused
norms' bits and speed on the GPU: vae_norm_probe.py (lab/probes/README.md) and lab/LOG.md."""
import copy

import numpy as np
import pytest
import torch

from triton_interpreter import run_interpreted
from ghostedit import EditRequest, OptimizationConfig
from ghostedit.engine import Engine
from ghostedit.models import exact
from ghostedit.optimize import registry, vae_frames


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


def test_fused_norms_run_as_released_where_the_kernel_cannot_run_and_are_put_back(vae64):
    """On a CPU (no Triton interpreter) each norm runs as released and applies the SiLU its module no longer does,
    and the upsampling skips its float32 round trip: in bf16 the same operations, the same bits; the VAE is as it
    was after the context."""
    vae = copy.deepcopy(vae64).to(torch.bfloat16)
    image = (torch.rand(1, 3, 64, 64, generator=torch.Generator().manual_seed(2)) * 2 - 1).to(torch.bfloat16)
    activations = {module: module.nonlinearity for module in vae.modules() if hasattr(module, "nonlinearity")}
    with torch.no_grad(), vae_frames.image_convolutions(vae):
        expected = vae.decode(vae.encode(image))
        with vae_frames.fused_norms(vae) as count:
            fused = vae.decode(vae.encode(image))
            assert all(isinstance(module.nonlinearity, torch.nn.Identity) for module in activations)
    assert count > 0 and torch.equal(fused, expected)
    assert all(module.nonlinearity is activation for module, activation in activations.items())
    assert not any("forward" in vars(module) for module in vae.modules())


def test_fused_norms_need_a_gpu_and_say_why():
    available = registry.options("cpu")["vae"]
    assert available["image"].ok and not available["image-fused"].ok and "CUDA" in available["image-fused"].reason


FUSED_CHECK = """
import copy, torch
from ghostedit.engine import Engine
from ghostedit.optimize import vae_frames
vae_frames.KERNEL_DEVICES = ("cuda", "cpu")   # Triton's interpreter runs the kernel on the CPU
import sys
model, channels, block = sys.argv[1], int(sys.argv[2]), sys.argv[3]
vae = Engine(model, device="cpu").load().vae
vae = copy.deepcopy(getattr(vae, "vae", vae)).float()
image = torch.rand(1, channels, 64, 96, generator=torch.Generator().manual_seed(0)) * 2 - 1
residuals = []
bias_residual = vae_frames.bias_residual
vae_frames.bias_residual = lambda *args: residuals.append(1) or bias_residual(*args)
calls = []
normalize = torch.nn.functional.normalize
torch.nn.functional.normalize = lambda *a, **k: calls.append(1) or normalize(*a, **k)
with torch.no_grad(), vae_frames.image_convolutions(vae):
    latents = vae.encode(image)
    decoded = vae.decode(latents)
    released_calls = len(calls)
    with vae_frames.fused_norms(vae):
        fused_latents = vae.encode(image)
        fused_decoded = vae.decode(fused_latents)
assert released_calls > 0 and len(calls) == released_calls, (released_calls, len(calls))
blocks = sum(1 for module in vae.modules() if type(module).__name__ == block)
assert len(residuals) == blocks > 0, (len(residuals), blocks)   # each block once: its biases folded into the kernels
for fused, expected in ((fused_latents, latents), (fused_decoded, decoded)):
    error = float((fused - expected).norm() / expected.norm())
    assert error < 1e-5, error
print("ok")
"""


@pytest.mark.parametrize("model, channels, block", [("tiny", 3, "QwenImageResidualBlock"),
                                                    ("tiny-2.1", 4, "QwenImage21ResidualBlock")])
def test_the_fused_norm_kernel_computes_the_released_norm_and_silu_in_tritons_interpreter(model, channels, block):
    """The tiny VAE in float32 (the interpreter truncates conversions to bf16, so float32 shows the arithmetic), the
    Edit model's and Qwen-Image-2.1's (RGBA): encoding and decoding with every norm in the kernel, none through the
    released code, and every residual block's convolution biases added by the kernels after them, agree with the
    released VAE to float32 rounding."""
    assert run_interpreted(FUSED_CHECK, model, str(channels), block, timeout=600).strip().endswith("ok")


def test_the_vae_input_has_the_bits_of_the_references_float32_preprocessing():
    """exact.to_tensor looks the pixels up on the device; the reference computes x / 255 * 2 - 1 in float32."""
    pixels = np.random.default_rng(0).integers(0, 256, (48, 64, 3), dtype=np.uint8)
    reference = torch.from_numpy(pixels.astype(np.float32) / 255.0 * 2.0 - 1.0).permute(2, 0, 1).unsqueeze(0)
    for dtype in (torch.float32, torch.bfloat16):
        assert torch.equal(exact.to_tensor(torch.from_numpy(pixels), dtype), reference.to(dtype))


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
