"""Where the time of one whole edit goes: each stage's wall time against the time the GPU spent on its kernels, and
what runs outside the named stages. For issue 17's second target (4 steps, CFG 1, at most 0.9 s end to end).

On the GPU machine (after `source scripts/gpu/setup.sh`):
    python3 lab/probes/profile_edit.py [--config best] [--steps 4] [--cfg 1] [--side 1024] [--out DIR]
    py-spy record --format raw -o stacks.txt -- python3 lab/probes/profile_edit.py --cpu-runs 10 (see cpu_stacks.py)
Loads the full-size synthetic model (`--model tiny --device cpu` rehearses on a CPU), runs the edit twice (load, prepare and compile; then warm), then profiles a
third run with torch.profiler. The stages are the ranges RunRecorder.stage names in the trace; a kernel belongs to
the stage its launch falls in. Wall times are the warm run's, kernel times the profiled run's. Writes DIR/profile-edit/results.json and prints the table.
"""
from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path

import torch

from ghostedit import OptimizationConfig
from ghostedit.bench.output import environment, markdown_table
from ghostedit.telemetry import STAGE_RANGE

from edit_probe import add_edit_probe_arguments, edit_probe  # beside this script

OUTSIDE = "outside the named stages"


def profiled_run(engine, request, config):
    """The run's result and its trace (each stage is a named range there, its kernels those launched inside it)."""
    from torch.profiler import ProfilerActivity, profile
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    with profile(activities=activities) as prof:
        result = engine.run(request, config)
    return result, prof.events()


def stage_windows(events) -> dict[str, tuple[float, float]]:
    """Each stage's [start, end] (microseconds) on the GPU's timeline: the profiler turns each stage's range into
    an annotation there, spanning the stage's kernels (on a CPU: the ranges themselves); a stage entered twice
    spans both."""
    on_gpu = any(event.name.startswith(STAGE_RANGE) and event.device_type == torch.autograd.DeviceType.CUDA
                 for event in events)
    device = torch.autograd.DeviceType.CUDA if on_gpu else torch.autograd.DeviceType.CPU
    windows = {}
    for event in events:
        if event.name.startswith(STAGE_RANGE) and event.device_type == device:
            name = event.name.removeprefix(STAGE_RANGE)
            start, end = event.time_range.start, event.time_range.end
            old = windows.get(name, (start, end))
            windows[name] = (min(old[0], start), max(old[1], end))
    return windows


def kernels_by_stage(events, windows) -> dict[str, dict[str, float]]:
    """GPU kernel milliseconds per stage and kernel name, by where each kernel started."""
    found = defaultdict(lambda: defaultdict(float))
    for event in events:
        if event.device_type != torch.autograd.DeviceType.CUDA or event.name.startswith(STAGE_RANGE):
            continue  # not a kernel, or a stage's annotation
        start = event.time_range.start
        stage = next((name for name, (low, high) in windows.items() if low <= start <= high), OUTSIDE)
        found[stage][event.name] += event.time_range.elapsed_us() / 1000
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_edit_probe_arguments(parser)
    parser.add_argument("--top", type=int, default=3, help="the largest kernels kept per stage")
    parser.add_argument("--python-profile", action="store_true", help="also one warm edit under cProfile: each "
                        "function's own and cumulative seconds (the profiler's overhead included), the largest kept in "
                        "DIR/profile-edit/python.json")
    parser.add_argument("--cpu-runs", type=int, default=0, help="then this many warm edits in cpu_sampled_runs, for a "
                        "sampling profiler run around the script (lab/probes/cpu_stacks.py reads its samples)")
    args = parser.parse_args()
    engine, request = edit_probe(args)
    config = OptimizationConfig.parse(args.config)
    engine.run(request, config)  # load, prepare, compile
    warm = engine.run(request, config).telemetry.summary()  # the wall times: the profiler slows the CPU side
    _, events = profiled_run(engine, request, config)
    stages, total_s = warm["stages_s"], warm["total_s"]
    windows = stage_windows(events)
    kernels = kernels_by_stage(events, windows)
    rows = []
    for stage in [*stages, OUTSIDE]:
        wall = total_s - sum(stages.values()) if stage == OUTSIDE else stages[stage]
        gpu_ms = sum(kernels.get(stage, {}).values())
        top = sorted(kernels.get(stage, {}).items(), key=lambda item: -item[1])[:args.top]
        rows.append({"stage": stage, "wall_s": wall, "gpu_s": gpu_ms / 1000, "idle_s": wall - gpu_ms / 1000,
                     "kernels": len(kernels.get(stage, {})),
                     "top": [{"name": name[:120], "ms": ms} for name, ms in top]})
    found = {"config": config.label, "text": config.text, "side": args.side, "steps": args.steps, "cfg": args.cfg,
             "total_s": total_s, "rows": rows, "environment": environment(),
             # a stage with no range in the trace has its kernels counted outside the stages
             "stages_without_range": [stage for stage in stages if stage not in windows]}
    out = Path(args.out) / "profile-edit"
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(found, indent=2, default=str))
    print(markdown_table(rows, {"stage": "stage", "wall_s": "wall s", "gpu_s": "GPU kernels s",
                                "idle_s": "GPU idle s", "kernels": "kernel names"}))
    for row in rows:
        print(row["stage"], [f"{kernel['ms']:.1f} ms {kernel['name']}" for kernel in row["top"]])
    if args.python_profile:
        python_profile(engine, request, config, out / "python.json")
    cpu_sampled_runs(engine, request, config, args.cpu_runs)


def python_profile(engine, request, config, path: Path, keep: int = 120) -> None:
    """One warm edit under cProfile; the functions with the most cumulative time written to `path`."""
    import cProfile
    import pstats
    profiler = cProfile.Profile()
    profiler.enable()
    engine.run(request, config)
    profiler.disable()
    stats = pstats.Stats(profiler).stats  # (file, line, name) -> (primitive calls, calls, own s, cumulative s, callers)
    rows = [{"function": f"{name} ({Path(file).name}:{line})", "calls": calls, "own_s": own, "cumulative_s": total}
            for (file, line, name), (_, calls, own, total, _) in stats.items()]
    rows.sort(key=lambda row: -row["cumulative_s"])
    path.write_text(json.dumps(rows[:keep], indent=1))
    for row in rows[:keep]:
        print(f"{row['cumulative_s'] * 1000:9.2f} ms cum {row['own_s'] * 1000:8.2f} ms own {row['calls']:7d}  "
              f"{row['function'][:110]}")


def cpu_sampled_runs(engine, request, config, runs: int) -> None:
    """Warm edits whose samples lab/probes/cpu_stacks.py keeps: they are the samples under this function."""
    for _ in range(runs):
        engine.run(request, config)


if __name__ == "__main__":
    main()
