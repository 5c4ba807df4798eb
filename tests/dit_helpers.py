"""The tiny DiT alone in float32, through the engine's own preparation and forward path (as the DiT-level bench
runs it): for tests that compare DiT outputs across configurations."""
from ghostedit.bench.dit import dit_inputs, running
from ghostedit.engine import Engine
from ghostedit.telemetry import RunRecorder


def dit_engine() -> Engine:
    return Engine("tiny", device="cpu", dtype="float32", dit_only=True)


def inputs_for(engine: Engine, side: int = 64, text_tokens: int = 8) -> dict:
    return dit_inputs(engine.load().dit, side, side, text_tokens, "cpu", engine.torch_dtype)


def dit_output(engine: Engine, config, inputs: dict, calls: int = 1):
    """The prepared DiT's output for `inputs` (the last of `calls` forwards)."""
    prepared, _ = engine.prepare(config)
    with running(prepared, config, inputs, "cpu", RunRecorder("cpu")) as (call, _):
        for _ in range(calls):
            output = call()
    return output
