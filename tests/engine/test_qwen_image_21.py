"""Qwen-Image-2.1 in GhostEdit on the CPU: the embedded tiny 2.1 and Turbo through the engine (text-to-image, up to
10 references, RGBA in and out, the prefix cache's tokens in the telemetry), the DiT against diffusers' transformer
at every attention backend with and without the prefix cache, and the refusals that say why (toggles written for
the Edit DiT, Turbo's fixed steps, sizes, image counts). diffusers' whole pipeline is held against GhostEdit's in
test_reference.py."""
from __future__ import annotations

import glob

import numpy as np
import pytest
import torch
from PIL import Image

from qwen21_loras import LORA_TARGETS, qwen21_lora_file
from ghostedit.config import EditRequest, OptimizationConfig
from ghostedit.device import UnavailableOptionError
from ghostedit.errors import InvalidRequestError


@pytest.fixture(scope="module")
def engine():
    from ghostedit.engine import Engine
    return Engine("tiny-2.1", device="cpu")


def _transparent(size=(96, 64)) -> Image.Image:
    """An RGBA image whose left half is fully transparent."""
    pixels = np.zeros((size[1], size[0], 4), dtype=np.uint8)
    pixels[..., :3] = np.random.default_rng(0).integers(0, 255, (size[1], size[0], 3))
    pixels[:, size[0] // 2:, 3] = 255
    return Image.fromarray(pixels, "RGBA")


def test_text_to_image_without_an_input_image(engine):
    result = engine.run(EditRequest(images=[], prompt="a lighthouse at dusk", steps=2, cfg_scale=1.0))
    assert result.family.name == "tiny-2.1" and result.image.size == (256, 256)
    assert result.image.mode == "RGBA" and result.inputs == []
    tokens = result.telemetry.dit_tokens
    assert len(tokens) == 2 and tokens[1] == 256 < tokens[0], "from the cache, the target's 16x16 tokens alone"


def test_ten_transparent_references_keep_their_alpha_and_the_cache_computes_the_target_alone(engine):
    image = _transparent()
    request = EditRequest(images=[image] * 10, prompt="put them together", steps=2, cfg_scale=1.0, keep_alpha=True)
    assert request.images[0].mode == "RGBA", "a transparent input keeps its alpha for 2.1"
    result = engine.run(request)
    assert result.image.mode == "RGBA" and len(result.inputs) == 10
    width, height = result.image.size
    assert width % 32 == 0 and height % 32 == 0 and width > height, "the size follows the last reference"
    first, cached = result.telemetry.dit_tokens
    assert cached == width * height // 256 and first > 10 * cached, (first, cached)
    off = engine.run(request, OptimizationConfig(**{"prefix-cache": "off"}))
    assert off.telemetry.dit_tokens == [first, first]


def test_turbo_runs_its_fixed_sigmas_and_refuses_other_step_counts():
    from ghostedit.engine import Engine
    turbo = Engine("tiny-2.1-turbo", device="cpu")
    assert turbo.spec.default_steps == 8
    with pytest.raises(InvalidRequestError, match="8 fixed sigmas"):
        turbo.run(EditRequest(images=[], prompt="a cat", steps=4, cfg_scale=1.0, width=64, height=64))
    result = turbo.run(EditRequest(images=[], prompt="a cat", steps=8, cfg_scale=1.0, width=64, height=64))
    assert len(result.telemetry.step_seconds) == 8
    (prepared,) = turbo.cache.view()
    assert [round(float(sigma), 6) for sigma in prepared.pipe.scheduler.sigmas] == list(turbo.family.sample_sigmas), \
        "Turbo's sigmas as its model_index.json gives them (shift 1)"


@pytest.mark.parametrize("setting, choice, words", [
    ("text-encoder", "joined-windows", "Qwen3-VL, has no windowed attention"),
    ("vae", "image", "already runs a lone frame as 2-D convolutions"),
])
def test_a_toggle_written_for_the_edit_dit_is_refused_on_2_1_with_its_reason(engine, setting, choice, words):
    value = (choice,) if setting == "rewrites" else choice
    with pytest.raises(UnavailableOptionError, match=words):
        engine.check(OptimizationConfig(**{setting: value}))
    assert words in engine.options()[setting][choice].reason


def test_the_prefix_cache_is_2_1_s_and_an_edit_model_refuses_turning_it_off():
    from ghostedit.engine import Engine
    edit = Engine("tiny", device="cpu")
    with pytest.raises(UnavailableOptionError, match="no token's keys stay the same"):
        edit.check(OptimizationConfig(**{"prefix-cache": "off"}))
    with pytest.raises(InvalidRequestError, match="takes 1 to 3 input images; got 0"):
        edit.run(EditRequest(images=[], prompt="a cat", steps=1))


@pytest.mark.parametrize("request_fields, message", [
    (dict(width=80, height=64), "multiples of 32"),
])
def test_2_1_request_refusals(engine, request_fields, message):
    with pytest.raises(InvalidRequestError, match=message):
        engine.run(EditRequest(images=[], prompt="a cat", steps=1, cfg_scale=1.0, **request_fields))


# ---- the DiT against diffusers' transformer ----

@pytest.fixture(scope="module")
def transformers(tmp_path_factory):
    """diffusers' QwenImage21Transformer2DModel and GhostEdit's DiT over one tiny checkpoint, in float32."""
    from diffusers import QwenImage21Transformer2DModel
    from reference_checkpoints import _build_transformer_21
    from safetensors.torch import load_file

    from ghostedit.models.qwen_image_21 import tiny
    from ghostedit.models.qwen_image_21.dit import QwenImage21DiT

    folder = tmp_path_factory.mktemp("transformer-21")
    _build_transformer_21(folder, seed=5)
    reference = QwenImage21Transformer2DModel.from_pretrained(str(folder), torch_dtype=torch.float32)
    ours = QwenImage21DiT(**tiny.TRANSFORMER)
    ours.load_state_dict({k: v.float() for f in glob.glob(str(folder / "*.safetensors"))
                          for k, v in load_file(f).items()})
    return reference, ours


@pytest.mark.parametrize("backend", ["diffsynth", "sdpa-math", "sdpa-flash", "flex"])
def test_the_dit_matches_diffusers_with_and_without_the_prefix_cache(transformers, backend):
    """Two references and text around them (the block-causal segments), three steps: the prefix cache filled at the
    first and read at the others, against diffusers' own KV cache."""
    from diffusers.models.transformers.transformer_qwenimage21 import QwenImage21KVCache

    from ghostedit.models.qwen_image_21.dit import layout, step_forward
    from ghostedit.models.seams import DitOptions, PrefixKVCache

    reference, ours = transformers
    generator = torch.Generator().manual_seed(0)
    slots = torch.zeros(1, 16, dtype=torch.bool)
    slots[0, 5:7] = slots[0, 10:14] = True
    image_mask = torch.cat([slots, torch.ones(1, 6, dtype=torch.bool)], 1)
    shapes = [(1, 2, 4), (1, 4, 4), (1, 4, 6)]
    prompt = torch.randn(1, 16, 64, generator=generator)
    latents = torch.randn(1, 48, 64, generator=generator)
    options = DitOptions(attention=backend)
    layout_ = layout(image_mask, shapes, None, ours.rope, "cpu", options)
    theirs_cache, our_cache = QwenImage21KVCache(2), PrefixKVCache()
    with torch.no_grad():
        for step, t in enumerate((0.9, 0.5, 0.2)):
            expected = reference(hidden_states=latents, encoder_hidden_states=prompt, timestep=torch.tensor([t]),
                                 img_shapes=[shapes], img_mask=image_mask, kv_cache=theirs_cache,
                                 kv_cache_mode="extract" if step == 0 else "cached", return_dict=False)[0][:, -24:]
            cached, _ = step_forward(ours, latents, prompt, torch.tensor([t]), layout_, step,
                                     options.replace(prefix_cache=our_cache))
            uncached = ours(latents, prompt, torch.tensor([t]), layout_, options)
            exact = backend in ("diffsynth", "sdpa-flash")  # the kernel diffusers' SDPA runs here
            torch.testing.assert_close(cached, expected, rtol=0 if exact else 1e-5, atol=0 if exact else 1e-5)
            if backend == "flex":  # from the cache, no block structure is left: SDPA's kernel, not flex's
                torch.testing.assert_close(cached, uncached, rtol=1e-5, atol=1e-5)
            else:
                assert torch.equal(cached, uncached), "the cache changes what is computed, not the result (float32)"
            latents = torch.cat([latents[:, :24], torch.randn(1, 24, 64, generator=generator)], 1)
    assert our_cache.summary() == {"branches": 1, "tokens_computed": [58, 24, 24]}


@pytest.mark.parametrize("rewrite", ["real_rope", "fused_qkv"])
def test_a_rewrite_computes_the_released_forward_bit_for_bit_with_and_without_the_prefix_cache(transformers,
                                                                                               rewrite):
    """real_rope (the rotary factors as real cos and sin) and fused_qkv (q, k and v from one joined projection),
    on three steps of a layout with two references: the prefix cache filled and read, float32."""
    import copy

    from ghostedit.models.qwen_image_21.dit import layout, step_forward
    from ghostedit.models.seams import DitOptions, PrefixKVCache
    from ghostedit.optimize import rewrites

    _, ours = transformers
    rewritten = copy.deepcopy(ours)
    if rewrite == "fused_qkv":
        assert rewrites.fuse_qkv(rewritten) == len(ours.blocks)
        assert not hasattr(rewritten.blocks[0].attn, "to_q")
    generator = torch.Generator().manual_seed(1)
    slots = torch.zeros(1, 16, dtype=torch.bool)
    slots[0, 5:7] = slots[0, 10:14] = True
    image_mask = torch.cat([slots, torch.ones(1, 6, dtype=torch.bool)], 1)
    shapes = [(1, 2, 4), (1, 4, 4), (1, 4, 6)]
    prompt, latents = torch.randn(1, 16, 64, generator=generator), torch.randn(1, 48, 64, generator=generator)
    stock, options = DitOptions(), DitOptions(**{rewrite: True})
    layouts = [layout(image_mask, shapes, None, ours.rope, "cpu", each) for each in (stock, options)]
    caches = [PrefixKVCache(), PrefixKVCache()]
    with torch.no_grad():
        for step, t in enumerate((0.9, 0.5, 0.2)):
            expected, _ = step_forward(ours, latents, prompt, torch.tensor([t]), layouts[0], step,
                                       stock.replace(prefix_cache=caches[0]))
            output, _ = step_forward(rewritten, latents, prompt, torch.tensor([t]), layouts[1], step,
                                     options.replace(prefix_cache=caches[1]))
            assert torch.equal(output, expected), step
            assert torch.equal(rewritten(latents, prompt, torch.tensor([t]), layouts[1], options),
                               ours(latents, prompt, torch.tensor([t]), layouts[0], stock))
            latents = torch.cat([latents[:, :24], torch.randn(1, 24, 64, generator=generator)], 1)


def test_every_toggle_says_whether_it_applies_to_2_1():
    """Each toggle applies to 2.1's DiT or gives a reason; the ones that apply: attention (SDPA's kernels, flex, the
    FP8 attentions), compile (and its Inductor options), FP8 (torchao), memory placement, the schedule, the prefix
    cache, CUDA graphs, the lossless rewrites real-rope, fused-qkv (with joint-layout, which names 2.1's only
    layout), carried-residual, fused-qk-norm-rope, fp8-attention-out and fused-swiglu-quant (2.1's alone), the step
    cache, the text encoder's (compiled, graphed) and the VAE's (image-fused) choices."""
    from ghostedit.models.family import QWEN_IMAGE_21_DIT
    from ghostedit.optimize import registry

    applying = {toggle.name for toggle in registry.toggles() if QWEN_IMAGE_21_DIT not in toggle.families}
    assert applying == {"attention", "compile", "inductor-cdt", "inductor-multi-kernel", "inductor-persistent-rows",
                        "fp8", "memory", "scheduler", "prefix-cache", "cuda-graph", "real-rope", "fused-qkv",
                        "joint-layout", "carried-residual", "fused-qk-norm-rope", "fp8-attention-out",
                        "fused-swiglu-quant", "step-cache", "text-encoder", "vae"}
    for toggle in registry.toggles():
        reason = toggle.families.get(QWEN_IMAGE_21_DIT)
        assert reason is None or len(reason) > 40, f"{toggle.name}: a reason a person can read"
    options = registry.options("cpu", QWEN_IMAGE_21_DIT)
    assert options["attention"]["flex"].ok and not options["attention"]["fa3"].ok
    assert registry.family_availability(registry.get("attention"), "cudnn-fp8", QWEN_IMAGE_21_DIT).ok
    te = registry.family_availability(registry.get("fp8"), "te", QWEN_IMAGE_21_DIT)
    assert not te.ok and "torchao" in te.reason


# ---- LoRAs in the key formats published for 2.1 ----



@pytest.mark.parametrize("style", ["diffusers", "diffsynth", "comfyui"])
def test_a_2_1_lora_applies_fused_and_at_runtime_in_each_published_format(engine, tmp_path, style):
    from ghostedit.config import LoraChoice

    path = qwen21_lora_file(tmp_path, style)
    request = EditRequest(images=[], prompt="a cat", steps=2, cfg_scale=1.0, width=64, height=64)
    plain = np.asarray(engine.run(request).image, dtype=np.int16)
    images = {}
    for mode in ("fused", "runtime"):
        result = engine.run(request, OptimizationConfig(loras=[LoraChoice.from_file(path, 1.0, mode)]))
        (lora,) = result.telemetry.loras
        assert lora["layers_matched"] == 2 * len(LORA_TARGETS) and lora["keys_not_applied"] == 0, lora
        images[mode] = np.asarray(result.image, dtype=np.int16)
    assert np.abs(images["fused"] - plain).mean() > 5, "the LoRA changes the image"
    assert np.abs(images["fused"] - images["runtime"]).mean() < 2, "fused and runtime are the same LoRA"


def test_the_licence_is_shown_for_real_2_1_weights_on_the_page_and_not_for_the_embedded_model(engine):
    from ghostedit.engine import Engine
    from ghostedit.models.qwen_image_21.tiny import ensure_tiny_model
    from ghostedit.ui.hub import model_words

    folder = Engine(str(ensure_tiny_model(turbo=True)), device="cpu")
    assert "Qwen-Image-2.1-Turbo is released under the **Qwen Research License (non-commercial use only)**" in \
        model_words(folder)
    assert "Licen" not in model_words(engine) and engine.spec.licence is None


def test_compiled_blocks_run_one_graph_to_fill_the_cache_and_one_for_every_cached_step():
    """Regional compile of the 2.1 DiT: the cache-filling first step and the cached steps are two graphs, shared by
    the blocks, and the steps after the second compile nothing (no recompiles across steps, no graph breaks)."""
    from torch._dynamo.utils import counters

    from ghostedit.models.qwen_image_21 import tiny
    from ghostedit.models.qwen_image_21.dit import QwenImage21DiT, layout, step_forward
    from ghostedit.models.seams import DitOptions, PrefixKVCache
    from ghostedit.optimize.compile import compile_regions

    torch._dynamo.reset()
    counters.clear()
    dit = QwenImage21DiT(**tiny.TRANSFORMER).eval()
    compile_regions(dit, "regional")
    slots = torch.zeros(1, 12, dtype=torch.bool)
    slots[0, 5:9] = True
    layout_ = layout(torch.cat([slots, torch.ones(1, 4, dtype=torch.bool)], 1), [(1, 4, 4), (1, 4, 4)], None,
                     dit.rope, "cpu")
    cache, graphs = PrefixKVCache(), []
    with torch.no_grad():
        for step in range(4):
            step_forward(dit, torch.randn(1, 32, 64), torch.randn(1, 12, 64), torch.tensor([0.9 - 0.2 * step]),
                         layout_, step, DitOptions(prefix_cache=cache))
            graphs.append(counters["stats"]["unique_graphs"])
    assert graphs == [1, 2, 2, 2] and not counters["graph_break"], (graphs, dict(counters["graph_break"]))


def test_a_compiled_edit_counts_the_compile_of_both_graphs_as_warm_up(engine):
    """The engine tells the cache-filling forward and the cached ones apart by step before they run: each first
    call, which compiles its graph, is the compile warm-up, left out of its step's time."""
    request = EditRequest(images=[], prompt="a cat", steps=3, cfg_scale=1.0, width=64, height=64)
    first = engine.run(request, OptimizationConfig(compile="regional"))
    assert first.telemetry.warm_up_steps == [0, 1] and first.telemetry.dit_tokens[1] < first.telemetry.dit_tokens[0]
    assert engine.run(request, OptimizationConfig(compile="regional")).telemetry.warm_up_steps == []


def test_a_fused_lora_is_written_into_fused_qkv_s_joined_rows(engine, tmp_path):
    """fused-qkv joins to_q, to_k and to_v; a LoRA published on the three lands in the joined rows: the image of the
    LoRA without the rewrite, every key applied."""
    from ghostedit.config import LoraChoice

    lora = LoraChoice.from_file(qwen21_lora_file(tmp_path, "diffusers"), 1.0, "fused")
    request = EditRequest(images=[], prompt="a cat", steps=2, cfg_scale=1.0, width=64, height=64)
    plain = engine.run(request, OptimizationConfig(loras=[lora]))
    fused = engine.run(request, OptimizationConfig(rewrites=("fused-qkv",), loras=[lora]))
    (applied,) = fused.telemetry.loras
    assert applied["keys_not_applied"] == 0, applied
    difference = np.abs(np.asarray(fused.image, dtype=np.int16) - np.asarray(plain.image, dtype=np.int16))
    assert difference.max() <= 1, difference.max()
