"""Timing a probe needs beyond the bench's (ghostedit.telemetry.median_ms: calls timed alone)."""
from __future__ import annotations

import torch


def back_to_back_ms(fn, calls: int, warmup: int = 0) -> float:
    """Milliseconds per call of `fn` over `calls` calls launched back to back on a GPU (CUDA events around them
    all, the CPU free to run ahead), after `warmup` untimed calls: against median_ms's calls timed alone, what a
    call costs the GPU kept busy, where the power limit holds the clocks back."""
    for _ in range(warmup):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(calls):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / calls
