"""The LoRA-switch bench: on a prepared (FP8, compiled) configuration, how long switching fused LoRAs takes (the
first LoRA, one to another, stacked, back to none) and whether anything recompiles, and what changing a runtime
LoRA's scale costs. The LoRAs are random, shaped like real Qwen-Image LoRAs (every linear of every block, at a rank),
written once to the output folder."""
from __future__ import annotations

import time
from pathlib import Path

import torch

from ..config import LoraChoice, OptimizationConfig
from ..device import synchronize
from ..optimize import lora as lora_layers

# The linears a Qwen-Image LoRA trains in each block (14 per block: 840 on the 60-block DiT)
TARGETS = ("attn.to_q", "attn.to_k", "attn.to_v", "attn.to_out.0", "attn.add_q_proj", "attn.add_k_proj",
           "attn.add_v_proj", "attn.to_add_out", "img_mlp.net.0.proj", "img_mlp.net.2", "txt_mlp.net.0.proj",
           "txt_mlp.net.2", "img_mod.1", "txt_mod.1")


def synthetic_lora(dit, rank: int, seed: int, path: Path) -> Path:
    """A LoRA file in the diffusers/PEFT layout (transformer.<layer>.lora_A/lora_B), random, the size of a real one."""
    from safetensors.torch import save_file
    if path.exists():
        return path
    generator = torch.Generator().manual_seed(seed)
    tensors = {}
    for index, _ in enumerate(dit.transformer_blocks):
        for target in TARGETS:
            linear = dit.get_submodule(f"transformer_blocks.{index}.{target}")
            key = f"transformer.transformer_blocks.{index}.{target}"
            tensors[f"{key}.lora_A.weight"] = (torch.randn(rank, linear.in_features, generator=generator)
                                               / linear.in_features ** 0.5).to(torch.bfloat16)
            tensors[f"{key}.lora_B.weight"] = (torch.randn(linear.out_features, rank, generator=generator)
                                               * 0.01).to(torch.bfloat16)
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(path))
    return path


def compiled_frames() -> int:
    """Frames torch.compile has compiled in this process so far (a difference across a run = its recompiles)."""
    from torch._dynamo.utils import counters
    return counters["frames"]["ok"]


def run_lora_switch_bench(engine, request, config: OptimizationConfig, rank: int, folder: Path) -> dict:
    """Switches on the prepared configuration, each timed by the engine ("LoRA switch" stage)."""
    base = engine.load(config)
    a, b = (LoraChoice.from_file(synthetic_lora(base.dit, rank, seed, folder / f"lora-{name}-r{rank}.safetensors"))
            for name, seed in (("a", 1), ("b", 2)))
    ready = engine.run(request, config)  # prepared and compiled before any switch
    steps = [("first LoRA (none to A)", (a,)), ("A to B", (b,)), ("B to A + B stacked", (a, b)),
             ("back to none", ()), ("none to A again", (a,))]
    rows = []
    for name, loras in steps:
        frames = compiled_frames()
        result = engine.run(request, config.replace(loras=loras))
        stages = result.telemetry.stages
        rows.append({"switch": name, "switch_s": stages.get("LoRA switch", 0.0),
                     "compile_warmup_s": stages.get("compile warm-up", 0.0),
                     "new_compiled_frames": compiled_frames() - frames, "cache_hit": result.telemetry.cache_hit,
                     "edit_s": result.telemetry.total_seconds, "report": {k: v for k, v in result.prepared_report.items()
                                                                          if k.startswith("LoRA")}})
        print(f"{name}: {rows[-1]['switch_s']:.2f} s, recompiled frames {rows[-1]['new_compiled_frames']}", flush=True)
    return {"config": config.label, "text": config.text, "rank": rank, "ready_edit_s": ready.telemetry.total_seconds,
            "layers": sum(1 for _ in base.dit.transformer_blocks) * len(TARGETS), "rows": rows,
            "runtime_scale": _runtime_scale_change(engine, request, config, a)}


def _runtime_scale_change(engine, request, config, lora: LoraChoice) -> dict:
    """A runtime LoRA prepared once; a new scale is a cache hit whose only cost is rewriting the small B matrices.
    Run on the configuration less the rewrites that refuse runtime LoRAs."""
    runtime = config.for_runtime_loras().replace(loras=(LoraChoice(lora.path, lora.sha256, 0.5, "runtime"),))
    engine.run(request, runtime)
    frames = compiled_frames()
    again = engine.run(request, runtime.replace(loras=(LoraChoice(lora.path, lora.sha256, 1.0, "runtime"),)))
    prepared, _ = engine.prepare(runtime)
    start = time.perf_counter()
    lora_layers.set_runtime_scales(prepared.dit, {lora.sha256: 0.8})
    synchronize(engine.device)
    return {"cache_hit": again.telemetry.cache_hit, "new_compiled_frames": compiled_frames() - frames,
            "set_scales_s": time.perf_counter() - start, "edit_s": again.telemetry.total_seconds,
            "s_per_step": again.telemetry.denoise_seconds_per_step, "config": runtime.replace(loras=()).label}
