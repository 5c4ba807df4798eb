"""NVIDIA Transformer Engine FP8: the DiT's image-stream linears become TE Linear layers whose weights are cast to
FP8 once, at preparation (created under TE's quantized model init), and every forward runs under TE's FP8 autocast.

TE's FP8 GEMMs need the token count of a layer's input divisible by 16. The image stream always is (latent tokens
come in 2x2 patches of a size that is a multiple of 16 pixels); the text stream is as long as the prompt, and the
modulation and timestep linears see one row per sample, so those stay in bf16 and the report names them.
"""
from __future__ import annotations

import contextlib
import functools
import importlib.util

import torch

from ..device import Availability, load_torch_cudnn, needs_cuda

# The text stream's linears (as separate projections, or fused by the fused-qkv rewrite), the modulation and the
# timestep embedding: their inputs are not a multiple of 16 tokens
_IMAGE_STREAM_SKIP = ("txt_", "add_q_proj", "add_k_proj", "add_v_proj", "add_qkv", "to_add_out", "_mod.",
                      "time_text_embed", "norm_out")


def availability(device: str) -> Availability:
    gpu = needs_cuda(device, "Transformer Engine FP8", min_capability=(8, 9))
    if not gpu.ok:
        return gpu
    # Found, not imported: importing TE changes the whole process (lab/probes/README.md: te_probe.py), so only a run
    # that asks for TE pays for it; a broken install then fails at preparation with TE's own message.
    if importlib.util.find_spec("transformer_engine") is None:
        return Availability.no("transformer_engine is not installed (see scripts/gpu/build_te_wheel.sh)")
    return Availability.yes()


@functools.cache  # called per converted layer and per forward
def import_te():
    """Imports transformer_engine.pytorch against the cuDNN that PyTorch itself runs with (device.load_torch_cudnn)."""
    load_torch_cudnn()
    import transformer_engine.pytorch as te
    return te


def recipe(scaling: str):
    """"current": per-tensor scales computed from each tensor at every call; "delayed": scales from the amax
    history of earlier calls (cheaper, one step behind)."""
    from transformer_engine.common.recipe import DelayedScaling, Float8CurrentScaling, Format
    if scaling == "current":
        return Float8CurrentScaling(fp8_format=Format.E4M3)
    return DelayedScaling(fp8_format=Format.E4M3, amax_history_len=16, amax_compute_algo="max")


def _model_init(fp8_recipe):
    te = import_te()
    init = getattr(te, "quantized_model_init", None) or te.fp8_model_init
    return init(enabled=True, recipe=fp8_recipe)


def image_stream_targets(eligible: dict[str, torch.nn.Linear]) -> list[tuple[str, torch.nn.Linear]]:
    """The linears TE can take: the image stream's."""
    return [(name, m) for name, m in eligible.items() if not any(part in name for part in _IMAGE_STREAM_SKIP)]


def convert(model: torch.nn.Module, eligible: dict[str, torch.nn.Linear], report, device: str, scaling: str) -> None:
    """Replaces the eligible linears (by name) that TE can take with TE Linear layers; the rest stay bf16."""
    te = import_te()
    fp8_recipe = recipe(scaling)
    targets = image_stream_targets(eligible)
    refused = set(eligible) - {name for name, _ in targets}
    for name, linear in targets:
        linear.to(device)
        with _model_init(fp8_recipe):
            replacement = te.Linear(linear.in_features, linear.out_features, bias=linear.bias is not None,
                                    params_dtype=linear.weight.dtype, device=device)
        with torch.no_grad():
            replacement.weight.copy_(linear.weight)  # quantizes once into the FP8 weight
            if linear.bias is not None:
                replacement.bias.copy_(linear.bias)
        parent_name, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent_name) if parent_name else model, child, replacement)
    report.kept_bf16 = sorted(set(report.kept_bf16) | refused)
    report.converted = len(targets)
    model.ghostedit_te_recipe = fp8_recipe


def autocast(model: torch.nn.Module):
    te = import_te()
    fp8_recipe = getattr(model, "ghostedit_te_recipe", None)
    if fp8_recipe is None:
        return contextlib.nullcontext()
    enter = getattr(te, "autocast", None)
    if enter is not None:
        return enter(enabled=True, recipe=fp8_recipe)
    return te.fp8_autocast(enabled=True, fp8_recipe=fp8_recipe)
