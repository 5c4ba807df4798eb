"""DiffSynth's Qwen-Image pipeline made to compute an edit exactly as the model's reference (diffusers'
QwenImageEditPipeline / QwenImageEditPlusPipeline, the text encoder as released on transformers 4.x) computes it.

Where DiffSynth 2.1.12 differs, and where each is fixed (tests/engine/test_reference.py holds every stage against
diffusers):
- the text encoder's image tokens need `mm_token_type_ids` for their 3-D rotary positions on transformers 5
  (PromptEmbedder, below);
- each input image is resized once from the original for each encoder, by the family's rule (EditImageEmbedder);
- true CFG rescales the combined prediction to the norm of the conditional one, per token (ExactPipeline);
- the 8-bit output is rounded, not truncated (ExactPipeline);
- the DiT is GhostEdit's own (models/qwen_image/dit.py: its MLP activation is GELU with the tanh approximation);
  the VAE's RMS norm is computed in float32 (ReferenceScaledVAE's norms are Float32RMSNorm);
- in bf16: the text encoder's rotary frequencies stay float32 (`float32_rotary`, applied by
  models/loading.py) and the VAE normalizes its latents as the reference does (ReferenceScaledVAE, the
  class GhostEdit's model table entries name);
- the schedule's sigmas and the Euler step are computed as diffusers' scheduler computes them (ReferenceSchedule);
- 2511's `zero_cond_t` comes from the transformer config (passed by the runner from the family).

An edit that starts from its first image (a mask, a strength below 1) is computed as diffusers'
QwenImageEditInpaintPipeline computes one (Start, StartEmbedder, ExactPipeline.step): see Start.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np
import torch
from diffsynth.diffusion import FlowMatchScheduler
from diffsynth.models import qwen_image_vae
from diffsynth.pipelines.qwen_image import (QwenImagePipeline, QwenImageUnit_EditImageEmbedder,
                                            QwenImageUnit_InputImageEmbedder, QwenImageUnit_NoiseInitializer,
                                            QwenImageUnit_PromptEmbedder)
from PIL import Image

from .. import masks, pillow_resize
from ..errors import InvalidRequestError
from ..images import fit
from .family import EDIT_PLUS_TEMPLATE, Family, dimensions
from .guidance import ReferenceGuidance
from .qwen_image import dit

SYSTEM = ("<|im_start|>system\nDescribe the key features of the input image (color, shape, size, texture, objects, "
          "background), then explain how the user's text instruction should alter or modify the image. Generate a new "
          "image that meets the user's requirements while maintaining consistency with the original input where "
          "appropriate.<|im_end|>\n<|im_start|>user\n{}<|im_end|>\n<|im_start|>assistant\n")
IMAGE_TOKENS = "<|vision_start|><|image_pad|><|vision_end|>"
DROP_TOKENS = 64  # the system part of the template, left out of the prompt embedding (as the reference does)


# ---- the VAE as the reference computes it ----

class Float32RMSNorm(qwen_image_vae.QwenImageRMS_norm):
    """The VAE's RMS norm normalizing in float32 whatever the dtype, as the reference's does."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dim = 1 if self.channel_first else -1
        return torch.nn.functional.normalize(x.float(), dim=dim).to(x.dtype) * self.scale * self.gamma + self.bias


class ReferenceScaledVAE(qwen_image_vae.QwenImageVAE):
    """The VAE's latent normalization as the reference computes it in the VAE's dtype: encoding divides by the
    std, decoding divides by 1 / std rounded to that dtype (DiffSynth multiplies by 1 / std kept from float32; in
    bf16 the condition latents differ by 4e-3 relative); its RMS norms normalize in float32 (Float32RMSNorm)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        for module in self.modules():
            if type(module) is qwen_image_vae.QwenImageRMS_norm:
                module.__class__ = Float32RMSNorm

    def _statistics(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return _latent_statistics(self.z_dim, x.device, x.dtype)

    def encode(self, x, tiled=False, tile_size=128, tile_stride=64, **kwargs):
        if tiled:
            return super().encode(x, tiled=True, tile_size=tile_size, tile_stride=tile_stride, **kwargs)
        x = self.quant_conv(self.encoder(x.unsqueeze(2)))[:, :self.z_dim]
        mean, std = self._statistics(x)
        return ((x - mean) / std).squeeze(2)

    def encode_sample(self, x: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
        """`x` encoded as diffusers' inpaint and img2img pipelines encode their image: a sample of the VAE's
        posterior (mean + std x `noise`), normalized by multiplying by 1 / std (computed in float32, then cast)."""
        moments = self.quant_conv(self.encoder(x.unsqueeze(2)))
        mean, log_variance = moments[:, :self.z_dim], moments[:, self.z_dim:]
        sample = mean + torch.exp(0.5 * log_variance.clamp(-30.0, 20.0)) * noise.unsqueeze(2)
        latents_mean, _ = self._statistics(sample)
        return ((sample - latents_mean) * _reciprocal_std(self.z_dim, sample.device, sample.dtype)).squeeze(2)

    def decode(self, x, tiled=False, tile_size=128, tile_stride=64, **kwargs):
        if tiled:
            return super().decode(x, tiled=True, tile_size=tile_size, tile_stride=tile_stride, **kwargs)
        x = x.unsqueeze(2)
        mean, std = self._statistics(x)
        x = x / (1.0 / std) + mean
        return self.decoder(self.post_quant_conv(x)).squeeze(2)


@functools.cache
def _latent_statistics(z_dim: int, device: torch.device, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """The latents' mean and std, [1, z_dim, 1, 1, 1], made once per device and dtype: a copy to the GPU at every
    encode and decode waited there for the work queued before it."""
    shape = (1, z_dim, 1, 1, 1)
    return tuple(torch.tensor(values).view(shape).to(device=device, dtype=dtype)
                 for values in (LATENTS_MEAN, LATENTS_STD))


@functools.cache
def _reciprocal_std(z_dim: int, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    return (1.0 / torch.tensor(LATENTS_STD)).view(1, z_dim, 1, 1, 1).to(device=device, dtype=dtype)


def class_path(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def float32_rotary(text_encoder: torch.nn.Module) -> None:
    """The text encoder's rotary frequencies back in float32 after a cast to bf16, as transformers loads them
    (DiffSynth casts the whole model, buffers included: the positions of a long prompt lose precision)."""
    for module in text_encoder.modules():
        if isinstance(getattr(module, "inv_freq", None), torch.Tensor) and hasattr(module, "config"):
            with torch.device("cpu"):
                fresh = type(module)(module.config)
            for name in ("inv_freq", "original_inv_freq"):
                buffer = getattr(module, name)
                setattr(module, name, getattr(fresh, name).to(device=buffer.device, dtype=torch.float32))


# As in Qwen-Image's vae/config.json (and DiffSynth's QwenImageVAE, which keeps the mean and 1 / the std)
LATENTS_MEAN = [-0.7571, -0.7089, -0.9113, 0.1075, -0.1745, 0.9653, -0.1517, 1.5508, 0.4134, -0.0715, 0.5517, -0.3632,
                -0.1922, -0.9497, 0.2503, -0.2921]
LATENTS_STD = [2.8184, 1.4541, 2.3275, 2.6558, 1.2196, 1.7708, 2.6052, 2.0743, 3.2687, 2.1526, 2.8652, 1.5579, 1.6382,
               1.1253, 2.8251, 1.9160]


# ---- images ----

def size_for(image: Image.Image, area: int) -> tuple[int, int]:
    """The reference's size of `image` for `area`: aspect ratio kept, sides multiples of 32."""
    return dimensions(area, image.size[0] / image.size[1])


def resized(image: Image.Image, area: int) -> Image.Image:
    """The image at size_for `area`, LANCZOS as diffusers' VaeImageProcessor resizes."""
    return fit(image, size_for(image, area))


def condition_images(family: Family, images: list[Image.Image]) -> list[Image.Image]:
    """What the VAE encodes as the DiT's condition, each from its original."""
    return [resized(image, family.condition.vae_area) for image in images]


def condition_sizes(family: Family, images: list[Image.Image],
                    start_size: tuple[int, int] | None = None) -> list[tuple[int, int]]:
    """The sizes of condition_images, without resizing; `start_size`: the output's, where the edit starts from
    the first image (its condition is the image it starts from: Start)."""
    sizes = [size_for(image, family.condition.vae_area) for image in images]
    return sizes if start_size is None else [start_size, *sizes[1:]]


def condition_pixels(family: Family, image: Image.Image, device) -> torch.Tensor:
    """condition_images' image as 8-bit [H, W, 3] pixels on the device, resized there with Pillow's arithmetic
    (pillow_resize.py): the same bits, without the GPU waiting for Pillow on the CPU."""
    return pillow_resize.resize(image, size_for(image, family.condition.vae_area), device)


def to_tensor(pixels: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """[-1, 1] from 8-bit [H, W, 3] pixels, as the reference's preprocessing computes it in float32, then cast. The
    pixels are looked up on their device in a table of the 256 values that formula gives: no float pass on the
    CPU, and the same bits (a division on the device may round otherwise)."""
    return _unit_range(str(pixels.device))[pixels.long()].permute(2, 0, 1).unsqueeze(0).to(dtype)


@functools.cache
def _unit_range(device: str) -> torch.Tensor:
    return torch.from_numpy(np.arange(256, dtype=np.float32) / 255.0 * 2.0 - 1.0).to(device)


# ---- an edit that starts from its first image: strength and mask ----

@dataclass(frozen=True)
class Start:
    """An edit that starts from its first input image, computed as diffusers' QwenImageEditInpaintPipeline (0.42.1)
    computes one, and the same rule for any family and number of images:
    - the first image, resized to the output's size (cropped around the mask first, with `padding_mask_crop`), is
      encoded as a sample of the VAE's posterior whose noise the seed's generator draws before the edit's noise
      (StartEmbedder); those latents are the first image's condition for the DiT too (the reference's condition
      is its start image: the output's size, cropped with it), while the text encoder sees the image as the family
      resizes it, uncropped;
    - `strength` s of n steps starts at step int(n - s n) from those latents noised to that step's sigma
      (ReferenceSchedule, StartEmbedder): 1 starts from the noise alone;
    - with a mask (white = change), after every step the latents outside it are set back to the start's latents
      noised to the next step's sigma, and to the start's own after the last (ExactPipeline.step);
    - with `padding_mask_crop` the model edits the crop only and the result is laid over the first image through
      the mask, as the reference's overlay does; `paste_back` does the same without a crop (Start.finished).
    The reference takes one image and makes an output of its size; GhostEdit takes 1 to 3 images and any output
    size (the mask and the first image are resized to it): the edited image is the first."""
    image: Image.Image                  # the first input image, as loaded
    size: tuple[int, int]               # the output's (width, height)
    mask: Image.Image | None            # at the output's size, white = change; None: strength alone
    crop: tuple[int, int, int, int] | None
    paste_back: bool

    @classmethod
    def of(cls, request, size: tuple[int, int]) -> "Start | None":
        """The start of `request` (config.EditRequest) at the output's size; None for a plain edit."""
        if not request.starts_from_image:
            return None
        mask = None if request.mask is None else masks.at_size(request.mask, size)
        crop = None if request.padding_mask_crop is None else masks.crop_region(mask, *size,
                                                                                request.padding_mask_crop)
        return cls(request.images[0], size, mask, crop, request.paste_back or crop is not None)

    @functools.cached_property
    def original(self) -> Image.Image:
        """The first image at the output's size (LANCZOS, as the reference resizes it)."""
        return fit(self.image, self.size)

    def pixels(self, device) -> torch.Tensor:
        """What the VAE encodes, as 8-bit [H, W, 3] pixels on the device."""
        if self.crop is None:
            return pillow_resize.resize(self.image, self.size, device)
        return torch.from_numpy(np.array(masks.cropped(self.original, self.crop, self.size))).to(device)

    def finished(self, image: Image.Image) -> Image.Image:
        """The decoded edit, laid over the first image through the mask where asked (or cropped)."""
        return masks.overlay(self.mask, self.original, image, self.crop) if self.paste_back else image


@dataclass(frozen=True)
class Inpainting:
    """What the denoising loop keeps outside the mask: the start's latents (and the mask on the latents' grid, 1 =
    change; None: strength alone). One object, not tensors, among DiffSynth's inputs: the DiT's calls take those
    inputs and their shapes, which stay those of a plain edit."""
    latents: torch.Tensor
    mask: torch.Tensor | None


# ---- pipeline units ----

class NoiseInitializer(QwenImageUnit_NoiseInitializer):
    """DiffSynth's noise, but for an edit that starts from its first image, whose noise StartEmbedder draws after
    the sample of the VAE's posterior, as the reference draws them from one generator."""

    def __init__(self):
        super().__init__()
        self.input_params = (*self.input_params, "input_image")

    def process(self, pipe, height, width, seed, rand_device, layer_num, input_image=None):
        if input_image is not None:
            return {}
        return super().process(pipe, height, width, seed, rand_device, layer_num)


class StartEmbedder(QwenImageUnit_InputImageEmbedder):
    """The latents the denoising starts from: the noise for a plain edit (as DiffSynth's unit), and for a Start
    what the reference's prepare_latents and prepare_mask_latents compute (Start says what)."""

    def __init__(self):
        super().__init__()
        self.input_params = ("input_image", "noise", "seed", "rand_device", "height", "width")
        self.output_params = ("latents", "noise", "inpainting")

    def process(self, pipe, input_image, noise, seed, rand_device, height, width):
        if input_image is None:
            return {"latents": noise, "input_latents": None}
        pipe.load_models_to_device(self.onload_model_names)
        generator = torch.Generator(rand_device).manual_seed(seed)
        shape = (1, len(LATENTS_MEAN), height // 8, width // 8)
        vae_dtype = next(pipe.vae.parameters()).dtype  # the reference draws the posterior's noise in the VAE's
        posterior, noise = (torch.randn(shape, generator=generator, device=rand_device, dtype=dtype).to(pipe.device)
                            for dtype in (vae_dtype, pipe.torch_dtype))
        latents = pipe.vae.encode_sample(to_tensor(input_image.pixels(pipe.device), pipe.torch_dtype), posterior)
        mask = None if input_image.mask is None else masks.latent_mask(
            input_image.mask, input_image.crop, (width // 8, height // 8), pipe.device, pipe.torch_dtype)
        return {"noise": noise, "latents": pipe.scheduler.noised(latents, noise, 0),
                "inpainting": Inpainting(latents, mask)}


class EditImageEmbedder(QwenImageUnit_EditImageEmbedder):
    """The condition latents (each image resized once to the family's VAE area, on the device; the first one the
    latents the edit starts from, where it starts from it: Start) and, as `edit_image` for the prompt embedder, what
    the text encoder sees (resized once from the original to the VL area, or to the VAE's size where the family has
    none)."""

    def __init__(self, family: Family):
        super().__init__()
        self.family = family
        self.input_params = (*self.input_params, "inpainting")

    def process(self, pipe, edit_image, tiled, tile_size, tile_stride, edit_image_auto_resize=False,
                inpainting=None):
        if edit_image is None:
            return {}
        pipe.load_models_to_device(self.onload_model_names)
        images = edit_image if isinstance(edit_image, list) else [edit_image]
        latents = [inpainting.latents if index == 0 and inpainting is not None else
                   pipe.vae.encode(to_tensor(condition_pixels(self.family, image, pipe.device), pipe.torch_dtype),
                                   tiled=tiled, tile_size=tile_size, tile_stride=tile_stride)
                   for index, image in enumerate(images)]
        # on the CPU while the VAE encodes: the text encoder's processor takes Pillow images
        vl_images = condition_images(self.family, images) if self.family.condition.vl_area is None else \
            [resized(image, self.family.condition.vl_area) for image in images]
        return {"edit_latents": latents, "edit_image": vl_images}


class PromptEmbedder(QwenImageUnit_PromptEmbedder):
    """The family's template with the images, through the text encoder with `mm_token_type_ids`: on transformers 5
    that is what gives the image tokens the 3-D rotary positions the model was trained with (transformers 4.x)."""

    def __init__(self, family: Family):
        super().__init__()
        self.family = family

    def text(self, prompt: str, count: int) -> str:
        if self.family.template == EDIT_PLUS_TEMPLATE:
            return SYSTEM.format("".join(f"Picture {i}: {IMAGE_TOKENS}" for i in range(1, count + 1)) + prompt)
        return SYSTEM.format(IMAGE_TOKENS + prompt)

    def process(self, pipe, prompt, edit_image=None) -> dict:
        if edit_image is None:
            raise ValueError("an edit needs at least one input image")
        pipe.load_models_to_device(self.onload_model_names)
        images = edit_image if isinstance(edit_image, list) else [edit_image]
        inputs = pipe.processor(text=[self.text(prompt, len(images))], images=images, padding=True,
                                return_tensors="pt").to(pipe.device)
        hidden_states = pipe.text_encoder(
            input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"],
            pixel_values=inputs["pixel_values"], image_grid_thw=inputs["image_grid_thw"],
            mm_token_type_ids=inputs["mm_token_type_ids"], output_hidden_states=True, use_cache=False)[-1]
        (embedding,) = [e[DROP_TOKENS:] for e in self.extract_masked_hidden(hidden_states, inputs["attention_mask"])]
        embedding = embedding.unsqueeze(0).to(dtype=pipe.torch_dtype, device=pipe.device)
        mask = torch.ones(embedding.shape[:2], dtype=torch.long, device=pipe.device)
        return {"prompt_emb": embedding, "prompt_emb_mask": mask}


# ---- the schedule ----

class ReferenceSchedule(FlowMatchScheduler):
    """DiffSynth's "Qwen-Image" flow-matching schedule computed as diffusers' FlowMatchEulerDiscreteScheduler computes
    it from the repo's scheduler config (float32 numpy from a float64 linspace; DiffSynth's torch arithmetic lands
    1-2 float32 units away), and its Euler step adding in float32 as diffusers' does. Given `sigmas` (a model's fixed
    ones: Qwen-Image-2.1-Turbo's) go through the same shift; a config without dynamic shifting shifts by its `shift`."""

    def __init__(self, config: dict):
        super().__init__("Qwen-Image")
        self.config = config

    def set_timesteps(self, num_inference_steps=100, denoising_strength=1.0, training=False, dynamic_shift_len=None,
                      exponential_shift_mu=None, sigmas=None, **kwargs):
        """The schedule of `num_inference_steps` (or of the given `sigmas`), from the step `denoising_strength`
        starts at (as the reference's get_timesteps cuts it)."""
        if training or exponential_shift_mu is not None or dynamic_shift_len is None:
            raise ValueError("GhostEdit's edits use the schedule as the reference computes it")
        config = self.config
        if num_inference_steps < 2 and config["shift_terminal"]:  # the stretch below would divide zero by zero
            raise InvalidRequestError(
                f"one step cannot run on the model's schedule: it stretches the sigmas to the terminal shift "
                f"({config['shift_terminal']}), undefined for a single step (the reference's pipeline gives NaN, a "
                f"black image). Use 2 steps or more, or the Lightning schedule")
        if sigmas is None:
            sigmas = np.linspace(1.0, 1 / num_inference_steps, num_inference_steps)
        sigmas = np.array(sigmas).astype(np.float32)
        if config.get("use_dynamic_shifting", True):
            slope = (config["max_shift"] - config["base_shift"]) / (config["max_image_seq_len"]
                                                                    - config["base_image_seq_len"])
            mu = dynamic_shift_len * slope + config["base_shift"] - slope * config["base_image_seq_len"]
            sigmas = math.exp(mu) / (math.exp(mu) + (1 / sigmas - 1))
        else:
            sigmas = config["shift"] * sigmas / (1 + (config["shift"] - 1) * sigmas)
        if config["shift_terminal"]:
            one_minus = 1 - sigmas
            sigmas = 1 - one_minus / (one_minus[-1] / (1 - config["shift_terminal"]))
        start = masks.first_step(num_inference_steps, denoising_strength)
        self.sigmas = torch.from_numpy(sigmas[start:]).to(torch.float32)
        self.timesteps = self.sigmas * config["num_train_timesteps"]
        self.training = False
        self._step_sizes, self._sigmas = {}, {}

    def noised(self, sample: torch.Tensor, noise: torch.Tensor, index: int) -> torch.Tensor:
        """`sample` noised to the sigma of step `index`, as the reference's scale_noise computes it (the sigma in
        the sample's dtype)."""
        key = (sample.device, sample.dtype)
        if key not in self._sigmas:  # once per schedule: a copy at every step would make the CPU wait for the GPU
            self._sigmas[key] = self.sigmas.to(device=sample.device, dtype=sample.dtype)
        sigma = self._sigmas[key][index]
        return sigma * noise + (1.0 - sigma) * sample

    def step(self, model_output, timestep, sample, to_final=False, **kwargs):
        if isinstance(timestep, torch.Tensor):
            timestep = timestep.cpu()  # DiffSynth's loop hands the CPU's own; one on the GPU is read back
        index = int(torch.argmin((self.timesteps - timestep).abs()))
        step = self._step_sizes_on(model_output.device, to_final)[index]
        return (sample.float() + step * model_output).to(model_output.dtype)

    def _step_sizes_on(self, device, to_final: bool) -> torch.Tensor:
        """Each step's sigma difference in float32 (to the next sigma, or to 0 after the last or with `to_final`),
        copied to `device` once per schedule: a copy at every step would make the CPU wait for the GPU there."""
        key = (torch.device(device), to_final)
        if key not in self._step_sizes:
            following = torch.zeros_like(self.sigmas) if to_final else torch.cat([self.sigmas[1:], torch.zeros(1)])
            self._step_sizes[key] = (following - self.sigmas).to(device, non_blocking=True)
        return self._step_sizes[key]


# ---- the pipeline ----

class ExactPipeline(ReferenceGuidance, QwenImagePipeline):
    """DiffSynth's QwenImagePipeline with the family's units, GhostEdit's DiT forward, the reference's true CFG
    (ReferenceGuidance: rescaled, `guided`) and its rounding."""

    family: Family | None = None

    def use_family(self, family: Family) -> None:
        self.family = family
        self.model_fn = dit.model_fn   # GhostEdit's DiT forward: the engine hands it each run's options
        self.use_schedule(family.computation.scheduler)
        swaps = {QwenImageUnit_EditImageEmbedder: functools.partial(EditImageEmbedder, family),
                 QwenImageUnit_PromptEmbedder: functools.partial(PromptEmbedder, family),
                 QwenImageUnit_NoiseInitializer: NoiseInitializer, QwenImageUnit_InputImageEmbedder: StartEmbedder}
        self.units = [swaps[type(unit)]() if type(unit) in swaps else unit for unit in self.units]

    def use_schedule(self, config: dict) -> None:
        """The sampling schedule of a scheduler config, computed as diffusers computes it (ReferenceSchedule)."""
        self.scheduler = ReferenceSchedule(config)

    def step(self, scheduler, latents, progress_id, noise_pred, inpainting=None, noise=None, **inputs):
        """DiffSynth's Euler step; with a mask, the latents outside it set back to the start's noised to the next
        step's sigma (the start's own after the last), as the reference's denoising loop does."""
        latents = super().step(scheduler, latents=latents, progress_id=progress_id, noise_pred=noise_pred, **inputs)
        if inpainting is None or inpainting.mask is None:
            return latents
        kept = (inpainting.latents if progress_id == len(scheduler.timesteps) - 1
                else scheduler.noised(inpainting.latents, noise, progress_id + 1))
        return (1 - inpainting.mask) * kept + inpainting.mask * latents

    def vae_output_to_image(self, vae_output, pattern="B C H W"):
        """8-bit, rounded, as diffusers' postprocessing: [-1, 1] to [0, 1] in the VAE's dtype, then x 255 and
        rounded in float32. Computed where the output is: the bits numpy gives (one IEEE product, rounding half to
        even), and a quarter of the bytes to copy back."""
        image = (vae_output[0] * 0.5 + 0.5).clamp(0, 1).float()
        pixels = (image * 255).round().to(torch.uint8).permute(1, 2, 0).contiguous()
        return Image.fromarray(pixels.cpu().numpy())
