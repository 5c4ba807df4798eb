"""Where the time of Qwen-Image-2.1's cached step goes (issue 41: its cached step was 1.94x DiffSynth's, the target
2.5x): the full-size synthetic 2.1 DiT alone, a configuration's step that fills the prefix cache and then its cached
steps, each timed (CUDA events, median after warm-up), the cached step profiled with torch.profiler, its GPU kernels
sorted into GEMMs, attention, GhostEdit's and Inductor's kernels and the rest (profile_dit.py's families), beside
the ideal times of its GEMMs and its attention at the H100 ceilings profile_dit.py names.

On the GPU machine (after `source scripts/gpu/setup.sh`), one device call:
    python3 lab/probes/profile_dit_21.py [--config CONFIG] [--references N] [--out DIR]
Writes DIR/profile-21/profile.json and prints a summary. `--model tiny-2.1 --device cpu --config baseline`
rehearses the code path on a CPU (its times say nothing; no kernel profile there).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import torch

from ghostedit.config import OptimizationConfig
from ghostedit.engine import Engine
from ghostedit.engine.runner import dit_run
from ghostedit.models.qwen_image_21.dit import layout, step_forward
from ghostedit.models.seams import PrefixKVCache
from ghostedit.telemetry import RunRecorder, median_ms

from profile_dit import ATTENTION_TFLOPS, FP8_GEMM_TFLOPS, kernel_breakdown, print_breakdown  # beside this script

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests" / "gpu"))
from gpu_scripts import dit_21_inputs  # noqa: E402 - the GPU tests' 2.1 DiT inputs

# scripts/gpu/bench.sh's fastest 2.1 configuration (QWEN21_FASTEST), the one of the cached step's figure
FASTEST = ("attention=cudnn-fp8,fp8=torchao,compile=regional,text-encoder=graphed,vae=image-fused,"
           "rewrites=inductor-persistent-rows+cuda-graph+real-rope+fused-qkv+carried-residual"
           "+fused-qk-norm-rope+fp8-attention-out")
TEXT_BEFORE, TEXT_AFTER = 24, 40   # prompt tokens before and after the references' slots
FILLING_TIMESTEP, CACHED_TIMESTEP = 0.9, 0.5


def ideal_ms(dit, target_tokens: int, prefix_tokens: int) -> dict:
    """A cached step's GEMM and attention FLOPs at the ceilings: every block's linears over the target's tokens (the
    modulation is computed once per step, for one token), and the target's queries over the prefix's and its own
    keys."""
    block = dit.blocks[0]
    weights = sum(module.in_features * module.out_features for name, module in block.named_modules()
                  if isinstance(module, torch.nn.Linear))
    heads, head_dim = block.attn.heads, block.attn.head_dim
    blocks = len(dit.blocks)
    gemm_flops = 2 * weights * target_tokens * blocks
    attention_flops = 4 * target_tokens * (prefix_tokens + target_tokens) * heads * head_dim * blocks
    return {"gemm_tflop": gemm_flops / 1e12, "attention_tflop": attention_flops / 1e12,
            "gemm_ms": gemm_flops / FP8_GEMM_TFLOPS / 1e9, "attention_ms": attention_flops / ATTENTION_TFLOPS / 1e9}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.environ.get("OUT", "bench-results"))
    parser.add_argument("--model", default="synthetic-2.1")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--config", default=FASTEST)
    parser.add_argument("--side", type=int, default=1024)
    parser.add_argument("--references", type=int, default=1, help="reference images (0: text-to-image)")
    parser.add_argument("--repeats", type=int, default=10)
    args = parser.parse_args()
    out = Path(args.out) / "profile-21"
    out.mkdir(parents=True, exist_ok=True)
    device, side_tokens = args.device, args.side // 16
    engine = Engine(args.model, device=device, dit_only=True)
    dit = engine.load().dit
    given = dit_21_inputs(dit, side_tokens, args.references, TEXT_BEFORE, TEXT_AFTER, 1, device)
    config = OptimizationConfig.parse(args.config)
    prepared, _ = engine.prepare(config)
    target = side_tokens * side_tokens
    prefix = TEXT_BEFORE + TEXT_AFTER + args.references * target  # the text and each reference's latent tokens
    report = {"config": config.label, "device": torch.cuda.get_device_name() if device.startswith("cuda") else device,
              "torch": torch.__version__, "side": args.side, "references": args.references,
              "tokens": {"prefix": prefix, "target": target}, "ideal": ideal_ms(prepared.dit, target, prefix)}
    latents, prompt = given["latents"][0], given["prompt"]
    with torch.no_grad(), dit_run(prepared, config, device, prefix + target, RunRecorder(device)) as (options, ran):
        options = options.replace(prefix_cache=PrefixKVCache())
        layout_ = layout(given["image_mask"], given["shapes"], None, prepared.dit.rope, device, options)
        steps, computed = iter(range(10**9)), []

        def step(timestep: float):
            prediction, tokens = step_forward(prepared.dit, latents, prompt,
                                              torch.tensor([timestep], device=device, dtype=torch.bfloat16), layout_,
                                              next(steps), options)
            computed.append(tokens)
            return prediction
        # the filling step once as the edit runs it (the first, which fills the cache), then cached steps; each of
        # the two is compiled (and with cuda-graph captured at its second call) by the warm-up of its timing
        report["filling_first_call_ms"] = median_ms(lambda: step(FILLING_TIMESTEP), device, repeats=1, warmup=0)
        report["cached_ms"] = median_ms(lambda: step(CACHED_TIMESTEP), device, repeats=args.repeats, warmup=3)
        report["words"] = ran.get("words", {})
        report["tokens_computed"] = {"filling": computed[0], "cached": computed[-1]}  # the cache read: target only
        assert computed == [prefix + target] + [target] * (len(computed) - 1), report["tokens_computed"]
        print(json.dumps({key: report[key] for key in ("config", "tokens", "cached_ms", "ideal")}), flush=True)
        if device.startswith("cuda"):
            report["cached_step"] = kernel_breakdown(lambda: step(CACHED_TIMESTEP))
            print_breakdown(report["cached_step"], report["ideal"])
    (out / "profile.json").write_text(json.dumps(report, indent=2, default=str))


if __name__ == "__main__":
    main()
