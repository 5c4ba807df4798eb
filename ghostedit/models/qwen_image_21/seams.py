"""Stand-in for the seams module of branch `dit` (ghostedit/models/seams.py, "seams ready for 2.1", 487fd7e): the
names and signatures Qwen-Image-2.1's DiT calls, with the same meaning, until the two branches are merged. Then
dit.py imports them from `..seams` and this file goes; what it has that module has not yet (the "flex" backend over
block-causal `Segments`, and a Segments' `block_mask`) moves into that module's attention dispatch.

DitOptions   one run's choices, handed to the forward and down to every block (frozen)
PrefixKVCache  the prefix's keys and values per CFG branch (told apart by step index) and block, for one run
Segments     a block-causal mask as spans of the query sequence (the target's queries after the last span)
attention    attention over streams joined along the sequence, by the backend the options name
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Callable, Sequence

import torch
import torch.nn.functional as F

QKV = tuple[torch.Tensor, torch.Tensor, torch.Tensor]
DIFFSYNTH = "diffsynth"   # the attention DiffSynth runs for this DiT (its own choice)
FLEX = "flex"             # one flex_attention call over a block-causal mask
FLEX_BLOCK_SIZE = 128     # flex_attention's block mask works in blocks of 128 tokens


# ---- the run's options ----

@dataclass(frozen=True)
class DitOptions:
    """One run's choices for a DiT forward: the attention backend ("diffsynth", an SDPA kernel "sdpa-flash",
    "sdpa-cudnn", "sdpa-efficient", "sdpa-math", or "flex") and the run's prefix KV cache (None: every token at
    every step)."""
    attention: str = DIFFSYNTH
    prefix_cache: PrefixKVCache | None = None

    def replace(self, **changes) -> DitOptions:
        return dataclasses.replace(self, **changes)


class BranchSteps:
    """Which CFG branch a forward belongs to, from its step index: the pipeline runs a step's branches one after
    another, so a forward at the same step as the one before is that step's next branch."""

    def __init__(self):
        self.step: int | None = None
        self.branch = 0

    def begin(self, step: int) -> int:
        self.branch = self.branch + 1 if step == self.step else 0
        self.step = step
        return self.branch


class PrefixKVCache:
    """The keys and values of a forward's prefix tokens (text and reference images, the same at every step), per
    CFG branch and block, for one run: the step that finds its branch empty computes every token and stores each
    block's prefix (`filling`); later steps compute the target's tokens only. What each forward computed is
    counted for the run's telemetry."""

    def __init__(self):
        self._branches = BranchSteps()
        self._entries: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor]] = {}
        self._filled: set[int] = set()
        self.tokens_computed: list[int] = []   # tokens each forward computed, in order

    def begin(self, step: int) -> None:
        self._branches.begin(step)

    @property
    def branch(self) -> int:
        return self._branches.branch

    @property
    def filling(self) -> bool:
        return self.branch not in self._filled

    @property
    def shape_key(self) -> str:
        """What the cache adds to a forward's shapes (a compiled DiT runs one graph for each)."""
        return "filling the prefix cache" if self.filling else "from the prefix cache"

    def store(self, block: int, keys: torch.Tensor, values: torch.Tensor) -> None:
        # copies of their own: a view would keep the whole forward's tensors alive
        self._entries[(self.branch, block)] = (keys.clone(), values.clone())

    def stored(self, block: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self._entries[(self.branch, block)]

    def done(self, tokens: int) -> None:
        self._filled.add(self.branch)
        self.tokens_computed.append(tokens)

    def summary(self) -> dict:
        return {"branches": len(self._filled), "tokens_computed": list(self.tokens_computed)}


# ---- attention ----

@dataclass(frozen=True)
class Segments:
    """A block-causal mask as spans of the query sequence: each (start, end, causal) attends to the keys [0, end),
    with a causal triangle over its own span where `causal` (text); the queries after the last span (the target)
    attend to every key. Keys where `key_valid` [batch, keys] is False (padding) are attended by none.
    `block_mask`: flex_attention's BlockMask of the same mask, made once for a run's forwards (flex_block_mask)."""
    spans: tuple[tuple[int, int, bool], ...]
    key_valid: torch.Tensor | None = field(default=None, compare=False)
    block_mask: object = field(default=None, compare=False)

    @property
    def prefix_end(self) -> int:
        return self.spans[-1][1] if self.spans else 0


def attention(streams: Sequence[QKV], options: DitOptions, *, layout: str = "bshd", mask=None,
              prefix: tuple[torch.Tensor, torch.Tensor] | None = None,
              diffsynth: Callable | None = None) -> torch.Tensor:
    """Attention over `streams` ((q, k, v) each [batch, seq, heads, head_dim]) joined along the sequence, by the
    backend `options.attention` names; `mask` None or `Segments`; `prefix` (keys, values) joined before the keys;
    `diffsynth` the family's DiffSynth attention, (q, k, v, mask) heads first -> [batch, queries, heads * dim].
    Returns [batch, queries, heads * head_dim]."""
    if layout != "bshd":
        raise ValueError("this stand-in takes the projections' layout only")
    q, k, v = (torch.cat(parts, dim=1) if len(parts) > 1 else parts[0] for parts in zip(*streams))
    if options.attention == FLEX and isinstance(mask, Segments):
        return _flex(q, k, v, mask)
    q, k, v = (t.transpose(1, 2) for t in (q, k, v))
    if prefix is not None:
        keys, values = (t.transpose(1, 2) for t in prefix)
        k, v = torch.cat([keys, k], dim=2), torch.cat([values, v], dim=2)
    if isinstance(mask, Segments):
        return _segments(q, k, v, mask, options.attention, diffsynth)
    return _attend(q, k, v, options.attention, mask, diffsynth)


# [batch, heads, seq, head_dim] in and out: the kernel SDPA runs when only that backend is enabled, called directly
# (`sdpa_kernel` would set process-wide flags)
SDPA_BACKENDS = {
    "sdpa-flash": lambda q, k, v: (torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v) if
                                   q.device.type == "cpu" else
                                   torch.ops.aten._scaled_dot_product_flash_attention(q, k, v))[0],
    "sdpa-cudnn": lambda q, k, v: torch.ops.aten._scaled_dot_product_cudnn_attention(q, k, v, None, False)[0],
    "sdpa-efficient": lambda q, k, v: torch.ops.aten._scaled_dot_product_efficient_attention(q, k, v, None, False)[0],
    "sdpa-math": lambda q, k, v: torch.ops.aten._scaled_dot_product_attention_math(q, k, v)[0],
}


def _attend(q, k, v, backend: str, mask, diffsynth) -> torch.Tensor:
    """q, k, v [batch, heads, seq, head_dim] by one backend: [batch, queries, heads * head_dim]. Masked attention is
    PyTorch SDPA's own choice of kernel; flex, where no block structure is left (a step from the cache), too."""
    if backend == DIFFSYNTH:
        return diffsynth(q, k, v, mask)
    if mask is not None or backend == FLEX:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask).transpose(1, 2).flatten(2)
    return SDPA_BACKENDS[backend](q, k, v).transpose(1, 2).flatten(2)


def _segments(q, k, v, segments: Segments, backend: str, diffsynth) -> torch.Tensor:
    """Block-causal attention span by span (as diffusers' QwenImage21AttnProcessor computes it): a span attends to
    the keys up to its end, a causal span with a triangle over its own keys; the target's queries to every key."""
    valid = segments.key_valid
    outputs = []
    for start, end, causal in segments.spans:
        span_mask = None
        if causal:
            length = end - start
            span_mask = torch.cat([torch.ones(length, start, dtype=torch.bool, device=q.device),
                                   torch.ones(length, length, dtype=torch.bool, device=q.device).tril()], dim=1)
        if valid is not None:
            keys_valid = valid[:, None, None, :end]
            span_mask = keys_valid if span_mask is None else span_mask & keys_valid
        outputs.append(_attend(q[:, :, start:end], k[:, :, :end], v[:, :, :end], backend, span_mask, diffsynth))
    target_mask = None if valid is None else valid[:, None, None, :]
    outputs.append(_attend(q[:, :, segments.prefix_end:], k, v, backend, target_mask, diffsynth))
    return torch.cat(outputs, dim=1)


def _flex(q, k, v, segments: Segments) -> torch.Tensor:
    """One flex_attention call over the segments' BlockMask, the sequence padded to whole mask blocks."""
    from torch.nn.attention.flex_attention import flex_attention
    length = q.shape[1]
    padded = math.ceil(length / FLEX_BLOCK_SIZE) * FLEX_BLOCK_SIZE
    q, k, v = (F.pad(t, (0, 0, 0, 0, 0, padded - length)).transpose(1, 2) for t in (q, k, v))
    out = flex_attention(q, k, v, block_mask=segments.block_mask)
    return out.transpose(1, 2)[:, :length].flatten(2)


def flex_block_mask(segments: Segments, length: int, batch: int, device) -> object:
    """flex_attention's BlockMask of `segments` over a sequence of `length` queries and keys (padded positions
    masked out): a query sees the keys before it, and every key of its own image (a non-causal span, or the
    target after the last span)."""
    from torch.nn.attention.flex_attention import create_block_mask
    padded = math.ceil(length / FLEX_BLOCK_SIZE) * FLEX_BLOCK_SIZE
    image_ids = torch.full((padded,), -1, dtype=torch.long, device=device)
    images = [(start, end) for start, end, causal in segments.spans if not causal] + [(segments.prefix_end, length)]
    for number, (start, end) in enumerate(images):
        image_ids[start:end] = number
    key_valid = torch.ones(batch, padded, dtype=torch.bool, device=device)
    if segments.key_valid is not None:
        key_valid[:, :length] = segments.key_valid

    def mask_mod(b, h, query, key):
        same_image = (image_ids[query] == image_ids[key]) & (image_ids[query] >= 0)
        return ((query >= key) | same_image) & key_valid[b, key] & (query < length) & (key < length)

    return create_block_mask(mask_mod, B=batch, H=None, Q_LEN=padded, KV_LEN=padded, device=device, _compile=False)
