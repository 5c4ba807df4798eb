"""Python's garbage-collection pauses, timed per generation through gc.callbacks: for the probes of lab/probes that
ask whether collections explain a stage's time (a warm edit's stages, a first call's preparation and trace)."""
from __future__ import annotations

import gc
import time


class CollectorPauses:
    """Seconds spent in collections, and how many ran, per generation since the last take()."""

    def __init__(self):
        self._started = None
        self.seconds, self.counts = [0.0] * 3, [0] * 3
        gc.callbacks.append(self._callback)

    def _callback(self, phase, info):
        if phase == "start":
            self._started = time.perf_counter()
        else:
            self.seconds[info["generation"]] += time.perf_counter() - self._started
            self.counts[info["generation"]] += 1

    def take(self) -> dict:
        """{"seconds": per generation, "counts": per generation} since the last take, then starts again."""
        taken = {"seconds": list(self.seconds), "counts": list(self.counts)}
        self.seconds, self.counts = [0.0] * 3, [0] * 3
        return taken
