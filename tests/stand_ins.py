"""CPU stand-ins the tests share for what this machine lacks: a CUDA graph's capture and replay, pinned memory."""
import contextlib

import torch
from torch.utils import _pytree as pytree


class ReplayingCapture:
    """A CPU stand-in for CudaCapture: the outputs live in fixed tensors, and a replay recomputes them from the
    held inputs the function closes over (a wrapper that forgot to copy new inputs in would replay stale ones)."""

    warming = contextlib.nullcontext
    device_type = "cpu"

    def capture(self, function, pool):
        outputs = function()

        def replay():
            for held, new in zip(pytree.tree_leaves(outputs), pytree.tree_leaves(function())):
                held.copy_(new)
        return replay, outputs, pool


class PlainMemory:
    """Stands in for pinned memory, keeping each chunk it gave."""

    def __init__(self):
        self.chunks = []

    def __call__(self, nbytes: int) -> torch.Tensor:
        self.chunks.append(torch.zeros(nbytes, dtype=torch.uint8))
        return self.chunks[-1]

    @property
    def requests(self) -> list[int]:
        return [chunk.numel() for chunk in self.chunks]
