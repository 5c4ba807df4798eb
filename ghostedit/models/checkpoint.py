"""A Qwen-Image-Edit folder in the released layout (transformer/, text_encoder/, vae/, processor/, tokenizer/ and
their configs) loaded through DiffSynth's own loader, each model built from the folder's config rather than
DiffSynth's hard-coded full size, so that every size of the same architecture loads the same way.

DiffSynth identifies a checkpoint by a hash of its keys and shapes: each component's hash is entered in its model
table ("model table" patch) with a class that builds the configured model; an entry DiffSynth had for the same
hash (the released full-size files) is replaced by the equivalent configured one, so a file loads once.
"""
from __future__ import annotations

import glob
from pathlib import Path

import torch
from diffsynth.configs import MODEL_CONFIGS, VRAM_MANAGEMENT_MODULE_MAPS
from diffsynth.core.loader import ModelConfig, hash_model_file
from diffsynth.models.general_modules import AdaLayerNorm, RMSNorm, TimestepEmbeddings
from diffsynth.models.qwen_image_dit import QwenEmbedRope, QwenImageDiT, QwenImageTransformerBlock
from diffsynth.models.qwen_image_text_encoder import QwenImageTextEncoder

from ..diffsynth_patches import check_version
from .exact import LATENTS_MEAN, LATENTS_STD, class_path, install_module_patches
from .family import Family, UnsupportedModel, detect, read_json

TEXT_ENCODER_CONVERTER = ("diffsynth.utils.state_dict_converters.qwen_image_text_encoder."
                          "QwenImageTextEncoderStateDictConverter")
# (component folder, DiffSynth's model name, weight files)
COMPONENTS = (
    ("transformer", "qwen_image_dit", "diffusion_pytorch_model*.safetensors"),
    ("text_encoder", "qwen_image_text_encoder", "model*.safetensors"),
    ("vae", "qwen_image_vae", "diffusion_pytorch_model*.safetensors"),
)
LATENT_CHANNELS = 16
VAE_CLASS = "diffsynth.models.qwen_image_vae.QwenImageVAE"  # what DiffSynth's loader imports: GhostEdit's patched VAE


def _path(cls: type | str) -> str:
    return cls if isinstance(cls, str) else class_path(cls)


class ConfiguredQwenImageDiT(QwenImageDiT):
    """DiffSynth's QwenImageDiT (same attribute names and blocks) at the sizes of a diffusers transformer config."""

    def __init__(self, num_layers: int, num_attention_heads: int, attention_head_dim: int, joint_attention_dim: int,
                 axes_dims_rope: list[int]):
        torch.nn.Module.__init__(self)  # QwenImageDiT.__init__ would build the 20B model
        install_module_patches()  # the MLP's activation as the released model's, before its blocks are built
        dim = num_attention_heads * attention_head_dim
        self.pos_embed = QwenEmbedRope(theta=10000, axes_dim=list(axes_dims_rope), scale_rope=True)
        self.time_text_embed = TimestepEmbeddings(256, dim, diffusers_compatible_format=True, scale=1000,
                                                  align_dtype_to_timestep=False)
        self.txt_norm = RMSNorm(joint_attention_dim, eps=1e-6)
        self.img_in = torch.nn.Linear(4 * LATENT_CHANNELS, dim)
        self.txt_in = torch.nn.Linear(joint_attention_dim, dim)
        self.transformer_blocks = torch.nn.ModuleList(
            QwenImageTransformerBlock(dim=dim, num_attention_heads=num_attention_heads,
                                      attention_head_dim=attention_head_dim) for _ in range(num_layers))
        self.norm_out = AdaLayerNorm(dim, single=True)
        self.proj_out = torch.nn.Linear(dim, 4 * LATENT_CHANNELS)


class ConfiguredTextEncoder(QwenImageTextEncoder):
    """DiffSynth's QwenImageTextEncoder over the Qwen2.5-VL of a text_encoder/config.json (or that config)."""

    def __init__(self, config):
        from transformers import Qwen2_5_VLConfig, Qwen2_5_VLModel

        torch.nn.Module.__init__(self)  # QwenImageTextEncoder.__init__ would build the 7B model
        self.config = config if isinstance(config, Qwen2_5_VLConfig) else Qwen2_5_VLConfig(**config)
        self.model = Qwen2_5_VLModel(self.config)
        self.lm_head = torch.nn.Linear(self.config.text_config.hidden_size, self.config.text_config.vocab_size,
                                       bias=False)


def _dit_kwargs(config: dict, folder: Path) -> dict:
    if config.get("in_channels", 64) != 4 * LATENT_CHANNELS or config.get("out_channels", 16) != LATENT_CHANNELS \
            or config.get("patch_size", 2) != 2:
        raise UnsupportedModel(f"{folder}: transformer/config.json has in_channels={config.get('in_channels')}, "
                               f"out_channels={config.get('out_channels')}, patch_size={config.get('patch_size')}; "
                               "DiffSynth's pipeline runs 16 latent channels in 2x2 patches")
    return {"num_layers": config["num_layers"], "num_attention_heads": config["num_attention_heads"],
            "attention_head_dim": config["attention_head_dim"], "joint_attention_dim": config["joint_attention_dim"],
            "axes_dims_rope": list(config["axes_dims_rope"])}


def _vae_kwargs(config: dict, folder: Path) -> dict:
    given = {"latents_mean": LATENTS_MEAN, "latents_std": LATENTS_STD}
    different = [name for name, values in given.items()
                 if config.get(name) is not None and [round(v, 4) for v in config[name]] != values]
    if different:
        raise UnsupportedModel(f"{folder}: vae/config.json's {' and '.join(different)} differ from the ones the "
                               "engine's QwenImageVAE applies")
    if config.get("input_channels", 3) != 3 or config.get("z_dim", LATENT_CHANNELS) != LATENT_CHANNELS:
        raise UnsupportedModel(f"{folder}: vae/config.json is not an RGB VAE with {LATENT_CHANNELS} latent channels")
    names = ("base_dim", "z_dim", "dim_mult", "num_res_blocks", "attn_scales", "temperal_downsample", "dropout")
    return {name: config[name] for name in names if name in config}


def weight_files(folder: Path, component: str, pattern: str,
                 layout: str = "transformer/, text_encoder/, vae/, processor/, tokenizer/") -> list[str]:
    """The files of `component` matching `pattern`; none is a refusal that names the folders the layout needs."""
    files = sorted(glob.glob(str(folder / component / pattern)))
    if not files:
        raise UnsupportedModel(f"{folder} has no {component}/{pattern}: a model folder needs the released layout "
                               f"({layout})")
    return files


def model_table_entry(files: list[str], model_name: str, model_class: str, kwargs: dict,
                      converter: str | None = None) -> ModelConfig:
    """The weight files of one model entered in DiffSynth's model table by their hash (an entry of the same hash
    replaced), with the class that builds the configured model; their ModelConfig."""
    path = files if len(files) > 1 else files[0]
    model_hash = hash_model_file(path)
    MODEL_CONFIGS[:] = [c for c in MODEL_CONFIGS if c["model_hash"] != model_hash]
    entry = {"model_hash": model_hash, "model_name": model_name, "model_class": model_class, "extra_kwargs": kwargs}
    if converter:
        entry["state_dict_converter"] = converter
    MODEL_CONFIGS.append(entry)
    return ModelConfig(path=path)


def model_configs(folder: Path) -> tuple[Family, list[ModelConfig], ModelConfig, ModelConfig]:
    """The family of the model in `folder`, and DiffSynth ModelConfigs for its weights, tokenizer and processor,
    each weight file entered in DiffSynth's model table with the class its config describes."""
    check_version()
    install_module_patches()
    folder = Path(folder)
    family = detect(folder)
    entries = {
        "transformer": (ConfiguredQwenImageDiT, QwenImageDiT,
                        _dit_kwargs(read_json(folder, "transformer/config.json"), folder), None),
        "text_encoder": (ConfiguredTextEncoder, QwenImageTextEncoder,
                         {"config": read_json(folder, "text_encoder/config.json")}, TEXT_ENCODER_CONVERTER),
        "vae": (VAE_CLASS, VAE_CLASS, _vae_kwargs(read_json(folder, "vae/config.json"), folder), None),
    }
    configs = []
    for component, model_name, pattern in COMPONENTS:
        files = weight_files(folder, component, pattern)
        cls, diffsynth_cls, kwargs, converter = entries[component]
        VRAM_MANAGEMENT_MODULE_MAPS[_path(cls)] = VRAM_MANAGEMENT_MODULE_MAPS[_path(diffsynth_cls)]
        configs.append(model_table_entry(files, model_name, _path(cls), kwargs, converter))
    for name in ("tokenizer", "processor"):
        if not (folder / name).is_dir():
            raise UnsupportedModel(f"{folder} has no {name}/ folder")
    return family, configs, ModelConfig(path=str(folder / "tokenizer")), ModelConfig(path=str(folder / "processor"))
