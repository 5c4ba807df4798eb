"""Qwen-Image-2.1's DiT, GhostEdit's own, read top to bottom: the single-stream transformer of the released model
(diffusers' QwenImage21Transformer2DModel and DiffSynth's QwenImage21DiT compute the same; this file computes it
too, on their state dict: the same parameter names, no conversion).

The sequence is one stream: the prompt's tokens as the text encoder gave them, each reference image's latent tokens
in the places the text encoder reserved for that image (one image slot there is 2x2 latent tokens), and the target
image's tokens appended last. Attention is block-causal: a text token sees what comes before it and itself; a
reference image's tokens see what comes before the image and the whole image; the target's tokens see everything.
Text and reference tokens are modulated as at t=0 (`causal_condition`), so their keys and values are the same at
every step: the first step fills a prefix cache with them and later steps compute the target's tokens alone.

Where the run's choices attach, the forward calls the seams (models/seams.py; the options travel down in `DitOptions`):
- attention: `attention(...)` over the block-causal `Segments` (span by span through the backend the options name,
  or one flex_attention call), or, from the cache, the target's queries over the cached prefix and its own keys;
  with an FP8 attention (its q and k scales from their norms' bounds, set at preparation: `Attention.fp8_scales`)
  a cached step attends wholly in FP8 and the step that fills the cache runs the reference images' and the
  target's spans in FP8, the causal text spans exact; a padded batch of prompts (a mask on every step) is refused;
- linear: every projection is an `nn.Linear` attribute of its module (`to_q`, `img_mlp.proj`, ...), so a quantizer
  (torchao's FP8) replaces the weights in place and the forward does not change;
- block loop: `QwenImage21DiT.run_blocks` runs `blocks` in order, each an `nn.Module` of its own (regional compile
  compiles each; the cache-filling step and the cached steps are one graph each), behind `options.step_cache`
  where a step cache runs: it watches the target's tokens alone (the only ones a cached step computes, so a
  filling step and a cached one compare alike), and a step it serves ends the loop after the first block;
- prefix KV cache: `options.prefix_cache` (one per run: its CFG branches by step index), begun at each step by
  `step_forward`, which hands the forward its `PrefixStep`: filled by the first step of a branch, read by the others;
- CUDA graphs: `step_forward` (what the pipeline calls at each step) replays the whole forward from
  `options.graphs`, one graph per input signature, CFG branch and cache state (the cache's tensors are kept at
  fixed addresses from edit to edit: the filling forward's graph writes the tensors the cached forwards' read);
- sequence split: `options.sequence_split` (Ulysses) splits the prefix's tokens and the target's over the ranks,
  each on its own (`Shards`: a rank holds the same target tokens whether its step fills the prefix cache or reads
  it), and trades tokens for heads around attention, where each rank attends over every token with its share of
  the heads: the block-causal mask applies unchanged, and the prefix cache keeps the rank's heads of every prefix
  token as attention received them (what a cached step's attention receives them with).
The sequence's structure (`Layout`: positions, segments, rotary factors) is the same at every step of a CFG branch:
the pipeline makes it once (`layout`) and hands it to each forward.

The fast paths, each a named branch on an option of the run's DitOptions, computing what the released model does:
real_rope   the rotary factors as real (cos, sin) instead of complex numbers, which Inductor cannot fuse
            (models/rotary.py; bit-equal in float32)
fused_qkv   one projection for q, k and v (`to_qkv`, the weights joined at preparation: `Attention.fuse_qkv`)
fused_qk_norm_rope  with an FP8 attention, at a step from the prefix cache: the target's q and k normalized, rotated
            and cast to FP8 by one kernel (kernels/qk_norm_rope.py, the Edit DiT's), attending over the cached
            prefix as the seam's FP8 path does (its keys cast at k's scale, its values with the target's at one
            scale); the step that fills the cache computes q and k as released (its causal text spans attend exact
            in bf16), and on one GPU the cache keeps the prefix's keys cast to FP8 and its values' largest
            magnitude, which a cached step would otherwise work out again (under a sequence split, the bf16 keys
            and values the seam's FP8 path reads)
fp8_attention_out  on that path, cuDNN's FP8 output into the FP8 output projection as written (seams.out_projection)
carried_residual  each block's last residual addition done by the next block, where compiled code fuses it into that
            block's first LayerNorm; the last one after the loop (`finish`)
fused_swiglu_quant  with torchao's FP8 GEMMs, the feed-forward's silu(gate) * up quantized per row for the FP8 down
            projection in one kernel (kernels/swiglu_quant.py), at every step
q, k and v always stay in the projections' [batch, seq, heads, head_dim] layout here (the Edit DiT's joint_layout:
one stream, nothing to join).
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
import torch.utils._pytree as pytree
from diffsynth.core.attention import attention_forward
from torch import nn

from ...kernels import fp8_attention
from ...kernels.attention import FP8_BACKENDS
from ...kernels.qk_norm_rope import qk_norm_rope_fp8
from ...kernels.swiglu_quant import swiglu_rowwise_fp8
from ..rotary import cos_sin, real_rotation
from ..seams import (FLEX, DitOptions, PrefixStep, Segments, SequenceSplit, attention, flex_block_mask, fp8_linear,
                     fused_linear, joinable_parts, normed_bound, out_projection, value_scale)

IMAGE_TOKENS_PER_SLOT = 4  # one image slot of the text encoder's sequence stands for 2x2 latent tokens
# fused_qkv's projection, with the released projections it joins in the order of its output rows
FUSED_PROJECTIONS = {"to_qkv": ("to_q", "to_k", "to_v")}
Rotary = torch.Tensor | tuple[torch.Tensor, torch.Tensor]   # [L, D / 2] complex factors, or real_rope's (cos, sin)


# ---- the sequence's structure ----

def fp8_prefix_keys(options: DitOptions, shards: Shards | None) -> bool:
    """Whether the prefix cache keeps each block's prefix keys in FP8 (Attention._prefix_entry): where the cached
    steps run fused_qk_norm_rope on one GPU."""
    return options.fused_qk_norm_rope and shards is None


def reads_prefix(prefix: PrefixStep | None) -> bool:
    """Whether a forward reads its prefix's keys and values from the cache (computing the target's tokens only)
    rather than filling it or running without one."""
    return prefix is not None and not prefix.filling


@dataclass
class Layout:
    """Where everything sits in the joint sequence of one CFG branch, the same at every step of a run."""
    length: int                        # tokens of the joint sequence
    image_positions: torch.Tensor      # [N] the latent tokens' positions (references, then the target)
    text_positions: torch.Tensor       # [L - N] the text tokens' positions
    vl_text_positions: torch.Tensor    # [L - N] where those are in the text encoder's sequence
    prefix_length: int                 # text and reference tokens: everything before the target
    segments: Segments                 # the block-causal mask
    rotary: Rotary                     # the rotary factors of every token

    def rotary_from(self, start: int) -> Rotary:
        """The rotary factors of the tokens from `start` on."""
        return pytree.tree_map(lambda part: part[start:], self.rotary)

    @property
    def target_length(self) -> int:
        return self.length - self.prefix_length

    def without_block_mask(self) -> Layout:
        """The layout for a forward from the prefix cache, which attends by no block structure: without flex's
        BlockMask (a new object every edit, so a graph's signature would change with each edit)."""
        return dataclasses.replace(self, segments=dataclasses.replace(self.segments, block_mask=None))


# a CUDA-graphed forward takes its layout as an input: its tensors copied in before each replay, its numbers part of
# the graph's signature
pytree.register_dataclass(Layout)


@dataclass(frozen=True)
class Shards:
    """This rank's tokens under a sequence split: the prefix's (text and references) and the target's, each split
    over the ranks on its own, so that a rank holds the same target tokens in a step that fills the prefix cache
    and in one that reads it (the step cache compares them; the prediction is gathered from them)."""
    prefix: SequenceSplit
    target: SequenceSplit

    @classmethod
    def of(cls, split: SequenceSplit | None, layout_: Layout) -> Shards | None:
        if split is None:
            return None
        return cls(split.over(layout_.prefix_length), split.over(layout_.target_length))

    def own(self, x: torch.Tensor, dim: int, with_prefix: bool) -> torch.Tensor:
        """This rank's tokens of `x` along `dim` (its last tokens the target's): its prefix shard (`with_prefix`),
        then its target shard."""
        target_length = sum(self.target.shards)
        target = self.target.shard(x.narrow(dim, x.shape[dim] - target_length, target_length), dim)
        if not with_prefix:
            return target
        return torch.cat([self.prefix.shard(x.narrow(dim, 0, x.shape[dim] - target_length), dim), target], dim=dim)


def layout(image_mask: torch.Tensor, img_shapes: list[tuple[int, int, int]], prompt_mask: torch.Tensor | None,
           rope: "Rope", device, options: DitOptions = DitOptions()) -> Layout:
    """The Layout for a text encoder sequence whose image slots are `image_mask` ([B, S], the target's slots
    appended; samples share one layout) and images of `img_shapes` (frames, height, width) in latent tokens;
    `prompt_mask` [B, S] False at padded prompt tokens (a batch of prompts of different lengths), or None."""
    repeats = torch.where(image_mask[0], IMAGE_TOKENS_PER_SLOT, 1)
    is_image = torch.repeat_interleave(image_mask[0], repeats)
    image_positions = is_image.nonzero(as_tuple=True)[0]
    lengths = [math.prod(shape) for shape in img_shapes]
    if sum(lengths) != image_positions.numel():
        raise ValueError(f"the images have {sum(lengths)} latent tokens but the text encoder's sequence reserved "
                         f"{image_positions.numel()}")
    image_ids = torch.full_like(is_image, -1, dtype=torch.long)
    image_ids[image_positions] = torch.tensor([block for block, n in enumerate(lengths) for _ in range(n)],
                                              device=is_image.device)
    length, prefix_length = is_image.numel(), is_image.numel() - lengths[-1]
    text_positions = (~is_image).nonzero(as_tuple=True)[0]
    vl_text_positions = (~image_mask[0]).nonzero(as_tuple=True)[0]
    key_valid = None
    if prompt_mask is not None and options.attention in FP8_BACKENDS:
        raise ValueError(f"the FP8 attention {options.attention} takes no attention mask, and this batch of prompts "
                         "of different lengths needs one at every step (the shorter prompts' padding keys masked): "
                         "run the prompts one at a time, or choose an exact attention backend")
    if prompt_mask is not None:
        key_valid = torch.ones(prompt_mask.shape[0], length, dtype=torch.bool, device=device)
        key_valid[:, text_positions.to(device)] = prompt_mask.bool()[:, vl_text_positions.to(prompt_mask.device)]
    segments = Segments(_spans(image_ids[:prefix_length].tolist()), key_valid)
    if options.attention == FLEX:
        segments = Segments(segments.spans, key_valid,
                            flex_block_mask(segments, length, image_mask.shape[0], device))
    rotary = rope(img_shapes, is_image, device)
    return Layout(length, image_positions.to(device), text_positions.to(device), vl_text_positions.to(device),
                  prefix_length, segments, cos_sin(rotary) if options.real_rope else rotary)


def _spans(image_ids: list[int]) -> tuple[tuple[int, int, bool], ...]:
    """Runs of one text stretch (-1: causal) or one image (its id) as (start, end, causal)."""
    spans, start = [], 0
    for index in range(1, len(image_ids) + 1):
        if index == len(image_ids) or image_ids[index] != image_ids[start]:
            spans.append((start, index, image_ids[start] < 0))
            start = index
    return tuple(spans)


class Rope:
    """3-axis (frame, height, width) rotary positions over the joint sequence: text advances one position on every
    axis; an image holds the frame position the text reached and lays its tokens on a height/width grid centred on
    zero, then moves the position on by its longer side. No parameters: the tables are made once per device."""

    def __init__(self, axes_dim: list[int], theta: int = 10000):
        positive, negative = torch.arange(8192), torch.arange(1024).flip(0) * -1 - 1
        self._tables = {"cpu": [torch.cat([_frequencies(positive, dim, theta), _frequencies(negative, dim, theta)])
                                for dim in axes_dim]}

    def tables(self, device) -> list[torch.Tensor]:
        key = str(device)
        if key not in self._tables:
            self._tables[key] = [table.to(device) for table in self._tables["cpu"]]
        return self._tables[key]

    def __call__(self, img_shapes, is_image: torch.Tensor, device) -> torch.Tensor:
        frame, image_height, image_width = [], [], []
        cursor = position = 0
        flags = is_image.tolist()
        for _, height, width in img_shapes:
            start = flags.index(True, cursor)
            frame.extend(range(position, position + start - cursor))
            position += start - cursor
            cursor = start + height * width
            frame.extend([position] * (height * width))
            position += max(height, width)
            image_height.extend(h for h in range(-(height - height // 2), height // 2) for _ in range(width))
            image_width.extend(w for _ in range(height) for w in range(-(width - width // 2), width // 2))
        frame.extend(range(position, position + len(flags) - cursor))
        frame = torch.tensor(frame, dtype=torch.long, device=device)
        height_index, width_index = frame.clone(), frame.clone()
        mask = is_image.to(device)
        height_index[mask] = torch.tensor(image_height, dtype=torch.long, device=device)
        width_index[mask] = torch.tensor(image_width, dtype=torch.long, device=device)
        tables = self.tables(device)
        return torch.cat([tables[0][frame], tables[1][height_index], tables[2][width_index]], dim=-1)


def _frequencies(index: torch.Tensor, dim: int, theta: int) -> torch.Tensor:
    angles = torch.outer(index, 1.0 / torch.pow(theta, torch.arange(0, dim, 2).to(torch.float32).div(dim)))
    return torch.polar(torch.ones_like(angles), angles)


def apply_rotary(x: torch.Tensor, rotary: Rotary) -> torch.Tensor:
    """x [B, S, H, D] rotated by rotary: [S, D / 2] complex factors, or real_rope's (cos, sin), each [S, D];
    computed in float32."""
    if isinstance(rotary, tuple):
        return real_rotation(x, tuple(part.unsqueeze(1) for part in rotary))
    rotated = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2)) * rotary.unsqueeze(1)
    return torch.view_as_real(rotated).flatten(3).type_as(x)


def diffsynth_attention(q, k, v, mask) -> torch.Tensor:
    """DiffSynth's own attention for this DiT (its choice of kernel, PyTorch SDPA for a mask), heads first in,
    [batch, queries, heads * head_dim] out."""
    return attention_forward(q, k, v, q_pattern="b n s d", k_pattern="b n s d", v_pattern="b n s d",
                             out_pattern="b s n d", attn_mask=mask).flatten(2)


# ---- the model ----

class ZeroCenteredRMSNorm(nn.Module):
    """RMS norm in float32 whose weight is stored minus one (the scale is weight + 1)."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = x.float()
        hidden = hidden * torch.rsqrt(torch.mean(hidden ** 2, dim=-1, keepdim=True) + self.eps)
        return (hidden * (self.weight.float() + 1)).to(x.dtype)


class RMSNorm(nn.Module):
    """The q/k norm: the mean square in float32, the weight applied in its own dtype."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        variance = x.to(torch.float32).pow(2).mean(-1, keepdim=True)
        x = x * torch.rsqrt(variance + self.eps)
        if self.weight.dtype in (torch.float16, torch.bfloat16):
            x = x.to(self.weight.dtype)
        return x * self.weight


class TimestepEmbedding(nn.Module):
    """The sinusoidal embedding of t (cos first, then sin, in float32) through two bias-free linears."""

    def __init__(self, dim: int, frequencies: int = 256):
        super().__init__()
        self.half = frequencies // 2
        self.linear_1 = nn.Linear(frequencies, dim, bias=False)
        self.linear_2 = nn.Linear(dim, dim, bias=False)

    def forward(self, timestep: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        # made here in float32 (a buffer would be cast with the model), on the device (as diffusers makes them; a
        # copy from host memory would make the CPU wait, and a CUDA graph capture refuses it)
        frequencies = torch.exp(-math.log(10000) * torch.arange(self.half, dtype=torch.float32,
                                                                device=timestep.device) / self.half)
        angles = (1000.0 * timestep.float())[:, None] * frequencies[None]
        embedding = torch.cat([torch.cos(angles), torch.sin(angles)], dim=-1).to(dtype)
        return self.linear_2(F.silu(self.linear_1(embedding)))


class TimeTextEmbed(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.timestep_embedder = TimestepEmbedding(dim)


class TextProjection(nn.Module):
    def __init__(self, context_dim: int, dim: int, eps: float):
        super().__init__()
        self.text_norm = ZeroCenteredRMSNorm(context_dim, eps)
        self.in_layer = nn.Linear(context_dim, dim, bias=False)
        self.out_layer = nn.Linear(dim, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out_layer(F.gelu(self.in_layer(self.text_norm(x)), approximate="tanh"))


class Attention(nn.Module):
    def __init__(self, dim: int, heads: int, head_dim: int, eps: float):
        super().__init__()
        self.heads, self.head_dim = heads, head_dim
        self.to_q = nn.Linear(dim, heads * head_dim, bias=False)
        self.to_k = nn.Linear(dim, heads * head_dim, bias=False)
        self.to_v = nn.Linear(dim, heads * head_dim, bias=False)
        self.to_out = nn.ModuleList([nn.Linear(heads * head_dim, dim, bias=False)])
        self.norm_q = RMSNorm(head_dim, eps)
        self.norm_k = RMSNorm(head_dim, eps)
        # the FP8 scales of q and k from their bounds (set at preparation for an FP8 attention: fp8_scales)
        self.register_buffer("q_scale", None, persistent=False)
        self.register_buffer("k_scale", None, persistent=False)

    def forward(self, x, rotary, layout_: Layout, prefix: tuple | None, keep_prefix: bool, options: DitOptions,
                shards: Shards | None) -> tuple[torch.Tensor, tuple | None]:
        """`prefix`: the cached prefix's (keys, values), the queries being the target's alone; `keep_prefix`: return
        this step's prefix keys and values for the cache (under a sequence split, this rank's heads of every prefix
        token); `shards`: this rank's tokens under a sequence split (its prefix shard, then its target shard)."""
        projected = self.to_qkv(x).chunk(3, dim=-1) if options.fused_qkv else \
            (self.to_q(x), self.to_k(x), self.to_v(x))
        query, key, value = (part.unflatten(-1, (-1, self.head_dim)) for part in projected)
        if options.fused_qk_norm_rope and prefix is not None:
            output, descale = self._fused_fp8_attention(query, key, value, rotary, prefix, options, shards)
            return out_projection(self.to_out[0], output, descale, options.fp8_attention_out, value.dtype), None
        query = apply_rotary(self.norm_q(query).to(value.dtype), rotary)
        key = apply_rotary(self.norm_k(key).to(value.dtype), rotary)
        kept = []
        keep = (lambda keys, values: kept.append(self._prefix_entry(keys[:, :layout_.prefix_length],
                                                                    values[:, :layout_.prefix_length], options, shards))
                ) if keep_prefix else None
        if prefix is None:
            mask = layout_.segments
        else:  # the target sees every key: only padded prompt tokens are masked
            valid = layout_.segments.key_valid
            mask = None if valid is None else valid[:, None, None, :]
        streams, sharded = [(query, key, value)], None
        if shards is not None and prefix is not None:
            sharded = [shards.target]
        elif shards is not None:  # the prefix's shard and the target's, each gathered over the ranks on its own
            own_prefix = shards.prefix.own_tokens
            streams = [tuple(t[:, :own_prefix] for t in streams[0]), tuple(t[:, own_prefix:] for t in streams[0])]
            sharded = [shards.prefix, shards.target]
        out = attention(streams, options, mask=mask, prefix=prefix, sharded=sharded, keep=keep,
                        fp8_scales=(self.q_scale, self.k_scale), diffsynth=diffsynth_attention)
        return self.to_out[0](out.type_as(query)), (kept[0] if kept else None)

    def _fused_fp8_attention(self, query, key, value, rotary, prefix: tuple, options: DitOptions,
                             shards: Shards | None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """A step from the prefix cache with the target's q and k normalized, rotated and cast to FP8 by one kernel
        (fused_qk_norm_rope), over the cached prefix as the seam's FP8 path attends it: the cached keys cast at k's
        scale, the cached values and the target's at one scale (under a sequence split reduced over the ranks, the
        kernel run on this rank's tokens and its FP8 bytes sent to the others, as the Edit DiT does). The output as
        the kernel writes it and the factor that gives its real values (None for FlashAttention-3's real bf16)."""
        cos, sin = rotary
        q8, k8 = qk_norm_rope_fp8([query], [key], [self.norm_q.weight], [self.norm_k.weight], [cos], [sin],
                                  self.q_scale, self.k_scale, self.norm_q.eps)
        q_descale, k_descale = fp8_attention.descale(self.q_scale), fp8_attention.descale(self.k_scale)
        if shards is None:  # the prefix as _prefix_entry kept it: the joined values' scale from the two largest
            prefix_k8, prefix_values, prefix_largest = prefix
            scale = fp8_attention.fp8_scale(torch.maximum(prefix_largest, fp8_attention.largest_magnitude(value)))
            (prefix_v8, v8), v_descale = fp8_attention.fp8_parts([prefix_values, value], scale)
            return fp8_attention.attend_fp8([q8], q_descale, [prefix_k8, k8], k_descale, [prefix_v8, v8], v_descale,
                                            options.attention)
        prefix_keys, prefix_values = prefix
        (prefix_k8,), _ = fp8_attention.fp8_parts([prefix_keys], self.k_scale)
        split = options.sequence_split
        (prefix_v8, v8), v_descale = fp8_attention.fp8_parts([prefix_values, value],
                                                             value_scale([prefix_values, value], split))
        kernel_descale = []

        def attend(streams):
            ((target_q8, target_k8, target_v8),) = streams
            output, descale = fp8_attention.attend_fp8([target_q8], q_descale, [prefix_k8, target_k8], k_descale,
                                                       [prefix_v8, target_v8], v_descale, options.attention)
            kernel_descale.append(descale)
            return output
        output = split.attention(((q8, k8, v8),), [shards.target], attend)
        return output, kernel_descale[0]

    def _prefix_entry(self, keys, values, options: DitOptions, shards: Shards | None) -> tuple[torch.Tensor, ...]:
        """What the prefix cache keeps of this block's prefix keys and values for the cached steps: as they are; on
        one GPU with fused_qk_norm_rope, the keys already cast to FP8 at k's fixed scale and the values with their
        largest magnitude, each the same at every step, so that a cached step neither casts the prefix's keys nor
        reads its values for their scale (the same bits: the joined values' largest magnitude is the larger of the
        two parts', and the cast is elementwise)."""
        if not fp8_prefix_keys(options, shards):
            return keys, values
        (keys8,), _ = fp8_attention.fp8_parts([keys], self.k_scale)
        return keys8, values, fp8_attention.largest_magnitude(values)

    def qk_norms(self) -> tuple[RMSNorm, RMSNorm]:
        return self.norm_q, self.norm_k

    def output_projections(self) -> tuple[nn.Module]:
        return (self.to_out[0],)

    def fp8_scales(self) -> None:
        """The FP8 scales of q and k worked out once from their norms' bounds, for an FP8 attention (LoRAs change
        linear layers only, not the RMSNorm weights)."""
        self.q_scale = fp8_attention.fp8_scale(normed_bound((self.norm_q,), self.head_dim))
        self.k_scale = fp8_attention.fp8_scale(normed_bound((self.norm_k,), self.head_dim))

    def fuse_qkv(self) -> None:
        """One projection for q, k and v (fused_qkv): the weights joined in the order of the output rows. On plain
        linear layers, before quantization (fused LoRAs are written into the joined rows later)."""
        for fused, parts in FUSED_PROJECTIONS.items():
            setattr(self, fused, fused_linear([getattr(self, part) for part in parts]))
            for part in parts:
                delattr(self, part)


class FeedForward(nn.Module):
    """SwiGLU: out(silu(gate_layer(x)) * proj(x))."""

    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.proj = nn.Linear(dim, hidden, bias=False)
        self.gate_layer = nn.Linear(dim, hidden, bias=False)
        self.out = nn.Linear(hidden, dim, bias=False)

    def projections(self) -> tuple[nn.Module, nn.Module, nn.Module]:
        return self.gate_layer, self.proj, self.out

    def forward(self, x: torch.Tensor, options: DitOptions = DitOptions()) -> torch.Tensor:
        if options.fused_swiglu_quant:  # silu(gate) * up quantized per row in its kernel, into the FP8 down projection
            gate, up = self.gate_layer(x), self.proj(x)
            values, scales = swiglu_rowwise_fp8(gate.reshape(-1, gate.shape[-1]), up.reshape(-1, up.shape[-1]))
            out = fp8_linear(self.out, values, scales)
            return out.reshape(*x.shape[:-1], out.shape[-1])
        return self.out(F.silu(self.gate_layer(x)) * self.proj(x))


class Block(nn.Module):
    """Attention and the feed-forward, each after a LayerNorm scaled by the shared modulation's rows and added back
    through a tanh gate. With `pending` (carried_residual) the block first adds what the block before left and leaves
    its own last addition undone, the same additions moved so that compiled code fuses each into the next
    LayerNorm."""

    def __init__(self, dim: int, heads: int, head_dim: int, mlp_ratio: int, eps: float):
        super().__init__()
        self.attn = Attention(dim, heads, head_dim, eps)
        self.img_mlp = FeedForward(dim, dim * mlp_ratio)
        self.eps = eps

    def forward(self, x, modulation, rotary, layout_: Layout, prefix: tuple | None, keep_prefix: bool,
                options: DitOptions, shards: Shards | None,
                pending: Pending | None = None) -> tuple[torch.Tensor, tuple | None, Pending | None]:
        """(x, this step's prefix keys and values for the cache or None, the addition left to the next block or
        None)."""
        if pending is not None:
            x = finish(x, pending)
        scale1, gate1, scale2, gate2 = modulation.chunk(4, dim=-1)
        normed = F.layer_norm(x, x.shape[-1:], eps=self.eps) * (1 + scale1)
        attended, kept = self.attn(normed, rotary, layout_, prefix, keep_prefix, options, shards)
        x = x + gate1.tanh() * attended
        normed = F.layer_norm(x, x.shape[-1:], eps=self.eps) * (1 + scale2)
        if pending is not None:
            return x, kept, (gate2.tanh(), self.img_mlp(normed, options))
        return _in_range(x + gate2.tanh() * self.img_mlp(normed, options)), kept, None


Pending = tuple[torch.Tensor, torch.Tensor]   # a block's last addition left undone: its gate and its update


def finish(x: torch.Tensor, pending: Pending) -> torch.Tensor:
    """The residual addition a block left undone (carried_residual), and the clip of a block's output."""
    gate, update = pending
    return _in_range(x + gate * update)


def nothing_pending(x: torch.Tensor, modulation: torch.Tensor) -> Pending:
    """What the first block adds: zeros shaped as a block's gate and update, so that every block runs one compiled
    graph (x + 0 * 0 is x)."""
    return x.new_zeros((*modulation.shape[:-1], x.shape[-1])), torch.zeros_like(x)


def _in_range(x: torch.Tensor) -> torch.Tensor:
    """A block's output clipped to float16's range where it computes in float16 (as released)."""
    return x.clip(-65504, 65504) if x.dtype == torch.float16 else x


class FinalNorm(nn.Module):
    """The output norm: LayerNorm scaled by a projection of the timestep embedding (no shift)."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.linear = nn.Linear(dim, dim, bias=False)
        self.eps = eps


class QwenImage21DiT(nn.Module):
    """The released model at the sizes of a diffusers transformer config (its __init__ takes that config's keys)."""

    # Regional compile (optimize/compile.py) compiles each block as it is called: a run's cache-filling step and its
    # cached steps are one graph each (torch's automatic dynamic shapes make the second one over any length), and
    # the blocks share them; no token dimension needs marking
    one_graph_per_step_kind = True
    # projections joined into one by fused_qkv (models/seams.py); fused LoRAs and the pinned base read this
    fused_projections = FUSED_PROJECTIONS

    def __init__(self, patch_size: int = 1, in_channels: int = 64, out_channels: int | None = 64,
                 num_layers: int = 32, attention_head_dim: int = 128, num_attention_heads: int = 32,
                 context_in_dim: int = 4096, mlp_ratio: int = 3, axes_dims_rope=(16, 56, 56), eps: float = 1e-6,
                 causal_condition: bool = True):
        super().__init__()
        if patch_size != 1 or not causal_condition:
            raise ValueError("Qwen-Image-2.1's DiT takes latents unpatched (patch_size 1) with causal_condition")
        dim = num_attention_heads * attention_head_dim
        # the transformer config's values, as DiffSynth's QwenImage21DiT takes them (the bench builds stock's from it)
        self.config = {"patch_size": patch_size, "in_channels": in_channels, "out_channels": out_channels,
                       "num_layers": num_layers, "attention_head_dim": attention_head_dim,
                       "num_attention_heads": num_attention_heads, "context_in_dim": context_in_dim,
                       "mlp_ratio": mlp_ratio, "axes_dims_rope": tuple(axes_dims_rope), "eps": eps,
                       "causal_condition": causal_condition}
        self.heads, self.head_dim = num_attention_heads, attention_head_dim
        self.rope = Rope(list(axes_dims_rope))
        self.time_text_embed = TimeTextEmbed(dim)
        self.txt_in = TextProjection(context_in_dim, dim, eps)
        self.img_in = nn.Linear(in_channels, dim, bias=False)
        # one modulation shared by every block: [scale 1, gate 1, scale 2, gate 2]
        self.modulation = nn.Sequential(nn.SiLU(), nn.Linear(dim, 4 * dim, bias=False))
        self.transformer_blocks = nn.ModuleList(
            Block(dim, num_attention_heads, attention_head_dim, mlp_ratio, eps) for _ in range(num_layers))
        self.norm_out = FinalNorm(dim, eps)
        self.proj_out = nn.Linear(dim, out_channels or in_channels, bias=False)

    @property
    def blocks(self) -> nn.ModuleList:
        """The repeated blocks (DiffSynth's attribute name, which the state dict's keys carry)."""
        return self.transformer_blocks

    def joinable_parts(self) -> list[list[torch.Tensor]]:
        """The weight groups fused_qkv joins (seams.joinable_parts)."""
        return joinable_parts(self, self.fused_projections)

    def attention_layers(self) -> list[Attention]:
        """What the rewrites' preparation steps work on (optimize/rewrites.py)."""
        return [block.attn for block in self.transformer_blocks]

    def feed_forwards(self) -> list[FeedForward]:
        return [block.img_mlp for block in self.transformer_blocks]

    def forward(self, latents: torch.Tensor, prompt_embeds: torch.Tensor, timestep: torch.Tensor, layout_: Layout,
                options: DitOptions = DitOptions(), prefix: PrefixStep | None = None) -> torch.Tensor:
        """The target's prediction [B, T, C] from `latents` [B, N, C] (the references' tokens, then the target's),
        the text encoder's `prompt_embeds` [B, S, E] and `timestep` [B] in [0, 1], over this CFG branch's
        `layout_`. `prefix`: this forward's part of the prefix cache (step_forward begins it), which it fills
        (every token computed) or reads (the target's tokens alone). Under a sequence split each rank runs its
        tokens (`Shards`) and the prediction is gathered from the ranks' target tokens."""
        from_cache = reads_prefix(prefix)
        shards = Shards.of(options.sequence_split, layout_)
        temb = self.time_text_embed.timestep_embedder(
            torch.cat([timestep, timestep.new_zeros(1)]).to(latents.dtype), latents.dtype)  # t, and 0 for the prefix
        modulation = self.modulation(temb)                     # [B + 1, 4 dim]
        target_rows, prefix_row = modulation[:-1, None], modulation[-1:, None]
        final_scale = self.norm_out.linear(F.silu(temb).to(latents.dtype))[:-1, None]

        if from_cache:  # the target's tokens alone (a tensor of their own, as every block gets); the prefix is cached
            hidden = self.img_in(latents[:, -layout_.target_length:])
            rotary = layout_.rotary_from(layout_.prefix_length)
        else:
            image_tokens = self.img_in(latents)
            hidden = image_tokens.new_empty(latents.shape[0], layout_.length, image_tokens.shape[-1])
            hidden[:, layout_.text_positions] = self.txt_in(prompt_embeds)[:, layout_.vl_text_positions]
            hidden[:, layout_.image_positions] = image_tokens
            rotary = layout_.rotary
        prefix_tokens, target_tokens = (0 if from_cache else layout_.prefix_length), layout_.target_length
        if shards is not None:  # this rank's tokens, with their rotary factors
            hidden = shards.own(hidden, 1, not from_cache)
            rotary = pytree.tree_map(lambda part: shards.own(part, 0, not from_cache), rotary)
            prefix_tokens = 0 if from_cache else shards.prefix.own_tokens
            target_tokens = shards.target.own_tokens
        rows = target_rows if from_cache else torch.cat([prefix_row.expand(-1, prefix_tokens, -1),
                                                         target_rows.expand(-1, target_tokens, -1)], dim=1)
        hidden = self.run_blocks(hidden, rows, rotary, layout_, options, prefix, shards)
        target = hidden[:, hidden.shape[1] - target_tokens:]
        target = F.layer_norm(target, target.shape[-1:], eps=self.norm_out.eps) * (1 + final_scale)
        prediction = self.proj_out(target)
        return prediction if shards is None else shards.target.gather(prediction, 1)

    def run_blocks(self, hidden, modulation, rotary, layout_: Layout, options: DitOptions,
                   prefix: PrefixStep | None, shards: Shards | None) -> torch.Tensor:
        """The block loop: each block reads its cached prefix, or hands this step's to the cache. Behind the step
        cache the loop may end after the first block with the target's tokens alone (the cache adds the other
        blocks' change to them; a filling step, a branch's first, is never served, so every block stores its
        prefix). Under a sequence split, `hidden` is this rank's tokens (`shards`) and the cache holds its heads. With
        carried_residual each block hands its last addition to the next, and the last one's is added here (the step
        cache, which watches each block's output, never runs with it)."""
        from_cache = reads_prefix(prefix)
        heads = self.heads if shards is None else self.heads // shards.target.degree
        prefix_shape = (hidden.shape[0], layout_.prefix_length, heads, self.head_dim)
        prefix_dtype = fp8_attention.FP8 if fp8_prefix_keys(options, shards) else hidden.dtype
        target_tokens = layout_.target_length if shards is None else shards.target.own_tokens
        step_cache, target = options.step_cache, hidden.shape[1] - target_tokens
        pending = nothing_pending(hidden, modulation) if options.carried_residual else None
        for index, block in enumerate(self.blocks):
            cached = prefix.stored(index, prefix_shape, prefix_dtype) if from_cache else None
            before = hidden
            hidden, kept, pending = block(hidden, modulation, rotary, layout_, cached,
                                          prefix is not None and not from_cache, options, shards, pending)
            if kept is not None:
                prefix.store(index, *kept)
            if step_cache is not None:
                served, stop = step_cache.after_block(index, before[:, target:], hidden[:, target:],
                                                      index == len(self.blocks) - 1)
                if stop:
                    return served
        return hidden if pending is None else finish(hidden, pending)


# ---- one denoising step ----

def step_forward(dit: QwenImage21DiT, latents: torch.Tensor, prompt_embeds: torch.Tensor, timestep: torch.Tensor,
                 layout_: Layout, step: int, options: DitOptions = DitOptions()) -> tuple[torch.Tensor, int]:
    """The forward at denoising step `step` as the pipeline calls it (QwenImage21DiT.forward's arguments): the
    prefix cache told the step before it and the tokens computed after it, outside the forward (a forward replayed
    from a CUDA graph runs none of its Python), and the forward replayed from CUDA graphs where the run's options
    hold them; the step cache told the step too. Returns the prediction and the tokens the forward computed."""
    if options.step_cache is not None:
        options.step_cache.begin(step)
    cache = options.prefix_cache
    prefix = None if cache is None else cache.begin(step)
    from_cache = reads_prefix(prefix)
    tokens = layout_.target_length if from_cache else layout_.length
    inputs = {"latents": latents, "prompt_embeds": prompt_embeds, "timestep": timestep,
              "layout_": layout_.without_block_mask() if from_cache else layout_}
    if options.graphs is None:
        prediction = dit(**inputs, options=options, prefix=prefix)
    else:
        # a graph per CFG branch and cache state (a filling forward writes its branch's kept tensors, a cached one
        # reads them) and per sequence split (a split forward runs other kernels on the same inputs)
        prediction = options.graphs.run(lambda held: dit(**held, options=options, prefix=prefix), inputs,
                                        name=(options.sequence_split, prefix))
    if cache is not None:
        cache.done(tokens)
    return prediction, tokens
