"""The preparation recipe: from the base DiT to the DiT a configuration runs, as a short sequence of named steps,
lossless ones (LoRA, rewrites, compile) kept apart from the lossy one (FP8).

Works on a copy that shares the base's tensors and only ever replaces them, so the base is never modified and a
failure anywhere leaves it (and whatever else holds it) as it was.
"""
from __future__ import annotations

import copy

import torch

from .config import OptimizationConfig
from .optimize import compile as compile_opt, fp8, lora as lora_opt
from .telemetry import RunRecorder


def clone_sharing_weights(module: torch.nn.Module) -> torch.nn.Module:
    """A copy of the module tree whose parameters are new Parameter objects over the same storage: replacing a
    weight in the copy (fusing, quantizing) leaves the original untouched, and unchanged weights cost nothing."""
    memo = {id(p): torch.nn.Parameter(p.data, requires_grad=False) for p in module.parameters()}
    memo.update({id(b): b for b in module.buffers()})
    return copy.deepcopy(module, memo)


def prepare_dit(base_dit: torch.nn.Module, config: OptimizationConfig, recorder: RunRecorder, device: str):
    """Returns the prepared DiT, on `device`, and a report of what each step did, in words. A base kept in host
    memory is brought over as the steps go: FP8 layers one at a time, so the device never holds the bf16 DiT."""
    from .optimize import rewrites  # imports DiffSynth's DiT module: loaded with the model, not with the app
    report = {}

    def step(name, message):
        return recorder.stage(name, message, into_prepare=True)

    with step("copy", "copying the DiT (weights shared)"):
        dit = clone_sharing_weights(base_dit)
    # Lossless
    if config.lora is not None:
        with step("read LoRA", "reading the LoRA"):
            matched = lora_opt.match_lora(dit, lora_opt.read_lora_file(config.lora.path))
        if config.lora.mode == "fused":
            with step("fuse LoRA", "fusing the LoRA into bf16 weights"):
                lora_opt.fuse_lora(dit, matched, config.lora.scale)
        else:
            with step("attach LoRA", "attaching runtime LoRA layers"):
                lora_opt.attach_runtime_lora(dit, matched)
        report["lora"] = f"{config.lora.name}: {matched.report}, {config.lora.mode}"
    if "joint-layout" in config.rewrites:  # also implied by fused-qkv and cudnn-fp8 (see OptimizationConfig)
        layers = rewrites.joint_attention(dit, fp8_scales=config.attention == "cudnn-fp8")
        report["joint-layout"] = f"{len(layers)} joint attention layers in the projections' layout"
        if "fused-qkv" in config.rewrites:
            with step("fuse QKV", "fusing q/k/v projections"):
                report["fused-qkv"] = f"{rewrites.fuse_qkv(layers)} attention layers with fused q/k/v projections"
    if "real-rope" in config.rewrites:
        rewrites.use_real_rope(dit)
        report["real-rope"] = "rotary embedding with real cos/sin"
    # Lossy: after any fusing, so a LoRA is merged into bf16 weights, never into quantized ones
    with step("quantize", "quantizing to FP8"):
        report["fp8"] = fp8.apply_fp8(dit, config.fp8, device).text
    with step("to device", f"moving the DiT to {device}"):
        dit.to(device)
    # Lossless, last: compile what the steps above produced
    if config.compile != "off":
        with step("compile", "setting up torch.compile"):
            options, words = rewrites.inductor_settings(config.rewrites)
            blocks = compile_opt.compile_regions(dit, config.compile, options)
        report["compile"] = ", ".join([f"{config.compile}: {blocks} transformer blocks (compiled on first call)",
                                       *words])
    return dit, report
