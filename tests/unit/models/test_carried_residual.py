"""The carried-residual rewrite (the forward's `carried_residual` path, models/qwen_image/dit.py) on the tiny DiT in
float32 on a CPU: its declaration, and that it computes the released function. Through the forward's block loop (and
replayed from graphs, here the stand-in capture of test_cuda_graphs.py), each addition is the same float32 operation
moved from the end of one block to the start of the next, so the forward's output equals the released blocks' bit for
bit; so does a block called alone, and the per-token modulation of zero_cond_t models. What the move is for, Inductor
fusing the addition into the next LayerNorm, is measured on the GPU (lab/LOG.md)."""
import pytest
import torch

from dit_helpers import dit_engine, inputs_for
from ghostedit import OptimizationConfig
from ghostedit.bench.dit import running
from ghostedit.models.qwen_image import dit as qwen_image
from ghostedit.models.seams import DitOptions
from ghostedit.optimize import cuda_graphs, registry
from ghostedit.optimize.toggles.carried_residual import why_not_carried
from ghostedit.telemetry import RunRecorder
from stand_ins import ReplayingCapture

CARRIED = OptimizationConfig(rewrites=("carried-residual",))


@pytest.fixture(scope="module")
def stock_and_carried():
    engine = dit_engine()
    stock, _ = engine.prepare(OptimizationConfig())
    carried, _ = engine.prepare(CARRIED)
    return engine, stock, carried


def test_the_flag_is_a_lossless_prepared_rewrite_with_a_run_time_option():
    toggle = registry.get("carried-residual")
    assert toggle.group == "rewrites" and toggle.changes == registry.PREPARED and not CARRIED.lossy
    assert CARRIED.cache_key != OptimizationConfig().cache_key and toggle.run_context is not None


def handed_on(dit, run) -> tuple:
    """run()'s result, and whether the second block was handed a pending addition at each call."""
    handed = []
    hook = dit.blocks[1].register_forward_pre_hook(
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
        output, handed = handed_on(carried.dit, call)
    assert handed == [True] and torch.equal(output, released)
    assert "carried-residual" not in ran.get("words", {})


def test_replayed_from_graphs_the_blocks_hand_their_additions_on(stock_and_carried):
    engine, stock, carried = stock_and_carried
    inputs = inputs_for(engine)
    with torch.no_grad():
        released = stock.pipe.model_fn(dit=stock.dit, **inputs)
    graphs = cuda_graphs.ShapeGraphs(ReplayingCapture())
    options = DitOptions(carried_residual=True, graphs=graphs)
    with torch.no_grad(), graphs.running(("carried", None), RunRecorder("cpu")):
        outputs, handed = handed_on(carried.dit, lambda: [carried.pipe.model_fn(dit=carried.dit, options=options,
                                                                                **inputs) for _ in range(3)])
    assert handed and all(handed) and graphs.captured == 1
    for output in outputs:
        assert torch.equal(output, released)


def test_a_run_says_where_the_blocks_add_their_own():
    assert "step cache" in why_not_carried(CARRIED.replace(**{"step-cache": "fbcache-0"}))
    assert why_not_carried(CARRIED) is None


def test_blocks_hand_the_addition_on_and_a_block_alone_finishes_it(stock_and_carried):
    engine, stock, carried = stock_and_carried
    generator = torch.Generator().manual_seed(0)
    block = stock.dit.blocks[0]
    width = block.dim
    image, text = torch.randn((1, 32, width), generator=generator), torch.randn((1, 8, width), generator=generator)
    block_inputs = {"temb": torch.randn((1, width), generator=generator), "image_rotary_emb": (
        torch.polar(torch.ones(32, block.attention_head_dim // 2), torch.randn(32, block.attention_head_dim // 2,
                                                                               generator=generator)),
        torch.polar(torch.ones(8, block.attention_head_dim // 2), torch.randn(8, block.attention_head_dim // 2,
                                                                              generator=generator)))}
    with torch.no_grad():
        expected_text, expected_image = block(image=image, text=text, **block_inputs)
        pending = qwen_image.nothing_pending(image, text)
        base_text, base_image, left = block(image=image, text=text, pending=pending, **block_inputs)
    assert not torch.equal(base_image, expected_image)  # the addition is left to the next block ...
    finished_image, finished_text = qwen_image.finish(base_image, base_text, left)
    assert torch.equal(finished_image, expected_image) and torch.equal(finished_text, expected_text)  # ... as it was
    # the next block gets what the first one gets, stride for stride: one compiled graph serves every block
    assert [part.stride() for part in left] == [part.stride() for part in pending]
