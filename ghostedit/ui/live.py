"""A run seen while it happens: the engine runs in a worker thread and its progress events stream out, and the
words, tables and JSON that show a progress event or a finished run."""
from __future__ import annotations

import queue
import threading
import time
from dataclasses import dataclass
from typing import NamedTuple

from ..models.family import family_words
from ..telemetry import ProgressEvent
from .mask_inputs import start_words

# Engine stage names in the words the page uses
STAGE_WORDS = {
    "load": "loading the model",
    "download": "downloading the model",
    "LoRA read": "reading LoRA files",
    "prepare": "preparing",
    "preparing": "preparing",
    "compile warm-up": "compiling",
    "CUDA graph capture": "capturing CUDA graphs",
    "set-up": "setting up the run",
    "image encoding": "encoding images",
    "text encoding": "encoding text",
    "denoising": "denoising",
    "decoding": "decoding",
    "done": "done",
}


def stage_words(stage: str) -> str:
    return STAGE_WORDS.get(stage, stage)


@dataclass
class Live:
    """What to show now: the latest progress event (None before the first: the run waits for the engine) and the
    seconds since the run started, which keep counting during a long stage."""
    event: ProgressEvent | None
    elapsed: float


class View(NamedTuple):
    """A live view of a running edit: the status Markdown and the run's state for API clients (progress_json)."""
    status: str
    run_json: dict


_FINISHED = object()


def stream_run(engine, request, config, cancel: threading.Event, tick_seconds: float = 1.0):
    """Starts `engine.run` in a worker thread at once and returns the stream of it: a Live at every progress event
    and every `tick_seconds` without one, then the EditResult. An engine error is raised from the stream. If the
    consumer stops listening (a closed page) or closes the stream, the run is cancelled at its next step instead of
    holding the device."""
    stream = _stream(engine, request, config, cancel, tick_seconds)
    next(stream)  # the engine starts now (not when the first item is asked for), and closing cancels from here on
    return stream


def _stream(engine, request, config, cancel: threading.Event, tick_seconds: float):
    events: queue.Queue = queue.Queue()
    outcome: dict = {}

    def work():
        try:
            outcome["result"] = engine.run(request, config, on_progress=events.put, cancel=cancel)
        except BaseException as error:  # noqa: BLE001 - raised again in the consumer below
            outcome["error"] = error
        finally:
            events.put(_FINISHED)

    worker = threading.Thread(target=work, name="ghostedit-run", daemon=True)
    waiting_since = time.perf_counter()
    worker.start()
    latest, arrived = None, waiting_since
    try:
        yield  # started: stream_run returns the stream here
        while (item := _next(events, tick_seconds)) is not _FINISHED:
            if item is not None:
                latest, arrived = item, time.perf_counter()
                yield Live(latest, latest.elapsed)
            elif latest is None:
                yield Live(None, time.perf_counter() - waiting_since)
            else:
                yield Live(latest, latest.elapsed + time.perf_counter() - arrived)
    finally:
        if worker.is_alive():
            cancel.set()
    if "error" in outcome:
        raise outcome["error"]
    yield outcome["result"]


def _next(events: queue.Queue, timeout: float):
    try:
        return events.get(timeout=timeout)
    except queue.Empty:
        return None


def _gib(value: float | None) -> str:
    return "–" if value is None else f"{value:.2f} GiB"


def _seconds(value: float | None) -> str:
    return "–" if value is None else f"{value:.2f} s"


def memory_words(label: str) -> str:
    """The memory label, saying plainly when it is not GPU memory."""
    if label.startswith("host"):
        return f"{label}: no GPU, so this is the app's own RAM"
    return label


def progress_bar(event: ProgressEvent | None) -> str:
    """A real progress bar over the current stage's steps; without steps (loading, preparing) an indeterminate one
    that still shows the run is working."""
    if event is not None and event.download is not None and event.download["total_bytes"]:
        done, total = event.download["done_bytes"], event.download["total_bytes"]
        return (f'<progress class="ghost-progress" value="{done}" max="{total}" '
                f'aria-label="downloading: {100 * done / total:.0f}%"></progress>\n\n')
    if event is None or not event.total_steps:
        return '<progress class="ghost-progress" aria-label="working"></progress>\n\n'
    return (f'<progress class="ghost-progress" value="{event.step}" max="{event.total_steps}" '
            f'aria-label="{stage_words(event.stage)}: step {event.step} of {event.total_steps}"></progress>\n\n')


def live_status(live: Live, heading: str = "", waiting: str | None = None) -> str:
    """Markdown for the live view: stage, step i/N, s/step, elapsed, ETA, current and peak memory; before the run
    has the engine, `waiting` says what it waits for (default: another job)."""
    event, elapsed = live.event, live.elapsed
    if event is None:
        return (f"{heading}### ⏳ Waiting for the engine… {elapsed:.0f} s\n"
                + (waiting or "Another job is using the device; this run starts when it ends."))
    title = stage_words(event.stage).capitalize()
    if event.total_steps:
        title += f" · step {event.step}/{event.total_steps}"
    if event.worker:
        title += f" · on {event.worker}"
    detail = f" — {event.message}" if event.message and event.stage in ("load", "preparing", "download") else ""
    return (f"{heading}### ⏳ {title}{detail}\n{progress_bar(event)}"
            "| step | s/step | elapsed | ETA | memory now | peak |\n|---|---|---|---|---|---|\n"
            f"| {event.step}/{event.total_steps or '–'} | {_seconds(event.step_seconds)} | {elapsed:.1f} s | "
            f"{_seconds(event.eta)} | {_gib(event.memory.allocated_gib)} | {_gib(event.peak.allocated_gib)} |\n\n"
            f"<small>Memory: {memory_words(event.memory.label)}.</small>")


def progress_words(live: Live) -> str:
    """The live state in a line, for Gradio's progress updates (what an API client sees while the run goes on)."""
    event = live.event
    words = [stage_words(event.stage), f"{_seconds(event.step_seconds)}/step", f"elapsed {live.elapsed:.1f} s",
             f"ETA {_seconds(event.eta)}", f"{event.memory.label}: {_gib(event.memory.allocated_gib)} now, "
             f"{_gib(event.peak.allocated_gib)} peak"]
    return " · ".join(words + ([f"on {event.worker}"] if event.worker else []))


def progress_json(live: Live) -> dict:
    """The live state for API clients (the same numbers as the status text)."""
    event, elapsed = live.event, live.elapsed
    if event is None:
        return {"state": "waiting", "elapsed_s": elapsed}
    return {
        "state": "running",
        "stage": event.stage,
        "stage_words": stage_words(event.stage),
        "step": event.step,
        "total_steps": event.total_steps,
        "step_s": event.step_seconds,
        "elapsed_s": elapsed,
        "eta_s": event.eta,
        "memory": {"label": event.memory.label, "now_gib": event.memory.allocated_gib,
                   "peak_gib": event.peak.allocated_gib},
        "message": event.message,
        "worker": event.worker or None,
        "download": event.download,
    }


def done_status(result, heading: str = "") -> str:
    summary = result.telemetry.summary()
    per_step = summary["denoise_s_per_step"]
    cache = "prepared pipeline from the cache" if summary["cache_hit"] else "pipeline prepared for this run"
    return (f"{heading}### ✅ Done in {summary['total_s']:.2f} s\n"
            f"{per_step:.3f} s per denoising step · {cache} · peak {_gib(summary['peak_allocated_gib'])} "
            f"({summary['memory_kind']}){ran_on(summary)}")


def batch_status(results: list, wall_s: float) -> str:
    """The total of a run that made several images: the wall time from the first image's start to the last one's
    end, and each image's own engine time."""
    each = " · ".join(f"image {index} {result.telemetry.total_seconds:.2f} s"
                      for index, result in enumerate(results, 1))
    return f"### ✅ {len(results)} images in {wall_s:.2f} s\n{each} (engine time of each)"


def cancelled_status(cancelled: BaseException, done: int) -> str:
    """After Cancel: what stopped, and what of the run was kept (the images of a batch finished before it)."""
    kept = (f"The {done} image{'s' if done > 1 else ''} of this run finished before it {'are' if done > 1 else 'is'} "
            "kept; the rest was not made." if done else "This run made no image.")
    return f"### ⏹ Cancelled ({cancelled})\n{kept}"


def ran_on(summary: dict) -> str:
    """Which worker of a pool ran the edit (engine/workers.py); nothing without a pool."""
    worker = summary.get("worker")
    return f" · ran on worker {worker['index']}: {worker['device']} ({worker['name']})" if worker else ""


def run_summary(result) -> str:
    """Markdown beside the result: what ran, cache hit or miss, the stage breakdown, what each toggle did."""
    summary = result.telemetry.summary()
    request = result.request
    lines = [f"**{result.config.label}** · {result.width}×{result.height} · {request.steps} steps · "
             f"CFG {request.cfg_scale:g} · seed {request.seed}{start_words(request)} · attention ran: "
             f"{result.attention_backend}{ran_on(summary)}", "", f"Model: {family_words(result.family)}", ""]
    if summary["cache_hit"]:
        lines.append("**Prepared pipeline: cache hit** (prepared by an earlier run, reused as is)")
    else:
        prepare = summary["stages_s"].get("prepare", 0.0)
        lines.append(f"**Prepared pipeline: cache miss** (built for this run in {prepare:.2f} s; the next run with "
                     "this configuration reuses it)")
    lines += ["", "| stage | seconds | share |", "|---|---:|---:|"]
    total = summary["total_s"] or 1.0
    for stage, seconds in summary["stages_s"].items():
        lines.append(f"| {stage_words(stage)} | {seconds:.3f} | {100 * seconds / total:.0f}% |")
        if stage == "prepare":
            lines += [f"| &nbsp;&nbsp;↳ {step} | {step_seconds:.3f} | |"
                      for step, step_seconds in summary["prepare_steps_s"].items()]
    lines.append(f"| **end to end** | **{summary['total_s']:.3f}** | |")
    if summary["denoise_s_per_step"] is not None:
        lines += ["", f"Denoising: **{summary['denoise_s_per_step']:.3f} s/step** (median of "
                      f"{len(summary['step_s'])}: {' '.join(f'{s:.3f}' for s in summary['step_s'])})"]
    lines.append(f"Peak {memory_words(summary['memory_kind'])}: **{_gib(summary['peak_allocated_gib'])}**")
    lines += ["", "What each toggle did:"] + [f"- {name}: {words}" for name, words in result.prepared_report.items()]
    lines += [lora_line(lora) for lora in summary["loras"]]
    lines += [f"\n⚠️ {note}" for note in summary["notes"]]
    return "\n".join(lines)


def lora_line(lora: dict) -> str:
    """One LoRA in a line: its format, what matched, and what was not applied and why (the keys: API telemetry)."""
    line = (f"- LoRA **{lora['name']}** ({lora['mode']}, scale {lora['scale']:g}): {', '.join(lora['formats'])}, "
            f"{lora['layers_matched']} layers matched")
    if lora["keys_not_applied"]:
        line += f"; ⚠️ {lora['keys_not_applied']} keys not applied: {'; '.join(lora['not_applied_reasons'])}"
    return line


def result_json(result, run_number: int, serving: dict | None = None) -> dict:
    """The finished run for API clients: configuration, sizes, what each toggle did, the full telemetry, and with
    `serving` where the app's handler spent its time beside the engine's `total_s` (ui/handlers.py)."""
    request = result.request
    return {
        "state": "done",
        "run": run_number,
        "configuration": result.config.label,
        "width": result.width,
        "height": result.height,
        "steps": request.steps,
        "cfg_scale": request.cfg_scale,
        "seed": request.seed,
        "start": request.start_settings(),
        "attention_ran": result.attention_backend,
        "prepared_report": dict(result.prepared_report),
        "telemetry": result.telemetry.summary(),
        **({"serving": serving} if serving is not None else {}),
    }
