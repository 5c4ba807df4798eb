"""The embedded tiny Qwen-Image-2.1 (and its Turbo): the released architecture at miniature size, random but
deterministic, generated on first use in the released repo layout (model_index.json, transformer/, text_encoder/,
vae/, scheduler/, processor/) and loaded through the same path as real weights (checkpoint.py), so that CPU tests
and CI run the real 2.1 pipeline end to end with no download. Its outputs are not pictures.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch
from diffsynth.models.qwen_image_21_vae import QwenImage21VAE
from safetensors.torch import save_file

from ...paths import generated_once, ghostedit_home
from ..family import QWEN_IMAGE_21, QWEN_IMAGE_21_TURBO
from ..processor import special_token_ids
from .dit import QwenImage21DiT
from .processor import write_processor

TINY_MODEL_NAME = "tiny-2.1-v1"  # bump whenever the generated files change: caches keep old versions
SEED = 20260920
INIT_STD = 0.1          # every DiT linear: modulation and gates far from zero, as in a trained model
QK_NORM_GAIN = 3.0      # peaked attention (random q/k are near-orthogonal)

# DiT: 64 wide (2 heads x 32), 2 blocks, SwiGLU 3x; rope axes even and summing to the head dim; 64 latent channels
TRANSFORMER = {"patch_size": 1, "in_channels": 64, "out_channels": 64, "num_layers": 2, "attention_head_dim": 32,
               "num_attention_heads": 2, "context_in_dim": 64, "mlp_ratio": 3, "axes_dims_rope": [8, 12, 12],
               "eps": 1e-6, "causal_condition": True}
# VAE: RGBA in and out, 64 latent channels, 16x (four spatial halvings), narrow
VAE = {"base_dim": 8, "decoder_base_dim": 8, "z_dim": 64, "dim_mult": [1, 1, 2, 2, 2], "num_res_blocks": 1,
       "attn_scales": [], "temperal_downsample": [False, True, True, True], "dropout": 0.0, "is_residual": True,
       "in_channels": 4, "out_channels": 4, "patch_size": None, "scale_factor_temporal": 8,
       "scale_factor_spatial": 16}
# Text encoder: Qwen3-VL with a 2-layer LM (hidden = the DiT's context dim) and a 2-block vision tower of 16-px patches
TEXT_HIDDEN = 64
# The processor's smallest image: a 64x64 condition image keeps its size (16 image tokens)
MIN_PIXELS = 32 * 32


def text_encoder_config(token_ids: dict) -> dict:
    """A tiny Qwen3-VL's text_encoder/config.json as transformers 4.x writes it (rope_scaling, rope_theta)."""
    ids = {k: token_ids[k] for k in ("image_token_id", "video_token_id", "vision_start_token_id",
                                     "vision_end_token_id")}
    return {
        "architectures": ["Qwen3VLForConditionalGeneration"], "model_type": "qwen3_vl", "torch_dtype": "bfloat16",
        "tie_word_embeddings": False, **ids,
        "text_config": {
            "model_type": "qwen3_vl_text", "hidden_size": TEXT_HIDDEN, "intermediate_size": 2 * TEXT_HIDDEN,
            "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 32,
            "hidden_act": "silu", "rms_norm_eps": 1e-6, "max_position_embeddings": 4096, "attention_bias": False,
            "attention_dropout": 0.0, "rope_theta": 5000000,
            "rope_scaling": {"mrope_interleaved": True, "mrope_section": [4, 6, 6], "rope_type": "default"},
            "bos_token_id": token_ids["bos_token_id"], "eos_token_id": token_ids["eos_token_id"],
            "vocab_size": token_ids["vocab_size"], "initializer_range": 0.02, "use_cache": True,
        },
        "vision_config": {
            "model_type": "qwen3_vl", "depth": 2, "hidden_size": 32, "intermediate_size": 64, "num_heads": 2,
            "out_hidden_size": TEXT_HIDDEN, "hidden_act": "gelu_pytorch_tanh", "in_channels": 3, "patch_size": 16,
            "spatial_merge_size": 2, "temporal_patch_size": 2, "num_position_embeddings": 64,
            "deepstack_visual_indexes": [0], "initializer_range": 0.02,
        },
    }

MODEL_INDEX = {"_class_name": "QwenImage21Pipeline", "_diffusers_version": "0.42.0",
               "processor": ["transformers", "Qwen3VLProcessor"],
               "scheduler": ["diffusers", "FlowMatchEulerDiscreteScheduler"],
               "text_encoder": ["transformers", "Qwen3VLForConditionalGeneration"],
               "transformer": ["diffusers", "QwenImage21Transformer2DModel"],
               "vae": ["diffusers", "AutoencoderKLQwenImage21"]}
FOLDERS = {False: "Qwen-Image-2.1", True: "Qwen-Image-2.1-Turbo"}  # turbo: its folder


def ensure_tiny_model(turbo: bool = False, root: Path | None = None) -> Path:
    """The tiny 2.1 (or Turbo) folder, both generated on first use (once, safely: paths.generated_once)."""
    def generate(staging: Path) -> None:
        for is_turbo in (False, True):
            generate_tiny_model(staging / FOLDERS[is_turbo], is_turbo)
    return generated_once(Path(root) if root is not None else ghostedit_home() / TINY_MODEL_NAME, generate) \
        / FOLDERS[turbo]


def generate_tiny_model(folder: Path, turbo: bool) -> None:
    """The released layout with tiny seeded weights: GhostEdit's DiT, transformers' Qwen3-VL, DiffSynth's VAE."""
    family = QWEN_IMAGE_21_TURBO if turbo else QWEN_IMAGE_21
    folder.mkdir(parents=True)
    index = {**MODEL_INDEX, **({"sample_sigmas": list(family.sample_sigmas)} if turbo else {})}
    _write_json(folder / "model_index.json", index)
    _write_json(folder / "scheduler" / "scheduler_config.json",
                {"_class_name": "FlowMatchEulerDiscreteScheduler", **family.schedule})
    write_processor(folder / "processor", min_pixels=MIN_PIXELS)
    token_ids = special_token_ids(folder / "processor")
    _save(folder / "transformer", {"_class_name": "QwenImage21Transformer2DModel", **TRANSFORMER},
          build_dit(SEED + (10 if turbo else 0)), "diffusion_pytorch_model.safetensors")
    _save(folder / "text_encoder", text_encoder_config(token_ids), build_text_encoder(token_ids), "model.safetensors")
    _save(folder / "vae", {"_class_name": "AutoencoderKLQwenImage21", **VAE}, build_vae(), 
          "diffusion_pytorch_model.safetensors")


def build_dit(seed: int) -> torch.nn.Module:
    return init_like_trained(QwenImage21DiT(**TRANSFORMER), seed)


def init_like_trained(dit: torch.nn.Module, seed: int) -> torch.nn.Module:
    """Seeded weights for a 2.1 DiT with the released attribute names (GhostEdit's, or diffusers' in the tests):
    every linear normal, the q/k norms' gain 3, the text norm's zero-centred weight away from zero."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for module in dit.modules():
            if isinstance(module, torch.nn.Linear):
                module.weight.copy_(torch.randn(module.weight.shape, generator=generator) * INIT_STD)
        for block in dit.transformer_blocks:
            block.attn.norm_q.weight.fill_(QK_NORM_GAIN)
            block.attn.norm_k.weight.fill_(QK_NORM_GAIN)
        dit.txt_in.text_norm.weight.copy_(torch.randn(dit.txt_in.text_norm.weight.shape, generator=generator) * 0.1)
    return dit


def build_text_encoder(token_ids: dict) -> torch.nn.Module:
    from transformers import Qwen3VLConfig, Qwen3VLForConditionalGeneration
    with torch.random.fork_rng(devices=[]):  # seed the default init without touching the caller's RNG
        torch.manual_seed(SEED + 1)
        return Qwen3VLForConditionalGeneration(Qwen3VLConfig(**text_encoder_config(token_ids)))


def build_vae() -> torch.nn.Module:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(SEED + 2)
        return QwenImage21VAE(**{k: v for k, v in VAE.items()})


def _save(folder: Path, config: dict, module: torch.nn.Module, name: str) -> None:
    _write_json(folder / "config.json", config)
    save_file({k: v.detach().to(torch.bfloat16).contiguous() for k, v in module.state_dict().items()},
              str(folder / name), metadata={"format": "pt"})


def _write_json(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2) + "\n")
