"""The prepared-pipeline cache: one prepared pipeline per cache key, built on first use and reused after, the least
recently used ones evicted to keep the memory they add to the base weights within a budget.

Changed only under the engine's lock; `view()` is a tuple replaced whole after every change, so the System tab and
the prepare notice read it at once, even during someone else's run.
"""
from __future__ import annotations

import gc
from collections import OrderedDict

import psutil
import torch

from ..device import empty_cache, gpu_capacity_bytes
from ..telemetry import GIB
from .prepare import PreparedPipeline

ACTIVATION_SHARE = 0.25  # of the card kept free for activations when no budget is given


class PreparedCache:
    def __init__(self, device: str, budget_gib: float | None = None):
        self.device = device
        self.budget_gib = budget_gib
        self._prepared: OrderedDict[tuple, PreparedPipeline] = OrderedDict()
        self._view: tuple[PreparedPipeline, ...] = ()

    def get(self, key: tuple) -> PreparedPipeline | None:
        prepared = self._prepared.get(key)
        if prepared is not None:
            self._prepared.move_to_end(key)
            self._publish()
        return prepared

    def put(self, prepared: PreparedPipeline) -> None:
        self._prepared[prepared.key] = prepared
        self._publish()
        self._evict_over_budget(keep=prepared.key)

    def make_room(self, needed_bytes: int) -> None:
        """Evicts least recently used pipelines until `needed_bytes` more fit the budget: before a build, so that
        the new pipeline never sits beside the ones it replaces."""
        for key in list(self._prepared):
            if self.owned_bytes() + needed_bytes <= self.budget_bytes():
                break
            self.evict(key)

    def view(self) -> tuple[PreparedPipeline, ...]:
        """The pipelines, most recently used first; safe to read without the engine's lock."""
        return self._view

    def owned_bytes(self) -> int:
        return sum(p.owned_bytes for p in self._prepared.values())

    def budget_bytes(self) -> int:
        if self.budget_gib is not None:
            return int(self.budget_gib * GIB)
        if self.device.startswith("cuda"):
            free, total = torch.cuda.mem_get_info()
            capacity = gpu_capacity_bytes(self.device)
            free -= total - capacity  # a capped card (set_per_process_memory_fraction) has less than the driver says
            return max(0, int(free + self.owned_bytes() - ACTIVATION_SHARE * capacity))
        return int(0.5 * psutil.virtual_memory().available + self.owned_bytes())

    def evict(self, key: tuple) -> None:
        prepared = self._prepared.pop(key)
        self._publish()
        prepared.pipe.dit = None
        del prepared
        gc.collect()  # a compiled block and its compiled code reference each other: only the cycle collector frees them
        empty_cache(self.device)

    def free(self) -> int:
        """Drops every pipeline; returns the bytes they held."""
        freed = self.owned_bytes()
        for key in list(self._prepared):
            self.evict(key)
        return freed

    def _evict_over_budget(self, keep: tuple) -> None:
        budget = self.budget_bytes()
        for key in list(self._prepared):
            if self.owned_bytes() <= budget:
                break
            if key != keep:
                self.evict(key)

    def _publish(self) -> None:
        self._view = tuple(reversed(self._prepared.values()))
