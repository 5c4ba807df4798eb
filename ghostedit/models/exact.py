"""DiffSynth's Qwen-Image pipeline made to compute an edit exactly as the model's reference (diffusers'
QwenImageEditPipeline / QwenImageEditPlusPipeline, the text encoder as released on transformers 4.x) computes it.

Where DiffSynth 2.1.12 differs, and where each is fixed (tests/test_reference.py holds every stage against diffusers):
- the text encoder's image tokens need `mm_token_type_ids` for their 3-D rotary positions on transformers 5
  (PromptEmbedder, below);
- each input image is resized once from the original for each encoder, by the family's rule (EditImageEmbedder);
- true CFG rescales the combined prediction to the norm of the conditional one, per token (ExactPipeline);
- the 8-bit output is rounded, not truncated (ExactPipeline);
- the DiT's MLP activation is GELU with the tanh approximation, the VAE's RMS norm is computed in float32 (module
  patches listed in diffsynth_patches.py, installed by `install_module_patches` before any model is built);
- 2511's `zero_cond_t` comes from the transformer config (passed by the runner from the family).
"""
from __future__ import annotations

import numpy as np
import torch
from diffsynth.models import qwen_image_dit, qwen_image_vae
from diffsynth.pipelines.qwen_image import (QwenImagePipeline, QwenImageUnit_EditImageEmbedder,
                                            QwenImageUnit_PromptEmbedder)
from einops import rearrange
from PIL import Image

from ..diffsynth_patches import replace
from .family import EDIT_PLUS_TEMPLATE, Family, dimensions

SYSTEM = ("<|im_start|>system\nDescribe the key features of the input image (color, shape, size, texture, objects, "
          "background), then explain how the user's text instruction should alter or modify the image. Generate a new "
          "image that meets the user's requirements while maintaining consistency with the original input where "
          "appropriate.<|im_end|>\n<|im_start|>user\n{}<|im_end|>\n<|im_start|>assistant\n")
IMAGE_TOKENS = "<|vision_start|><|image_pad|><|vision_end|>"
DROP_TOKENS = 64  # the system part of the template, left out of the prompt embedding (as the reference does)


# ---- module patches: the model's own functions ----

class TanhGELU(qwen_image_dit.ApproximateGELU):
    """The DiT's MLP activation as trained: GELU, tanh approximation (DiffSynth: x * sigmoid(1.702 x))."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.gelu(self.proj(x), approximate="tanh")


class Float32RMSNorm(qwen_image_vae.QwenImageRMS_norm):
    """The VAE's RMS norm normalizing in float32 whatever the dtype, as the reference's does."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dim = 1 if self.channel_first else -1
        return torch.nn.functional.normalize(x.float(), dim=dim).to(x.dtype) * self.scale * self.gamma + self.bias


def install_module_patches() -> None:
    """Idempotent; before any DiT or VAE is built (their constructors look the classes up in their modules)."""
    replace("DiT MLP activation", TanhGELU)
    replace("VAE RMS norm", Float32RMSNorm)


# ---- images ----

def resized(image: Image.Image, area: int) -> Image.Image:
    """The image at the reference's size for `area` (aspect ratio kept, sides multiples of 32), LANCZOS as
    diffusers' VaeImageProcessor resizes."""
    size = dimensions(area, image.size[0] / image.size[1])
    return image.resize(size, Image.LANCZOS, reducing_gap=None)


def condition_images(family: Family, images: list[Image.Image]) -> list[Image.Image]:
    """What the VAE encodes as the DiT's condition, each from its original."""
    return [resized(image, family.condition.vae_area) for image in images]


def to_tensor(image: Image.Image, dtype: torch.dtype, device) -> torch.Tensor:
    """[-1, 1], computed in float32 as the reference's preprocessing is, then cast."""
    array = np.asarray(image, dtype=np.float32) / 255.0 * 2.0 - 1.0
    return torch.from_numpy(array).permute(2, 0, 1).unsqueeze(0).to(device=device, dtype=dtype)


# ---- pipeline units ----

class EditImageEmbedder(QwenImageUnit_EditImageEmbedder):
    """The condition latents (each image resized once to the family's VAE area) and, as `edit_image` for the
    prompt embedder, what the text encoder sees (resized once from the original to the VL area, or the VAE's image
    where the family has none)."""

    def __init__(self, family: Family):
        super().__init__()
        self.family = family

    def process(self, pipe, edit_image, tiled, tile_size, tile_stride, edit_image_auto_resize=False):
        if edit_image is None:
            return {}
        pipe.load_models_to_device(self.onload_model_names)
        images = edit_image if isinstance(edit_image, list) else [edit_image]
        vae_images = condition_images(self.family, images)
        latents = [pipe.vae.encode(to_tensor(image, pipe.torch_dtype, pipe.device), tiled=tiled, tile_size=tile_size,
                                   tile_stride=tile_stride) for image in vae_images]
        vl_area = self.family.condition.vl_area
        vl_images = vae_images if vl_area is None else [resized(image, vl_area) for image in images]
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
            mm_token_type_ids=inputs["mm_token_type_ids"], output_hidden_states=True)[-1]
        (embedding,) = [e[DROP_TOKENS:] for e in self.extract_masked_hidden(hidden_states, inputs["attention_mask"])]
        embedding = embedding.unsqueeze(0).to(dtype=pipe.torch_dtype, device=pipe.device)
        mask = torch.ones(embedding.shape[:2], dtype=torch.long, device=pipe.device)
        return {"prompt_emb": embedding, "prompt_emb_mask": mask}


# ---- the pipeline ----

def guided(positive: torch.Tensor, negative: torch.Tensor, scale: float) -> torch.Tensor:
    """True CFG as the reference computes it: the combination rescaled, per DiT token (2x2 latent patch, all
    channels), to the norm of the conditional prediction."""
    combined = negative + scale * (positive - negative)
    tokens = "B C (H P) (W Q) -> B H W (C P Q)"
    positive_norm = rearrange(positive, tokens, P=2, Q=2).norm(dim=-1, keepdim=True)
    combined_tokens = rearrange(combined, tokens, P=2, Q=2)
    rescaled = combined_tokens * (positive_norm / combined_tokens.norm(dim=-1, keepdim=True))
    return rearrange(rescaled, "B H W (C P Q) -> B C (H P) (W Q)", P=2, Q=2)


class ExactPipeline(QwenImagePipeline):
    """DiffSynth's QwenImagePipeline with the family's units, the reference's true CFG and its rounding."""

    family: Family | None = None

    def use_family(self, family: Family) -> None:
        self.family = family
        swaps = {QwenImageUnit_EditImageEmbedder: EditImageEmbedder, QwenImageUnit_PromptEmbedder: PromptEmbedder}
        self.units = [swaps[type(unit)](family) if type(unit) in swaps else unit for unit in self.units]

    def cfg_guided_model_fn(self, model_fn, cfg_scale, inputs_shared, inputs_posi, inputs_nega, **inputs_others):
        positive = model_fn(**inputs_posi, **inputs_shared, **inputs_others)
        if cfg_scale == 1.0:
            return positive
        negative = model_fn(**inputs_nega, **inputs_shared, **inputs_others)
        return guided(positive, negative, cfg_scale)

    def vae_output_to_image(self, vae_output, pattern="B C H W"):
        image = (vae_output[0].float() * 0.5 + 0.5).clamp(0, 1)  # as diffusers' postprocessing, for [-1, 1]
        array = (image.permute(1, 2, 0).cpu().numpy() * 255).round().astype(np.uint8)
        return Image.fromarray(array)
