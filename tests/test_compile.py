"""Regional compile traces the DiT's block once: no restarted trace, no second compile for the second block."""
import torch
from torch._dynamo.utils import compile_times, counters

from dit_helpers import dit_engine, dit_output, inputs_for
from ghostedit.config import OptimizationConfig


def test_compiled_blocks_are_traced_and_compiled_once():
    """Before the fixes in optimize/compile.py, Dynamo restarted its trace over DiffSynth's float attributes
    ("compile_attempt_1") and compiled the block a second time because only the first block's inputs are views
    (2 frames); on the full-size model they cost 8 of a 28 s first call."""
    torch._dynamo.reset()
    counters.clear()
    config = OptimizationConfig(compile="regional", rewrites=("real-rope",))
    engine = dit_engine()
    inputs = inputs_for(engine)
    first = dit_output(engine, config, inputs)
    again = dit_output(engine, config, inputs)
    assert torch.equal(first, again)
    assert len(engine.load().dit.transformer_blocks) > 1
    assert counters["frames"]["total"] == 1, dict(counters["frames"])
    assert "compile_attempt_1" not in compile_times(repr="str", aggregate=True)
