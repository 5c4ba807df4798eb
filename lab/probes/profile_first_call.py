"""Where the first call of a compiled configuration spends its time: run it twice, on an empty compile cache and
then in a new process that finds the cache on disk (a restart).

On the GPU machine (after `source scripts/gpu/setup.sh`):
    python3 lab/probes/profile_first_call.py cold [CONFIG]; python3 lab/probes/profile_first_call.py restart --cprofile [CONFIG]
Builds the full-size synthetic DiT alone, prepares the configuration (default: the bench's best), and runs its
first forward (with --cprofile, the preparation and the first forward under cProfile, which slows Python-heavy
work). Writes first-call-<label>.json:
wall times, Dynamo's compile-time breakdown, the compile caches' hit/miss/bypass counters, the garbage collector's
pauses in the preparation and the first forward, and with --cprofile the functions with the most cumulative and own
time.
"""
from __future__ import annotations

import argparse
import contextlib
import cProfile
import functools
import gc
import io
import json
import os
import pstats
import re
import time
from pathlib import Path

import torch

from ghostedit.bench.dit import dit_inputs, running
from ghostedit.config import OptimizationConfig
from ghostedit.engine import Engine
from ghostedit.optimize import compile as compile_blocks
from ghostedit.telemetry import RunRecorder

from gc_pauses import CollectorPauses  # beside this script


def top_functions(profile: cProfile.Profile, key: str, count: int = 40) -> list[str]:
    text = io.StringIO()
    pstats.Stats(profile, stream=text).sort_stats(key).print_stats(count)
    return [line for line in text.getvalue().splitlines() if line.strip()][-count:]


def generated_reductions(cache_dir: str | None) -> dict[str, int]:
    """How many distinct reduction kernels Inductor generated into the compile cache, persistent (whole rows in
    registers) and looped: on an emptied cache, those of this process's compile."""
    names = set()
    for source in Path(cache_dir or "/nonexistent").rglob("*.py"):
        names.update(re.findall(r"\b(triton_(?:per|red)_fused\w*)", source.read_text(errors="replace")))
    return {kind: sum(name.startswith(f"triton_{prefix}_") for name in names)
            for kind, prefix in (("persistent", "per"), ("looped", "red"))}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("label", help="cold or restart: names the output file")
    parser.add_argument("config", nargs="?", default="best")
    parser.add_argument("--cprofile", action="store_true")
    parser.add_argument("--workers-at-first-compile", action="store_true",
                        help="leave the compile workers to torch, which starts them at the first compile, instead of "
                             "the engine's start as preparation begins (the A/B of that start)")
    parser.add_argument("--keys-at-first-compile", action="store_true",
                        help="leave the compile cache's keys (hashes of torch's and Triton's files) to the first "
                             "compile, instead of the engine's thread started as preparation begins (the A/B)")
    parser.add_argument("--dynamic", choices=("tokens", "true", "none"), default="tokens",
                        help="the blocks' dynamic dimensions: tokens as the engine compiles them "
                             "(compile.compile_over_tokens), true for all (torch.compile(dynamic=True)), none for "
                             "torch's default (static first, a dimension that changes made dynamic at a recompile)")
    parser.add_argument("--out", default=os.environ.get("OUT", "bench-results") + "/first-call")
    args = parser.parse_args()
    if args.workers_at_first_compile:
        compile_blocks.start_compile_workers = lambda: None
    if args.keys_at_first_compile:
        compile_blocks.start_hashing_compile_keys = lambda: None
    if args.dynamic != "tokens":  # the blocks' one compiled call made with this `dynamic`, and no marks
        compile_with = torch.compile
        torch.compile = lambda function, dynamic=None, options=None: compile_with(
            function, dynamic=args.dynamic == "true" or None, options=options)
        compile_blocks.compile_over_tokens = lambda block, compiled: setattr(
            block, "_compiled_call_impl", functools.partial(compiled, block))
    began = time.perf_counter()
    engine = Engine("synthetic", device="cuda", dit_only=True)
    inputs = dit_inputs(engine.load().dit, 1024, 1024, 256, "cuda", torch.bfloat16)
    config = OptimizationConfig.parse(args.config)
    tracked, pauses = len(gc.get_objects()), CollectorPauses()
    built = time.perf_counter()
    engine.check(config)  # the availability checks prepare begins with (each cached once made), timed apart
    check_s = time.perf_counter() - built
    built = time.perf_counter()
    preparing, profile = (cProfile.Profile() if args.cprofile else None for _ in range(2))
    with preparing or contextlib.nullcontext():
        pipeline, _ = engine.prepare(config)
        torch.cuda.synchronize()
    prepared = time.perf_counter()
    collected = {"prepare": pauses.take()}
    with running(pipeline, config, inputs, "cuda", RunRecorder("cuda")) as (call, _):
        with profile or contextlib.nullcontext():
            call()
            torch.cuda.synchronize()
        first_call = time.perf_counter() - prepared
        collected["first_call"] = pauses.take()
        start = time.perf_counter()
        call()
        torch.cuda.synchronize()
        second_call = time.perf_counter() - start
    from torch._dynamo.utils import compile_times, counters
    result = {
        "config": config.label, "label": args.label, "gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
        "cache_dir": os.environ.get("TORCHINDUCTOR_CACHE_DIR"),
        "build_s": built - began - check_s, "check_s": check_s, "dynamic": args.dynamic,
        "prepare_s": prepared - built, "prepare_stages_s": pipeline.prepare_seconds,
        "first_call_s": first_call, "workers_started": "at the first compile" if args.workers_at_first_compile
        else "as preparation begins",
        "compile_keys": "at the first compile" if args.keys_at_first_compile else "as preparation begins",
        "generated_reductions": generated_reductions(os.environ.get("TORCHINDUCTOR_CACHE_DIR")),
        "second_call_s": second_call,
        "gc_frozen_objects": gc.get_freeze_count(), "gc_tracked_objects": tracked,
        "gc_pauses": collected,
        "dynamo_compile_times": compile_times(repr="str", aggregate=True),
        "counters": {group: dict(values) for group, values in counters.items() if values},
        "cprofile": args.cprofile,
        "top_cumulative": top_functions(profile, "cumulative") if profile else [],
        "top_own_time": top_functions(profile, "tottime") if profile else [],
        "prepare_top_cumulative": top_functions(preparing, "cumulative") if preparing else [],
    }
    print(json.dumps({key: result[key] for key in ("label", "check_s", "prepare_s", "prepare_stages_s", "first_call_s",
                                                       "second_call_s", "gc_pauses")}),
          flush=True)
    print(result["dynamo_compile_times"])
    print(json.dumps(result["counters"], indent=1))
    print("\n".join(result["top_cumulative"][:30]))
    print("\n".join(result["prepare_top_cumulative"][:30]))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"first-call-{args.label}.json").write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
