"""True CFG as the model's reference computes it (diffusers' QwenImageEditPlusPipeline), shared by one process's
pipeline (exact.py) and CFG parallel's ranks (parallel/cfg.py)."""
from __future__ import annotations

import torch
from einops import rearrange


def guided(positive: torch.Tensor, negative: torch.Tensor, scale: float) -> torch.Tensor:
    """True CFG as the reference computes it: the combination rescaled, per DiT token (2x2 latent patch, all
    channels), to the norm of the conditional prediction."""
    combined = negative + scale * (positive - negative)
    tokens = "B C (H P) (W Q) -> B H W (C P Q)"
    positive_norm = rearrange(positive, tokens, P=2, Q=2).norm(dim=-1, keepdim=True)
    combined_tokens = rearrange(combined, tokens, P=2, Q=2)
    rescaled = combined_tokens * (positive_norm / combined_tokens.norm(dim=-1, keepdim=True))
    return rearrange(rescaled, "B H W (C P Q) -> B C (H P) (W Q)", P=2, Q=2)
