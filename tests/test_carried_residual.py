"""The carried-residual rewrite (ghostedit/optimize/carried_residual.py) on the tiny DiT in float32 on a CPU: its
declaration, and that it computes DiffSynth's function. Through GhostEdit's block loop (put in DiffSynth's place by
the flag's run-time context, and captured by cuda-graph, here the stand-in capture of test_cuda_graphs.py), each
addition is the same float32 operation moved from the end of one block to the start of the next, so the forward's
output equals the released blocks' bit for bit; so does a block called alone, and the per-token modulation of
zero_cond_t models. What the move is for,
Inductor fusing the addition into the next LayerNorm, is measured on the GPU (lab/LOG.md)."""
import contextlib

import pytest
import torch

from dit_helpers import dit_engine, inputs_for
from ghostedit import OptimizationConfig
from ghostedit.bench.dit import running
from ghostedit.telemetry import RunRecorder
from ghostedit.optimize import carried_residual, cuda_graphs, registry
from test_cuda_graphs import ReplayingCapture

CARRIED = OptimizationConfig(rewrites=("carried-residual",))


@pytest.fixture(scope="module")
def stock_and_carried():
    engine = dit_engine()
    stock, _ = engine.prepare(OptimizationConfig())
    carried, _ = dit_engine().prepare(OptimizationConfig())  # the same embedded weights, blocks of its own
    assert carried_residual.carry_residuals(carried.dit) == len(stock.dit.transformer_blocks)
    return engine, stock, carried


def test_the_flag_is_a_lossless_prepared_rewrite_with_a_run_time_loop():
    toggle = registry.get("carried-residual")
    assert toggle.group == "rewrites" and toggle.changes == registry.PREPARED and not CARRIED.lossy
    assert CARRIED.cache_key != OptimizationConfig().cache_key and toggle.run_context is not None


def handed_on(carried, run) -> tuple:
    """run()'s result, and whether the second block was handed a pending addition at each call."""
    handed = []
    hook = carried.dit.transformer_blocks[1].register_forward_pre_hook(
        lambda block, args, kwargs: handed.append(kwargs.get("pending") is not None), with_kwargs=True)
    try:
        return run(), handed
    finally:
        hook.remove()


@pytest.mark.parametrize("zero_cond_t", [False, True])
def test_the_engines_forward_gives_the_released_blocks_output_bit_for_bit(stock_and_carried, zero_cond_t):
    engine, stock, carried = stock_and_carried
    inputs = {**inputs_for(engine), "zero_cond_t": zero_cond_t}
    with torch.no_grad():
        released = stock.pipe.model_fn(dit=stock.dit, **inputs)
    with running(carried, CARRIED, inputs, "cpu", RunRecorder("cpu")) as (call, ran):
        output, handed = handed_on(carried, call)
    assert handed == [True] and torch.equal(output, released)
    assert "carried-residual" not in ran.get("words", {})


@pytest.mark.parametrize("graph_outside", [True, False])
def test_under_cuda_graphs_loop_either_way_round(stock_and_carried, graph_outside):
    """The run-time contexts nest in preparation order, cuda-graph's outside; either way round the blocks hand
    their additions on and every capture and replay gives the released output."""
    engine, stock, carried = stock_and_carried
    inputs = inputs_for(engine)
    with torch.no_grad():
        released = stock.pipe.model_fn(dit=stock.dit, **inputs)
    graphs = cuda_graphs.ShapeGraphs(ReplayingCapture())
    owner = ("carried", None)
    with contextlib.ExitStack() as stack:
        stack.enter_context(torch.no_grad())
        stack.enter_context(graphs.running(owner, RunRecorder("cpu")))
        loops = [lambda: cuda_graphs.graphed(carried.pipe, graphs), lambda: carried_residual.carried(carried.pipe)]
        for loop in (loops[::-1] if graph_outside else loops):
            stack.enter_context(loop())
        outputs, handed = handed_on(carried, lambda: [carried.pipe.model_fn(dit=carried.dit, **inputs)
                                                      for _ in range(3)])
    assert handed and all(handed) and graphs.captured == 1
    for output in outputs:
        assert torch.equal(output, released)


def test_a_run_says_where_the_blocks_add_their_own():
    assert "step cache" in carried_residual.why_not_carried(CARRIED.replace(**{"step-cache": "fbcache-0"}))
    assert carried_residual.why_not_carried(CARRIED) is None


def test_blocks_hand_the_addition_on_and_a_block_alone_finishes_it(stock_and_carried):
    engine, stock, carried = stock_and_carried
    generator = torch.Generator().manual_seed(0)
    width = stock.dit.transformer_blocks[0].dim
    image, text = torch.randn((1, 32, width), generator=generator), torch.randn((1, 8, width), generator=generator)
    block_inputs = {"temb": torch.randn((1, width), generator=generator), "image_rotary_emb": None}
    released, block = stock.dit.transformer_blocks[0], carried.dit.transformer_blocks[0]
    with torch.no_grad():
        expected_text, expected_image = released(image=image, text=text, **block_inputs)
        alone_text, alone_image = block(image=image, text=text, **block_inputs)
        pending = carried_residual.nothing_pending(image, text)
        base_text, base_image, left = block(image=image, text=text, pending=pending, **block_inputs)
    assert torch.equal(alone_image, expected_image) and torch.equal(alone_text, expected_text)
    assert not torch.equal(base_image, expected_image)  # the addition is left to the next block ...
    finished_image, finished_text = carried_residual.finish(base_image, base_text, left)
    assert torch.equal(finished_image, expected_image) and torch.equal(finished_text, expected_text)  # ... as it was
    # the next block gets what the first one gets, stride for stride: one compiled graph serves every block
    assert [part.stride() for part in left] == [part.stride() for part in pending]
