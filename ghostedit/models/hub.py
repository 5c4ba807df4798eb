"""Real Qwen-Image-Edit weights: a local folder in the released layout, or a Hugging Face / ModelScope repo id
("modelscope:<id>") that becomes one. Which model it is comes from the folder's own configs (family.py); DiffSynth
loads the weights (checkpoint.py) and the pipeline computes as the reference does (exact.py).
"""
from __future__ import annotations

from pathlib import Path

import torch

from ..paths import ghostedit_home
from .family import detect, exact_pipeline, load

# What an edit reads from a repo (the rest, e.g. README and examples, is not downloaded)
REPO_FILES = ["model_index.json", "transformer/*", "text_encoder/*", "vae/*", "scheduler/*", "tokenizer/*",
              "processor/*"]


def repo_folder(repo: str) -> Path:
    """The local folder of a repo id, downloaded into GhostEdit's cache on first use."""
    if repo.startswith("modelscope:"):
        from modelscope import snapshot_download as modelscope_download
        return Path(modelscope_download(repo.removeprefix("modelscope:"), allow_patterns=REPO_FILES,
                                        cache_dir=str(ghostedit_home() / "modelscope")))
    from huggingface_hub import snapshot_download
    return Path(snapshot_download(repo.removeprefix("hf:"), allow_patterns=REPO_FILES,
                                  cache_dir=str(ghostedit_home() / "hub")))


def load_pretrained_pipeline(spec, device: str, torch_dtype: torch.dtype):
    """The family's DiffSynth pipeline over the folder's weights, computing as the family's reference."""
    if spec.kind == "local":
        folder = Path(spec.source)
    else:
        try:
            folder = repo_folder(spec.source)
        except Exception as error:
            raise RuntimeError(f"could not download {spec.source} from the model hub ({type(error).__name__}: "
                               f"{error}). Without network access, download the repo elsewhere and pass its "
                               "folder.") from error
    computation = (spec.family or detect(folder)).computation
    family, weights, tokenizer, processor = load(computation.checkpoint)(folder)
    pipe = load(computation.pipeline).from_pretrained(torch_dtype=torch_dtype, device=device, model_configs=weights,
                                                      tokenizer_config=tokenizer, processor_config=processor)
    return exact_pipeline(pipe, family)
