"""A Qwen-Image-Edit folder in the released layout (transformer/, text_encoder/, vae/, processor/, tokenizer/ and
their configs) loaded through DiffSynth's own loader, each model built from the folder's config rather than
DiffSynth's hard-coded full size, so that every size of the same architecture loads the same way.

DiffSynth identifies a checkpoint by a hash of its keys and shapes: each component's hash is entered in its model
table ("model table" patch) with a class that builds the configured model (GhostEdit's DiT, models/qwen_image/dit.py,
and its VAE computing as the reference, exact.py); an entry DiffSynth had for the same hash (the released full-size
files) is replaced by the equivalent configured one, so a file loads once.
"""
from __future__ import annotations

import glob
from pathlib import Path

import torch
from diffsynth.configs import MODEL_CONFIGS, VERSION_CHECKER_MAPS, VRAM_MANAGEMENT_MODULE_MAPS
from diffsynth.core.loader import ModelConfig, hash_model_file
from diffsynth.models.qwen_image_dit import QwenImageDiT as DiffSynthDiT
from diffsynth.models.qwen_image_text_encoder import QwenImageTextEncoder
from diffsynth.models.qwen_image_vae import QwenImageVAE as DiffSynthVAE

from ..diffsynth_patches import check_version
from .exact import LATENTS_MEAN, LATENTS_STD, ReferenceScaledVAE, class_path
from .family import Family, UnsupportedModel, detect, read_json
from .qwen_image.dit import LATENT_CHANNELS, QwenImageDiT

TEXT_ENCODER_CONVERTER = ("diffsynth.utils.state_dict_converters.qwen_image_text_encoder."
                          "QwenImageTextEncoderStateDictConverter")
# (component folder, DiffSynth's model name, weight files)
COMPONENTS = (
    ("transformer", "qwen_image_dit", "diffusion_pytorch_model*.safetensors"),
    ("text_encoder", "qwen_image_text_encoder", "model*.safetensors"),
    ("vae", "qwen_image_vae", "diffusion_pytorch_model*.safetensors"),
)


def enter_model(model_hash: str, model_name: str, cls: type, stands_for: type | None, kwargs: dict,
                converter: str | None = None) -> None:
    """A checkpoint's entry in DiffSynth's model table (the "model table" patch): DiffSynth's loader builds `cls`
    with `kwargs` for a file of this hash. The offload and version maps of the DiffSynth class it stands for are
    shared with it (same objects: a fix to DiffSynth's applies to it too); None: `cls` has maps of its own (DiffSynth's
    class itself, or one whose module declares them). An entry with the same hash is replaced."""
    MODEL_CONFIGS[:] = [c for c in MODEL_CONFIGS if c["model_hash"] != model_hash]
    entry = {"model_hash": model_hash, "model_name": model_name, "model_class": class_path(cls),
             "extra_kwargs": dict(kwargs)}
    if converter:
        entry["state_dict_converter"] = converter
    MODEL_CONFIGS.append(entry)
    if stands_for is None:
        return
    VRAM_MANAGEMENT_MODULE_MAPS[class_path(cls)] = VRAM_MANAGEMENT_MODULE_MAPS[class_path(stands_for)]
    if class_path(stands_for) in VERSION_CHECKER_MAPS:
        VERSION_CHECKER_MAPS[class_path(cls)] = VERSION_CHECKER_MAPS[class_path(stands_for)]


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


def model_table_entry(files: list[str], model_name: str, cls: type, stands_for: type | None, kwargs: dict,
                      converter: str | None = None) -> ModelConfig:
    """The weight files of one model entered in DiffSynth's model table by their hash (enter_model), with the class
    that builds the configured model; their ModelConfig."""
    path = files if len(files) > 1 else files[0]
    enter_model(hash_model_file(path), model_name, cls, stands_for, kwargs, converter)
    return ModelConfig(path=path)


def model_configs(folder: Path) -> tuple[Family, list[ModelConfig], ModelConfig, ModelConfig]:
    """The family of the model in `folder`, and DiffSynth ModelConfigs for its weights, tokenizer and processor,
    each weight file entered in DiffSynth's model table with the class its config describes."""
    check_version()
    folder = Path(folder)
    family = detect(folder)
    entries = {
        "transformer": (QwenImageDiT, DiffSynthDiT,
                        _dit_kwargs(read_json(folder, "transformer/config.json"), folder), None),
        "text_encoder": (ConfiguredTextEncoder, QwenImageTextEncoder,
                         {"config": read_json(folder, "text_encoder/config.json")}, TEXT_ENCODER_CONVERTER),
        "vae": (ReferenceScaledVAE, DiffSynthVAE, _vae_kwargs(read_json(folder, "vae/config.json"), folder), None),
    }
    configs = []
    for component, model_name, pattern in COMPONENTS:
        files = weight_files(folder, component, pattern)
        cls, diffsynth_cls, kwargs, converter = entries[component]
        configs.append(model_table_entry(files, model_name, cls, diffsynth_cls, kwargs, converter))
    for name in ("tokenizer", "processor"):
        if not (folder / name).is_dir():
            raise UnsupportedModel(f"{folder} has no {name}/ folder")
    return family, configs, ModelConfig(path=str(folder / "tokenizer")), ModelConfig(path=str(folder / "processor"))
