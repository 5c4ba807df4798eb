"""Tiny checkpoints in the exact folder and key layout of Qwen's released repos (Qwen/Qwen-Image-Edit, -2509, -2511),
built with diffusers' and transformers' own classes and seeded weights, for holding GhostEdit against diffusers.

Each folder has what the real repo has: model_index.json; transformer/ (diffusers' QwenImageTransformer2DModel:
config.json, sharded safetensors and their index); text_encoder/ (Qwen2_5_VLForConditionalGeneration with the key
names transformers 4.x saved, `model.layers...`, `visual...`, `lm_head`, sharded with an index); vae/
(AutoencoderKLQwenImage); scheduler/ (the repos' scheduler config); tokenizer/ and processor/ (Qwen's special tokens
and pixel limits). Only the sizes are tiny. Nothing here is read by GhostEdit from its name: the folder names are
the repos' last path part only so that a failure names the model.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from safetensors.torch import save_file

from ghostedit.models.processor import QWEN_MAX_PIXELS, QWEN_MIN_PIXELS, special_token_ids, write_processor
from ghostedit.models.tiny import tiny_text_encoder_config

SEED = 20261124
INIT_STD = 0.1          # every DiT linear: modulation and gates far from zero, as in a trained model
QK_NORM_GAIN = 3.0      # peaked attention (random q/k are near-orthogonal)

# As Qwen publishes it in each repo (scheduler/scheduler_config.json)
SCHEDULER_CONFIG = {
    "_class_name": "FlowMatchEulerDiscreteScheduler", "_diffusers_version": "0.34.0.dev0",
    "base_image_seq_len": 256, "base_shift": 0.5, "invert_sigmas": False, "max_image_seq_len": 8192,
    "max_shift": 0.9, "num_train_timesteps": 1000, "shift": 1.0, "shift_terminal": 0.02,
    "stochastic_sampling": False, "time_shift_type": "exponential", "use_beta_sigmas": False,
    "use_dynamic_shifting": True, "use_exponential_sigmas": False, "use_karras_sigmas": False,
}
# repo: (pipeline class in model_index.json, transformer's zero_cond_t)
MODELS = {
    "Qwen-Image-Edit": ("QwenImageEditPipeline", False),
    "Qwen-Image-Edit-2509": ("QwenImageEditPlusPipeline", False),
    "Qwen-Image-Edit-2511": ("QwenImageEditPlusPipeline", True),
}
TRANSFORMER = {"patch_size": 2, "in_channels": 64, "out_channels": 16, "num_layers": 2, "attention_head_dim": 32,
               "num_attention_heads": 2, "joint_attention_dim": 64, "guidance_embeds": False,
               "axes_dims_rope": (8, 12, 12)}
VAE = {"base_dim": 8, "z_dim": 16, "dim_mult": [1, 2, 4, 4], "num_res_blocks": 1, "attn_scales": [],
       "temperal_downsample": [False, True, True], "dropout": 0.0}
SHARD_BYTES = 300_000   # small enough that every checkpoint is sharded, as the released ones are


def build(root: Path, repo: str) -> Path:
    """The tiny `repo` (a key of MODELS) under root/repo; returns the folder."""
    pipeline_class, zero_cond_t = MODELS[repo]
    folder = Path(root) / repo
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    _write_json(folder / "model_index.json", _model_index(pipeline_class))
    write_processor(folder / "processor", QWEN_MIN_PIXELS, QWEN_MAX_PIXELS)
    write_processor(folder / "tokenizer", QWEN_MIN_PIXELS, QWEN_MAX_PIXELS)
    for name in ("preprocessor_config.json", "video_preprocessor_config.json"):
        (folder / "tokenizer" / name).unlink()  # the repos' tokenizer/ holds the tokenizer only
    (folder / "scheduler").mkdir()
    _write_json(folder / "scheduler" / "scheduler_config.json", SCHEDULER_CONFIG)
    _build_transformer(folder / "transformer", zero_cond_t)
    _build_text_encoder(folder / "text_encoder", special_token_ids(folder / "processor"))
    _build_vae(folder / "vae")
    return folder


def _model_index(pipeline_class: str) -> dict:
    return {"_class_name": pipeline_class, "_diffusers_version": "0.36.0.dev0",
            "processor": ["transformers", "Qwen2VLProcessor"],
            "scheduler": ["diffusers", "FlowMatchEulerDiscreteScheduler"],
            "text_encoder": ["transformers", "Qwen2_5_VLForConditionalGeneration"],
            "tokenizer": ["transformers", "Qwen2Tokenizer"],
            "transformer": ["diffusers", "QwenImageTransformer2DModel"],
            "vae": ["diffusers", "AutoencoderKLQwenImage"]}


def config_files(repo: str) -> dict[str, bytes]:
    """The config files of the tiny `repo` without its weights (what a model is recognised by), relative path ->
    content: for tests of recognition, of downloads, and of a folder whose weights fail to load."""
    pipeline_class, zero_cond_t = MODELS[repo]
    configs = {"model_index.json": _model_index(pipeline_class),
               "transformer/config.json": {"_class_name": "QwenImageTransformer2DModel", **TRANSFORMER,
                                           "zero_cond_t": zero_cond_t},
               "text_encoder/config.json": {"architectures": ["Qwen2_5_VLForConditionalGeneration"],
                                            "model_type": "qwen2_5_vl"},
               "vae/config.json": {"_class_name": "AutoencoderKLQwenImage", **VAE},
               "scheduler/scheduler_config.json": SCHEDULER_CONFIG,
               "processor/preprocessor_config.json": {"min_pixels": QWEN_MIN_PIXELS, "max_pixels": QWEN_MAX_PIXELS}}
    return {path: (json.dumps(config, indent=2) + "\n").encode() for path, config in configs.items()}


def write_configs(folder: Path, repo: str, pipeline_class: str | None = None) -> Path:
    """config_files(repo) written into `folder` (any name); `pipeline_class` replaces model_index.json's."""
    for relative, content in config_files(repo).items():
        (folder / relative).parent.mkdir(parents=True, exist_ok=True)
        (folder / relative).write_bytes(content)
    if pipeline_class:
        _write_json(folder / "model_index.json", _model_index(pipeline_class))
    return folder


def _write_json(path: Path, data: dict) -> None:
    path.write_text(json.dumps(data, indent=2) + "\n")


def _bf16(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().to(torch.bfloat16).contiguous() for k, v in module.state_dict().items()}


def _save_sharded(state_dict: dict[str, torch.Tensor], folder: Path, stem: str) -> None:
    """`stem`-0000i-of-0000n.safetensors files and `stem`.safetensors.index.json, as save_pretrained writes them."""
    shards, current, size = [], {}, 0
    for key in sorted(state_dict):
        tensor = state_dict[key]
        if current and size + tensor.nbytes > SHARD_BYTES:
            shards.append(current)
            current, size = {}, 0
        current[key] = tensor
        size += tensor.nbytes
    shards.append(current)
    weight_map = {}
    for index, shard in enumerate(shards, 1):
        name = f"{stem}-{index:05d}-of-{len(shards):05d}.safetensors"
        save_file(shard, str(folder / name), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(shard, name))
    total = sum(t.nbytes for t in state_dict.values())
    _write_json(folder / f"{stem}.safetensors.index.json", {"metadata": {"total_size": total}, "weight_map": weight_map})


def _build_transformer(folder: Path, zero_cond_t: bool) -> None:
    from diffusers import QwenImageTransformer2DModel

    torch.manual_seed(SEED)
    model = QwenImageTransformer2DModel(**TRANSFORMER, zero_cond_t=zero_cond_t)
    generator = torch.Generator().manual_seed(SEED)
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, torch.nn.Linear):
                for param in (module.weight, module.bias):
                    if param is not None:
                        param.copy_(torch.randn(param.shape, generator=generator) * INIT_STD)
        for block in model.transformer_blocks:
            for norm in (block.attn.norm_q, block.attn.norm_k, block.attn.norm_added_q, block.attn.norm_added_k):
                norm.weight.fill_(QK_NORM_GAIN)
    model.save_config(folder)
    _save_sharded(_bf16(model), folder, "diffusion_pytorch_model")


def _build_text_encoder(folder: Path, token_ids: dict) -> None:
    """Saved with transformers 4.x's key names (transformers 5 would write `model.language_model...`)."""
    from transformers import Qwen2_5_VLForConditionalGeneration

    config = tiny_text_encoder_config(token_ids)
    torch.manual_seed(SEED + 1)
    model = Qwen2_5_VLForConditionalGeneration(config)
    folder.mkdir(parents=True)
    config.save_pretrained(folder)
    state_dict = {}
    for key, tensor in _bf16(model).items():
        if key.startswith("model.language_model."):
            key = "model." + key.removeprefix("model.language_model.")
        elif key.startswith("model.visual."):
            key = key.removeprefix("model.")
        state_dict[key] = tensor
    _save_sharded(state_dict, folder, "model")


def _build_vae(folder: Path) -> None:
    from diffusers import AutoencoderKLQwenImage

    torch.manual_seed(SEED + 2)
    model = AutoencoderKLQwenImage(**VAE)
    model.save_config(folder)
    save_file(_bf16(model), str(folder / "diffusion_pytorch_model.safetensors"), metadata={"format": "pt"})


# ---- Qwen-Image-2.1 and its Turbo (diffusers' QwenImage21Pipeline) ----

# The schedule of Qwen's 2.1 repos as GhostEdit assumes it (the released scheduler_config.json is not in any source
# here; DiffSynth's "Qwen-Image" template and LightX2V's 2.1 scheduler both compute this one): GhostEdit computes
# whatever a folder's config says, as diffusers does, so the tests hold it for this one
SCHEDULER_CONFIG_21 = {**SCHEDULER_CONFIG, "_diffusers_version": "0.42.0"}
# Turbo's as GhostEdit assumes it: its sigmas used as they are (shift 1, no resolution shift, no terminal stretch)
TURBO_SCHEDULER_CONFIG_21 = {**SCHEDULER_CONFIG_21, "use_dynamic_shifting": False, "shift": 1.0,
                             "shift_terminal": None}
# Qwen/Qwen-Image-2.1-Turbo's model_index.json `sample_sigmas` (DiffSynth's Turbo example passes the same list)
TURBO_SIGMAS = [1.0, 0.978453, 0.95418, 0.926626, 0.89508, 0.845148, 0.704534, 0.414568]
MODELS_21 = {"Qwen-Image-2.1": None, "Qwen-Image-2.1-Turbo": TURBO_SIGMAS}  # repo: its model_index sample_sigmas


def build_21(root: Path, repo: str) -> Path:
    """The tiny 2.1 `repo` (a key of MODELS_21) under root/repo, built with diffusers' and transformers' classes;
    returns the folder."""
    from ghostedit.models.qwen_image_21 import tiny
    from ghostedit.models.qwen_image_21.processor import write_processor as write_processor_21

    folder = Path(root) / repo
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    _write_json(folder / "model_index.json", _model_index_21(MODELS_21[repo]))
    write_processor_21(folder / "processor", min_pixels=tiny.MIN_PIXELS)
    (folder / "scheduler").mkdir()
    _write_json(folder / "scheduler" / "scheduler_config.json",
                TURBO_SCHEDULER_CONFIG_21 if MODELS_21[repo] else SCHEDULER_CONFIG_21)
    _build_transformer_21(folder / "transformer", seed=SEED + (10 if MODELS_21[repo] else 0))
    _build_text_encoder_21(folder / "text_encoder", special_token_ids(folder / "processor"))
    _build_vae_21(folder / "vae")
    return folder


def _model_index_21(sample_sigmas: list[float] | None) -> dict:
    """The released model_index.json (the embedded tiny 2.1 writes the same), Turbo's with its sigmas."""
    from ghostedit.models.qwen_image_21.tiny import MODEL_INDEX
    return {**MODEL_INDEX, **({"sample_sigmas": sample_sigmas} if sample_sigmas is not None else {})}


def _build_transformer_21(folder: Path, seed: int) -> None:
    from diffusers import QwenImage21Transformer2DModel

    from ghostedit.models.qwen_image_21 import tiny

    model = tiny.init_like_trained(QwenImage21Transformer2DModel(**tiny.TRANSFORMER), seed)
    model.save_config(folder)
    _save_sharded(_bf16(model), folder, "diffusion_pytorch_model")


def _build_text_encoder_21(folder: Path, token_ids: dict) -> None:
    """Written as transformers 4.x wrote Qwen3-VL: its config.json with rope_scaling, its weights keyed
    `model.language_model...`, `model.visual...`, `lm_head.weight` (the keys DiffSynth's converter maps)."""
    from transformers import Qwen3VLConfig, Qwen3VLForConditionalGeneration

    from ghostedit.models.qwen_image_21 import tiny

    config_json = tiny.text_encoder_config(token_ids)
    torch.manual_seed(SEED + 1)
    model = Qwen3VLForConditionalGeneration(Qwen3VLConfig(**config_json))
    folder.mkdir(parents=True)
    _write_json(folder / "config.json", config_json)
    _save_sharded(_bf16(model), folder, "model")


def _build_vae_21(folder: Path) -> None:
    from diffusers import AutoencoderKLQwenImage21

    from ghostedit.models.qwen_image_21 import tiny

    torch.manual_seed(SEED + 2)
    model = AutoencoderKLQwenImage21(**tiny.VAE)
    model.save_config(folder)
    save_file(_bf16(model), str(folder / "diffusion_pytorch_model.safetensors"), metadata={"format": "pt"})
