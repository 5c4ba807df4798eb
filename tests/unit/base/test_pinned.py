"""Weights copied into pinned host memory are packed into chunks whose sizes are powers of two (PyTorch's pinned
allocator would round each tensor up to one): the same values, dtypes and shapes, little memory beyond the weights.
A CPU machine has no pinned memory, so plain memory stands in for the allocator; the packing is the same code."""
import pytest
import torch

from dit_helpers import dit_engine, inputs_for
from stand_ins import PlainMemory
from ghostedit.engine.runner import forward
from ghostedit.pinned import (ALIGNMENT, HOST_REGISTER, PinnedArena, host_register_settings, moved_in_turn,
                              pin_module, power_of_two_at_least)


def test_tensors_of_every_kind_keep_their_values_in_power_of_two_chunks():
    memory = PlainMemory()
    arena = PinnedArena(memory, chunk_bytes=4096)
    generator = torch.Generator().manual_seed(0)
    tensors = [torch.randn(3, 5, generator=generator).to(torch.bfloat16),     # 30 bytes
               torch.randn(40, 40, generator=generator),                      # 6400: more than a chunk
               torch.randint(0, 9, (7,), generator=generator),                # int64
               torch.tensor(2.5, dtype=torch.float16),                        # 0-dim
               torch.randn(4, 2, generator=generator, dtype=torch.complex64),
               torch.zeros(0, 3),
               torch.randn(8, 8, generator=generator).t()]                    # not contiguous
    copies = [arena.copy(tensor) for tensor in tensors]
    for tensor, copy in zip(tensors, copies):
        assert copy.dtype == tensor.dtype and copy.shape == tensor.shape and torch.equal(copy, tensor)
    assert all(nbytes == power_of_two_at_least(nbytes) for nbytes in memory.requests)
    assert memory.requests[:2] == [4096, 8192]  # the large tensor's own chunk; the tensors after it fill its rest
    assert len(memory.requests) == 2
    ranges = [(chunk.data_ptr(), chunk.numel()) for chunk in memory.chunks]
    for copy in copies:
        if copy.numel():
            [base] = [base for base, size in ranges if base <= copy.data_ptr() < base + size]
            assert (copy.data_ptr() - base) % ALIGNMENT == 0


def test_tensors_laid_end_to_end_are_one_span_even_where_a_chunk_is_partly_used():
    memory = PlainMemory()
    arena = PinnedArena(memory, chunk_bytes=4096)
    arena.copy(torch.zeros(700))                                  # 2800 of the first chunk's 4096 bytes
    parts = [torch.randn(8, 16), torch.randn(4, 16), torch.randn(8, 16)]   # 1280 bytes together: no room left
    copies = arena.copy_end_to_end(parts)
    assert all(torch.equal(copy, part) for copy, part in zip(copies, parts))
    assert all(after.data_ptr() == before.data_ptr() + before.numel() * 4 for before, after in zip(copies, copies[1:]))
    assert copies[0].data_ptr() == memory.chunks[1].data_ptr()
    with pytest.raises(ValueError, match="one dtype"):
        arena.copy_end_to_end([torch.zeros(2), torch.zeros(2, dtype=torch.bfloat16)])


def test_a_subclassed_tensor_is_refused():
    class Wrapped(torch.Tensor):
        pass
    with pytest.raises(TypeError, match="plain tensors"):
        PinnedArena(PlainMemory()).copy(torch.zeros(2).as_subclass(Wrapped))


def test_a_dit_packed_into_the_arena_gives_the_same_output():
    engine = dit_engine()
    pipe = engine.load()
    inputs = {**inputs_for(engine), "dit": pipe.dit}
    with torch.no_grad():
        before = forward(pipe.model_fn, inputs)
        weights = sum(t.numel() * t.element_size() for t in [*pipe.dit.parameters(), *pipe.dit.buffers()])
        memory = PlainMemory()
        arena = PinnedArena(memory)
        pin_module(pipe.dit, arena)
        assert torch.equal(forward(pipe.model_fn, inputs), before)
    assert sum(memory.requests) <= weights + (1 << 28)
    chunks = {chunk.data_ptr() for chunk in memory.chunks}
    assert all(tensor.untyped_storage().data_ptr() in chunks
               for tensor in [*pipe.dit.parameters(), *pipe.dit.buffers()])


def test_modules_moved_in_turn_arrive_in_order_each_when_its_turn_comes():
    layers = [torch.nn.Linear(4, 4) for _ in range(5)]
    for index, layer in enumerate(moved_in_turn(layers, "meta")):
        assert layer is layers[index]
        assert all(t.device.type == "meta" for t in [*layer.parameters(), *layer.buffers()])
        assert all(t.device.type == "cpu" for later in layers[index + 1:] for t in later.parameters())


def test_pages_are_pinned_the_faster_way_keeping_the_users_allocator_settings():
    assert host_register_settings("") == HOST_REGISTER
    assert host_register_settings("expandable_segments:True,") == f"expandable_segments:True,{HOST_REGISTER}"
    assert host_register_settings("pinned_use_background_threads:True") is None  # the user chose how to pin
