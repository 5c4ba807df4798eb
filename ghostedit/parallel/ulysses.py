"""Ulysses sequence parallel for the Qwen DiT's joint attention, on the "ulysses" mesh dimension.

The image tokens (output latent and input images) are split along the sequence over the ranks, with their rotary
frequencies; the text tokens (a few hundred) stay whole on every rank. Everything in a block but attention works
token by token, so each rank runs its own shard. Around attention, an all-to-all trades the image shard's heads for
the whole image sequence (each rank then attends with heads/N heads over every token), the text keeps the same
heads/N heads, and after attention the image goes back by the reverse all-to-all while the text's heads are
all-gathered, so the text stream stays identical on every rank. Attention has no mask here, so the order in which
the tokens meet does not matter. Shards may differ by one token: the all-to-alls take uneven splits.

The all-to-alls are torch.distributed's functional collectives, which torch.compile traces inside the compiled
blocks. `SequenceSharding` splits the DiT's input and gathers its output with module hooks around the blocks.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.distributed import _functional_collectives as collectives

from ..errors import InvalidRequestError
from .mesh import ParallelMesh


@dataclass
class Layout:
    """How the current DiT forward's tokens lie over the Ulysses ranks: set by the hooks of `SequenceSharding`,
    read by the attention (inside compiled blocks these plain values are guarded constants)."""
    group: object
    rank: int
    degree: int
    image_shards: tuple[int, ...] = ()   # image tokens on each rank

    @property
    def image_offset(self) -> int:
        return sum(self.image_shards[:self.rank])

    @property
    def image_tokens(self) -> int:
        return self.image_shards[self.rank]


_layout: Layout | None = None


def active() -> bool:
    return _layout is not None


def shard_sizes(total: int, parts: int) -> tuple[int, ...]:
    """torch.tensor_split's sizes: the first total % parts shards one token longer."""
    return tuple(total // parts + (1 if index < total % parts else 0) for index in range(parts))


def _wait(tensor: torch.Tensor) -> torch.Tensor:
    return collectives.wait_tensor(tensor)


def sequence_to_heads(tensors, layout: Layout) -> tuple[torch.Tensor, ...]:
    """Each of `tensors` (q, k and v: one all-to-all for the three) from [batch, own image tokens, heads, d] to
    [batch, all image tokens, heads / N, d]: head group j goes to rank j."""
    batch, tokens, heads, dim = tensors[0].shape
    per_rank = heads // layout.degree
    # one copy into the send buffer: [ranks, own tokens, q/k/v, batch, heads / N, d]
    send = torch.stack([t.reshape(batch, tokens, layout.degree, per_rank, dim).permute(2, 1, 0, 3, 4)
                        for t in tensors], dim=2)
    received = _wait(collectives.all_to_all_single(send.flatten(0, 1), list(layout.image_shards),
                                                   [tokens] * layout.degree, layout.group))
    return received.permute(1, 2, 0, 3, 4).unbind(0)  # [all tokens, q/k/v, batch, ...] -> q, k, v


def heads_to_sequence(x: torch.Tensor, layout: Layout) -> torch.Tensor:
    """The reverse of sequence_to_heads: [batch, all image tokens, heads / N, d] -> [batch, own tokens, heads, d]."""
    batch, _, per_rank, dim = x.shape
    tokens = layout.image_tokens
    send = x.permute(1, 0, 2, 3).contiguous()
    received = _wait(collectives.all_to_all_single(send, [tokens] * layout.degree, list(layout.image_shards),
                                                   layout.group))
    return received.reshape(layout.degree, tokens, batch, per_rank, dim).permute(2, 1, 0, 3, 4).flatten(2, 3)


def gather_heads(x: torch.Tensor, layout: Layout) -> torch.Tensor:
    """[batch, tokens, heads / N, d] on each rank -> [batch, tokens, heads, d] on every rank."""
    batch, tokens, per_rank, dim = x.shape
    gathered = _wait(collectives.all_gather_tensor(x.contiguous(), 0, layout.group))
    return gathered.reshape(layout.degree, batch, tokens, per_rank, dim).permute(1, 2, 0, 3, 4).flatten(2, 3)


def joint_attention(streams, attend) -> torch.Tensor:
    """Joint attention of the text stream (whole) and this rank's image shard, each (q, k, v) in
    [batch, tokens, heads, d]. `attend(streams, heads)` is the single-process joint attention over the
    redistributed streams, returning [batch, tokens, heads * d]. Returns [batch, text + own image tokens, heads * d],
    as the single-process attention would for these tokens."""
    layout = _layout
    text, image = streams
    heads = text[0].shape[2]
    per_rank = heads // layout.degree
    own_heads = slice(layout.rank * per_rank, (layout.rank + 1) * per_rank)
    text_part = tuple(t[:, :, own_heads] for t in text)
    image_part = sequence_to_heads(image, layout)
    output = attend((text_part, image_part), per_rank).unflatten(-1, (per_rank, -1))
    text_tokens = text[0].shape[1]
    text_out = gather_heads(output[:, :text_tokens], layout)
    image_out = heads_to_sequence(output[:, text_tokens:], layout)
    return torch.cat([text_out, image_out], dim=1).flatten(2)


def split_joined(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor):
    """DiffSynth's joined [batch, heads, text + image tokens, d] q, k and v as (text, image) streams in
    [batch, tokens, heads, d] (views). The text's length comes from the shapes, not from a value that compiled
    code would guard on: the positive and negative prompts differ in length."""
    text_tokens = q.shape[2] - _layout.image_tokens
    text = tuple(t[:, :, :text_tokens].transpose(1, 2) for t in (q, k, v))
    image = tuple(t[:, :, text_tokens:].transpose(1, 2) for t in (q, k, v))
    return text, image


def check_heads(dit: torch.nn.Module, degree: int) -> None:
    heads = dit.transformer_blocks[0].attn.num_heads
    if heads % degree:
        raise InvalidRequestError(f"Ulysses over {degree} ranks needs a head count divisible by {degree}; "
                                  f"the DiT has {heads}")


class SequenceSharding:
    """Inside this block the DiT's forwards run sequence-parallel: the image tokens split after the input
    projection, their rotary frequencies split alike, the per-token modulation index (zero_cond_t) split, and the
    image tokens gathered again before the output norm."""

    def __init__(self, dit: torch.nn.Module, mesh: ParallelMesh):
        check_heads(dit, mesh.ulysses_degree)
        self.dit = dit
        self.layout = Layout(mesh.group("ulysses"), mesh.ulysses_rank, mesh.ulysses_degree)
        self.handles = []

    def __enter__(self):
        global _layout
        dit = self.dit
        self.handles = [dit.img_in.register_forward_hook(self._split_image),
                        dit.pos_embed.register_forward_hook(self._split_frequencies),
                        dit.norm_out.register_forward_pre_hook(self._gather_image)]
        self.handles += [block.register_forward_pre_hook(self._split_block_inputs, with_kwargs=True)
                         for block in dit.transformer_blocks]
        _layout = self.layout
        return self

    def __exit__(self, *exc):
        global _layout
        _layout = None
        for handle in self.handles:
            handle.remove()

    def _own(self, x: torch.Tensor, dim: int) -> torch.Tensor:
        """This rank's image tokens along `dim`, as a tensor of its own (not a view: see compile's
        hand_blocks_plain_tensors)."""
        if x.shape[dim] != sum(self.layout.image_shards):
            raise RuntimeError(f"sequence parallel expected {sum(self.layout.image_shards)} image tokens, got "
                               f"{x.shape[dim]} (entity prompts, ControlNets and rope interpolation are not split)")
        return x.narrow(dim, self.layout.image_offset, self.layout.image_tokens).clone()

    def _split_image(self, module, args, image):
        self.layout.image_shards = shard_sizes(image.shape[1], self.layout.degree)
        return self._own(image, 1)

    def _split_frequencies(self, module, args, frequencies):
        image, text = frequencies
        image = tuple(self._own(f, 0) for f in image) if isinstance(image, tuple) else self._own(image, 0)
        return image, text

    def _split_block_inputs(self, module, args, kwargs):
        if kwargs.get("attention_mask") is not None:
            raise RuntimeError("sequence parallel does not take attention masks (entity prompts)")
        if kwargs.get("modulate_index") is not None:
            return args, {**kwargs, "modulate_index": self._own(kwargs["modulate_index"], 1)}
        return None

    def _gather_image(self, module, args):
        image, *rest = args
        longest = max(self.layout.image_shards)
        padded = torch.nn.functional.pad(image, (0, 0, 0, longest - image.shape[1]))
        gathered = _wait(collectives.all_gather_tensor(padded.contiguous(), 1, self.layout.group))
        pieces = [gathered[:, rank * longest: rank * longest + size]
                  for rank, size in enumerate(self.layout.image_shards)]
        return (torch.cat(pieces, dim=1), *rest)
