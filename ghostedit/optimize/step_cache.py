"""First-Block Cache: a lossy step cache (the method of ParaAttention's FBCache and of cache-dit's DBCache with one
front block and no back blocks), the step cache a DiT forward's block loop consults (models/seams.py, StepCache).
Every DiT forward runs the first transformer block. When the image stream's change through it differs little from
its change at the last fully computed forward of the same CFG pass (mean absolute difference relative to that
change, under the threshold), the other blocks are skipped and their change to the image stream at that forward is
added instead. Threshold 0 never skips: the output is the full run's, bit for bit.

Why not cache-dit itself (1.5.3, checked against DiffSynth 2.1.12): its BlockAdapter swaps in its cached blocks
only inside a patched `transformer.forward` of a diffusers pipeline class (it patches the class, so every pipeline
of the process), keys its blocks on diffusers' argument names (`hidden_states`, `encoder_hidden_states`) and imports
diffusers, a test-only dependency here; GhostEdit's forward declares the seam instead.

One cache lives for one edit and keeps one state per CFG pass: the pipeline calls the DiT for the positive, then
the negative prompt at each step, and the two passes' changes are not comparable with each other. Under Ulysses
sequence parallel the ranks decide together (their shards' sums added); under CFG parallel a rank caches its own
pass."""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..models.seams import BranchSteps

PASS_NAMES = ("positive", "negative")  # DiffSynth's order of the CFG passes within a step


@dataclass
class PassState:
    """One CFG pass: the first block's change to the image stream and the other blocks' change at the last computed
    forward, and what happened at each step."""
    first_change: torch.Tensor | None = None
    rest_change: torch.Tensor | None = None
    computed: list[int] = field(default_factory=list)
    cached: list[int] = field(default_factory=list)
    relative_changes: list[float] = field(default_factory=list)  # at every step after the first


class FirstBlockCache:
    def __init__(self, threshold: float, mesh=None):
        """`mesh`: the process mesh of a parallel edit (its Ulysses ranks decide together), None in one process."""
        if threshold < 0:
            raise ValueError(f"a step cache threshold is at least 0; got {threshold}")
        self.threshold = threshold
        self.mesh = mesh
        self.passes: list[PassState] = []
        self.blocks_per_forward = 0
        self.blocks_run = 0
        self._branches = BranchSteps()
        self._after_first: torch.Tensor | None = None

    # ---- one forward ----

    def begin(self, step: int) -> None:
        """A forward at step `step` starts; the same step again is that step's next CFG pass."""
        branch = self._branches.begin(step)
        while len(self.passes) <= branch:
            self.passes.append(PassState())

    @property
    def _step(self) -> int:
        return self._branches.step

    @property
    def _pass(self) -> int:
        return self._branches.branch

    def after_block(self, index: int, before: torch.Tensor, after: torch.Tensor,
                    last: bool) -> tuple[torch.Tensor, bool]:
        """After block `index` turned the image stream `before` into `after`: the stream the loop goes on with and
        whether it stops (after the first block, when the cache serves the others' change)."""
        self.blocks_run += 1
        if index == 0:
            if last:
                raise RuntimeError("the step cache skips the blocks after the first: this DiT has only one")
            return self._after_first_block(before, after)
        if last:
            self.blocks_per_forward = index + 1
            self.passes[self._pass].rest_change = after - self._after_first
            self._after_first = None
        return after, False

    def _after_first_block(self, image_in: torch.Tensor, image_out: torch.Tensor) -> tuple[torch.Tensor, bool]:
        state = self.passes[self._pass]
        change = image_out - image_in
        skipping = False
        if state.first_change is not None:
            relative = self._relative_difference(change, state.first_change)
            state.relative_changes.append(relative)
            skipping = relative < self.threshold
        if skipping:
            state.cached.append(self._step)
            return image_out + state.rest_change, True
        state.computed.append(self._step)
        state.first_change = change
        self._after_first = image_out
        return image_out, False

    def _relative_difference(self, now: torch.Tensor, before: torch.Tensor) -> float:
        """sum |now - before| / sum |before|, accumulated in float32 (one device sync per forward). Under Ulysses
        each rank holds a shard of the image tokens: the sums are added over the ranks, so that every rank decides
        alike (a rank that skipped the blocks would leave the others waiting in their all-to-alls)."""
        sums = torch.stack([torch.sum((now - before).abs(), dtype=torch.float32),
                            torch.sum(before.abs(), dtype=torch.float32)])
        if self.mesh is not None and self.mesh.ulysses_degree > 1:
            torch.distributed.all_reduce(sums, group=self.mesh.group("ulysses"))
        return (sums[0] / sums[1]).item()

    # ---- what it did ----

    def summary(self) -> dict:
        forwards = sum(len(state.computed) + len(state.cached) for state in self.passes)
        computed = sum(len(state.computed) for state in self.passes)
        return {
            "method": "First-Block Cache",
            "threshold": self.threshold,
            "forwards": forwards,
            "forwards_computed": computed,
            "forwards_cached": forwards - computed,
            "blocks_run": self.blocks_run,
            "blocks_full_run": forwards * self.blocks_per_forward,
            "cached_steps": {_pass_name(index, self.mesh): list(state.cached) for index, state in enumerate(self.passes)},
            "relative_changes": {_pass_name(index, self.mesh): [round(value, 5) for value in state.relative_changes]
                                 for index, state in enumerate(self.passes)},
        }

    def words(self) -> str:
        found = self.summary()
        return (f"First-Block Cache, threshold {self.threshold:g}: {found['forwards_computed']} of "
                f"{found['forwards']} DiT forwards computed, {found['forwards_cached']} from the cache; "
                f"{found['blocks_run']} of {found['blocks_full_run']} transformer blocks run")


def _pass_name(index: int, mesh) -> str:
    """DiffSynth runs the positive pass first; under CFG parallel a rank runs one pass only, its CFG rank's."""
    if mesh is not None and mesh.cfg_degree > 1:
        index += mesh.cfg_rank
    return PASS_NAMES[index] if index < len(PASS_NAMES) else f"pass {index + 1}"
