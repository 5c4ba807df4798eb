"""The CUDA-graph flag (`cuda-graph`, ghostedit/optimize/cuda_graphs.py) without a GPU: its declaration (a run-time
rewrite, unavailable on a CPU with the reason, and the reasons a run gives for not capturing), and the graph store's
bookkeeping on the tiny DiT through DiffSynth's own model_fn, with a stand-in capture that replays by running the
captured loop again on the tensors the graph would read. That checks what a real graph depends on: each replay must
see the new inputs copied into the held tensors, a shape is warmed before it is captured, and other weights or
another configuration drop the graphs. The captured kernels themselves are the GPU's: on the GPU the graphed
forward's output equals the loop's bit for bit (docs/benchmarks.md, section 1)."""
import contextlib

import pytest
import torch

from dit_helpers import dit_engine, inputs_for
from ghostedit import EditRequest, OptimizationConfig
from ghostedit import tensors
from ghostedit.device import UnavailableOptionError
from ghostedit.optimize import cuda_graphs, registry
from ghostedit.telemetry import RunRecorder

GRAPHED = OptimizationConfig(rewrites=("cuda-graph",))


class ReplayingCapture:
    """A CPU stand-in for CudaCapture: the outputs live in fixed tensors, and a replay recomputes them from the
    held inputs the loop closes over (a wrapper that forgot to copy new inputs in would replay stale ones)."""

    warming = contextlib.nullcontext

    def capture(self, loop, pool):
        outputs = loop()

        def replay():
            for held, new in zip(outputs, loop()):
                held.copy_(new)
        return replay, outputs, pool


@pytest.fixture(scope="module")
def prepared():
    prepared, _ = dit_engine().prepare(OptimizationConfig())
    return prepared


def forwards(prepared, graphs, inputs_list, owner=("stock", None)):
    with torch.no_grad(), graphs.running(owner, RunRecorder("cpu")), cuda_graphs.graphed(prepared.pipe, graphs):
        return [prepared.pipe.model_fn(dit=prepared.dit, **inputs) for inputs in inputs_list]


def varied(inputs: dict, seed: int) -> dict:
    generator = torch.Generator().manual_seed(seed)
    return {**inputs, "latents": torch.randn(inputs["latents"].shape, generator=generator),
            "timestep": torch.tensor([100.0 * seed])}


def test_the_flag_is_a_lossless_run_time_rewrite_unavailable_on_a_cpu():
    toggle = registry.get("cuda-graph")
    assert toggle.group == "rewrites" and toggle.changes == registry.RUN
    assert GRAPHED.cache_key == OptimizationConfig().cache_key  # the same prepared pipeline
    assert "cuda-graph" not in GRAPHED.prepared_label and not GRAPHED.lossy
    assert "CUDA GPU" in registry.availability(toggle, registry.ON, "cpu").reason


def test_a_cpu_engine_refuses_it_with_the_reason(engine, house):
    request = EditRequest(images=[house], prompt="make it night", width=64, height=64, steps=2)
    with pytest.raises(UnavailableOptionError, match="CUDA GPU"):
        engine.run(request, GRAPHED)


def test_replays_give_the_loops_result_for_each_forwards_own_inputs(prepared):
    inputs = inputs_for(dit_engine())
    series = [varied(inputs, seed) for seed in range(1, 5)]
    with torch.no_grad():
        expected = [prepared.pipe.model_fn(dit=prepared.dit, **each) for each in series]
    graphs = cuda_graphs.ShapeGraphs(ReplayingCapture())
    outputs = forwards(prepared, graphs, series)
    assert (graphs.forwards, graphs.captured, graphs.replayed) == (4, 1, 3)  # warmed, captured, then replayed
    for output, reference in zip(outputs, expected):
        torch.testing.assert_close(output, reference, rtol=0, atol=0)
    assert len(prepared.dit.transformer_blocks) > 1  # the DiT's own blocks are back after the forwards
    assert not any(isinstance(block, cuda_graphs._GraphedLoop) for block in prepared.dit.transformer_blocks)


def test_each_shape_is_warmed_then_captured_and_kept_across_runs(prepared):
    graphs = cuda_graphs.ShapeGraphs(ReplayingCapture())
    small, large = inputs_for(dit_engine(), side=64), inputs_for(dit_engine(), side=96)
    forwards(prepared, graphs, [small, large, small, large])
    assert (graphs.captured, graphs.replayed) == (2, 2)
    forwards(prepared, graphs, [small, large])
    assert (graphs.captured, graphs.replayed) == (0, 2)
    assert "2 of 2 DiT forwards replayed" in graphs.words() and "2 shapes held" in graphs.words()


@pytest.mark.parametrize("next_owner", [("stock", object()), ("attention=sdpa-math", None)],
                         ids=["other fused LoRAs", "another configuration"])
def test_other_weights_or_another_configuration_drop_the_graphs(prepared, next_owner):
    graphs = cuda_graphs.ShapeGraphs(ReplayingCapture())
    inputs = inputs_for(dit_engine())
    forwards(prepared, graphs, [inputs, inputs])
    assert graphs.captured == 1
    forwards(prepared, graphs, [inputs, inputs, inputs], owner=next_owner)
    assert (graphs.captured, graphs.replayed) == (1, 2)  # warmed again, then captured again


def test_a_run_says_why_it_cannot_capture(prepared):
    """The step cache, or weights off the device: the run's words say so and the blocks run from Python."""
    cached = OptimizationConfig(rewrites=("cuda-graph",), **{"step-cache": "fbcache-0"})
    assert "the step cache decides" in cuda_graphs.why_not_capturable(prepared.dit, "cpu", cached)
    assert "some of the DiT's weights are on cpu" in cuda_graphs.why_not_capturable(prepared.dit, "cuda:0", GRAPHED)
    assert cuda_graphs.why_not_capturable(prepared.dit, "cpu", GRAPHED) is None



def test_where_a_modules_weights_lie_is_kept_until_the_module_moves(monkeypatch):
    """tensors.devices walks a module's tensors once and keeps the answer while its first tensor stays put: every
    edit asks it of the DiT's blocks and the text encoder."""
    module = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 4))
    walks = []
    module_tensors = tensors.module_tensors
    monkeypatch.setattr(tensors, "module_tensors", lambda m: walks.append(1) or module_tensors(m))
    assert tensors.devices(module) == {torch.device("cpu")} and tensors.devices(module) == {torch.device("cpu")}
    assert len(walks) == 1
    module.to("meta")
    assert tensors.devices(module) == {torch.device("meta")} and len(walks) == 2


def test_the_dit_graphs_outlive_a_change_of_the_encoders_settings_not_of_the_dits(prepared):
    """Their owner is the configuration's DiT settings: another text-encoder or VAE choice replays the same graphs,
    another attention backend (which a graph replays as captured) drops them."""
    owner = cuda_graphs.owner(GRAPHED, prepared)
    assert cuda_graphs.owner(GRAPHED.replace(vae="image", **{"text-encoder": "joined-windows"}), prepared) == owner
    assert cuda_graphs.owner(GRAPHED.replace(attention="sdpa-math"), prepared) != owner
