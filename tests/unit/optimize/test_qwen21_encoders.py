"""Qwen-Image-2.1's text encoder (Qwen3-VL) and VAE (QwenImage21VAE) under the `text-encoder` and `vae` toggles, on
the tiny 2.1 on the CPU: what the registry declares for the family; `compiled` gives the eager prompt embedding to
float32 rounding and compiles once; `graphed` routes every decoder layer and vision block through ShapeGraphs (the
CPU stand-in capture of tests/unit/optimize/test_cuda_graphs.py) and gives the eager embedding bit for bit;
`image-fused` without its kernels gives the released VAE's bits (its kernels in Triton's interpreter:
tests/unit/optimize/test_vae.py). The graphs' kernels on the GPU: tests/gpu/test_text_encoder_graph_check.py."""
import copy
from types import SimpleNamespace

import pytest
import torch
from diffsynth.pipelines.qwen_image_21 import QwenImage21Unit_PromptEmbedder
from torch._dynamo.utils import counters

from ghostedit.engine import Engine
from ghostedit.models.family import QWEN_IMAGE_21_DIT, QWEN_IMAGE_DIT
from ghostedit.optimize import registry, text_encoder_graphs, vae_frames, vision_windows
from ghostedit.optimize.cuda_graphs import ShapeGraphs
from ghostedit.optimize.toggles import text_encoder as text_encoder_toggle
from ghostedit.telemetry import RunRecorder
from stand_ins import ReplayingCapture


@pytest.fixture(scope="module")
def pipe():
    return Engine("tiny-2.1", device="cpu", dtype="float32").load()


def _cases(house):
    """Prompts as the 2.1 pipeline encodes them: one reference, two of different sizes, none (text-to-image)."""
    return [("make it a haunted house", [house]), ("night", [house, house.resize((96, 64))]), ("a cat", None)]


def prompt_embedding(pipe, prompt: str, images) -> torch.Tensor:
    with torch.no_grad():
        return QwenImage21Unit_PromptEmbedder().process(pipe, prompt, edit_image=images)["prompt_embeds"]


def _context(pipe, device="cpu"):
    recorder = SimpleNamespace(telemetry=SimpleNamespace(notes=[]))
    return SimpleNamespace(prepared=SimpleNamespace(pipe=pipe), device=device, recorder=recorder, ran={},
                           not_applied=lambda toggle, words: SimpleNamespace())


def test_the_registry_declares_the_encoder_choices_for_2_1_with_their_reasons():
    edit, qwen21 = registry.options("cpu", QWEN_IMAGE_DIT), registry.options("cpu", QWEN_IMAGE_21_DIT)
    assert qwen21["text-encoder"]["compiled"].ok
    assert "CUDA GPU" in qwen21["text-encoder"]["graphed"].reason   # this machine's reason, not the family's
    assert registry.family_availability(registry.get("text-encoder"), "graphed", QWEN_IMAGE_21_DIT).ok
    assert "has no windowed attention" in qwen21["text-encoder"]["joined-windows"].reason
    assert "nn.Conv2d" in qwen21["vae"]["image"].reason
    assert "CUDA" in qwen21["vae"]["image-fused"].reason
    assert registry.family_availability(registry.get("vae"), "image-fused", QWEN_IMAGE_21_DIT).ok
    assert edit["text-encoder"]["joined-windows"].ok and edit["vae"]["image"].ok   # the Edit family's, unchanged


def test_the_text_encoders_layers_are_found_by_structure(pipe):
    model = pipe.text_encoder.model.model   # DiffSynth's wrapper > Qwen3VLForConditionalGeneration > Qwen3VLModel
    assert text_encoder_graphs.regions(pipe.text_encoder) == [*model.language_model.layers, *model.visual.blocks]
    assert not vision_windows.has_windows(pipe.text_encoder)
    assert vision_windows.has_windows(Engine("tiny", device="cpu").load().text_encoder)   # Qwen2.5-VL's
    with pytest.raises(ValueError, match="no windowed attention"):
        with vision_windows.joined_windows(pipe.text_encoder):
            pass


def test_a_compiled_2_1_text_encoder_gives_the_eager_embedding_and_compiles_once(pipe, house):
    cases = _cases(house)
    eager = [prompt_embedding(pipe, prompt, images) for prompt, images in cases]
    context = _context(pipe)
    with text_encoder_toggle._text_encoder(context, "compiled"):
        compiled = [prompt_embedding(pipe, prompt, images) for prompt, images in cases]
    frames = counters["frames"]["total"]
    with text_encoder_toggle._text_encoder(context, "compiled"):
        again = [prompt_embedding(pipe, prompt, images) for prompt, images in cases]
    assert counters["frames"]["total"] == frames   # nothing compiled a second time
    for each, reference in zip([*compiled, *again], [*eager, *eager]):
        assert each.shape == reference.shape
        assert float((each - reference).norm() / reference.norm()) < 1e-5
    assert all(layer._compiled_call_impl is None for layer in text_encoder_graphs.regions(pipe.text_encoder))


def test_graphed_2_1_layers_give_the_eager_embedding_warmed_then_captured_then_replayed(pipe, house):
    cases = _cases(house)
    expected = [prompt_embedding(pipe, prompt, images) for prompt, images in cases]
    layers = text_encoder_graphs.regions(pipe.text_encoder)
    language = len(text_encoder_graphs.language_model(pipe.text_encoder).layers)
    graphs = ShapeGraphs(ReplayingCapture(), limit=8 * len(layers), capture_at_first_call=True)
    counts = []
    with text_encoder_graphs.graphed_layers(pipe.text_encoder, graphs):
        for _ in range(2):
            with graphs.running((0, None), RunRecorder("cpu")):
                for (prompt, images), reference in zip(cases, expected):
                    torch.testing.assert_close(prompt_embedding(pipe, prompt, images), reference, rtol=0, atol=0)
                counts.append((graphs.captured, graphs.replayed))
    # first edits: each prompt length's decoder layers and each set of images' vision blocks captured once; the
    # text-to-image prompt has no vision pass; then every call replays
    captured = 3 * language + 2 * (len(layers) - language)
    assert counts == [(captured, 0), (0, captured)]
    assert not any("forward" in vars(layer) for layer in layers)


def test_a_graphed_vision_block_is_handed_the_images_boundaries_on_the_host_once_per_forward(pipe):
    """transformers' SDPA path reads each image's length back to split the attention per image: a graph is handed
    them on the host (copied once for all the blocks of one forward), a flash-named attention keeps them where
    they are."""
    copies = []
    boundaries = SimpleNamespace(device=torch.device("cuda"),
                                 cpu=lambda: copies.append(1) or torch.tensor([0, 16, 40], dtype=torch.int32))
    config = SimpleNamespace(_attn_implementation="sdpa")
    handed = text_encoder_graphs._boundaries_on_host(config)
    for _ in range(3):   # a forward's blocks
        kwargs = handed({"cu_seqlens": boundaries, "max_seqlen": None})
    assert copies == [1] and kwargs["cu_seqlens"].tolist() == [0, 16, 40] and kwargs["max_seqlen"] is None
    config._attn_implementation = vision_windows.NAME
    assert handed({"cu_seqlens": boundaries})["cu_seqlens"] is boundaries


def test_a_streamed_2_1_text_encoder_runs_graphed_as_eager_and_says_so(pipe):
    context = _context(pipe, device="cuda")   # a CPU text encoder: as a streamed one on a GPU machine
    said = []
    context.not_applied = lambda toggle, words: said.append(words)
    with text_encoder_toggle._text_encoder(context, "graphed"):
        assert not any("forward" in vars(layer) for layer in text_encoder_graphs.regions(pipe.text_encoder))
    assert said and "the text encoder is streamed" in said[0] and said[0].endswith("it runs eager")


# ---- the VAE ----

def test_the_2_1_vae_has_its_convolutions_2d_already_and_fused_norms_fall_back_to_the_released_bits(pipe):
    """On a CPU (no Triton interpreter) each norm runs as released and applies the SiLU its module no longer does,
    and the upsampling skips its float32 round trip: in bf16 the same bits; the VAE is as it was after."""
    vae = copy.deepcopy(getattr(pipe.vae, "vae", pipe.vae)).to(torch.bfloat16)
    assert vae_frames.already_2d(vae)
    image = (torch.rand(1, 4, 64, 64, generator=torch.Generator().manual_seed(2)) * 2 - 1).to(torch.bfloat16)
    activations = {module: module.nonlinearity for module in vae.modules() if hasattr(module, "nonlinearity")}
    with torch.no_grad(), vae_frames.image_convolutions(vae) as convolutions:
        expected = vae.decode(vae.encode(image))
        with vae_frames.fused_norms(vae) as norms:
            fused = vae.decode(vae.encode(image))
            assert all(isinstance(module.nonlinearity, torch.nn.Identity) for module in activations)
    assert convolutions > 0 and norms > 0 and torch.equal(fused, expected)
    assert all(module.nonlinearity is activation for module, activation in activations.items())
    assert not any("forward" in vars(module) for module in vae.modules())
