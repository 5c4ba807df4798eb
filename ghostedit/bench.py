"""`python -m ghostedit bench`: configurations one after another in one process, on the same inputs.

Each configuration runs once cold (prepare, compile warm-up) and then `--repeats` times warm; the table reports
the warm medians (with `--repeats 0` the cold run's own figures: the engine times preparation and the compile
warm-up as stages of their own), with preparation and compile warm-up apart, the speedup over the first (baseline)
configuration and each output's difference from the baseline's output. Writes table.md, results.json, chart.png and
the outputs.
"""
from __future__ import annotations

import json
import statistics
from pathlib import Path

from .cli import add_model_argument, request_from_args
from .config import OptimizationConfig
from .device import package_version

DEFAULT_IMAGE = Path(__file__).resolve().parent.parent / "assets" / "examples" / "house.png"
COLUMNS = {
    "config": "configuration",
    "s_per_step": "denoise s/step",
    "end_to_end_s": "end to end s",
    "prepare_s": "prepare s",
    "warmup_s": "compile warm-up s",
    "peak_gib": "peak GiB",
    "speedup_step": "speedup (step)",
    "speedup_e2e": "speedup (e2e)",
    "max_abs": "max abs diff",
    "psnr_db": "PSNR dB",
}


# What a first run does once, before the edit itself
ONE_TIME_STAGES = ("load", "prepare", "compile warm-up")


def edit_seconds(summary: dict) -> float:
    """A run's time without the one-time stages: a cold run's edit, comparable with a warm run's total."""
    return summary["total_s"] - sum(summary["stages_s"].get(stage, 0.0) for stage in ONE_TIME_STAGES)


def bench_configuration(engine, request, config: OptimizationConfig, repeats: int) -> dict:
    cold = engine.run(request, config)
    warm = [engine.run(request, config) for _ in range(repeats)] or [cold]
    summaries = [run.telemetry.summary() for run in warm]
    cold_stages = cold.telemetry.summary()["stages_s"]
    return {
        "config": config.label,
        "s_per_step": statistics.median(s["denoise_s_per_step"] for s in summaries),
        "end_to_end_s": statistics.median(edit_seconds(s) for s in summaries),
        "prepare_s": cold_stages.get("prepare", 0.0),
        "warmup_s": cold_stages.get("compile warm-up", 0.0),
        "peak_gib": max(s["peak_allocated_gib"] for s in summaries),
        "memory_kind": summaries[0]["memory_kind"],
        "warm_cache_hits": all(s["cache_hit"] for s in summaries) if repeats else None,
        "attention_ran": warm[-1].attention_backend,
        "report": warm[-1].prepared_report,
        "stages_s": summaries[-1]["stages_s"],
        "notes": sorted({note for s in summaries for note in s["notes"]}),
        "image": warm[-1].image,
    }


def run_bench(engine, request, configs: list[OptimizationConfig], repeats: int, one_at_a_time: bool = False,
              on_row=None) -> list[dict]:
    from .metrics import compare_images  # scikit-image: loaded when a bench runs, not with every CLI command
    rows = []
    for config in configs:
        if one_at_a_time:
            engine.free()
        row = bench_configuration(engine, request, config, repeats)
        baseline = rows[0] if rows else row
        row["speedup_step"] = baseline["s_per_step"] / row["s_per_step"]
        row["speedup_e2e"] = baseline["end_to_end_s"] / row["end_to_end_s"]
        row.update(compare_images(row["image"], baseline["image"]))
        rows.append(row)
        if on_row:
            on_row(row)
    return rows


def markdown_table(rows: list[dict], columns: dict[str, str] = COLUMNS) -> str:
    """The rows' `columns` (key: heading) as a markdown table."""
    import pandas as pd
    return pd.DataFrame(rows)[list(columns)].rename(columns=columns).to_markdown(index=False, floatfmt=".3f")


def write_bar_charts(path: Path, title: str, labels: list[str], times: list[float], time_label: str,
                     memory: list[float], memory_label: str) -> None:
    """Time and memory per configuration, side by side, one bar per configuration in run order."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (time_ax, memory_ax) = plt.subplots(1, 2, figsize=(13, 0.55 * len(labels) + 2.5))
    time_ax.barh(labels, times, color="#5b6ee1")
    time_ax.set_xlabel(time_label)
    memory_ax.barh(labels, memory, color="#e1875b")
    memory_ax.set_xlabel(memory_label)
    memory_ax.set_yticks([])
    for ax in (time_ax, memory_ax):
        ax.invert_yaxis()
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_outputs(rows: list[dict], out_dir: Path, title: str, context: dict) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    for index, row in enumerate(rows):
        row["image"].save(out_dir / f"output-{index}.png")
    serializable = [{k: v for k, v in row.items() if k != "image"} for row in rows]
    (out_dir / "results.json").write_text(json.dumps({**context, "rows": serializable}, indent=2))
    (out_dir / "table.md").write_text(markdown_table(rows) + "\n")
    write_bar_charts(out_dir / "chart.png", title, [row["config"] for row in rows], [row["s_per_step"] for row in rows],
                     "denoise seconds per step (lower is better)", [row["peak_gib"] for row in rows],
                     f"peak {rows[0]['memory_kind']} GiB")


def cmd_bench(args) -> int:
    from .device import UnavailableOptionError
    from .engine import Engine

    engine = Engine(args.model, device=args.device, host_memory=args.host_memory)
    configs = [OptimizationConfig.parse(text) for text in args.configs]
    for config in configs:  # refuse up front, with the reason, rather than after an hour of benchmarking
        try:
            engine.check(config)
        except UnavailableOptionError as error:
            raise SystemExit(f"{config.label}: {error}")
    if args.level == "dit":
        from .bench_dit import cmd_bench_dit
        return cmd_bench_dit(args, engine, configs)
    args.image = args.image or [str(DEFAULT_IMAGE)]
    request = request_from_args(args, engine.spec.default_steps)
    engine.load()  # before the first cold run: loading is no configuration's cost, in time or in memory peak
    rows = run_bench(engine, request, configs, args.repeats, args.one_at_a_time,
                     on_row=lambda row: print(f"{row['config']}: {row['s_per_step']:.3f} s/step, "
                                              f"{row['end_to_end_s']:.2f} s end to end", flush=True))
    context = {"model": engine.spec.source, "device": engine.device, "steps": request.steps,
               "cfg_scale": request.cfg_scale, "size": list(rows[0]["image"].size), "repeats": args.repeats,
               "environment": environment()}
    write_outputs(rows, Path(args.out_dir), args.title or f"GhostEdit bench: {engine.spec.source} on {engine.device}",
                  context)
    print(markdown_table(rows))
    print(f"wrote {args.out_dir}/table.md, results.json, chart.png")
    return 0


def environment() -> dict:
    import platform

    import torch
    info = {"python": platform.python_version(), "torch": torch.__version__, "diffsynth": package_version("diffsynth"),
            "cpu": platform.processor() or platform.machine()}
    if torch.cuda.is_available():
        info.update(gpu=torch.cuda.get_device_name(), cuda=torch.version.cuda)
    return info


def add_bench_command(commands) -> None:
    bench = commands.add_parser("bench", help="benchmark configurations on the same inputs")
    add_model_argument(bench)
    bench.add_argument("--configs", nargs="+", default=["baseline"],
                       help='first is the baseline; e.g. baseline "fp8=storage" "compile=regional,attention=auto"')
    bench.add_argument("--image", action="append", default=None, help=f"input image (default {DEFAULT_IMAGE.name})")
    bench.add_argument("--prompt", default="turn the scene into a ghostly night")
    bench.add_argument("--negative-prompt", default="")
    bench.add_argument("--steps", type=int, default=None)
    bench.add_argument("--cfg", type=float, default=4.0)
    bench.add_argument("--seed", type=int, default=0)
    bench.add_argument("--width", type=int, default=None)
    bench.add_argument("--height", type=int, default=None)
    bench.add_argument("--repeats", type=int, default=2,
                       help="pipeline: warm runs per configuration after the cold one (0: report the cold run); "
                            "dit: timed forwards")
    bench.add_argument("--level", choices=("pipeline", "dit"), default="pipeline",
                       help="pipeline: whole edits; dit: one DiT forward at the edit's shape (CUDA events)")
    bench.add_argument("--text-tokens", type=int, default=256, help="dit level: prompt tokens")
    bench.add_argument("--experiments", action="store_true",
                       help="dit level: also time CFG batching and a CUDA graph of the fastest configuration")
    bench.add_argument("--host-memory", nargs="*", default=(), choices=("base-dit", "text-encoder"),
                       help="keep these in host memory instead of on the device (see optimize/offload.py)")
    bench.add_argument("--one-at-a-time", action="store_true",
                       help="pipeline level: free prepared pipelines before each configuration, so each "
                            "configuration's memory peak is its own")
    bench.add_argument("--out-dir", default="bench-results")
    bench.add_argument("--title", default=None)
    bench.set_defaults(run=cmd_bench)
