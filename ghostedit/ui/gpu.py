"""Hugging Face ZeroGPU: the functions that use the GPU are decorated with `spaces.GPU` when the `spaces` package is
installed, each call asking for the GPU seconds that an edit of its steps, size, CFG and configuration needs
(gpu_seconds). Outside a ZeroGPU Space that decorator returns the function unchanged, and without the package nothing
is decorated, so the app runs the same everywhere else. Start-up on ZeroGPU (weights, ahead-of-time compile) is in
space.py."""
from __future__ import annotations

import functools
import inspect
import math
from typing import Callable

from .. import figures
from ..config import OptimizationConfig

START_S = 10.0   # not measured: ZeroGPU attaching its GPU slice and the pipeline's own set-up (an allowance)
MARGIN = 2.5     # ZeroGPU's slice of an H200 (MIG) is slower than a whole H100; an edit cut off is lost
GPU_SECONDS_MAX = 600
MEGAPIXEL = 1024 * 1024


@functools.cache
def measured_costs(fp8: str, compiled: bool) -> tuple[float, float] | None:
    """(seconds of one DiT forward per megapixel, seconds to prepare) for a configuration, from the committed run of
    the page's configurations on an H100 (docs/benchmarks/card-full: a CFG step is two forwards); None where that
    run did not measure the configuration."""
    config = OptimizationConfig(fp8=fp8, compile="regional" if compiled else "off")
    row = figures.row(figures.PAGE_RUN, config)
    if row is None:
        return None
    width, height = figures.results(figures.PAGE_RUN)["size"]
    return row["s_per_step"] / 2 * MEGAPIXEL / (width * height), row["prepare_s"]


@functools.cache
def encode_decode_s() -> float:
    """Text and image encoding plus decoding of a 1024x1024 stock edit, as the committed end-to-end run measured."""
    stock = figures.row("e2e-4", OptimizationConfig())
    return sum(stock["stages_s"][stage] for stage in ("text encoding", "image encoding", "decoding"))


@functools.cache
def lora_switch_s() -> float:
    """The slowest fused LoRA switch the committed run measured."""
    return max(row["switch_s"] for row in figures.results("lora-switch")["rows"])


def gpu_seconds(arguments: dict, default_area: int, default_steps: int, runs: int = 1) -> int:
    """GPU seconds for `runs` edits with these endpoint arguments: start, preparation (FP8, fused LoRAs), encoding
    and decoding, and steps x DiT forwards (two per step with CFG > 1) at the edit's size, with a margin. A
    configuration no committed run measured asks for the most."""
    steps = int(arguments.get("steps") or default_steps)
    width, height = int(arguments.get("width") or 0), int(arguments.get("height") or 0)
    scale = (width * height if width and height else default_area) / MEGAPIXEL
    forwards = 2 if float(arguments.get("cfg_scale") or 4.0) > 1 else 1
    costs = measured_costs(arguments.get("fp8") or "off", (arguments.get("compile") or "off") != "off")
    if costs is None:
        return GPU_SECONDS_MAX
    forward_s, prepare_s = costs
    loras = sum(1 for name, value in arguments.items()
                if name.startswith("lora") and not name.endswith(("_mode", "_scale")) and value not in (None, "none"))
    prepare = prepare_s + lora_switch_s() * loras
    edit = START_S + prepare + encode_decode_s() * scale + steps * forwards * forward_s * scale
    return min(GPU_SECONDS_MAX, math.ceil(runs * edit * MARGIN))


def on_gpu(fn: Callable, spec, runs_for: Callable[[dict], int] = lambda arguments: 1,
           arguments_of: Callable[[dict], dict] = lambda arguments: arguments) -> Callable:
    """`fn` as a ZeroGPU entry point for the model `spec` (its default size and steps), asking for gpu_seconds of
    the call's arguments (or of the /edit values `arguments_of` finds in them), where `runs_for` tells from them
    how many edits the call makes."""
    try:
        import spaces
    except ImportError:
        return fn
    signature = inspect.signature(fn)

    def duration(*args, **kwargs) -> int:
        # the values arrive as sent (preprocess=False): the handler refuses bad ones with their reason, so a value
        # that cannot be read here asks for the most time rather than failing before the handler runs
        try:
            arguments = signature.bind_partial(*args, **kwargs).arguments
            return gpu_seconds(arguments_of(arguments), spec.default_area, spec.default_steps, runs_for(arguments))
        except (TypeError, ValueError):
            return GPU_SECONDS_MAX

    return spaces.GPU(duration=duration)(fn)
