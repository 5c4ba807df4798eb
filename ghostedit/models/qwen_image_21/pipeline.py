"""DiffSynth's QwenImage21Pipeline made to compute as the model's reference, diffusers' QwenImage21Pipeline, on
GhostEdit's own DiT (dit.py).

DiffSynth's units are kept where they compute what diffusers computes: the prompt embedder (the 2.1 template, the
images composited over white for the vision tower, `mm_token_type_ids`, the hidden state before the text encoder's
final norm), the noise (the same draw), the size check. GhostEdit's own where DiffSynth 2.1.12 differs:
- each reference image is resized once from its original to the family's area (diffusers: `output_resolution`
  squared, 1024x1024, whatever the output size), where DiffSynth resizes to the output's area (raised to the
  processor's smallest), and kept RGBA for the VAE (EditImageEmbedder);
- the schedule is computed from the folder's scheduler config as diffusers' FlowMatchEulerDiscreteScheduler
  computes it, Turbo's `sample_sigmas` shifted by it as diffusers shifts them (DiffSynth uses its "Qwen-Image"
  template, and Turbo's sigmas as given) (Schedule);
- the 8-bit output is rounded, not truncated, and keeps its alpha channel (ExactPipeline21.vae_output_to_image);
- true CFG combines as diffusers does, linearly (models/guidance.py's `linear_guided`, which CFG parallel's ranks
  run too);
- the prefix cache is GhostEdit's own (models/seams.py's PrefixKVCache, one per call, its CFG branches told apart by
  step; its tensors kept with the run's CUDA graphs where it has them), on unless the call says off; the run's DiT
  options (`dit_options`) travel with the pipeline's inputs.
"""
from __future__ import annotations

import numpy as np
import torch
from diffsynth.pipelines.qwen_image_21 import (QwenImage21Pipeline, QwenImage21Unit_EditImageEmbedder,
                                               QwenImage21Unit_KVCacheInitializer, patchify, unpatchify)
from PIL import Image

from ..exact import ReferenceSchedule, condition_images, to_tensor
from ..family import Family
from ..guidance import ReferenceGuidance, linear_guided
from .dit import layout, step_forward
from ..seams import DitOptions, PrefixKVCache

# diffusers' FlowMatchEulerDiscreteScheduler defaults, for keys a scheduler config leaves out
SCHEDULER_DEFAULTS = {"base_image_seq_len": 256, "max_image_seq_len": 4096, "base_shift": 0.5, "max_shift": 1.15,
                      "shift": 1.0, "shift_terminal": None, "use_dynamic_shifting": False, "num_train_timesteps": 1000}


class EditImageEmbedder(QwenImage21Unit_EditImageEmbedder):
    """The reference images, each resized once from its original to the family's area (Pillow's LANCZOS, as
    diffusers' VaeImageProcessor), encoded by the VAE with all four channels; the same images go on to the prompt
    embedder, which composites them over white for the vision tower."""

    def __init__(self, family: Family):
        super().__init__()
        self.family = family

    def process(self, pipe, edit_image, height, width, tiled, tile_size, tile_stride):
        if not edit_image:
            return {"edit_image": None}
        images = condition_images(self.family, [image.convert("RGBA") for image in edit_image])
        pipe.load_models_to_device(self.onload_model_names)
        latents = [pipe.vae.encode(to_tensor(torch.from_numpy(np.array(image)).to(pipe.device), pipe.torch_dtype),
                                   tiled=tiled, tile_size=tile_size, tile_stride=tile_stride) for image in images]
        return {"edit_image": images, "edit_latents": latents}


class PrefixCacheUnit(QwenImage21Unit_KVCacheInitializer):
    """The run's prefix KV cache (its CFG branches told apart by step), or none when `use_kv_cache` is off; and the
    Layout of the joint sequence of each CFG branch whose prompt this process encoded (under CFG parallel, its
    rank's branch alone), the same at every step."""

    def process(self, pipe, inputs_shared, inputs_posi, inputs_nega):
        options = inputs_shared["options"]
        if inputs_shared["use_kv_cache"]:
            kept = None if options.graphs is None else options.graphs.kept
            inputs_shared["options"] = options.replace(prefix_cache=PrefixKVCache(kept))
        latents = inputs_shared["latents"]
        img_shapes = [*[(1, edit.shape[2], edit.shape[3]) for edit in inputs_shared.get("edit_latents") or []],
                      (1, latents.shape[2], latents.shape[3])]
        for inputs in (inputs_posi, inputs_nega) if inputs_shared["cfg_scale"] != 1 else (inputs_posi,):
            if "edit_image_pad_mask" not in inputs:  # the branch another CFG-parallel rank encodes and runs
                continue
            slots = inputs["edit_image_pad_mask"]
            image_mask = torch.cat([slots, slots.new_ones(slots.shape[0], img_shapes[-1][1] * img_shapes[-1][2] // 4)],
                                   dim=1)
            inputs["dit_layout"] = layout(image_mask, img_shapes, inputs["prompt_embeds_mask"], pipe.dit.rope,
                                          pipe.device, options)
        return inputs_shared, inputs_posi, inputs_nega


def model_fn(dit, latents, timestep, prompt_embeds, dit_layout, edit_latents=None, options=DitOptions(),
             progress_id=0, count_tokens=None, **kwargs):
    """One DiT forward as diffusers' pipeline makes it: the references' latent tokens before the target's, t / 1000
    in the latents' dtype, at step `progress_id` (dit.py's step_forward: the prefix cache, CUDA graphs).
    `count_tokens`: called with the number of tokens this forward computed (the target's alone from the cache)."""
    height, width = latents.shape[2], latents.shape[3]
    tokens = torch.cat([*[patchify(edit) for edit in edit_latents or []], patchify(latents)], dim=1)
    prediction, computed = step_forward(dit, tokens, prompt_embeds, timestep.to(latents.dtype) / 1000, dit_layout,
                                        progress_id, options)
    if count_tokens is not None:
        count_tokens(computed)
    return unpatchify(prediction, height, width)


class ExactPipeline21(ReferenceGuidance, QwenImage21Pipeline):
    """DiffSynth's QwenImage21Pipeline with the family's units and schedule, GhostEdit's DiT and prefix cache, and
    the reference's true CFG and rounding."""

    family: Family | None = None
    guidance = staticmethod(linear_guided)

    def use_family(self, family: Family) -> None:
        self.family = family
        self.use_schedule(family.schedule)
        swaps = {QwenImage21Unit_EditImageEmbedder: EditImageEmbedder, QwenImage21Unit_KVCacheInitializer:
                 lambda family: PrefixCacheUnit()}
        self.units = [swaps[type(unit)](family) if type(unit) in swaps else unit for unit in self.units]
        self.model_fn = model_fn

    def use_schedule(self, config: dict) -> None:
        """The sampling schedule of a scheduler config (diffusers' defaults for the keys it leaves out)."""
        self.scheduler = ReferenceSchedule({**SCHEDULER_DEFAULTS, **config})

    @torch.no_grad()
    def __call__(self, prompt: str, negative_prompt: str = "", cfg_scale: float = 1.0, edit_image=None,
                 height: int = 1024, width: int = 1024, seed: int = 0, num_inference_steps: int = 40,
                 sigmas: list[float] | None = None, dit_options: DitOptions = DitOptions(), prefix_cache: bool = True,
                 count_tokens=None, progress_bar_cmd=lambda steps: steps):
        """One image: text-to-image without `edit_image`, else guided by up to the family's number of references.
        `sigmas`: a schedule of its own (else the family's `sample_sigmas`, else N steps); `prefix_cache`: the
        prefix KV cache on; `count_tokens`: called with the tokens each DiT forward computed."""
        inputs_posi = {"prompt": prompt}
        inputs_nega = {"negative_prompt": negative_prompt}
        inputs_shared = {"cfg_scale": cfg_scale, "edit_image": list(edit_image) if edit_image else None,
                         "controlnet_inputs": None, "height": height, "width": width, "seed": seed,
                         "rand_device": "cpu", "tiled": False, "tile_size": 256, "tile_stride": 192,
                         "use_kv_cache": prefix_cache, "options": dit_options,
                         "count_tokens": count_tokens}
        for unit in self.units:
            inputs_shared, inputs_posi, inputs_nega = self.unit_runner(unit, self, inputs_shared, inputs_posi,
                                                                       inputs_nega)
        sigmas = sigmas if sigmas is not None else self.family.sample_sigmas
        latents = inputs_shared["latents"]
        self.scheduler.set_timesteps(num_inference_steps, dynamic_shift_len=latents.shape[2] * latents.shape[3],
                                     sigmas=None if sigmas is None else list(sigmas))
        self.load_models_to_device(self.in_iteration_models)
        for progress_id, timestep in enumerate(progress_bar_cmd(self.scheduler.timesteps)):
            timestep = timestep.reshape(1).to(dtype=self.torch_dtype, device=self.device)
            noise_pred = self.cfg_guided_model_fn(self.model_fn, cfg_scale, inputs_shared, inputs_posi, inputs_nega,
                                                  dit=self.dit, timestep=timestep, progress_id=progress_id)
            inputs_shared["latents"] = self.step(self.scheduler, progress_id=progress_id, noise_pred=noise_pred,
                                                 **inputs_shared)
        self.load_models_to_device(["vae"])
        image = self.vae.decode(inputs_shared["latents"])
        self.load_models_to_device([])
        return self.vae_output_to_image(image)

    def vae_output_to_image(self, vae_output, pattern="B C H W"):
        """8-bit RGBA, rounded, as diffusers' postprocessing: [-1, 1] to [0, 1] in the VAE's dtype, then x 255 and
        rounded in float32."""
        image = (vae_output[0] * 0.5 + 0.5).clamp(0, 1).float()
        pixels = (image * 255).round().to(torch.uint8).permute(1, 2, 0).contiguous()
        return Image.fromarray(pixels.cpu().numpy(), "RGBA")
