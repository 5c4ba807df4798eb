"""Ulysses sequence parallel on the "ulysses" mesh dimension: the sequence split of a DiT forward (models/seams.py,
SequenceSplit), which the forward calls where it splits its sharded tokens, around its attention, and where it
gathers them.

The image tokens (output latent and input images) are split along the sequence over the ranks, with their rotary
frequencies and per-token inputs; the text tokens (a few hundred) stay whole on every rank. Everything in a block but
attention works token by token, so each rank runs its own shard with the one-process code. Around attention, an
all-to-all trades the image shard's heads for the whole image sequence (each rank then attends with heads/N heads
over every token), the text keeps its heads/N heads, and after attention the image goes back by the reverse
all-to-all while the text's heads are all-gathered, so the text stream stays identical on every rank. FP8 tensors
travel as their bytes (half a bf16 tensor's), and a per-tensor FP8 scale is computed over the whole sequence
(`all_max` of each rank's largest value): every value is cast as one process casts it. Shards may differ by one
token: the all-to-alls take uneven splits. Qwen-Image-2.1's single stream has no whole part: its prefix (text and
references) and its target are split over the ranks each on its own, streams that `attention` gathers apart, each by
the split bound to its own tokens (models/qwen_image_21/dit.py, Shards).

The collectives are torch.distributed's functional collectives, which torch.compile traces inside compiled blocks
(the split's plain values are guarded constants there); each is waited for where its result is first used.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.distributed import _functional_collectives as collectives

from ..errors import InvalidRequestError
from .mesh import ParallelMesh


def shard_sizes(total: int, parts: int) -> tuple[int, ...]:
    """torch.tensor_split's sizes: the first total % parts shards one token longer."""
    return tuple(total // parts + (1 if index < total % parts else 0) for index in range(parts))


def _as_bytes(x: torch.Tensor) -> torch.Tensor:
    """FP8 tensors travel as bytes (collectives and stacking take no float8 dtypes); others as they are."""
    return x.view(torch.uint8) if x.element_size() == 1 and x.is_floating_point() else x


def _as(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """What arrived, as the dtype sent (bytes back to FP8)."""
    return x if x.dtype == dtype else x.view(dtype)


@dataclass(frozen=True)
class Ulysses:
    """The split over one mesh's Ulysses ranks; bound to a forward's sharded token count by `over`."""
    group: object
    rank: int
    degree: int
    shards: tuple[int, ...] = ()   # sharded tokens on each rank (set by `over`)

    @classmethod
    def of(cls, mesh: ParallelMesh, heads: int) -> Ulysses | None:
        """The split for `mesh` over a DiT with `heads` heads; None where the mesh has one Ulysses rank."""
        if mesh is None or mesh.ulysses_degree == 1:
            return None
        if heads % mesh.ulysses_degree:
            raise InvalidRequestError(f"Ulysses over {mesh.ulysses_degree} ranks needs a head count divisible by "
                                      f"{mesh.ulysses_degree}; the DiT has {heads}")
        return cls(mesh.group("ulysses"), mesh.ulysses_rank, mesh.ulysses_degree)

    def over(self, tokens: int) -> Ulysses:
        return Ulysses(self.group, self.rank, self.degree, shard_sizes(tokens, self.degree))

    @property
    def offset(self) -> int:
        return sum(self.shards[:self.rank])

    @property
    def own_tokens(self) -> int:
        return self.shards[self.rank]

    def shard(self, x: torch.Tensor, dim: int) -> torch.Tensor:
        """This rank's tokens along `dim`, as a tensor of its own (not a view: compiled blocks guard on a view's
        base)."""
        if x.shape[dim] != sum(self.shards):
            raise RuntimeError(f"sequence parallel expected {sum(self.shards)} tokens, got {x.shape[dim]}")
        return x.narrow(dim, self.offset, self.own_tokens).clone()

    def gather(self, x: torch.Tensor, dim: int) -> torch.Tensor:
        """Every rank's tokens along `dim`, in order (uneven shards padded to the longest for the all-gather)."""
        longest = max(self.shards)
        padding = [0, 0] * (x.dim() - 1 - dim) + [0, longest - x.shape[dim]]
        padded = torch.nn.functional.pad(x, padding).contiguous()
        gathered = collectives.wait_tensor(collectives.all_gather_tensor(padded, dim, self.group))
        return torch.cat([gathered.narrow(dim, rank * longest, size) for rank, size in enumerate(self.shards)], dim=dim)

    def all_max(self, x: torch.Tensor) -> torch.Tensor:
        return collectives.wait_tensor(collectives.all_reduce(x, "max", self.group))

    def all_sum(self, x: torch.Tensor) -> torch.Tensor:
        return collectives.wait_tensor(collectives.all_reduce(x, "sum", self.group))

    def attention(self, streams, sharded, attend) -> torch.Tensor:
        """`attend` over every token with heads/N heads: the sharded streams' q, k and v gathered along the sequence
        by one all-to-all each (started before the whole streams' heads are sliced), the whole streams' heads
        sliced; `attend`'s output [batch, all tokens, heads / N, d] back to [batch, this rank's tokens, heads, d].
        `sharded`, per stream: False (whole on every rank), True (split by this split's shards) or a split of the
        same ranks bound to the stream's own tokens (streams split apart: Qwen-Image-2.1's prefix and target)."""
        heads = streams[0][0].shape[2]
        per_rank = heads // self.degree
        own_heads = slice(self.rank * per_rank, (self.rank + 1) * per_rank)
        splits = [self if split is True else split for split in sharded]
        sent = [split._sequence_to_heads(stream) for stream, split in zip(streams, splits) if split]
        local, received = [], iter(sent)
        for stream, split in zip(streams, splits):
            local.append(next(received)() if split else tuple(t[:, :, own_heads] for t in stream))
        output = attend(local)
        parts, start = [], 0
        for stream, split in zip(streams, splits):
            tokens = sum(split.shards) if split else stream[0].shape[1]
            part = output[:, start:start + tokens]
            start += tokens
            parts.append(split._heads_to_sequence(part) if split else self._gather_heads(part))
        return torch.cat([part() for part in parts], dim=1)

    def _sequence_to_heads(self, qkv):
        """Starts the all-to-all of this rank's tokens of q, k and v, [batch, own tokens, heads, d] each (one
        all-to-all for the three): head group j goes to rank j. Returns what waits for it and gives (q, k, v),
        [batch, all tokens, heads / N, d] each."""
        batch, tokens, heads, dim = qkv[0].shape
        per_rank = heads // self.degree
        dtype = qkv[0].dtype
        # one copy into the send buffer: [ranks, own tokens, q/k/v, batch, heads / N, d]
        send = torch.stack([_as_bytes(t).reshape(batch, tokens, self.degree, per_rank, dim).permute(2, 1, 0, 3, 4)
                            for t in qkv], dim=2)
        started = collectives.all_to_all_single(send.flatten(0, 1), list(self.shards), [tokens] * self.degree,
                                                self.group)

        def received():
            arrived = collectives.wait_tensor(started).permute(1, 2, 0, 3, 4)  # [q/k/v, batch, all tokens, ...]
            return tuple(_as(t, dtype) for t in arrived.unbind(0))
        return received

    def _heads_to_sequence(self, x: torch.Tensor):
        """Starts the reverse all-to-all: [batch, all tokens, heads / N, d] -> [batch, own tokens, heads, d]."""
        batch, _, per_rank, dim = x.shape
        tokens, dtype = self.own_tokens, x.dtype
        started = collectives.all_to_all_single(_as_bytes(x).permute(1, 0, 2, 3).contiguous(),
                                                [tokens] * self.degree, list(self.shards), self.group)

        def received():
            arrived = _as(collectives.wait_tensor(started), dtype)
            return arrived.reshape(self.degree, tokens, batch, per_rank, dim).permute(2, 1, 0, 3, 4).flatten(2, 3)
        return received

    def _gather_heads(self, x: torch.Tensor):
        """Starts gathering every rank's heads: [batch, tokens, heads / N, d] -> [batch, tokens, heads, d]."""
        batch, tokens, per_rank, dim = x.shape
        dtype = x.dtype
        started = collectives.all_gather_tensor(_as_bytes(x).contiguous(), 0, self.group)

        def received():
            gathered = _as(collectives.wait_tensor(started), dtype)
            return gathered.reshape(self.degree, batch, tokens, per_rank, dim).permute(1, 2, 0, 3, 4).flatten(2, 3)
        return received
