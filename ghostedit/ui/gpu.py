"""Hugging Face ZeroGPU: the functions that use the GPU are decorated with `spaces.GPU` when the `spaces` package is
installed. Outside a ZeroGPU Space that decorator returns the function unchanged, and without the package nothing is
decorated, so the app runs the same everywhere else."""
from __future__ import annotations

import inspect
from typing import Callable

# Seconds of GPU a ZeroGPU call asks for: a margin for loading, preparing and compiling, plus a few seconds per step.
GPU_SECONDS_BASE = 60
GPU_SECONDS_PER_STEP = 3
GPU_SECONDS_MAX = 600


def gpu_seconds(steps: int, runs: int = 1) -> int:
    return min(GPU_SECONDS_MAX, runs * (GPU_SECONDS_BASE + GPU_SECONDS_PER_STEP * int(steps)))


def on_gpu(fn: Callable, runs_for: Callable[[dict], int] = lambda arguments: 1) -> Callable:
    """`fn` (which takes a `steps` argument) as a ZeroGPU entry point, asking for gpu_seconds(steps, runs) where
    `runs_for` tells from the call's arguments how many edits the call makes."""
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
            return gpu_seconds(arguments.get("steps") or 40, runs_for(arguments))
        except (TypeError, ValueError):
            return GPU_SECONDS_MAX

    return spaces.GPU(duration=duration)(fn)
