"""One browser session's runs: the comparison table against a chosen baseline run, the chart data, the gallery,
and CSV/JSON exports. Plain data and pandas; no Gradio here.

The image metrics against the baseline (PSNR, SSIM) are computed when asked for (`compute_metrics`), not when a run
joins: an edit's own answer shows them as PENDING, and the page's follow-up event fills them in (ui/handlers.py)."""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
from PIL import Image

from ..telemetry import STAGE_ORDER
from .live import stage_words

MAX_RUNS = 50  # a session keeps its latest runs; each holds its output image
OTHER_STAGE = "other"  # the part of a run's time outside every timed stage
# the time chart's stages, in the order they run (bottom to top of a bar): every one in every bar, a stage a run
# did not have at 0 s, so that the chart's series are all there from its first draw (a series that first appears
# later is not drawn: Gradio's plot fixes its series when it first draws)
CHART_STAGES = tuple(stage_words(stage) for stage in STAGE_ORDER) + (OTHER_STAGE,)
PENDING = "pending"  # PSNR and SSIM not computed yet: the comparison's follow-up computes them after the picture

COLUMNS = ("run", "configuration", "prompt", "seed", "steps", "size", "end-to-end s", "denoise s/step", "compile warm-up s",
           "load + prepare s", "peak memory GiB", "cache", "speedup e2e ×", "speedup s/step ×", "PSNR dB", "SSIM")

COMPARISON_RULE = ("Speedup, PSNR and SSIM compare each run with the baseline run when both edited the same input "
                   "images with the same prompt, seed and output size (steps, CFG and the toggles may differ); "
                   "other rows leave them empty. The end-to-end speedup leaves out loading the model (a one-time "
                   "cost of the app, not of a configuration) but counts preparing and compiling; the speedup per "
                   "denoising step is the steady-state number.")


@dataclass
class RunRecord:
    number: int
    configuration: str        # the configuration's label, e.g. "fp8-storage + compile-regional"
    toggles: dict             # the configuration, toggle by toggle
    params: dict              # the edit request without its images
    edit_key: str             # equal keys: the same edit, so outputs and timings are comparable
    image: Image.Image
    telemetry: dict           # RunTelemetry.summary()
    attention_ran: str
    prepared_report: dict
    inputs: tuple = ()        # the input images, for "Reuse these settings"
    view: str | None = None   # the output as the page shows it (a JPEG file, ui/media.py)
    png: str | None = None    # the output as a PNG file, once made for the download

    @property
    def label(self) -> str:
        return f"#{self.number} {self.configuration}"

    @property
    def seconds_without_load(self) -> float:
        return self.telemetry["total_s"] - self.telemetry["stages_s"].get("load", 0.0)


def record_from_result(result, number: int) -> RunRecord:
    request, config = result.request, result.config
    toggles = {"loras": [{"name": lora.name, "mode": lora.mode, "scale": lora.scale, "sha256": lora.sha256}
                         for lora in config.loras],
               **{setting: list(value) if isinstance(value, tuple) else value
                  for setting, value in config.settings().items()}}
    params = {"prompt": request.prompt, "negative_prompt": request.negative_prompt, "steps": request.steps,
              "cfg_scale": request.cfg_scale, "seed": request.seed, "width": result.width, "height": result.height,
              "input_images": len(request.images)}
    return RunRecord(number, config.label, toggles, params, edit_key(result), result.image,
                     result.telemetry.summary(), result.attention_backend, dict(result.prepared_report),
                     tuple(request.images))


def edit_key(result) -> str:
    """Identifies the edit apart from the things being compared (toggles, steps, CFG): the input images as given
    (not resized again for the key), the prompts, the seed and the output size."""
    digest = hashlib.sha256()
    for image in result.request.images:
        digest.update(f"{image.size}".encode())
        digest.update(image.tobytes())
    request = result.request
    digest.update(json.dumps([request.prompt, request.negative_prompt, request.seed, result.width,
                              result.height]).encode())
    return digest.hexdigest()


@dataclass
class History:
    runs: list[RunRecord] = field(default_factory=list)
    baseline_number: int | None = None
    next_number: int = 1
    latest_call: list[int] = field(default_factory=list)  # the runs the latest /edit or /run_variants made
    _metrics: dict = field(default_factory=dict)   # (run, baseline) -> compare_images(), computed once

    def begin_call(self) -> None:
        """An /edit or /run_variants starts: the runs it adds are the latest call's."""
        self.latest_call = []

    def add(self, result) -> RunRecord:
        record = record_from_result(result, self.next_number)
        self.next_number += 1
        self.latest_call.append(record.number)
        self.runs = (self.runs + [record])[-MAX_RUNS:]
        if self.baseline() is None:
            self.baseline_number = self.runs[0].number
        return record

    def baseline(self) -> RunRecord | None:
        return next((run for run in self.runs if run.number == self.baseline_number), None)

    def set_baseline(self, number: int | None) -> None:
        if number is not None and any(run.number == number for run in self.runs):
            self.baseline_number = number

    def clear(self) -> None:
        self.runs, self.baseline_number, self._metrics, self.latest_call = [], None, {}, []

    def _compared(self, run: RunRecord) -> RunRecord | None:
        """The baseline when `run` is the same edit as it (so the two compare), else None."""
        baseline = self.baseline()
        return baseline if baseline is not None and run.edit_key == baseline.edit_key else None

    def comparison(self, run: RunRecord) -> dict:
        """Speedups and image differences against the baseline; empty when the two runs are not the same edit. The
        image differences only once compute_metrics() has made them (`pending` until then)."""
        baseline = self._compared(run)
        if baseline is None:
            return {}
        versus = {"speedup_e2e": baseline.seconds_without_load / run.seconds_without_load,
                  "speedup_step": _ratio(baseline.telemetry["denoise_s_per_step"],
                                         run.telemetry["denoise_s_per_step"])}
        metrics = self._metrics.get((run.number, baseline.number))
        if metrics is None:
            return {**versus, "pending": True}
        return {**versus, "max_abs": metrics["max_abs"], "psnr_db": metrics["psnr_db"], "ssim": metrics["ssim"]}

    def pending_metrics(self) -> list[RunRecord]:
        """The runs whose image differences from the baseline are not computed yet."""
        return [run for run in self.runs if self.comparison(run).get("pending")]

    def compute_metrics(self) -> int:
        """Computes every missing image difference against the baseline; returns how many it computed."""
        pending = self.pending_metrics()
        if pending:
            from ..metrics import compare_images  # scikit-image: imported on the first comparison, not at start
        for run in pending:
            baseline = self._compared(run)
            self._metrics[(run.number, baseline.number)] = compare_images(run.image, baseline.image)
        return len(pending)

    def table(self) -> pd.DataFrame:
        rows = [self._row(run) for run in self.runs]
        return pd.DataFrame(rows, columns=list(COLUMNS))

    def _row(self, run: RunRecord) -> dict:
        telemetry, versus = run.telemetry, self.comparison(run)
        return {
            "run": f"#{run.number}" + (" (baseline)" if run.number == self.baseline_number else ""),
            "configuration": run.configuration,
            "prompt": run.params["prompt"],
            "seed": run.params["seed"],
            "steps": run.params["steps"],
            "size": f"{run.params['width']}×{run.params['height']}",
            "end-to-end s": round(telemetry["total_s"], 3),
            "denoise s/step": _round(telemetry["denoise_s_per_step"], 4),
            "compile warm-up s": round(telemetry["stages_s"].get("compile warm-up", 0.0), 3),
            "load + prepare s": round(telemetry["stages_s"].get("load", 0.0)
                                      + telemetry["stages_s"].get("prepare", 0.0), 3),
            "peak memory GiB": _round(telemetry["peak_allocated_gib"], 3),
            "cache": "hit" if telemetry["cache_hit"] else "miss",
            "speedup e2e ×": _round(versus.get("speedup_e2e"), 2),
            "speedup s/step ×": _round(versus.get("speedup_step"), 2),
            "PSNR dB": PENDING if versus.get("pending") else _psnr_words(versus.get("psnr_db")),
            "SSIM": PENDING if versus.get("pending") else _round(versus.get("ssim"), 4),
        }

    def memory_kind(self) -> str:
        return self.runs[0].telemetry["memory_kind"] if self.runs else ""

    def names(self) -> dict[int, str]:
        """{run number: its name on the charts and the comparison}: its configuration, with "(2)", "(3)"... for a
        configuration run again."""
        seen: dict[str, int] = {}
        names = {}
        for run in self.runs:
            seen[run.configuration] = seen.get(run.configuration, 0) + 1
            names[run.number] = run.configuration + (f" ({seen[run.configuration]})"
                                                     if seen[run.configuration] > 1 else "")
        return names

    def stage_chart(self) -> pd.DataFrame | None:
        """Seconds per stage per run (long format, for a stacked bar chart): every stage of CHART_STAGES in every
        run, compiling included, and what no stage accounts for as "other", so that each bar is as tall as the
        run's end-to-end time. None without runs: the chart draws nothing until the first run."""
        if not self.runs:
            return None
        names, rows = self.names(), []
        for run in self.runs:
            stages = dict.fromkeys(CHART_STAGES, 0.0)
            for stage, seconds in run.telemetry["stages_s"].items():
                stages[stage_words(stage)] += seconds
            stages[OTHER_STAGE] = max(0.0, run.telemetry["total_s"] - sum(stages.values()))
            # last stage first: the chart stacks its first series on top, so the first stage is at the bottom
            rows += [{"configuration": names[run.number], "stage": stage, "seconds": round(float(stages[stage]), 3),
                      "run": f"#{run.number}"} for stage in reversed(CHART_STAGES)]
        return pd.DataFrame(rows, columns=["configuration", "stage", "seconds", "run"])

    def memory_chart(self) -> pd.DataFrame | None:
        """Each run's peak memory (what it measures: memory_kind()); None without runs."""
        if not self.runs:
            return None
        names = self.names()
        return pd.DataFrame([{"configuration": names[run.number], "run": f"#{run.number}",
                              "peak GiB": float(run.telemetry["peak_allocated_gib"])} for run in self.runs],
                            columns=["configuration", "peak GiB", "run"])

    def compact_rows(self) -> list[dict]:
        """The comparison a person reads first, one row per run: its name, s/step, speed-ups, end to end,
        PSNR/SSIM and peak memory; what the edit was (prompt, seed, size, steps) rides along as `details`."""
        names, rows = self.names(), []
        for run in self.runs:
            telemetry, versus = run.telemetry, self.comparison(run)
            params = run.params
            rows.append({
                "name": names[run.number], "baseline": run.number == self.baseline_number,
                "s_per_step": telemetry["denoise_s_per_step"], "speedup_step": versus.get("speedup_step"),
                "speedup_e2e": versus.get("speedup_e2e"), "total_s": telemetry["total_s"],
                "compile_s": telemetry["stages_s"].get("compile warm-up", 0.0),
                "psnr": PENDING if versus.get("pending") else _psnr_words(versus.get("psnr_db")),
                "ssim": PENDING if versus.get("pending") else versus.get("ssim"),
                "peak_gib": telemetry["peak_allocated_gib"],
                "details": f"run #{run.number} · “{params['prompt']}” · seed {params['seed']} · "
                           f"{params['width']}×{params['height']} · {params['steps']} steps · "
                           f"CFG {params['cfg_scale']:g} · "
                           f"{'cache hit' if telemetry['cache_hit'] else 'prepared for this run'}"})
        return rows

    def run(self, number) -> RunRecord | None:
        return next((run for run in self.runs if number is not None and run.number == int(number)), None)

    def gallery(self) -> list[tuple[Image.Image, str]]:
        names = self.names()
        return [(run.view or run.image, f"{names[run.number]} · {run.telemetry['total_s']:.2f} s") for run in self.runs]

    def to_records(self) -> list[dict]:
        """Everything about every run (no images), for the JSON export (compute_metrics() first for the image
        differences)."""
        return [{"run": run.number, "baseline": run.number == self.baseline_number, "configuration": run.configuration,
                 "toggles": run.toggles, "params": run.params, "attention_ran": run.attention_ran,
                 "prepared_report": run.prepared_report, "telemetry": run.telemetry,
                 "versus_baseline": _json_safe(self.comparison(run))} for run in self.runs]

    def write_exports(self, folder: Path) -> tuple[Path, Path]:
        self.compute_metrics()
        folder.mkdir(parents=True, exist_ok=True)
        csv_path, json_path = folder / "ghostedit-history.csv", folder / "ghostedit-history.json"
        self.table().to_csv(csv_path, index=False)
        json_path.write_text(json.dumps({"comparison_rule": COMPARISON_RULE, "memory": self.memory_kind(),
                                         "runs": self.to_records()}, indent=2))
        return csv_path, json_path


def _ratio(numerator: float | None, denominator: float | None) -> float | None:
    if numerator is None or not denominator:
        return None
    return numerator / denominator


def _round(value: float | None, digits: int) -> float | None:
    return None if value is None else round(value, digits)


def _psnr_words(psnr: float | None) -> str:
    if psnr is None:
        return ""
    return "identical" if psnr == float("inf") else f"{psnr:.2f}"


def _json_safe(values: dict) -> dict:
    """PSNR of identical images is infinite, which JSON cannot hold: say it in words."""
    return {key: ("identical" if value == float("inf") else value) for key, value in values.items()}
