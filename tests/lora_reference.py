"""LoRA files in every format people share, with the real Qwen-Image key names, for the tiny DiT; and what each file
means according to a reference GhostEdit did not write: diffusers' `load_lora_weights` + `fuse_lora` on its own
QwenImageTransformer2DModel (tiny dims, GhostEdit's tiny weights) for the formats diffusers reads; ComfyUI's loader
conventions for those it refuses (`.lora.down`/`.lora.up`: alpha / rank * up @ down; `.diff`/`.diff_b`: added as
they are); PEFT's own LoKr and LoHa layers, merged, for those.

DiffSynth's QwenImageDiT (GhostEdit's tiny DiT) uses diffusers' parameter names as they are (DiffSynth has no state
dict converter for the Qwen-Image DiT): `diffusers_transformer` loads GhostEdit's weights strictly, which checks it.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

RANK = 4
ALPHA = 2.0
SEED = 7
LOKR_FACTOR = 4  # LoKr's left factor is [out/4, in/4] (the split LyCORIS picks for these sizes with factor 4)


def diffusers_transformer(ghostedit_dit: torch.nn.Module):
    """diffusers' QwenImageTransformer2DModel at the tiny DiT's sizes, holding its weights (float32)."""
    from diffusers import QwenImageTransformer2DModel
    from ghostedit.models import tiny
    model = QwenImageTransformer2DModel(num_layers=tiny.DIT_LAYERS, attention_head_dim=tiny.DIT_HEAD_DIM,
                                        num_attention_heads=tiny.DIT_HEADS, joint_attention_dim=tiny.TEXT_HIDDEN,
                                        axes_dims_rope=tuple(tiny.DIT_ROPE_AXES))
    model.load_state_dict({name: value.float() for name, value in ghostedit_dit.state_dict().items()}, strict=True)
    return model.float().eval()


def linear_shapes(model: torch.nn.Module) -> dict[str, tuple[int, int]]:
    """Every linear layer of the DiT (the blocks' attention, MLP and modulation, and the top-level ones)."""
    return {name: tuple(module.weight.shape) for name, module in model.named_modules()
            if isinstance(module, torch.nn.Linear)}


def random_factors(shapes: dict, seed: int = SEED, rank: int = RANK) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """{layer: (down [rank, in], up [out, rank])}, seeded."""
    generator = torch.Generator().manual_seed(seed)
    return {name: (torch.randn(rank, fan_in, generator=generator) * 0.2,
                   torch.randn(fan_out, rank, generator=generator) * 0.2)
            for name, (fan_out, fan_in) in shapes.items()}


def _low_rank(factors, down_key, up_key, alpha_key=None, alpha=ALPHA) -> dict[str, torch.Tensor]:
    tensors = {}
    for name, (down, up) in factors.items():
        tensors[down_key(name)] = down
        tensors[up_key(name)] = up
        if alpha_key:
            tensors[alpha_key(name)] = torch.tensor(alpha)
    return tensors


def write_diffusers(factors, path: Path) -> Path:
    """diffusers' own save (transformer. prefix), with its LoraConfig in the header: lora_alpha for every layer,
    alpha_pattern for one of them."""
    from peft import LoraConfig
    tensors = _low_rank(factors, lambda n: f"transformer.{n}.lora_A.weight", lambda n: f"transformer.{n}.lora_B.weight")
    config = LoraConfig(r=RANK, lora_alpha=8, target_modules=sorted(factors),
                        alpha_pattern={"transformer_blocks.1.attn.to_q": 2}).to_dict()
    config = {key: sorted(value) if isinstance(value, set) else value for key, value in config.items()}
    metadata = {"format": "pt", "lora_adapter_metadata": json.dumps({f"transformer.{k}": v for k, v in config.items()})}
    save_file(tensors, path, metadata=metadata)
    return path


def write_ai_toolkit(factors, path: Path) -> Path:
    save_file(_low_rank(factors, lambda n: f"diffusion_model.{n}.lora_A.weight",
                        lambda n: f"diffusion_model.{n}.lora_B.weight"), path)
    return path


def write_kohya(factors, path: Path) -> Path:
    """kohya sd-scripts / musubi-tuner: lora_unet_<name with underscores>, lora_down/lora_up, alpha."""
    flat = lambda n: "lora_unet_" + n.replace(".", "_")  # noqa: E731
    save_file(_low_rank(factors, lambda n: f"{flat(n)}.lora_down.weight", lambda n: f"{flat(n)}.lora_up.weight",
                        lambda n: f"{flat(n)}.alpha"), path)
    return path


def write_diffsynth(factors, path: Path) -> Path:
    save_file(_low_rank(factors, lambda n: f"{n}.lora_A.default.weight", lambda n: f"{n}.lora_B.default.weight"), path)
    return path


def write_lightning(factors, path: Path) -> Path:
    """The Qwen-Image-Lightning LoRAs' own keys: transformer_blocks.N.<...>.lora_down/lora_up with .alpha."""
    save_file(_low_rank(factors, lambda n: f"{n}.lora_down.weight", lambda n: f"{n}.lora_up.weight",
                        lambda n: f"{n}.alpha"), path)
    return path


def write_lora_dot_down(factors, path: Path) -> Path:
    save_file(_low_rank(factors, lambda n: f"transformer.{n}.lora.down.weight",
                        lambda n: f"transformer.{n}.lora.up.weight", lambda n: f"transformer.{n}.alpha"), path)
    return path


def write_diff(factors, path: Path, biases: dict) -> Path:
    """Full-weight deltas: diffusion_model.<name>.diff (= up @ down, made full) and .diff_b for the biases."""
    tensors = {f"diffusion_model.{name}.diff": (up @ down).contiguous() for name, (down, up) in factors.items()}
    tensors.update({f"diffusion_model.{name}.diff_b": bias for name, bias in biases.items()})
    save_file(tensors, path)
    return path


WRITERS_READ_BY_DIFFUSERS = {"diffusers": write_diffusers, "ai-toolkit": write_ai_toolkit, "kohya": write_kohya,
                             "diffsynth": write_diffsynth, "lightning": write_lightning}


def diffusers_fused(model, paths_and_scales: list[tuple[Path, float]]) -> dict[str, torch.Tensor]:
    """The transformer's weights after diffusers' QwenImageEditPlusPipeline.load_lora_weights + fuse_lora of each
    file at its scale, one after the other (the model is restored to its own weights afterwards)."""
    from diffusers import QwenImageEditPlusPipeline
    before = {name: value.clone() for name, value in model.state_dict().items()}
    pipe = QwenImageEditPlusPipeline(scheduler=None, vae=None, text_encoder=None, tokenizer=None, processor=None,
                                     transformer=model)
    for index, (path, scale) in enumerate(paths_and_scales):
        pipe.load_lora_weights(str(path), adapter_name=f"lora{index}")
        pipe.fuse_lora(lora_scale=scale, adapter_names=[f"lora{index}"])
    fused = {name.replace(".base_layer", ""): value.clone() for name, value in model.state_dict().items()
             if "lora_" not in name}
    pipe.unload_lora_weights()
    model.load_state_dict(before)
    return fused


def comfy_low_rank(base: dict, factors, scale: float, alpha: float = ALPHA) -> dict[str, torch.Tensor]:
    """ComfyUI's LoRA convention: W + scale * alpha / rank * up @ down."""
    return {**base, **{f"{name}.weight": base[f"{name}.weight"] + scale * alpha / down.shape[0] * (up @ down)
                       for name, (down, up) in factors.items()}}


def comfy_diff(base: dict, factors, biases: dict, scale: float) -> dict[str, torch.Tensor]:
    """ComfyUI's `diff` convention: W + scale * diff, b + scale * diff_b."""
    fused = {**base, **{f"{name}.weight": base[f"{name}.weight"] + scale * (up @ down)
                        for name, (down, up) in factors.items()}}
    fused.update({f"{name}.bias": base[f"{name}.bias"] + scale * bias for name, bias in biases.items()})
    return fused
