"""The seams of a DiT family's forward, declared once for every family file (models/qwen_image/dit.py: the
Qwen-Image(-Edit) DiT; a Qwen-Image-2.1 file builds on the same).

How a family file uses them. Its module classes hold the parameters DiffSynth loads (the same state dict, the same
attribute names: DiffSynth's loader builds the family's class from its model table) and expose `blocks` (the
repeated blocks: regional compile compiles each, the block loop runs them), `heads` and `head_dim`. Its forward
reads top to bottom and takes one `DitOptions`, the run's choices, which the engine makes for each run and which
travels down through every call: a fast path is a named branch on an option, never a patched-in replacement. Where
a toggle changes the forward, the forward calls a seam:

attention        `attention(streams, options, ...)`: one dispatch over every backend by `options.attention` (SDPA's
                 kernels, FlashAttention-2/3/4, SageAttention, the FP8 attentions, DiffSynth's own), for streams
                 joined along the sequence; masks (dense, or block-causal `Segments` computed segment by segment:
                 with an FP8 attention the spans that need no mask in FP8, the causal ones exact), keys and values
                 of a cached prefix, and the FP8 scales of q and k where bounds are known (`normed_bound`). Under a
                 sequence split the split's all-to-alls go around it, and per-tensor FP8 scales are computed over
                 the whole sequence, a cached prefix's values included (the one-process image).
linear           every projection is a module attribute called as a module: preparation replaces it (torchao's FP8
                 linear, Transformer Engine's, a runtime LoRA's PEFT layer) and the forward does not change.
                 `fp8_linear(layer, values, scales)` hands rows already in FP8 (a fused kernel's) to torchao's FP8
                 layer, and `out_projection` an FP8 attention's output as its kernel wrote it; `fused_linear`
                 joins projections of one input (a family names them in its DiT class's `fused_projections`, which
                 fused LoRAs and the pinned base read too).
block loop       the family's loop over `blocks`: each block is a module of its own (compiled regionally where
                 compile is on); behind `options.step_cache` when a step cache runs (`StepCache.after_block`); the
                 whole forward replayed from CUDA graphs where `options.graphs` is set (`ForwardGraphs.run`).
sequence split   `options.sequence_split` (Ulysses): `over(tokens)` binds it to a forward's sharded tokens, `shard`
                 and `gather` split and join them along a dimension, `attention` trades tokens for heads around the
                 local attention (streams split apart each by a split bound to its own tokens), `all_max` and
                 `all_sum` reduce over the ranks; None in one process. Each rank attends over every token with its
                 share of the heads, so a mask shared by the heads and a prefix cache of the rank's heads apply as
                 in one process.
step cache       `options.step_cache`: decides after the first block whether the others run at this step
                 (`begin(step)` at each forward, `after_block(...)` after each block).
prefix KV cache  `options.prefix_cache` (`PrefixKVCache`): the keys and values of the tokens before the target (text,
                 reference images), kept from the step that computed them, per CFG branch and block; later steps
                 compute the target's tokens only and attend over the kept prefix (`attention(..., prefix=...)`).

Nothing here holds run state at module level: whatever a run keeps lives in the objects its options hold.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol, Sequence

import torch
import torch.nn.functional as F
import torch.utils._pytree as pytree
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

from ..kernels import attention as backends, fp8_attention
from ..kernels.fp8 import torchao_fp8_linear

QKV = tuple[torch.Tensor, torch.Tensor, torch.Tensor]

DIFFSYNTH = "diffsynth"   # the attention DiffSynth runs for this DiT (its own choice: FA3 if installed, else SDPA)
FLEX = "flex"             # block-causal attention in one flex_attention call over the mask's BlockMask
FLEX_BLOCK_SIZE = 128     # flex_attention's block mask works in blocks of 128 tokens


# ---- the run's options ----

@dataclass(frozen=True)
class DitOptions:
    """One run's choices for a DiT forward: made by the engine from the configuration (each toggle sets its field),
    handed to the forward and down to every block. Frozen: compiled blocks guard on the values they read, so a new
    object with the same values runs the same compiled code. The objects it holds (a split, a cache, graphs) carry
    what the run keeps; compiled blocks read only the split's plain values."""
    attention: str = DIFFSYNTH          # a backend of kernels/attention.py (CONCRETE_BACKENDS), "diffsynth" or "flex"
    real_rope: bool = False             # the rotary embedding as real (cos, sin) instead of complex numbers
    joint_layout: bool = False          # q, k, v kept in the projections' [batch, seq, heads, head_dim] layout
    fused_qkv: bool = False             # one projection for q, k and v per stream (prepared: the weights joined)
    fused_qk_norm_rope: bool = False    # q and k normalized, rotated and cast to FP8 by one kernel
    fp8_attention_out: bool = False     # the FP8 attention's output into the FP8 output projections as written
    fused_gelu_quant: bool = False      # the feed-forward's GELU and its rowwise FP8 quantization in one kernel
    fused_swiglu_quant: bool = False    # SwiGLU's silu(gate) * up and its rowwise FP8 quantization in one kernel
    carried_residual: bool = False      # each block's last residual addition done by the next block
    sequence_split: SequenceSplit | None = None   # read inside the blocks (a frozen value: compared)
    # what the run keeps, read outside the blocks only: not part of the options' value (their equality and hash)
    step_cache: StepCache | None = field(default=None, compare=False)
    prefix_cache: PrefixKVCache | None = field(default=None, compare=False)
    graphs: ForwardGraphs | None = field(default=None, compare=False)

    def replace(self, **changes) -> DitOptions:
        return dataclasses.replace(self, **changes)


# a constant to pytree (so to torch.export, which exports a block with its options as they were at capture) and,
# through its value, to compiled code's guards
pytree.register_constant(DitOptions)


# ---- the seams' interfaces (what the options hold) ----

class SequenceSplit(Protocol):
    """A forward's sharded tokens split over ranks (parallel/ulysses.py). Unbound it knows the ranks; `over(tokens)`
    binds it to one forward's count of sharded tokens, which `shard`, `gather` and `attention` need."""
    degree: int
    rank: int

    def over(self, tokens: int) -> SequenceSplit: ...

    def shard(self, x: torch.Tensor, dim: int) -> torch.Tensor:
        """This rank's tokens of `x` along `dim` (a tensor of its own)."""

    def gather(self, x: torch.Tensor, dim: int) -> torch.Tensor:
        """Every rank's tokens joined along `dim`, in order."""

    def attention(self, streams: Sequence[QKV], sharded: Sequence[bool | SequenceSplit],
                  attend: Callable[[Sequence[QKV]], torch.Tensor]) -> torch.Tensor:
        """`attend` over every token with a share of the heads: each sharded stream's tokens gathered (`sharded`:
        True, split by this split's shards; a split of the same ranks bound to the stream's own tokens; False,
        whole on every rank), each whole stream's heads sliced; streams [batch, seq, heads, head_dim] (FP8 ones
        too), `attend`'s output [batch, all tokens, heads / degree, head_dim]; returns [batch, this rank's tokens,
        heads, head_dim]."""

    def all_max(self, x: torch.Tensor) -> torch.Tensor: ...

    def all_sum(self, x: torch.Tensor) -> torch.Tensor: ...


class StepCache(Protocol):
    """A step cache around the block loop (optimize/step_cache.py): told each forward's step, and after each block
    what it did to the stream it watches."""

    def begin(self, step: int) -> None:
        """A forward at denoising step `step` starts (the same step again: the step's next CFG pass)."""

    def after_block(self, index: int, before: torch.Tensor, after: torch.Tensor,
                    last: bool) -> tuple[torch.Tensor, bool]:
        """After block `index` turned the watched stream `before` into `after`: the stream the loop goes on with,
        and whether it stops here (the cache serves the remaining blocks' change)."""


class ForwardGraphs(Protocol):
    """The whole forward replayed from CUDA graphs, one per input signature (optimize/cuda_graphs.py). `kept`:
    tensors a graphed forward keeps from one forward to the next at fixed addresses (a prefix cache's:
    PrefixKVCache), dropped with the graphs."""
    kept: dict

    def run(self, function: Callable[[dict], Any], inputs: dict, name: Any = None) -> Any: ...


class BranchSteps:
    """Which CFG branch a forward belongs to, from its step index: the pipeline runs a step's branches one after
    another, so a forward at the same step as the one before is that step's next branch."""

    def __init__(self):
        self.step: int | None = None
        self.branch = 0

    def begin(self, step: int) -> int:
        self.branch = self.next(step)
        self.step = step
        return self.branch

    def next(self, step: int) -> int:
        """The branch a forward at `step` would belong to (what `begin` will say)."""
        return self.branch + 1 if step == self.step else 0


class PrefixKVCache:
    """The keys and values of a forward's prefix tokens (the tokens before the target: text and reference images,
    whose keys and values are the same at every step), per CFG branch and block, for one edit. The step that finds
    its branch empty computes every token and stores each block's prefix keys and values (`filling`); later steps
    compute the target's tokens only and attend over the stored prefix. The caller tells it when each forward
    begins (`begin` gives the forward its `PrefixStep`) and when it is done, with the tokens it computed (the run's
    telemetry).

    Where the entries live: in `kept`, {(branch, shape, dtype): {block: (keys, values)}}, written in place. A forward
    replayed from a CUDA graph reads and writes them at the addresses it was captured with, so the graphs' owner
    keeps them from edit to edit (ForwardGraphs.kept): the filling forward's graph writes the tensors the cached
    forwards' graphs read. Without graphs the cache keeps its own."""

    def __init__(self, kept: dict | None = None):
        self._branches = BranchSteps()
        self._kept = {} if kept is None else kept
        self._filled: set[int] = set()
        self.tokens_computed: list[int] = []   # tokens each forward computed, in order

    def begin(self, step: int) -> PrefixStep:
        """A forward at denoising step `step` starts (the same step again: the step's next CFG branch): its part of
        the cache."""
        branch = self._branches.begin(step)
        return PrefixStep(self._kept, branch, branch not in self._filled)

    def shape_key(self, step: int) -> str:
        """What the cache adds to the shapes of the forward at `step`, before it begins (a compiled DiT runs one
        graph for each)."""
        return "from the prefix cache" if self._branches.next(step) in self._filled else "filling the prefix cache"

    def done(self, tokens: int) -> None:
        """The forward ends, having computed `tokens` tokens; a filling forward fills its branch."""
        self._filled.add(self._branches.branch)
        self.tokens_computed.append(tokens)

    def summary(self) -> dict:
        return {"branches": len(self._filled), "tokens_computed": list(self.tokens_computed)}


@dataclass(frozen=True)
class PrefixStep:
    """One forward's part of a prefix cache: its CFG branch, and whether it fills the branch's entries or reads
    them. A value, not a view of the cache's state: a forward replayed from a CUDA graph does what it did at capture,
    and the value (branch, filling) names its graph."""
    kept: dict = field(compare=False, repr=False)
    branch: int
    filling: bool

    def store(self, block: int, keys: torch.Tensor, *rest: torch.Tensor) -> None:
        """Block `block`'s prefix keys, [batch, prefix tokens, heads, head_dim], and what the forward keeps with them
        (their values, and whatever else its cached steps read), copied into the kept tensors of the keys' shape and
        dtype (tensors of their own: a view would keep the whole forward's tensors alive)."""
        blocks = self.kept.setdefault((self.branch, tuple(keys.shape), keys.dtype), {})
        entry = (keys, *rest)
        if block not in blocks:
            blocks[block] = tuple(torch.empty(part.shape, dtype=part.dtype, device=part.device) for part in entry)
        for kept, new in zip(blocks[block], entry):
            kept.copy_(new)

    def stored(self, block: int, shape: tuple[int, ...], dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
        """What block `block` stored for this branch, with its keys at `shape` and `dtype`."""
        return self.kept[(self.branch, tuple(shape), dtype)][block]


# ---- attention ----

@dataclass(frozen=True)
class Segments:
    """A block-causal mask as spans of the query sequence: each (start, end, causal) attends to the keys [0, end)
    (everything before it and its own span), with a causal triangle over its own span where `causal` (text); the
    queries after the last span (the target) attend to every key. Keys where `key_valid` [batch, keys] is False
    (padding) are attended by none. `block_mask`: flex_attention's BlockMask of the same mask, made once for a run's
    forwards (flex_block_mask), for the "flex" backend."""
    spans: tuple[tuple[int, int, bool], ...]
    key_valid: torch.Tensor | None = field(default=None, compare=False)
    block_mask: object = field(default=None, compare=False)

    @property
    def prefix_end(self) -> int:
        return self.spans[-1][1] if self.spans else 0


# a CUDA-graphed forward takes its mask as an input (its tensors copied in, its spans part of the graph's signature)
pytree.register_dataclass(Segments)


def attention(streams: Sequence[QKV], options: DitOptions, *, layout: str = "bshd", mask=None,
              prefix: tuple[torch.Tensor, torch.Tensor] | None = None,
              fp8_scales: tuple[torch.Tensor | None, torch.Tensor | None] = (None, None),
              sharded: Sequence[bool | SequenceSplit] | None = None,
              keep: Callable[[torch.Tensor, torch.Tensor], None] | None = None,
              diffsynth: Callable | None = None) -> torch.Tensor:
    """Attention over `streams` joined along the sequence in order, by the backend `options.attention` names.

    streams     each (q, k, v), [batch, seq, heads, head_dim] (layout "bshd", the projections' own) or
                [batch, heads, seq, head_dim] ("bhsd", DiffSynth's)
    mask        None; a dense mask broadcastable to [batch, heads, queries, keys] (True or 0 attends: "diffsynth"
                takes it itself, any other exact backend leaves masked attention to SDPA's own choice of kernel); or
                `Segments` (block-causal), computed span by span, or in one flex_attention call by "flex"
    prefix      (keys, values) [batch, prefix, heads, head_dim] joined before the streams' keys and values (a
                prefix KV cache's), with no queries of their own
    fp8_scales  (q scale, k scale) for the FP8 backends: the FP8 scales of bounds on q and k (None: their largest
                values)
    sharded     which streams `options.sequence_split` splits over the ranks (the others are whole on each), each
                by the split's shards (True) or by the split bound to that stream's own tokens
    keep        called with the streams' keys and values as they are attended, joined, [batch, keys, heads,
                head_dim] (a cached prefix's left out; under a sequence split every token of this rank's heads):
                what a prefix cache stores, and gives back as `prefix` in the same split
    diffsynth   DiffSynth's own attention for this family, (q, k, v, mask) in [batch, heads, seq, head_dim] ->
                [batch, seq, heads * head_dim]: what the backend "diffsynth" runs (the family file hands it)

    Under a sequence split each rank attends over every token with its share of the heads: the mask applies
    unchanged where the heads share it, and `prefix` holds this rank's heads (what `keep` gave under the split).

    Returns [batch, queries, heads * head_dim], the streams' queries in order."""
    split = options.sequence_split
    if split is not None and sharded is not None and any(sharded):
        if isinstance(mask, torch.Tensor) and mask.dim() >= 3 and mask.shape[-3] != 1:
            raise RuntimeError("sequence parallel takes a mask that every head shares: each rank attends with a "
                               "share of the heads")
        if layout == "bhsd":
            streams = [tuple(t.transpose(1, 2) for t in stream) for stream in streams]
        scales = fp8_scales
        if options.attention in backends.FP8_BACKENDS:  # v's scale over every value attended, as one process's
            values = [stream[2] for stream in streams] + ([prefix[1]] if prefix is not None else [])
            scales = (*fp8_scales, value_scale(values, split))
        heads = streams[0][0].shape[2] // split.degree
        local = split.attention(streams, sharded, lambda parts: _local(parts, options, "bshd", mask, prefix, scales,
                                                                       diffsynth, keep).unflatten(-1, (heads, -1)))
        return local.flatten(2)
    return _local(streams, options, layout, mask, prefix, fp8_scales, diffsynth, keep)


def value_scale(values: Sequence[torch.Tensor], split: SequenceSplit) -> torch.Tensor:
    """The FP8 scale of v over the whole sequence where this rank holds part of it (some tokens, or some heads of a
    cached prefix): its largest magnitude reduced over the ranks, so every rank casts v as one process does."""
    local = torch.stack([fp8_attention.largest_magnitude(part) for part in values]).amax()
    return fp8_attention.fp8_scale(split.all_max(local))


def normed_bound(norms: Sequence[torch.nn.Module], head_dim: int) -> torch.Tensor:
    """The largest magnitude q or k can take after RMSNorms with these weights and a rotary embedding, with a margin
    for bf16 rounding: an RMS-normalized row of `head_dim` values has none above sqrt(head_dim), the weight scales
    it, and RoPE rotates pairs without changing their length. What an FP8 attention's scale of q or k is made from
    at preparation (a family's `fp8_scales`)."""
    largest = torch.stack([norm.weight.detach().abs().amax().float() for norm in norms]).amax()
    return largest * (head_dim ** 0.5 * 1.02)


def _local(streams, options: DitOptions, layout: str, mask, prefix, fp8_scales, diffsynth, keep) -> torch.Tensor:
    """Attention on this process's heads and tokens."""
    if keep is not None:
        keep(*_keys_and_values(streams, layout))
    backend = options.attention
    if backend in backends.FP8_BACKENDS:
        if layout == "bhsd":
            streams = [tuple(t.transpose(1, 2) for t in stream) for stream in streams]
        if isinstance(mask, Segments) and prefix is None:
            return _fp8_segments(streams, mask, backend, fp8_scales)
        if mask is not None:
            raise RuntimeError(f"the FP8 attention {backend} takes no attention mask")
        q_scale, k_scale, *v_scale = fp8_scales
        if prefix is not None:
            streams = _with_prefix_keys(streams, prefix)
        return fp8_attention.joint_attention(streams, q_scale, k_scale, backend, *v_scale).flatten(2)
    if backend == FLEX and isinstance(mask, Segments) and prefix is None:
        return _flex(*(torch.cat(parts, dim=2 if layout == "bhsd" else 1) for parts in zip(*streams)), mask, layout)
    if layout == "bhsd":
        q, k, v = (torch.cat(parts, dim=2) for parts in zip(*streams))
    else:
        q, k, v = (torch.cat(parts, dim=1).transpose(1, 2) for parts in zip(*streams))
    if prefix is not None:
        keys, values = (t.transpose(1, 2) for t in prefix)
        k, v = torch.cat([keys, k], dim=2), torch.cat([values, v], dim=2)
    if isinstance(mask, Segments):
        return _segments(q, k, v, mask, backend, diffsynth)
    return attend_heads_first(q, k, v, backend, mask, diffsynth)


def _keys_and_values(streams, layout: str) -> tuple[torch.Tensor, torch.Tensor]:
    """The streams' keys and values joined along the sequence, [batch, seq, heads, head_dim] (one stream's as they
    are: no copy)."""
    dim = 2 if layout == "bhsd" else 1
    keys, values = (parts[0] if len(parts) == 1 else torch.cat(parts, dim=dim) for parts in list(zip(*streams))[1:])
    return (keys.transpose(1, 2), values.transpose(1, 2)) if layout == "bhsd" else (keys, values)


def _with_prefix_keys(streams, prefix):
    """The FP8 attention's streams with a cached prefix's keys and values as a stream of their own without queries."""
    keys, values = prefix
    return [(keys[:, :0].new_empty((keys.shape[0], 0, *keys.shape[2:])), keys, values), *streams]


def attend_heads_first(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, backend: str, mask=None,
                       diffsynth: Callable | None = None) -> torch.Tensor:
    """q, k, v joined, [batch, heads, seq, head_dim], by one backend: [batch, queries, heads * head_dim]."""
    if backend == DIFFSYNTH:
        if diffsynth is None:
            raise ValueError("the 'diffsynth' attention backend needs the family's DiffSynth attention (diffsynth=)")
        return diffsynth(q, k, v, mask)
    if mask is not None or backend == FLEX:  # masked attention (and flex's where no block structure is left, a
        # step from the prefix cache): PyTorch SDPA's own choice of kernel
        return _masked(q, k, v, mask)
    if backend in backends.SDPA_BACKENDS:
        return backends.SDPA_BACKENDS[backend](q, k, v).transpose(1, 2).flatten(2)
    return backends.EXTERNAL[backend](q, k, v).flatten(2)


def _masked(q, k, v, mask) -> torch.Tensor:
    """Masked attention, [batch, heads, seq, head_dim] in: PyTorch SDPA's own choice of kernel, exact."""
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask).transpose(1, 2).flatten(2)


def _by_span(segments: Segments, length: int, device, attend: Callable) -> torch.Tensor:
    """Block-causal attention span by span (as diffusers' QwenImage21AttnProcessor computes it) over `length`
    queries: a span attends to the keys up to its end, a causal span with a triangle over its own keys; the
    target's queries attend to every key; a padded key (`key_valid` False) by none. `attend(start, end, keys, mask)`
    gives the queries [start, end) over the keys [0, keys) (None: every key) under `mask` (None: no mask, every
    one of those keys), [batch, queries, heads * head_dim]."""
    valid = segments.key_valid
    outputs = []
    for start, end, causal in segments.spans:
        span_mask = None
        if causal:
            count = end - start
            span_mask = torch.cat([torch.ones(count, start, dtype=torch.bool, device=device),
                                   torch.ones(count, count, dtype=torch.bool, device=device).tril()], dim=1)
        if valid is not None:
            keys_valid = valid[:, None, None, :end]
            span_mask = keys_valid if span_mask is None else span_mask & keys_valid
        outputs.append(attend(start, end, end, span_mask))
    target_mask = None if valid is None else valid[:, None, None, :]
    outputs.append(attend(segments.prefix_end, length, None, target_mask))
    return torch.cat(outputs, dim=1)


def _segments(q, k, v, segments: Segments, backend: str, diffsynth) -> torch.Tensor:
    """Block-causal attention of q, k, v [batch, heads, seq, head_dim], exact: the chosen backend where a span needs
    no mask, masked spans as attend_heads_first runs masks."""
    return _by_span(segments, q.shape[2], q.device, lambda start, end, keys, mask: attend_heads_first(
        q[:, :, start:end], k[:, :, :keys], v[:, :, :keys], backend, mask, diffsynth))


def _fp8_segments(streams, segments: Segments, backend: str, fp8_scales) -> torch.Tensor:
    """Block-causal attention with an FP8 attention, streams [batch, seq, heads, head_dim]: what a forward that
    fills a prefix cache runs (the cached steps attend with no mask, wholly in FP8). The spans that need no mask
    run the FP8 kernel: a reference image's queries over the keys up to its end, the target's over every key (the
    bulk of the work: it has as many queries as the cached steps and more keys). A causal text span needs its
    triangle, which the FP8 kernels do not take, and runs exact (PyTorch SDPA with the mask; a few hundred queries).
    q, k and v are cast to FP8 once, each with one scale over the whole sequence (given: q's and k's from their
    bounds, v's reduced over a sequence split's ranks; else their largest values'), and every span reads slices of
    them: the same FP8 values whatever the span."""
    if segments.key_valid is not None:
        raise RuntimeError(f"the FP8 attention {backend} takes no attention mask, and padded prompts in a batch "
                           "mask their padding keys: run the prompts one at a time, or choose an exact attention")
    q, k, v = (torch.cat(parts, dim=1) if len(parts) > 1 else parts[0] for parts in zip(*streams))
    q_scale, k_scale, *v_scale = fp8_scales
    (q8,), q_descale = fp8_attention.fp8_parts([q], q_scale)
    (k8,), k_descale = fp8_attention.fp8_parts([k], k_scale)
    (v8,), v_descale = fp8_attention.fp8_parts([v], v_scale[0] if v_scale else None)

    def attend(start, end, keys, mask):
        if mask is not None:  # a causal span
            return _masked(*(t.transpose(1, 2) for t in (q[:, start:end], k[:, :keys], v[:, :keys])), mask)
        output, descale = fp8_attention.attend_fp8([q8[:, start:end]], q_descale, [k8[:, :keys]], k_descale,
                                                   [v8[:, :keys]], v_descale, backend)
        return fp8_attention.real_values(output, descale, v.dtype).flatten(2)
    return _by_span(segments, q.shape[1], q.device, attend)


def _flex(q, k, v, segments: Segments, layout: str) -> torch.Tensor:
    """One flex_attention call over the segments' BlockMask, the sequence padded to whole mask blocks."""
    if layout == "bhsd":
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
    length = q.shape[1]
    padded = -(-length // FLEX_BLOCK_SIZE) * FLEX_BLOCK_SIZE
    q, k, v = (F.pad(t, (0, 0, 0, 0, 0, padded - length)).transpose(1, 2) for t in (q, k, v))
    out = flex_attention(q, k, v, block_mask=segments.block_mask)
    return out.transpose(1, 2)[:, :length].flatten(2)


def flex_block_mask(segments: Segments, length: int, batch: int, device) -> object:
    """flex_attention's BlockMask of `segments` over a sequence of `length` queries and keys (padded positions
    masked out): a query sees the keys before it, and every key of its own image (a non-causal span, or the target
    after the last span)."""
    padded = -(-length // FLEX_BLOCK_SIZE) * FLEX_BLOCK_SIZE
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


# ---- linear ----

def fp8_linear(layer: torch.nn.Module, values: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """`layer`, torchao's FP8 linear (the preparation step that chose this path checked it: `is_torchao_fp8`),
    applied to rows already in FP8: `values` [rows, in] float8_e4m3fn with float32 `scales` [rows, 1]; [rows, out]
    in bf16."""
    return torchao_fp8_linear(layer, values, scales)


def out_projection(linear: torch.nn.Module, output: torch.Tensor, descale: torch.Tensor | None, in_fp8: bool,
                   dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """An attention output projection of an FP8 attention's `output` as the kernel wrote it ([batch, seq, heads,
    head_dim]: FP8 with real values output * descale, or real values where descale is None). in_fp8 (a family's
    fp8_attention_out path): torchao's FP8 GEMM takes the FP8 values as they are, with `descale` as every row's
    scale; else they are dequantized to `dtype` and the layer quantizes them again per row."""
    if descale is None or not in_fp8:
        return linear(fp8_attention.real_values(output, descale, dtype).flatten(2))
    rows = output.flatten(2)
    flat = rows.reshape(-1, rows.shape[-1])
    projected = fp8_linear(linear, flat, descale.reshape(1, 1).expand(flat.shape[0], 1).contiguous())
    return projected.reshape(*rows.shape[:-1], projected.shape[-1])


def fused_linear(linears: list[torch.nn.Linear]) -> torch.nn.Linear:
    """One linear layer computing `linears` (same input) side by side, their output rows in order."""
    first = linears[0]
    fused = torch.nn.Linear(first.in_features, sum(l.out_features for l in linears), bias=first.bias is not None,
                            device="meta")
    fused.weight = torch.nn.Parameter(_joined([l.weight for l in linears]), requires_grad=False)
    if first.bias is not None:
        fused.bias = torch.nn.Parameter(_joined([l.bias for l in linears]), requires_grad=False)
    return fused


def _joined(parts: list[torch.Tensor]) -> torch.Tensor:
    """The parts joined along their first dimension: a view of them where they lie end to end in one storage (a base
    in pinned host memory is laid out so: joinable_parts), else a copy. A view's values are the base's: whoever
    writes into a joined weight in place must give it a tensor of its own first (engine/loras.py does)."""
    first = parts[0].detach()
    if not _end_to_end(parts):
        return torch.cat([part.detach() for part in parts])
    shape = (sum(part.shape[0] for part in parts), *first.shape[1:])
    return first.as_strided(shape, torch.empty(shape, device="meta").stride())


def _end_to_end(parts: list[torch.Tensor]) -> bool:
    """Contiguous tensors of one dtype in one storage, each starting where the one before ends."""
    first = parts[0]
    return all(part.is_contiguous() and part.dtype == first.dtype and
               part.untyped_storage().data_ptr() == first.untyped_storage().data_ptr() for part in parts) and \
        all(after.data_ptr() == before.data_ptr() + before.numel() * before.element_size()
            for before, after in zip(parts, parts[1:]))


def joinable_parts(module: torch.nn.Module, projections: dict[str, tuple[str, ...]]) -> list[list[torch.Tensor]]:
    """The weights and the biases that fusing `projections` ({fused name: the names it joins}, a family's) would
    join, each group in the order of the joined rows: a base in pinned host memory lays each group end to end
    (pinned.pin_module), so that joining them copies nothing."""
    groups = []
    for layer in module.modules():
        for parts in projections.values():
            linears = [getattr(layer, part, None) for part in parts]
            if all(isinstance(linear, torch.nn.Linear) for linear in linears):
                groups.append([linear.weight for linear in linears])
                if all(linear.bias is not None for linear in linears):
                    groups.append([linear.bias for linear in linears])
    return groups
