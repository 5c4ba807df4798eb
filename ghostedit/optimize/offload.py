"""What stays in host memory instead of on the device (Engine(host_memory=...)), so an FP8 DiT fits a 24 GB card.

base-dit      The base bf16 DiT lives in host memory; a configuration's DiT is built on the device from it, FP8
              layers moved over and quantized one at a time (recipe.py), so the device never holds the bf16 DiT.
text-encoder  The text encoder's weights stay in host memory and are streamed to the device layer by layer while
              it encodes (accelerate's cpu_offload), so its 15 GiB never sit beside the DiT.
Both cost host-to-device copies: once per preparation for the DiT, at every prompt encoding for the text encoder.
"""
from __future__ import annotations

import torch

from ..config import check_choice
from ..device import empty_cache

PLACEMENTS = ("base-dit", "text-encoder")


def checked(host_memory) -> tuple[str, ...]:
    for name in host_memory:
        check_choice("host memory placement", name, PLACEMENTS)
    return tuple(sorted(set(host_memory)))


def keep_in_host_memory(pipe, host_memory: tuple[str, ...], device: str) -> None:
    if "base-dit" in host_memory:
        pipe.dit.to("cpu")
    if "text-encoder" in host_memory:
        from accelerate import cpu_offload
        cpu_offload(pipe.text_encoder, execution_device=torch.device(device))
    empty_cache(device)
