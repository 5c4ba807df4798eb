"""Qwen-Image-2.1's DiT forward through the engine's own preparation and run contexts, step after step as the pipeline
calls it (`step_forward`: the first step fills the prefix cache, the others read it), on inputs made here: text, then
each reference image's slots with text after them, then the target's. For tests that compare a rewrite's forward
with the one without it (tests/unit/models/test_qwen_image_21_rewrites.py)."""
from __future__ import annotations

import torch

from ghostedit.config import OptimizationConfig
from ghostedit.engine.runner import dit_run
from ghostedit.models.qwen_image_21.dit import layout, step_forward
from ghostedit.models.seams import PrefixKVCache
from ghostedit.telemetry import RunRecorder

TIMESTEPS = (0.9, 0.5, 0.2)
TEXT_BEFORE, TEXT_AFTER = 3, 2   # prompt tokens before the first image's slots and after each one


def inputs(dit, references: int, side: int = 4, device: str = "cpu", dtype=torch.float32, seed: int = 0) -> dict:
    """The text encoder sequence with `references` images' slots (one slot: 2x2 latent tokens) and the target's,
    each image `side` x `side` latent tokens; the latents of each step (the references' fixed, the target's new)."""
    generator = torch.Generator(device).manual_seed(seed)
    image_slots = side * side // 4
    flags = [False] * TEXT_BEFORE
    for _ in range(references):
        flags += [True] * image_slots + [False] * TEXT_AFTER
    flags += [True] * image_slots
    tokens = side * side

    def randn(*shape):
        return torch.randn(*shape, generator=generator, device=device).to(dtype)
    fixed = randn(1, references * tokens, dit.img_in.in_features)
    return {"image_mask": torch.tensor([flags], device=device), "shapes": [(1, side, side)] * (references + 1),
            "prompt": randn(1, len(flags) - image_slots, dit.txt_in.in_layer.in_features),
            "latents": [torch.cat([fixed, randn(1, tokens, dit.img_in.in_features)], 1) for _ in TIMESTEPS]}


def predictions(engine, text: str, given: dict, first_attention: list | None = None) -> tuple[list[torch.Tensor], dict]:
    """Each step's prediction of the configuration `text` (its prefix-cache setting too), and what the run's
    contexts said (their words); `first_attention` collects the first block's attention output at each step."""
    config = OptimizationConfig.parse(text)
    cache = config.value("prefix-cache") == "on"
    prepared, _ = engine.prepare(config)
    dit, device = prepared.dit, given["prompt"].device
    hook = None if first_attention is None else dit.blocks[0].attn.register_forward_hook(
        lambda module, arguments, output: first_attention.append(output[0].float()))
    slots = int(given["image_mask"].sum())
    length = given["image_mask"].shape[1] - slots + 4 * slots   # the joint sequence: text, and 2x2 tokens a slot
    outputs = []
    with torch.no_grad(), dit_run(prepared, config, str(device), length, RunRecorder(str(device))) as (options, ran):
        options = options.replace(prefix_cache=PrefixKVCache() if cache else None)
        layout_ = layout(given["image_mask"], given["shapes"], None, dit.rope, device, options)
        for step, (t, latents) in enumerate(zip(TIMESTEPS, given["latents"])):
            timestep = torch.tensor([t], device=device, dtype=latents.dtype)
            prediction, _ = step_forward(dit, latents, given["prompt"], timestep, layout_, step, options)
            outputs.append(prediction.float())
    if hook is not None:
        hook.remove()
    return outputs, ran.get("words", {})
