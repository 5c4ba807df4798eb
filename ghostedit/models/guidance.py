"""True CFG as each family's reference computes it, and the pipelines' CFG step that runs it: shared by one
process's pipelines (exact.py, qwen_image_21/pipeline.py) and CFG parallel's ranks (parallel/cfg.py), which
combine the two predictions with the same function (`guidance`, a pipeline class's)."""
from __future__ import annotations

import torch
from einops import rearrange


def guided(positive: torch.Tensor, negative: torch.Tensor, scale: float) -> torch.Tensor:
    """True CFG as the Edit models' reference (diffusers' QwenImageEditPlusPipeline) computes it: the combination
    rescaled, per DiT token (2x2 latent patch, all channels), to the norm of the conditional prediction."""
    combined = linear_guided(positive, negative, scale)
    tokens = "B C (H P) (W Q) -> B H W (C P Q)"
    positive_norm = rearrange(positive, tokens, P=2, Q=2).norm(dim=-1, keepdim=True)
    combined_tokens = rearrange(combined, tokens, P=2, Q=2)
    rescaled = combined_tokens * (positive_norm / combined_tokens.norm(dim=-1, keepdim=True))
    return rearrange(rescaled, "B H W (C P Q) -> B C (H P) (W Q)", P=2, Q=2)


def linear_guided(positive: torch.Tensor, negative: torch.Tensor, scale: float) -> torch.Tensor:
    """True CFG as Qwen-Image-2.1's reference (diffusers' QwenImage21Pipeline) computes it: the linear combination,
    not rescaled."""
    return negative + scale * (positive - negative)


class ReferenceGuidance:
    """DiffSynth's CFG step (`cfg_guided_model_fn`) for a pipeline that combines as its reference: the conditional
    pass, then with true CFG the unconditional one, combined by the class's `guidance`."""

    guidance = staticmethod(guided)

    def cfg_guided_model_fn(self, model_fn, cfg_scale, inputs_shared, inputs_posi, inputs_nega, **inputs_others):
        positive = model_fn(**inputs_posi, **inputs_shared, **inputs_others)
        if cfg_scale == 1.0:
            return positive
        negative = model_fn(**inputs_nega, **inputs_shared, **inputs_others)
        return self.guidance(positive, negative, cfg_scale)
