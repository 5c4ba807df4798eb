"""`text-encoder=graphed` without a GPU: each text-encoder layer routed through ShapeGraphs on the tiny model, with the
stand-in capture of tests/unit/optimize/test_cuda_graphs.py (a replay recomputes the layer from the tensors the graph holds, so a
replay that missed its new inputs would give stale ones). The kernels themselves are the GPU's."""
import pytest
import torch
from PIL import Image

from ghostedit import EditRequest, OptimizationConfig
from ghostedit.device import UnavailableOptionError
from ghostedit.engine import Engine
from ghostedit.models import exact
from ghostedit.optimize import registry, text_encoder_graphs, vision_windows
from ghostedit.optimize.cuda_graphs import ShapeGraphs
from ghostedit.telemetry import RunRecorder
from stand_ins import ReplayingCapture


@pytest.fixture(scope="module")
def pipe():
    return Engine("tiny", device="cpu").load()


def prompt_embedding(pipe, prompt: str, image: Image.Image) -> torch.Tensor:
    with torch.no_grad():
        return exact.PromptEmbedder(pipe.family).process(pipe, prompt, edit_image=[image])["prompt_emb"]


def test_graphed_layers_give_the_released_embedding_warmed_then_captured_then_replayed(pipe, house):
    layers = len(text_encoder_graphs.regions(pipe.text_encoder))
    prompts = ["make it a haunted house", "make it night", "make it a haunted house"]
    with vision_windows.joined_windows(pipe.text_encoder):
        expected = [prompt_embedding(pipe, prompt, house) for prompt in prompts]
    graphs = ShapeGraphs(ReplayingCapture(), what="text-encoder layer calls replayed", limit=8 * layers,
                         capture_at_first_call=True)
    counts = []
    with vision_windows.joined_windows(pipe.text_encoder), \
            text_encoder_graphs.graphed_layers(pipe.text_encoder, graphs):
        for prompt, reference in zip([*prompts, *prompts], [*expected, *expected]):
            with graphs.running((0, None), RunRecorder("cpu")):
                torch.testing.assert_close(prompt_embedding(pipe, prompt, house), reference, rtol=0, atol=0)
                counts.append((graphs.captured, graphs.replayed))
    # two prompt lengths: each shape is warmed and captured in the edit that first brings it (the vision blocks'
    # one shape and the first prompt's length in the first edit, the second prompt's length in the second), then
    # replayed
    language = len(pipe.text_encoder.model.language_model.layers)
    assert counts == [(layers, 0), (language, layers - language), *[(0, layers)] * 4]
    assert not any("forward" in vars(layer) for layer in text_encoder_graphs.regions(pipe.text_encoder))


def test_graphed_is_a_gpu_choice_that_a_cpu_refuses_with_the_reason(engine, house):
    toggle = registry.get("text-encoder")
    assert "CUDA GPU" in registry.availability(toggle, "graphed", "cpu").reason
    request = EditRequest(images=[house], prompt="make it night", width=64, height=64, steps=2)
    with pytest.raises(UnavailableOptionError, match="CUDA GPU"):
        engine.run(request, OptimizationConfig(**{"text-encoder": "graphed"}))


def test_a_streamed_text_encoder_runs_graphed_as_joined_windows_and_says_so(pipe):
    """Streamed layer by layer (memory mode low), the weights are not on the device for a graph to read: the run
    says so in its words and notes and joins the vision windows only, as cuda-graph does for a streamed DiT."""
    from types import SimpleNamespace

    from ghostedit.optimize.registry import RunContext
    from ghostedit.optimize.toggles import text_encoder as toggle
    recorder = SimpleNamespace(telemetry=SimpleNamespace(notes=[]))
    context = RunContext(prepared=SimpleNamespace(pipe=pipe), config=None, device="cuda", sequence_length=0,
                         recorder=recorder)
    visual = pipe.text_encoder.model.visual
    with toggle._text_encoder(context, "graphed"):   # a CPU text encoder: as a streamed one on a GPU machine
        assert visual.config._attn_implementation == vision_windows.NAME
        assert not any("forward" in vars(layer) for layer in text_encoder_graphs.regions(pipe.text_encoder))
    assert "graphs not applied on this run: the text encoder is streamed" in context.ran["words"]["text-encoder"]
    assert recorder.telemetry.notes and visual.config._attn_implementation == "sdpa"
