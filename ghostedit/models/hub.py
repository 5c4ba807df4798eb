"""Real Qwen-Image-Edit weights through DiffSynth's ModelConfig: a Hugging Face or ModelScope repo id, or a local
folder with the same layout (transformer/, text_encoder/, vae/, processor/, tokenizer/ as Qwen publishes them).

A repo id downloads on first use; prefix it with "modelscope:" to use ModelScope instead of Hugging Face.
"""
from __future__ import annotations

import glob
import os
from pathlib import Path

import torch

from ..paths import ghostedit_home

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


def _hub_configs(repo: str):
    from diffsynth.core import ModelConfig

    source = "huggingface"
    if repo.startswith("modelscope:"):
        source, repo = "modelscope", repo.removeprefix("modelscope:")
    repo = repo.removeprefix("hf:")

    def config(pattern):
        return ModelConfig(model_id=repo, origin_file_pattern=pattern, download_source=source)
    return [config(pattern) for _, pattern in WEIGHT_FILES], config("tokenizer/"), config("processor/")


def load_pretrained_pipeline(spec, device: str, torch_dtype: torch.dtype):
    from diffsynth.pipelines.qwen_image import QwenImagePipeline

    if spec.kind == "local":
        model_configs, tokenizer_config, processor_config = _local_configs(Path(spec.source))
    else:
        os.environ.setdefault("DIFFSYNTH_MODEL_BASE_PATH", str(ghostedit_home() / "hub"))
        model_configs, tokenizer_config, processor_config = _hub_configs(spec.source)
    try:
        return QwenImagePipeline.from_pretrained(torch_dtype=torch_dtype, device=device, model_configs=model_configs,
                                                 tokenizer_config=tokenizer_config, processor_config=processor_config)
    except Exception as error:
        if spec.kind == "hub":
            raise RuntimeError(f"could not load {spec.source} from the model hub ({type(error).__name__}: {error}). "
                               "Without network access, download the repo elsewhere and pass its folder.") from error
        raise
