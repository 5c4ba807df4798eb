"""First-Block Cache for DiffSynth's QwenImageDiT: a lossy step cache (the method of ParaAttention's FBCache and of
cache-dit's DBCache with one front block and no back blocks). Every DiT forward runs the first transformer block.
When the image stream's change through it differs little from its change at the last fully computed forward of the
same CFG pass (mean absolute difference relative to that change, under the threshold), the other blocks are skipped
and their change to the image stream at that forward is added instead. Threshold 0 never skips: the output is the
full run's, bit for bit.

Why not cache-dit itself (1.5.3, checked against DiffSynth 2.1.12): its BlockAdapter swaps in its cached blocks
only inside a patched `transformer.forward`, but DiffSynth's `model_fn_qwen_image` never calls `dit.forward`: it
loops over `dit.transformer_blocks` itself, so with the adapter applied every block still runs and cache-dit counts
no step at all. Putting cache-dit's blocks into that list by hand fails too: DiffSynth calls each block with the
keywords `image=`, `text=`, `temb=`, which match none of cache-dit's forward patterns (`hidden_states`,
`encoder_hidden_states`). Its cache is reset per call of a diffusers pipeline class (it patches the class, so every
pipeline of the process), or never for a bare transformer; and it imports diffusers, a test-only dependency here.

One cache lives for one edit and keeps one state per CFG pass: DiffSynth calls the DiT for the positive, then the
negative prompt at each step, and the two passes' changes are not comparable with each other. It sits between the
engine and DiffSynth's model_fn and puts its block wrappers into the DiT only for the length of one forward, so
compiled blocks (regional compile), FP8 layers and the runner's compile bookkeeping see the DiT as prepared."""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

import torch

from .. import parallel
from . import block_loop

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
    def __init__(self, threshold: float):
        if threshold < 0:
            raise ValueError(f"a step cache threshold is at least 0; got {threshold}")
        self.threshold = threshold
        self.passes: list[PassState] = []
        self.blocks_per_forward = 0
        self.blocks_run = 0
        self._step: int | None = None
        self._pass = 0
        self._skipping = False
        self._after_first: torch.Tensor | None = None
        self._wrapped: tuple[torch.nn.ModuleList, torch.nn.ModuleList] | None = None

    # ---- one forward ----

    def wrap(self, model_fn):
        """DiffSynth's model_fn with this cache around its block loop."""
        def cached_model_fn(dit=None, progress_id=None, **inputs):
            if progress_id is None:
                raise RuntimeError("the step cache needs DiffSynth's step index (progress_id) with every DiT forward")
            self._begin(progress_id)
            blocks = dit.transformer_blocks
            if len(blocks) < 2:
                raise RuntimeError("the step cache skips the blocks after the first: this DiT has only one")
            self.blocks_per_forward = len(blocks)
            dit.transformer_blocks = self._wrappers(blocks)
            try:
                return model_fn(dit=dit, progress_id=progress_id, **inputs)
            finally:
                dit.transformer_blocks = blocks
                self._after_first = None
        return cached_model_fn

    def _wrappers(self, blocks: torch.nn.ModuleList) -> torch.nn.ModuleList:
        """The block list a forward runs: the DiT's own blocks, each behind a wrapper (made once per edit)."""
        if self._wrapped is None or self._wrapped[0] is not blocks:
            wrappers = [_FirstBlock(blocks[0], self)] + [_LaterBlock(block, self, last=index == len(blocks) - 1)
                                                         for index, block in enumerate(blocks) if index]
            self._wrapped = blocks, torch.nn.ModuleList(wrappers)
        return self._wrapped[1]

    def _begin(self, step: int) -> None:
        """A forward at the same step as the one before is that step's next CFG pass."""
        self._pass = self._pass + 1 if step == self._step else 0
        self._step = step
        while len(self.passes) <= self._pass:
            self.passes.append(PassState())

    def after_first_block(self, image_in: torch.Tensor, image_out: torch.Tensor) -> torch.Tensor:
        """Decides whether this forward skips the other blocks; returns the image stream the next block gets (or,
        when skipping, the forward's result)."""
        state = self.passes[self._pass]
        change = image_out - image_in
        self.blocks_run += 1
        self._skipping = False
        if state.first_change is not None:
            relative = _relative_difference(change, state.first_change)
            state.relative_changes.append(relative)
            self._skipping = relative < self.threshold
        if self._skipping:
            state.cached.append(self._step)
            return image_out + state.rest_change
        state.computed.append(self._step)
        state.first_change = change
        self._after_first = image_out
        return image_out

    @property
    def skipping(self) -> bool:
        return self._skipping

    def block_ran(self, image_out: torch.Tensor, last: bool) -> None:
        self.blocks_run += 1
        if last:
            self.passes[self._pass].rest_change = image_out - self._after_first

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
            "cached_steps": {_pass_name(index): list(state.cached) for index, state in enumerate(self.passes)},
            "relative_changes": {_pass_name(index): [round(value, 5) for value in state.relative_changes]
                                 for index, state in enumerate(self.passes)},
        }

    def words(self) -> str:
        found = self.summary()
        return (f"First-Block Cache, threshold {self.threshold:g}: {found['forwards_computed']} of "
                f"{found['forwards']} DiT forwards computed, {found['forwards_cached']} from the cache; "
                f"{found['blocks_run']} of {found['blocks_full_run']} transformer blocks run")


@contextlib.contextmanager
def first_block_cache(pipe, threshold: float):
    """A fresh cache around every DiT forward of `pipe` for one edit (DiffSynth calls `pipe.model_fn`)."""
    cache = FirstBlockCache(threshold)
    with block_loop.wrapped_model_fn(pipe, cache.wrap):
        yield cache


class _FirstBlock(torch.nn.Module):
    def __init__(self, block: torch.nn.Module, cache: FirstBlockCache):
        super().__init__()
        self.block, self.cache = block, cache

    def forward(self, image, text, **inputs):
        text, image_out = self.block(image=image, text=text, **inputs)
        return text, self.cache.after_first_block(image, image_out)


class _LaterBlock(torch.nn.Module):
    """A block after the first: passed over when the cache serves this forward. The text stream it would have
    changed is not read after the last block (only the image stream becomes the output)."""

    def __init__(self, block: torch.nn.Module, cache: FirstBlockCache, last: bool):
        super().__init__()
        self.block, self.cache, self.last = block, cache, last

    def forward(self, image, text, **inputs):
        if self.cache.skipping:
            return text, image
        text, image = self.block(image=image, text=text, **inputs)
        self.cache.block_ran(image, self.last)
        return text, image


def _relative_difference(now: torch.Tensor, before: torch.Tensor) -> float:
    """sum |now - before| / sum |before|, accumulated in float32 (one device sync per forward). Under Ulysses
    sequence parallel each rank holds a shard of the image tokens: the sums are added over the ranks, so that every
    rank decides alike (a rank that skipped the blocks would leave the others waiting in their all-to-alls)."""
    sums = torch.stack([torch.sum((now - before).abs(), dtype=torch.float32),
                        torch.sum(before.abs(), dtype=torch.float32)])
    mesh = parallel.current()
    if mesh is not None and mesh.ulysses_degree > 1:
        torch.distributed.all_reduce(sums, group=mesh.group("ulysses"))
    return (sums[0] / sums[1]).item()


def _pass_name(index: int) -> str:
    """DiffSynth runs the positive pass first; under CFG parallel a rank runs one pass only, its CFG rank's."""
    mesh = parallel.current()
    if mesh is not None and mesh.cfg_degree > 1:
        index += mesh.cfg_rank
    return PASS_NAMES[index] if index < len(PASS_NAMES) else f"pass {index + 1}"
