"""Pinned host memory for weights, pinned at their own size. PyTorch's pinned allocator (ATen's CachingHostAllocator)
rounds every request up to a power of two, so a weight just above one would pin nearly twice its size; weights are
copied instead as views into chunks whose sizes are powers of two already: only the unused end of a chunk is pinned
for nothing. Pages are pinned the allocator's faster way (host_register_settings). Modules in pinned memory are
brought to the GPU one after another with their copies started ahead (moved_in_turn)."""
from __future__ import annotations

import collections
import functools
import itertools
import os

import torch

CHUNK_BYTES = 1 << 28   # 256 MiB; a larger tensor gets a chunk of its own, which smaller tensors fill after it
ALIGNMENT = 512         # each tensor starts on this boundary: a view of any dtype, aligned copies


# By default the allocator pins with cudaHostAlloc, which faults in every page on one thread; with these settings
# it maps the pages on several threads and then registers them (lab/LOG.md: the weights' build time)
HOST_REGISTER = "pinned_use_cuda_host_register:True,pinned_num_register_threads:8"


def host_register_settings(user_settings: str) -> str | None:
    """The allocator settings to apply: the user's own (PyTorch resets some keys that a new setting string leaves
    out) with HOST_REGISTER added; None where the user chose how to pin."""
    if "pinned_" in user_settings:
        return None
    return ",".join(part for part in (user_settings.strip(","), HOST_REGISTER) if part)


@functools.cache
def _pin_with_host_register() -> None:
    user = os.environ.get("PYTORCH_ALLOC_CONF") or os.environ.get("PYTORCH_CUDA_ALLOC_CONF") or ""  # torch's order
    settings = host_register_settings(user)
    if settings is not None:
        torch._C._accelerator_setAllocatorSettings(settings)


def pinned_bytes(nbytes: int) -> torch.Tensor:
    _pin_with_host_register()
    return torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)


def power_of_two_at_least(nbytes: int) -> int:
    return 1 << max(nbytes - 1, 0).bit_length()


def _aligned(offset: int) -> int:
    return -(-offset // ALIGNMENT) * ALIGNMENT


class PinnedArena:
    """Copies of tensors, packed first-fit into chunks from `allocate` (pinned host memory; the tests pass plain
    memory), every chunk's size a power of two."""

    def __init__(self, allocate=pinned_bytes, chunk_bytes: int = CHUNK_BYTES):
        self._allocate, self._chunk_bytes = allocate, chunk_bytes
        self._chunks: list[list] = []   # [chunk (uint8), bytes used]

    def copy(self, tensor: torch.Tensor) -> torch.Tensor:
        return self.copy_end_to_end([tensor])[0]

    def copy_end_to_end(self, tensors: list[torch.Tensor]) -> list[torch.Tensor]:
        """Copies of `tensors` (one dtype) laid end to end in one chunk, in order: together they are one span of
        memory, which a view can join without copying (rewrites.fuse_qkv)."""
        for tensor in tensors:
            if type(tensor) not in (torch.Tensor, torch.nn.Parameter):
                raise TypeError(f"pinned copies are made of plain tensors, not {type(tensor).__name__}")
        if len({tensor.dtype for tensor in tensors}) > 1:
            raise ValueError("tensors laid end to end share one dtype")
        sizes = [tensor.numel() * tensor.element_size() for tensor in tensors]
        chunk, offset = self._room(sum(sizes))
        copies = []
        for tensor, nbytes in zip(tensors, sizes):
            view = chunk[offset:offset + nbytes].view(tensor.dtype).view(tensor.shape)
            view.copy_(tensor)
            copies.append(view)
            offset += nbytes
        return copies

    def _room(self, nbytes: int) -> tuple[torch.Tensor, int]:
        for entry in self._chunks:
            offset = _aligned(entry[1])
            if offset + nbytes <= entry[0].numel():
                entry[1] = offset + nbytes
                return entry[0], offset
        chunk = self._allocate(max(self._chunk_bytes, power_of_two_at_least(nbytes)))
        self._chunks.append([chunk, nbytes])
        return chunk, 0


def pin_module(module: torch.nn.Module, arena: PinnedArena | None = None, end_to_end=()) -> torch.nn.Module:
    """Every parameter and buffer of `module` not pinned yet moved into `arena` (a new one by default), one tensor
    (or one group of `end_to_end`, lists of its tensors laid end to end) at a time, so that only one extra copy
    exists at any moment."""
    arena = arena or PinnedArena()
    placed = set()
    with torch.no_grad():
        for group in end_to_end:
            if not any(tensor.is_pinned() for tensor in group):
                for tensor, copy in zip(group, arena.copy_end_to_end([tensor.data for tensor in group])):
                    tensor.data = copy
            placed.update(id(tensor) for tensor in group)
        for tensor in [*module.parameters(), *module.buffers()]:
            if id(tensor) not in placed and not tensor.is_pinned():
                tensor.data = arena.copy(tensor.data)
    return module


def moved_in_turn(modules, device: str, ahead: int = 2):
    """Yields each module moved to `device`, its tensors replaced as `.to` replaces them. On a GPU the copies of the
    next `ahead` modules run meanwhile on a stream of their own (from pinned memory a copy does not wait for the
    host), so whatever the caller does with one module overlaps the copies of the next."""
    target = torch.device(device)
    if target.type != "cuda":
        for module in modules:
            yield module.to(target)
        return
    copying = torch.cuda.Stream(target)

    def start(module):
        with torch.cuda.stream(copying):
            copies = [(tensor, tensor.to(target, non_blocking=True)) for tensor in [*module.parameters(),
                                                                                    *module.buffers()]]
        copied = torch.cuda.Event()
        copied.record(copying)
        return module, copies, copied

    modules = iter(modules)
    queue = collections.deque(start(module) for module in itertools.islice(modules, ahead))
    while queue:
        module, copies, copied = queue.popleft()
        following = next(modules, None)
        if following is not None:
            queue.append(start(following))
        computing = torch.cuda.current_stream(target)
        computing.wait_event(copied)
        for tensor, copy in copies:
            copy.record_stream(computing)  # made on the copy stream, freed after the caller's work on it
            tensor.data = copy
        yield module
