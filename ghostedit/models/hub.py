"""Real Qwen-Image-Edit and Qwen-Image-2.1 weights: a local folder in the released layout, or a Hugging Face / ModelScope repo id
("modelscope:<id>") that becomes one. A repo id is downloaded on first use (downloads.py: size announced, disk
checked, progress, resume, offline from the cache), then loaded like any local folder. Which model it is comes from
the folder's own configs (family.py); DiffSynth loads the weights (checkpoint.py) and the pipeline computes as the
reference does (exact.py).
"""
from __future__ import annotations

from pathlib import Path

import torch

from ..downloads import model_folder
from .family import detect, exact_pipeline, load


def load_pretrained_pipeline(spec, device: str, torch_dtype: torch.dtype, on_download=None):
    """The family's DiffSynth pipeline over the folder's weights, computing as the family's reference.
    `on_download`: gets the DownloadPlan (what will be fetched, before anything is) and then DownloadProgress."""
    folder = Path(spec.source) if spec.kind == "local" else download_model(spec.source, on_download)
    computation = (spec.family or detect(folder)).computation
    family, weights, tokenizer, processor = load(computation.checkpoint)(folder)
    tokenizer = {} if tokenizer is None else {"tokenizer_config": tokenizer}  # 2.1's processor holds its tokenizer
    pipe = load(computation.pipeline).from_pretrained(torch_dtype=torch_dtype, device=device, model_configs=weights,
                                                      processor_config=processor, **tokenizer)
    return exact_pipeline(pipe, family)


def download_model(reference: str, on_download=None) -> Path:
    """The local folder of a hub repo id, downloaded first where the cache does not hold it."""
    return model_folder(reference, on_progress=on_download, on_plan=on_download)
