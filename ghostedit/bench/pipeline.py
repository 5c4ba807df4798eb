"""The pipeline-level bench: whole edits through the engine, configurations one after another on the same inputs.

Each configuration runs once cold (prepare, compile warm-up) and then `repeats` times warm; the table reports the
warm medians (with `repeats` 0 the cold run's own figures: the engine times preparation and the compile warm-up as
stages of their own; the bench command sets the libraries up first with a short edit where no edit of the process
has, which the first configuration's figures would otherwise pay), with preparation and compile warm-up apart, the speedup
over the first (baseline) configuration and each output's difference from the baseline's output.

A configuration with a step cache is also measured against its full run: the same configuration without the cache,
run in the same bench (added before it when not listed), for the cache's own speed-up and PSNR/SSIM. Those figures
come with the reminder that random weights say little about a cache's quality with real weights.
"""
from __future__ import annotations

import dataclasses
import json
import statistics

from pathlib import Path

from ..config import OptimizationConfig
from ..optimize import registry
from ..optimize.toggles.step_cache import QUALITY_NOTE as STEP_CACHE_QUALITY_NOTE
from ..telemetry import ClockSampler
from .output import markdown_table, write_bar_charts, write_results

DEFAULT_IMAGE = Path(__file__).resolve().parents[2] / "assets" / "examples" / "house.png"
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
STEP_CACHE_COLUMNS = {
    "cache_threshold": "cache threshold",
    "forwards_computed": "DiT forwards computed",
    "served_step_s": "served step s",
    "computed_step_s": "computed step s",
    "cache_speedup_e2e": "cache speedup (e2e)",
    "cache_psnr_db": "cache PSNR dB",
    "cache_ssim": "cache SSIM",
}
STEP_CACHE = "step-cache"


# What a first run does once, before the edit itself
ONE_TIME_STAGES = ("load", "LoRA read", "prepare", "LoRA switch", "compile warm-up", "CUDA graph capture")


def stage_medians(summaries: list[dict], stages) -> dict[str, float]:
    """Each of `stages`' median over the runs' summaries (a run without the stage counts 0)."""
    return {stage: statistics.median(s["stages_s"].get(stage, 0.0) for s in summaries) for stage in stages}


def edit_seconds(summary: dict) -> float:
    """A run's time without the one-time stages: a cold run's edit, comparable with a warm run's total."""
    return summary["total_s"] - sum(summary["stages_s"].get(stage, 0.0) for stage in ONE_TIME_STAGES)


def bench_configuration(engine, request, config: OptimizationConfig, repeats: int) -> dict:
    with ClockSampler(engine.device) as cold_clock:  # the GPU's clock while the figures' runs ran
        cold = engine.run(request, config)
    with ClockSampler(engine.device) as warm_clock:
        warm = [engine.run(request, config) for _ in range(repeats)]
    warm, clock = (warm, warm_clock) if repeats else ([cold], cold_clock)
    summaries = [run.telemetry.summary() for run in warm]
    cold_summary = cold.telemetry.summary()
    cold_stages = cold_summary["stages_s"]
    return {
        "config": config.label,
        "text": config.text,
        "s_per_step": statistics.median(s["denoise_s_per_step"] for s in summaries),
        "end_to_end_s": statistics.median(edit_seconds(s) for s in summaries),
        "gpu_clock": clock.summary(),
        "prepare_s": cold_stages.get("prepare", 0.0),
        "warmup_s": cold_stages.get("compile warm-up", 0.0),
        # the cold run's too: preparing a configuration is part of what must fit
        "peak_gib": max(s["peak_allocated_gib"] for s in [cold_summary, *summaries]),
        "peak_reserved_gib": max((s["peak_reserved_gib"] or 0) for s in [cold_summary, *summaries]) or None,
        "placement": cold_summary["placement"],
        "memory_kind": summaries[0]["memory_kind"],
        "warm_cache_hits": all(s["cache_hit"] for s in summaries) if repeats else None,
        "attention_ran": warm[-1].attention_backend,
        "report": warm[-1].prepared_report,
        "stages_s": stage_medians(summaries, summaries[-1]["stages_s"]),
        "edits_s": [{"total": edit_seconds(s), **s["stages_s"]} for s in summaries],  # each edit's, in order
        "notes": sorted({note for s in summaries for note in s["notes"]}),
        "step_cache": summaries[-1]["step_cache"],
        **served_and_computed_steps(summaries[-1]),
        "image": warm[-1].image,
    }


def served_and_computed_steps(summary: dict) -> dict:
    """With a step cache: the median time of a step that every CFG pass took from the cache and of one that no pass
    did (None where there was none), for the speed-up at other skip rates."""
    found = summary["step_cache"]
    if found is None:
        return {}
    passes = list(found["cached_steps"].values())
    served = set.intersection(*map(set, passes))
    partly = set.union(*map(set, passes))
    steady = [(step, seconds) for step, seconds in enumerate(summary["step_s"]) if step not in summary["warm_up_steps"]]
    served_s = [seconds for step, seconds in steady if step in served]
    computed_s = [seconds for step, seconds in steady if step not in partly]
    return {"served_step_s": statistics.median(served_s) if served_s else None,
            "computed_step_s": statistics.median(computed_s) if computed_s else None}


def with_full_runs(configs: list[OptimizationConfig]) -> list[OptimizationConfig]:
    """The configurations, each one with a step cache preceded by its full run (itself without the cache), each
    configuration once."""
    result = []
    for config in configs:
        for needed in (full_run(config), config):
            if needed not in result:
                result.append(needed)
    return result


def full_run(config: OptimizationConfig) -> OptimizationConfig:
    return config.replace(**{STEP_CACHE: registry.get(STEP_CACHE).default})


def compare_with_full_run(row: dict, full: dict) -> dict:
    """A step cache's own figures: its speed-up over its full run and its output against the full run's."""
    from ..metrics import compare_images
    versus = compare_images(row["image"], full["image"])
    return {"full_run": full["config"], "cache_threshold": row["step_cache"]["threshold"],
            "forwards_computed": row["step_cache"]["forwards_computed"],
            "cache_speedup_step": full["s_per_step"] / row["s_per_step"],
            "cache_speedup_e2e": full["end_to_end_s"] / row["end_to_end_s"],
            "cache_max_abs": versus["max_abs"], "cache_psnr_db": versus["psnr_db"], "cache_ssim": versus["ssim"],
            "cache_quality_note": STEP_CACHE_QUALITY_NOTE}


SET_UP_STEPS = 2  # the fewest the model's schedule takes (models/exact.py)


def set_up_libraries(engine, request, config: OptimizationConfig) -> str:
    """A short edit, unmeasured, before cold rows: the process's first edit sets up cuBLAS, cuDNN and the encoders'
    kernels (the stock row of an H100 run paid seconds of text encoding for it), a cost of no configuration's.
    Returns what the cold rows came after, for the results."""
    engine.run(dataclasses.replace(request, steps=SET_UP_STEPS), config)
    return f"an unmeasured {SET_UP_STEPS}-step edit"


def run_bench(engine, request, configs: list[OptimizationConfig], repeats: int, one_at_a_time: bool = False,
              on_row=None, baseline: dict | None = None) -> list[dict]:
    """Each configuration's row against the first (`baseline`: an earlier process's, see earlier_baseline)."""
    from ..metrics import compare_images  # scikit-image: loaded when a bench runs, not with every CLI command
    rows, by_config = ([baseline] if baseline else []), {}
    for config in with_full_runs(configs):
        if one_at_a_time:
            engine.free()
        row = bench_configuration(engine, request, config, repeats)
        reference = rows[0] if rows else row
        row["speedup_step"] = reference["s_per_step"] / row["s_per_step"]
        row["speedup_e2e"] = reference["end_to_end_s"] / row["end_to_end_s"]
        row.update(compare_images(row["image"], reference["image"]))
        if row["step_cache"] is not None:
            row.update(compare_with_full_run(row, by_config[full_run(config)]))
        by_config[config] = row
        rows.append(row)
        if on_row:
            on_row(row)
    return rows


def earlier_baseline(folder: Path, request, repeats: int, start: dict) -> dict:
    """The first row of the run whose results are in `folder` (results.json, output-0.png), made by another process
    with this request's steps, CFG, size, mask and strength (`start`) and repeats (refused otherwise: its figures
    would compare other work)."""
    from PIL import Image
    found = {"start": {}, **json.loads((folder / "results.json").read_text())}
    asked = {"steps": request.steps, "cfg_scale": request.cfg_scale, "repeats": repeats, "start": start}
    differing = {key: (found.get(key), value) for key, value in asked.items() if found.get(key) != value}
    if request.width is not None and found["size"] != [request.width, request.height]:
        differing["size"] = (found["size"], [request.width, request.height])
    if differing:
        told = ", ".join(f"{key} ({theirs} there, {ours} here)" for key, (theirs, ours) in differing.items())
        raise SystemExit(f"--baseline-from {folder}: that run differs from this one in {told}")
    with Image.open(folder / "output-0.png") as image:
        return {**found["rows"][0], "image": image.convert("RGB"), "measured_in": folder.name}


def table(rows: list[dict]) -> str:
    """The markdown table; with a step cache among the configurations, its own columns and the reminder."""
    if all(row["step_cache"] is None for row in rows):
        return markdown_table(rows, COLUMNS)
    cached = [{**row, **{key: row.get(key) for key in STEP_CACHE_COLUMNS}} for row in rows]
    return markdown_table(cached, {**COLUMNS, "ssim": "SSIM", **STEP_CACHE_COLUMNS}) + \
        f"\n\nStep cache columns: against the same configuration without the cache; {STEP_CACHE_QUALITY_NOTE}."


def write_outputs(rows: list[dict], out_dir: Path, title: str, context: dict) -> None:
    """results.json, table.md, chart.png and each configuration's output image."""
    out_dir.mkdir(parents=True, exist_ok=True)
    for index, row in enumerate(rows):
        row["image"].save(out_dir / f"output-{index}.png")
    serializable = [{k: v for k, v in row.items() if k != "image"} for row in rows]
    write_results(out_dir, {**context, "rows": serializable})
    (out_dir / "table.md").write_text(table(rows) + "\n")
    write_bar_charts(out_dir / "chart.png", title, [row["config"] for row in rows], [row["s_per_step"] for row in rows],
                     "denoise seconds per step (lower is better)", [row["peak_gib"] for row in rows],
                     f"peak {rows[0]['memory_kind']} GiB")
