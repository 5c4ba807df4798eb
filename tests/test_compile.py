"""Regional compile traces the DiT's block once: no restarted trace, no second compile for the second block."""
import torch
from torch._dynamo.utils import compile_times, counters

from ghostedit.bench_dit import dit_inputs, forward
from ghostedit.config import OptimizationConfig
from ghostedit.models import load_base_dit, resolve
from ghostedit.recipe import prepare_dit
from ghostedit.telemetry import RunRecorder


def test_compiled_blocks_are_traced_and_compiled_once():
    """Before the fixes in optimize/compile.py, Dynamo restarted its trace over DiffSynth's float attributes
    ("compile_attempt_1") and compiled the block a second time because only the first block's inputs are views
    (2 frames); on the full-size model they cost 8 of a 28 s first call."""
    torch._dynamo.reset()
    counters.clear()
    config = OptimizationConfig(compile="regional", rewrites=("real-rope",))
    base = load_base_dit(resolve("tiny"), "cpu", torch.float32)
    dit, _ = prepare_dit(base, config, RunRecorder("cpu"), "cpu")
    inputs = dit_inputs(dit, 64, 64, 8, "cpu", torch.float32)
    first = forward(dit, inputs, config, "diffsynth")
    again = forward(dit, inputs, config, "diffsynth")
    assert torch.equal(first, again)
    assert len(dit.transformer_blocks) > 1
    assert counters["frames"]["total"] == 1, dict(counters["frames"])
    assert "compile_attempt_1" not in compile_times(repr="str", aggregate=True)
