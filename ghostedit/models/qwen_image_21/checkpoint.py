"""A Qwen-Image-2.1 folder in the released layout (model_index.json, transformer/, text_encoder/, vae/, scheduler/,
processor/) loaded through DiffSynth's own loader, each model built from the folder's config, as the Edit family's
checkpoint.py does: DiffSynth identifies a weight file by a hash of its keys and shapes, so each file's hash is
entered in its model table with the class that builds the configured model (the DiT: GhostEdit's own, dit.py; the
text encoder: DiffSynth's QwenImage21TextEncoder over the folder's Qwen3-VL config, its key converter kept; the VAE:
DiffSynth's QwenImage21VAE with the folder's config). An entry DiffSynth had for the same hash (the released files)
is replaced by the configured one, so a file loads once.
"""
from __future__ import annotations

import copy
import inspect
from pathlib import Path

import torch
from diffsynth.configs import VRAM_MANAGEMENT_MODULE_MAPS
from diffsynth.core.loader import ModelConfig
from diffsynth.models.qwen_image_21_text_encoder import QwenImage21TextEncoder
from diffsynth.models.qwen_image_21_vae import QwenImage21VAE

from ...diffsynth_patches import check_version
from ..checkpoint import model_table_entry, weight_files
from ..exact import class_path
from ..family import Family, UnsupportedModel, detect, read_json
from . import dit

TEXT_ENCODER_CONVERTER = ("diffsynth.utils.state_dict_converters.qwen_image_21_text_encoder."
                          "QwenImage21TextEncoderStateDictConverter")
LINEAR = "diffsynth.core.vram.layers.AutoWrappedLinear"
MODULE = "diffsynth.core.vram.layers.AutoWrappedModule"
# DiffSynth's offload/FP8 map for the DiT: its linears, and its norms as whole modules
VRAM_MANAGEMENT_MODULE_MAPS.setdefault(class_path(dit.QwenImage21DiT), {
    "torch.nn.Linear": LINEAR, f"{dit.__name__}.RMSNorm": MODULE, f"{dit.__name__}.ZeroCenteredRMSNorm": MODULE})
# (component folder, DiffSynth's model name, weight files)
COMPONENTS = (
    ("transformer", "qwen_image_21_dit", "diffusion_pytorch_model*.safetensors"),
    ("text_encoder", "qwen_image_21_text_encoder", "model*.safetensors"),
    ("vae", "qwen_image_21_vae", "diffusion_pytorch_model*.safetensors"),
)
LATENT_CHANNELS = 64
LAYOUT = "transformer/, text_encoder/, vae/, scheduler/, processor/"  # the released 2.1 folders

class ConfiguredTextEncoder(QwenImage21TextEncoder):
    """DiffSynth's QwenImage21TextEncoder (the hidden state before the final norm) over the Qwen3-VL of a
    text_encoder/config.json, instead of the 8B one its own __init__ builds."""

    def __init__(self, config: dict):
        from transformers import Qwen3VLConfig, Qwen3VLForConditionalGeneration

        torch.nn.Module.__init__(self)
        self.config = Qwen3VLConfig(**copy.deepcopy(config))  # it rewrites what it is given
        self.model = Qwen3VLForConditionalGeneration(self.config)
        # as DiffSynth's: the rotary frequencies stay float32 when the model is cast (its `to` restores them)
        self._fp32_buffers = {name: buffer.detach().clone() for name, buffer in self.model.named_buffers()
                              if buffer.dtype == torch.float32}

def _keyword_arguments(cls, config: dict) -> dict:
    """The config's values that `cls.__init__` takes (a diffusers config also holds `_class_name`, versions...)."""
    names = inspect.signature(cls.__init__).parameters
    return {name: value for name, value in config.items() if name in names and name != "self"}

def dit_kwargs(config: dict, folder: Path) -> dict:
    kwargs = _keyword_arguments(dit.QwenImage21DiT, config)
    if kwargs.get("patch_size", 1) != 1 or kwargs.get("in_channels", LATENT_CHANNELS) != LATENT_CHANNELS \
            or not kwargs.get("causal_condition", True):
        raise UnsupportedModel(f"{folder}: transformer/config.json has patch_size={kwargs.get('patch_size')}, "
                               f"in_channels={kwargs.get('in_channels')}, causal_condition="
                               f"{kwargs.get('causal_condition')}; GhostEdit runs 2.1's unpatched "
                               f"{LATENT_CHANNELS}-channel latents with causal_condition")
    return kwargs

def vae_kwargs(config: dict, folder: Path) -> dict:
    kwargs = _keyword_arguments(QwenImage21VAE, config)
    if kwargs.get("z_dim", LATENT_CHANNELS) != LATENT_CHANNELS or kwargs.get("in_channels", 4) != 4 \
            or kwargs.get("patch_size") is not None:
        raise UnsupportedModel(f"{folder}: vae/config.json is not an unpatched RGBA VAE with {LATENT_CHANNELS} "
                               "latent channels")
    return kwargs

def model_configs(folder: Path) -> tuple[Family, list[ModelConfig], None, ModelConfig]:
    """The family of the 2.1 model in `folder`, DiffSynth ModelConfigs for its weights, no tokenizer (the
    processor holds it) and its processor, each weight file entered in DiffSynth's model table with the class its
    config describes."""
    check_version()
    folder = Path(folder)
    family = detect(folder)
    entries = {
        # (the class, the DiffSynth class whose maps it shares: None where it has its own, its kwargs, converter)
        "transformer": (dit.QwenImage21DiT, None, dit_kwargs(read_json(folder, "transformer/config.json"), folder),
                        None),
        "text_encoder": (ConfiguredTextEncoder, QwenImage21TextEncoder,
                         {"config": read_json(folder, "text_encoder/config.json")}, TEXT_ENCODER_CONVERTER),
        "vae": (QwenImage21VAE, None, vae_kwargs(read_json(folder, "vae/config.json"), folder), None),
    }
    configs = [model_table_entry(weight_files(folder, component, pattern, LAYOUT), model_name, *entries[component])
               for component, model_name, pattern in COMPONENTS]
    if not (folder / "processor").is_dir():
        raise UnsupportedModel(f"{folder} has no processor/ folder")
    return family, configs, None, ModelConfig(path=str(folder / "processor"))
