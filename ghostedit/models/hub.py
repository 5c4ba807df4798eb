"""Real Qwen-Image-Edit weights through DiffSynth's ModelConfig: a Hugging Face or ModelScope repo id, or a local
folder with the same layout (transformer/, text_encoder/, vae/, processor/, tokenizer/ as Qwen publishes them).

A repo id is downloaded to a local folder on first use (ghostedit/downloads.py: size announced, disk checked,
progress, resume, offline from the cache; prefix it with "modelscope:" for ModelScope), then loaded from that folder
like any local one.
"""
from __future__ import annotations

import glob
from pathlib import Path

import torch

# (DiffSynth's model, file pattern inside the repo or folder)
WEIGHT_FILES = (
    ("dit", "transformer/diffusion_pytorch_model*.safetensors"),
    ("text_encoder", "text_encoder/model*.safetensors"),
    ("vae", "vae/diffusion_pytorch_model.safetensors"),
)


def _local_configs(folder: Path):
    from diffsynth.core import ModelConfig

    configs = []
    for _, pattern in WEIGHT_FILES:
        files = sorted(glob.glob(str(folder / pattern)))
        if not files:
            raise FileNotFoundError(f"{folder} has no {pattern}: a local model folder needs the layout of "
                                    f"Qwen/Qwen-Image-Edit-2509 (transformer/, text_encoder/, vae/, processor/)")
        configs.append(ModelConfig(path=files if len(files) > 1 else files[0]))
    return configs, ModelConfig(path=str(folder / "tokenizer")), ModelConfig(path=str(folder / "processor"))


def load_pretrained_pipeline(spec, device: str, torch_dtype: torch.dtype, on_download=None):
    """`on_download`: gets the DownloadPlan (what will be fetched, before anything is) and then DownloadProgress."""
    folder = Path(spec.source) if spec.kind == "local" else download_model(spec.source, on_download)
    return load_local_pipeline(folder, device, torch_dtype)


def download_model(reference: str, on_download=None) -> Path:
    """The local folder of a hub repo id, downloaded first where the cache does not hold it."""
    from ..downloads import model_folder
    return model_folder(reference, on_progress=on_download, on_plan=on_download)


def load_local_pipeline(folder: Path, device: str, torch_dtype: torch.dtype):
    from diffsynth.pipelines.qwen_image import QwenImagePipeline

    model_configs, tokenizer_config, processor_config = _local_configs(folder)
    return QwenImagePipeline.from_pretrained(torch_dtype=torch_dtype, device=device, model_configs=model_configs,
                                             tokenizer_config=tokenizer_config, processor_config=processor_config)
