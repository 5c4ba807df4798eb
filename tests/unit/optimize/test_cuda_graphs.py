"""The CUDA-graph flag (`cuda-graph`, ghostedit/optimize/cuda_graphs.py) without a GPU: its declaration (a run-time
rewrite, unavailable on a CPU with the reason, and the reasons a run gives for not capturing), the inputs a graphed
forward takes and what its signature holds, and the graph store's bookkeeping on the tiny DiT through the forward the
pipeline calls (its options holding the graphs), with a stand-in capture that replays by running the captured forward
again on the tensors the graph would read. That checks what a real graph depends on: each replay must
see the new inputs copied into the held tensors, a shape is warmed before it is captured, and other weights or
another configuration drop the graphs. The captured kernels themselves are the GPU's: on the GPU the graphed
forward's output equals the loop's bit for bit (lab/LOG.md, section 1). Qwen-Image-2.1's forward is replayed the
same way, its prefix cache's filling and cached forwards as graphs of their own over tensors kept from edit to
edit."""
import pytest
import torch

from dit_helpers import dit_engine, inputs_for
from qwen21_edits import predictions, references
from stand_ins import ReplayingCapture
from ghostedit.bench.dit import dit_inputs
from ghostedit import EditRequest, OptimizationConfig
from ghostedit import tensors
from ghostedit.device import UnavailableOptionError
from ghostedit.engine import Engine
from ghostedit.models.qwen_image import dit as qwen_image
from ghostedit.models.seams import DitOptions
from ghostedit.optimize import cuda_graphs, registry
from ghostedit.telemetry import RunRecorder

GRAPHED = OptimizationConfig(rewrites=("cuda-graph",))


@pytest.fixture(scope="module")
def prepared():
    prepared, _ = dit_engine().prepare(OptimizationConfig())
    return prepared


def forwards(prepared, graphs, inputs_list, owner=("stock", None)):
    with torch.no_grad(), graphs.running(owner, RunRecorder("cpu")):
        return [prepared.pipe.model_fn(dit=prepared.dit, options=DitOptions(graphs=graphs), **inputs)
                for inputs in inputs_list]


def varied(inputs: dict, seed: int) -> dict:
    generator = torch.Generator().manual_seed(seed)
    edits = inputs["edit_latents"]
    return {**inputs, "latents": torch.randn(inputs["latents"].shape, generator=generator),
            "edit_latents": ([torch.randn(edit.shape, generator=generator) for edit in edits] if isinstance(edits, list)
                             else torch.randn(edits.shape, generator=generator)),
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


@pytest.mark.parametrize("edit_images, zero_cond_t", [(1, False), (3, True)],
                         ids=["one image", "three images, zero_cond_t"])
def test_replays_give_the_forwards_result_for_each_forwards_own_inputs(prepared, edit_images, zero_cond_t):
    """The whole forward's inputs, a list of edit images among them, copied in before each replay; with zero_cond_t
    (2511) the forward builds its modulation index from host values, a constant of the graph."""
    engine = dit_engine()
    inputs = {**dit_inputs(engine.load().dit, 64, 64, 8, "cpu", engine.torch_dtype, edit_images=edit_images),
              "zero_cond_t": zero_cond_t}
    series = [varied(inputs, seed) for seed in range(1, 5)]
    with torch.no_grad():
        expected = [prepared.pipe.model_fn(dit=prepared.dit, **each) for each in series]
    graphs = cuda_graphs.ShapeGraphs(ReplayingCapture())
    outputs = forwards(prepared, graphs, series)
    assert (graphs.forwards, graphs.captured, graphs.replayed) == (4, 1, 3)  # warmed, captured, then replayed
    for output, reference in zip(outputs, expected):
        torch.testing.assert_close(output, reference, rtol=0, atol=0)


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
    """The step cache, weights off the device, or sequence parallel over gloo: the run's words say so and the
    blocks run from Python. Over NCCL the split's collectives are captured with the forward."""
    from types import SimpleNamespace
    cached = OptimizationConfig(rewrites=("cuda-graph",), **{"step-cache": "fbcache-0"})
    assert "the step cache decides" in cuda_graphs.why_not_capturable(prepared.dit, "cpu", cached)
    assert "some of the DiT's weights are on cpu" in cuda_graphs.why_not_capturable(prepared.dit, "cuda:0", GRAPHED)
    assert cuda_graphs.why_not_capturable(prepared.dit, "cpu", GRAPHED) is None
    gloo, nccl = (SimpleNamespace(ulysses_degree=2, backend=backend) for backend in ("gloo", "nccl"))
    assert "over gloo" in cuda_graphs.why_not_capturable(prepared.dit, "cpu", GRAPHED, gloo)
    assert cuda_graphs.why_not_capturable(prepared.dit, "cpu", GRAPHED, nccl) is None



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


def test_a_graphed_forward_takes_the_inputs_it_computes_and_refuses_what_it_does_not(prepared):
    """DiffSynth hands model_fn the pipeline's whole state: a graph's signature holds only the inputs the forward
    computes (the step's index would give each step a graph of its own); what it does not compute is refused."""
    inputs = {"latents": torch.zeros(1), "height": 64, "progress_id": 3, "num_inference_steps": 40,
              "edit_image": ["a PIL image"], "cfg_scale": 4.0}
    assert qwen_image.forward_inputs(inputs) == {"latents": inputs["latents"], "height": 64}
    for name in qwen_image.NOT_COMPUTED:
        with pytest.raises(NotImplementedError, match="does not compute"):
            qwen_image.forward_inputs({**inputs, name: torch.zeros(1)})


def test_the_graphs_of_a_dit_do_not_keep_it_alive(prepared):
    """The store keeps a DiT's graphs as long as the DiT lives (graphs_of: a weak key): nothing in them may refer
    to the DiT, or neither would ever be freed (preparing another configuration would run out of GPU memory)."""
    graphs = cuda_graphs.ShapeGraphs(ReplayingCapture())
    inputs = inputs_for(dit_engine())
    forwards(prepared, graphs, [inputs, inputs, inputs])
    assert graphs.captured == 1 and not _reaches(graphs, prepared.dit)


def _reaches(start, target, depth: int = 6) -> bool:
    """Whether `target` is reachable from `start` through containers and plain objects' attributes."""
    import gc
    seen, frontier = set(), [start]
    for _ in range(depth):
        found = []
        for node in frontier:
            for referent in gc.get_referents(node):
                if referent is target:
                    return True
                if id(referent) not in seen and isinstance(referent, (tuple, list, dict, object)) and \
                        not isinstance(referent, (type, torch.Tensor, str, int, float)):
                    seen.add(id(referent))
                    found.append(referent)
        frontier = found
    return False


def test_a_gpu_graphs_signature_holds_the_values_python_reads_off_host_tensors():
    """A graph holds what the forward read in Python at capture (DiffSynth reads the prompt's length off its mask,
    kept in host memory): two masks of one shape and other lengths are two graphs; device tensors go by their make."""
    def key(leaf, graph_device="cuda"):
        return cuda_graphs._leaf_key(leaf, graph_device)
    mask, shorter = torch.ones(1, 8, dtype=torch.bool), torch.ones(1, 8, dtype=torch.bool)
    shorter[0, 6:] = False
    assert key(mask) == key(mask.clone()) and key(mask) != key(shorter)
    assert key(mask, "cpu") == key(shorter, "cpu")  # on a CPU the host is the device


def test_a_split_forward_has_graphs_of_its_own(prepared):
    """The same inputs with and without a sequence split run different kernels (the split's all-to-alls and its
    shard's shapes): the forward names its graphs by its split, and a graph captured under one name is never
    replayed under another."""
    class NamedGraphs:
        names = []

        def run(self, function, inputs, name=None):
            self.names.append(name)
            return "not run"
    split = object()  # a stand-in for parallel.ulysses.Ulysses (frozen, hashable)
    inputs = inputs_for(dit_engine(), side=64)
    assert prepared.pipe.model_fn(dit=prepared.dit, options=DitOptions(graphs=NamedGraphs(), sequence_split=split),
                                  **inputs) == "not run"
    assert NamedGraphs.names == [split]
    graphs = cuda_graphs.ShapeGraphs(ReplayingCapture())
    held = {"latents": torch.ones(2, 3)}
    with torch.no_grad(), graphs.running(("stock", None), RunRecorder("cpu")):
        outputs = [graphs.run(lambda given: given["latents"] * 2, held, name=name)
                   for name in (None, None, split, split, None, split)]
    assert all(torch.equal(output, torch.full((2, 3), 2.0)) for output in outputs)
    assert (graphs.captured, graphs.replayed) == (2, 4) and "2 shapes held" in graphs.words()


# ---- Qwen-Image-2.1: each step's whole forward, the prefix cache's filling and cached forwards apart ----

@pytest.fixture(scope="module")
def prepared_21():
    prepared, _ = Engine("tiny-2.1", device="cpu", dtype="float32").prepare(OptimizationConfig())
    return prepared


@pytest.mark.parametrize("prefix_cache", [True, False], ids=["prefix cache", "no prefix cache"])
@pytest.mark.parametrize("count", [0, 1, 3], ids=["text-to-image", "one reference", "three references"])
def test_2_1_replays_give_the_eager_forwards_bit_for_bit_edit_after_edit(prepared_21, count, prefix_cache):
    """A first edit warms and captures; the next, with other references and noise of the same shapes, replays its
    graphs: with the prefix cache, its filling forward's graph writes the kept tensors the cached forwards' graph,
    captured in the edit before, reads."""
    graphs = cuda_graphs.ShapeGraphs(ReplayingCapture())
    counts, addresses = [], []
    for variant, seed in ((0, 1), (1, 2)):
        images = references(count, variant)
        expected = predictions(prepared_21, images, seed, prefix_cache)
        replayed = predictions(prepared_21, images, seed, prefix_cache, graphs)
        for output, reference in zip(replayed, expected, strict=True):
            torch.testing.assert_close(output, reference, rtol=0, atol=0)
        counts.append((graphs.captured, graphs.replayed))
        # the stand-in reads the cache in Python at each replay; a real graph reads the addresses it captured
        addresses.append({key: [t.data_ptr() for kv in blocks.values() for t in kv]
                          for key, blocks in graphs.kept.items()})
    if prefix_cache:  # the filling forward warmed, the cached ones warmed, captured, replayed; then all replayed
        assert counts == [(1, 2), (1, 4)] and len(graphs.kept) == 1
        assert addresses[0] == addresses[1], "the next edit fills the tensors the captured graph reads"
    else:
        assert counts == [(1, 3), (0, 4)] and not graphs.kept
