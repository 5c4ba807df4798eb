"""Where the time of one DiT forward goes, for the best configuration, and what compile settings change it.

On the GPU machine (after `source scripts/gpu/setup.sh`):
    python3 lab/probes/profile_dit.py [--config CONFIG] [--engine-only] [--out DIR]
Builds the full-size synthetic DiT alone, times the configuration's forward (CUDA events, median after warm-up,
first call apart; and the CPU's time to hand a forward to the GPU, with the calls that make it wait) with its blocks
compiled two ways: as the engine compiles them (dynamic shapes) and for static
shapes. Each is profiled with torch.profiler, its GPU kernels
sorted into GEMMs, attention, Inductor-generated kernels and the rest, against the ideal times of
the GEMMs and the attention at the measured ceilings. Writes profile.json and prints a summary.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import re
import time
import warnings
from collections import defaultdict
from pathlib import Path

import torch

from ghostedit.bench.dit import dit_inputs, running
from ghostedit.config import OptimizationConfig
from ghostedit.engine import Engine
from ghostedit.kernels import triton_code
from ghostedit.optimize import registry
from ghostedit.optimize.compile import compile_regions
from ghostedit.telemetry import RunRecorder, median_ms

from timing import back_to_back_ms  # beside this script

# Kernel families by name, first match wins: GhostEdit's own Triton kernels (ghostedit/kernels/triton_code.py) by their
# function names; Inductor names its kernels after the ops they fuse ("scaled_mm" when one quantizes a GEMM's
# input), and FlashAttention-4's kernels are CUTLASS kernels
FAMILIES = (("ghostedit", "^(" + "|".join(triton_code.NAMES) + ")$"),
            ("inductor", r"^triton_"),
            ("attention", r"flash|fmha|sdpa|attn|fprop"),
            ("gemm", r"gemm|cutlass|xmma|nvjet|f8f8bf16|scaled_mm|matmul|sm90_"),
            ("other", r""))
# Ceilings measured on an H100 before this project (its brief): FP8 rowwise GEMM and cuDNN attention at this shape
FP8_GEMM_TFLOPS, ATTENTION_TFLOPS = 1290, 687


def compiled_variant(engine, config: OptimizationConfig, dynamic: bool):
    """The configuration prepared without compile, then its blocks compiled for dynamic or static shapes."""
    compiled_only = [flag for flag in config.flags("rewrites") if registry.get(flag).compile_options]
    eager = config.replace(compile="off", rewrites=tuple(set(config.flags("rewrites")) - set(compiled_only)))
    prepared, _ = engine.prepare(eager)
    options, _ = registry.compile_options(config)
    if dynamic:
        compile_regions(prepared.dit, config.value("compile"), options)
    else:
        for block in prepared.dit.blocks:
            block.compile(dynamic=False, options=options or None)
    return prepared


def time_variant(call) -> dict:
    torch.cuda.synchronize()
    start = time.perf_counter()
    call()
    torch.cuda.synchronize()
    first_call_s = time.perf_counter() - start
    ms = median_ms(call, "cuda", repeats=10, warmup=2)
    return {"first_call_s": first_call_s, "ms_per_forward": ms, "back_to_back_ms": back_to_back_ms(call, 10),
            **cpu_side(call)}


def cpu_side(call, repeats: int = 10) -> dict:
    """How long the CPU takes to hand one forward to the GPU (from the call to its return, the GPU idle at the start):
    near the forward's GPU time, the CPU sets the pace. And how many times the forward makes the CPU wait for the
    GPU (torch's sync debug mode, which counts the synchronizing calls it knows of)."""
    times = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        start = time.perf_counter()
        call()
        times.append((time.perf_counter() - start) * 1000)
    torch.cuda.synchronize()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            call()
        finally:
            torch.cuda.set_sync_debug_mode("default")
        torch.cuda.synchronize()
    syncs = [str(warning.message)[:200] for warning in caught
             if "called a synchronizing CUDA operation" in str(warning.message)]  # not the mode's own notice
    return {"cpu_launch_ms": sorted(times)[len(times) // 2], "synchronizing_calls": len(syncs),
            "synchronizing_examples": sorted(set(syncs))[:5]}


def python_profile(call, top: int = 30) -> list[str]:
    """cProfile of one forward timed alone (the CPU's part; the GPU's kernels run meanwhile): the functions with the
    most cumulative time, as pstats prints them."""
    import cProfile
    import io
    import pstats
    torch.cuda.synchronize()
    profiler = cProfile.Profile()
    profiler.enable()
    call()
    profiler.disable()
    torch.cuda.synchronize()
    text = io.StringIO()
    pstats.Stats(profiler, stream=text).sort_stats("cumulative").print_stats(top)
    return [line[:200] for line in text.getvalue().splitlines() if line.strip()]


def kernel_breakdown(call, forwards: int = 3, trace: Path | None = None) -> dict:
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(forwards):
            call()
        torch.cuda.synchronize()
    if trace is not None:  # the kernels on their streams, for a timeline viewer (Perfetto); torch gzips a .gz path
        prof.export_chrome_trace(str(trace))
    kernels = defaultdict(lambda: [0.0, 0])
    spans = []
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            kernels[event.name][0] += event.device_time / 1000 / forwards
            kernels[event.name][1] += 1 / forwards
            spans.append((event.time_range.start, event.time_range.end, event.name))
    families = defaultdict(float)
    for name, (ms, _) in kernels.items():
        families[next(family for family, pattern in FAMILIES if re.search(pattern, name, re.IGNORECASE))] += ms
    top = sorted(kernels.items(), key=lambda item: -item[1][0])[:40]
    return {"families_ms": dict(families), "total_kernel_ms": sum(families.values()),
            "idle_between_kernels": idle_between(spans, forwards),
            "top_kernels": [{"name": name[:160], "ms": ms, "calls": round(calls)} for name, (ms, calls) in top]}


GAP_BOUNDS_US = (2, 5, 20, 100)  # the buckets of idle_between, microseconds


def idle_between(spans: list[tuple[float, float, str]], forwards: int) -> dict:
    """The GPU's idle time between consecutive kernels (start and end in microseconds), per forward, in buckets by
    the length of each gap (many short gaps are the launches inside a CUDA graph, long ones the GPU waiting for the
    CPU), and the longest gaps with the kernels around them."""
    spans.sort()
    buckets = defaultdict(lambda: [0.0, 0])
    longest = []
    busy_until, before = spans[0][1], spans[0][2]
    for start, end, name in spans[1:]:
        gap = start - busy_until
        if gap > 0:
            bound = next((f"under {b} us" for b in GAP_BOUNDS_US if gap < b), f"{GAP_BOUNDS_US[-1]} us or more")
            buckets[bound][0] += gap / 1000 / forwards
            buckets[bound][1] += 1 / forwards
            longest.append((gap, before[:70], name[:70]))
        if end > busy_until:
            busy_until, before = end, name
    return {"buckets": {bound: {"ms": ms, "gaps": round(count)} for bound, (ms, count) in buckets.items()},
            "longest": [{"us": gap, "after": after, "before": next_name}
                        for gap, after, next_name in sorted(longest, reverse=True)[:24]]}


def ideal_ms(dit, image_tokens: int, text_tokens: int) -> dict:
    """GEMM and attention FLOPs of one forward at the measured ceilings (the modulation layers see one token)."""
    block = dit.transformer_blocks[0]
    image_stream = ("attn.to_q", "attn.to_k", "attn.to_v", "attn.to_out", "img_mlp")
    text_stream = ("attn.add_q_proj", "attn.add_k_proj", "attn.add_v_proj", "attn.to_add_out", "txt_mlp")

    def weights(stream):
        return sum(m.in_features * m.out_features for name, m in block.named_modules()
                   if isinstance(m, torch.nn.Linear) and name.startswith(stream))
    blocks = len(dit.transformer_blocks)
    gemm_flops = 2 * (weights(image_stream) * image_tokens + weights(text_stream) * text_tokens) * blocks
    seq = image_tokens + text_tokens
    attention_flops = 4 * seq * seq * block.attn.num_heads * block.attn.head_dim * blocks
    return {"gemm_ms": gemm_flops / FP8_GEMM_TFLOPS / 1e9, "attention_ms": attention_flops / ATTENTION_TFLOPS / 1e9}


def print_breakdown(result: dict, ideal: dict) -> None:
    families = {family: round(ms, 1) for family, ms in result["families_ms"].items()}
    print("  idle between kernels per forward:", json.dumps(result["idle_between_kernels"]["buckets"]))
    for gap in result["idle_between_kernels"]["longest"][:12]:
        print(f"  idle {gap['us']:8.1f} us after {gap['after']} before {gap['before']}")
    print("  kernels per forward, ms:", families, f"sum {result['total_kernel_ms']:.1f}; "
          f"ideal GEMMs {ideal['gemm_ms']:.1f}, attention {ideal['attention_ms']:.1f}")
    for kernel in result["top_kernels"][:20]:
        print(f"  {kernel['ms']:8.2f} ms {kernel['calls']:5d}x  {kernel['name']}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.environ.get("OUT", "bench-results"))
    parser.add_argument("--config", default="best")
    parser.add_argument("--engine-only", action="store_true", help="skip the static-shapes variant")
    parser.add_argument("--name", default="profile", help="the output folder under --out")
    parser.add_argument("--python-profile", action="store_true", help="also cProfile one forward timed alone")
    parser.add_argument("--trace", action="store_true", help="also write the kernels' timeline (trace.json.gz)")
    args = parser.parse_args()
    out = Path(args.out) / args.name
    out.mkdir(parents=True, exist_ok=True)
    engine = Engine("synthetic", device="cuda", dit_only=True)
    base_dit = engine.load().dit
    inputs = dit_inputs(base_dit, 1024, 1024, 256, "cuda", torch.bfloat16)
    config = OptimizationConfig.parse(args.config)
    report = {"config": config.label, "gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
              "ideal": ideal_ms(base_dit, 8192, 256), "variants": {}}
    variants = {"engine (dynamic shapes)": True, "static shapes": False}
    for name, dynamic in list(variants.items())[:1 if args.engine_only else 2]:
        torch._dynamo.reset()  # each variant compiles from scratch, not from the previous one's code
        engine.free()
        prepared = compiled_variant(engine, config, dynamic)
        with running(prepared, config, inputs, "cuda", RunRecorder("cuda")) as (call, _):
            result = report["variants"][name] = time_variant(call)
            print(name, json.dumps(result), flush=True)
            result.update(kernel_breakdown(call, trace=out / "trace.json.gz" if args.trace else None))
            if args.python_profile:
                result["python_profile"] = python_profile(call)
                print("\n".join(result["python_profile"]))
        (out / "profile.json").write_text(json.dumps(report, indent=2))
        print_breakdown(result, report["ideal"])
        del prepared
        engine.free()
        gc.collect()  # compiled blocks and their code reference each other
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
