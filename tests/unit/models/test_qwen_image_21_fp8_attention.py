"""Qwen-Image-2.1 with an FP8 attention (models/seams.py's FP8 path, attention=cudnn-fp8), on the CPU with cuDNN's
FP8 kernel emulated and recorded (tests/cpu_fp8.py): which spans and steps take the FP8 kernel and which run exact
(a step from the prefix cache: one FP8 call over the cached prefix and the target; the step that fills it: the
reference images' and the target's spans in FP8, the causal text spans through exact SDPA), the scales the kernel
is handed, the refusal of a padded batch of prompts, the registry's declaration for the 2.1 family, whole edits of
the tiny 2.1 against the exact backend, and under Ulysses on two gloo processes the one-process image bit for bit (v's
FP8 scale reduced over the ranks, a cached prefix's values included). The FP8 kernel's own numerics are the GPU's:
tests/gpu/test_qwen21_fp8_attention.py."""
import contextlib
import os

import numpy as np
import pytest
import torch
import torch.multiprocessing
from PIL import Image

import cpu_fp8
from conftest import ASSETS
from gloo_runs import free_port
from ghostedit import EditRequest, OptimizationConfig
from ghostedit.engine import Engine
from ghostedit.kernels import fp8_attention
from ghostedit.models import seams
from ghostedit.models.family import QWEN_IMAGE_21_DIT, QWEN_IMAGE_DIT
from ghostedit.models.qwen_image_21.dit import Rope, layout
from ghostedit.models.seams import DitOptions, Segments
from ghostedit.optimize import registry

FP8 = DitOptions(attention="cudnn-fp8")
# text causal, one reference image, a second text stretch, then the target (tokens 20 to 27)
SPANS = ((0, 6, True), (6, 16, False), (16, 20, True))
LENGTH = 28
LOSSY_LEVELS = 6   # mean 8-bit levels the FP8 attention may move the tiny 2.1's image (as the conformance suite)


@contextlib.contextmanager
def recorded_fp8_kernel():
    """cuDNN's FP8 attention emulated on the CPU, each call's (queries, keys, v's descale) recorded."""
    calls = []
    emulated = fp8_attention.cudnn_fp8_attention

    def recording(q, k, v, q_descale, k_descale, v_descale):
        calls.append((sum(part.shape[1] for part in q), sum(part.shape[1] for part in k), float(v_descale)))
        return cpu_fp8.cudnn_fp8_attention(q, k, v, q_descale, k_descale, v_descale)
    fp8_attention.cudnn_fp8_attention = recording
    try:
        yield calls
    finally:
        fp8_attention.cudnn_fp8_attention = emulated


def _stream(length=LENGTH, seed=0):
    generator = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(1, length, 2, 16, generator=generator) for _ in range(3))


def _relative(output, reference) -> float:
    return float((output - reference).norm() / reference.norm())


# ---- the dispatch at the attention seam ----

def test_a_filling_step_runs_the_unmasked_spans_in_fp8_and_the_causal_text_exact():
    stream = _stream()
    exact = seams.attention([stream], DitOptions(attention="sdpa-math"), mask=Segments(SPANS))
    with recorded_fp8_kernel() as calls:
        output = seams.attention([stream], FP8, mask=Segments(SPANS))
    # the reference image's queries over the keys up to its end, the target's over every key; no text span
    assert [call[:2] for call in calls] == [(10, 16), (8, LENGTH)]
    text = [*range(0, 6), *range(16, 20)]
    assert torch.equal(output[:, text], exact[:, text])   # the causal spans: the exact path's own kernel
    images = [*range(6, 16), *range(20, LENGTH)]
    assert 0 < _relative(output[:, images], exact[:, images]) < 0.08


def test_every_span_reads_v_at_one_given_scale():
    """Under a sequence split the caller hands v's scale reduced over the ranks: each span's kernel gets it."""
    stream = _stream()
    v_scale = fp8_attention.fp8_scale(stream[2].abs().amax() * 2)
    with recorded_fp8_kernel() as calls:
        seams.attention([stream], FP8, mask=Segments(SPANS), fp8_scales=(None, None, v_scale))
    assert [descale for _, _, descale in calls] == [pytest.approx(float(1 / v_scale))] * 2


def test_a_cached_step_attends_over_the_cached_prefix_in_one_fp8_call():
    prefix_stream, target = _stream(20), _stream(8, seed=1)
    exact = seams.attention([target], DitOptions(attention="sdpa-math"), prefix=prefix_stream[1:])
    with recorded_fp8_kernel() as calls:
        output = seams.attention([target], FP8, prefix=prefix_stream[1:])
    assert [call[:2] for call in calls] == [(8, 28)]
    assert 0 < _relative(output, exact) < 0.08


def test_under_a_split_v_is_scaled_over_the_cached_prefix_too():
    """A cached step's v scale covers the prefix's values, whose largest may exceed the target's (else they would
    saturate): the value the split's ranks reduce is the one a process alone casts with."""
    prefix_stream, target = _stream(20), _stream(8, seed=1)
    keys, values = prefix_stream[1:]
    values = values * 10   # the prefix holds the largest value

    class OneRank:  # a split of one rank: its reductions are the identity
        degree, rank = 1, 0

        def all_max(self, x):
            return x

        def attention(self, streams, sharded, attend):
            return attend(streams)
    with recorded_fp8_kernel() as calls:
        seams.attention([target], FP8.replace(sequence_split=OneRank()), prefix=(keys, values), sharded=[True])
        seams.attention([target], FP8, prefix=(keys, values))
    split, alone = (descale for _, _, descale in calls)
    assert split == pytest.approx(alone) == pytest.approx(float(values.abs().amax() / 448))


# ---- a padded batch of prompts is refused ----

def test_a_padded_batch_of_prompts_is_refused_with_its_reason():
    valid = torch.ones(2, LENGTH, dtype=torch.bool)
    valid[1, 4:6] = False
    with pytest.raises(RuntimeError, match="padded prompts in a batch mask their padding keys"):
        seams.attention([tuple(t.expand(2, -1, -1, -1) for t in _stream())], FP8, mask=Segments(SPANS, valid))
    # the 2.1 DiT refuses it where it lays out the sequence, before any step: its mask applies at every step
    image_mask = torch.tensor([[False, False, True]] * 2)
    prompt_mask = torch.tensor([[True, True, True], [True, False, True]])
    rope = Rope([8, 12, 12])
    with pytest.raises(ValueError, match="batch of prompts of different lengths"):
        layout(image_mask, [(1, 2, 2)], prompt_mask, rope, "cpu", FP8)
    assert layout(image_mask, [(1, 2, 2)], prompt_mask, rope, "cpu").segments.key_valid is not None  # exact: runs


# ---- the registry ----

@pytest.mark.parametrize("backend", ["cudnn-fp8", "fa3-fp8"])
def test_the_registry_declares_the_fp8_attentions_for_2_1_with_the_filling_steps_treatment(backend):
    toggle = registry.get("attention")
    for family in (QWEN_IMAGE_21_DIT, QWEN_IMAGE_DIT):
        assert registry.family_availability(toggle, backend, family).ok, family
    help_text = toggle.choice(backend).help
    assert "fills" in help_text and "causal text span exact" in help_text and "refused" in help_text
    here = registry.availability(toggle, backend, "cpu")  # the machine's reason, as the Edit family's
    assert not here.ok and len(here.reason) > 20
    assert not registry.family_availability(toggle, "fa3", QWEN_IMAGE_21_DIT).ok   # still the Edit DiT's alone


# ---- whole edits of the tiny 2.1 ----

def _request(references: int = 1, cfg: float = 1.0) -> EditRequest:
    images = [Image.open(ASSETS / name).convert("RGB") for name in ("house.png", "mountains.png")[:references]]
    return EditRequest(images=images, prompt="ghostly", negative_prompt="daylight", width=64, height=64, steps=2,
                       cfg_scale=cfg, seed=1)


@pytest.fixture(scope="module")
def engine_21():
    return Engine("tiny-2.1", device="cpu", dtype="float32")


def _pixels(image):
    return np.asarray(image, dtype=np.int16)


@pytest.mark.parametrize("cache", ["on", "off"])
def test_a_2_1_edit_with_the_fp8_attention_takes_it_where_no_mask_is_needed(engine_21, cache):
    stock = _pixels(engine_21.run(_request(), OptimizationConfig(**{"prefix-cache": cache})).image)
    with cpu_fp8.gpu_paths_on_the_cpu(), recorded_fp8_kernel() as calls:
        result = engine_21.run(_request(), OptimizationConfig.parse(f"attention=cudnn-fp8,prefix-cache={cache}"))
    filling, cached = result.telemetry.dit_tokens
    target, reference = 16, 256   # 64 x 64 pixels: 4 x 4 latent tokens; the tiny family's area: 16 x 16
    assert (cached == target) == (cache == "on")
    blocks = len(engine_21.load().dit.blocks)
    fills, reads = [reference, target] * blocks, [target] * blocks   # per block: its spans' FP8 calls, in order
    assert [queries for queries, _, _ in calls] == fills + (reads if cache == "on" else fills)
    assert all(keys == filling for queries, keys, _ in calls if queries == target)   # the target: every key
    assert all(reference < keys < filling - target for queries, keys, _ in calls if queries == reference)
    difference = abs(_pixels(result.image) - stock)
    assert 0 < difference.mean() <= LOSSY_LEVELS, difference.mean()


# ---- under Ulysses: two gloo processes ----

def _ulysses_worker(rank: int, world_size: int, port: int, out_dir: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank),
                      WORLD_SIZE=str(world_size))
    torch.set_num_threads(1)
    from ghostedit.parallel import mesh as meshes
    results = {}
    try:
        mesh = meshes.setup("ulysses", True, "cpu")
        engine = Engine("tiny-2.1", device="cpu", dtype="float32")
        with cpu_fp8.gpu_paths_on_the_cpu():
            for cache in ("on", "off"):
                config = OptimizationConfig.parse(f"attention=cudnn-fp8,prefix-cache={cache}")
                images = []
                for each in (None, mesh):
                    engine.mesh = each
                    images.append(engine.run(_request(2, 4.0), config).image.tobytes())
                results[cache] = images[0] == images[1]
    finally:
        meshes.teardown()
    torch.save(results, f"{out_dir}/rank{rank}.pt")


def test_under_ulysses_a_2_1_edit_with_the_fp8_attention_is_the_one_process_edit_bit_for_bit(tmp_path):
    torch.multiprocessing.spawn(_ulysses_worker, args=(2, free_port(), str(tmp_path)), nprocs=2)
    for rank in range(2):
        assert torch.load(tmp_path / f"rank{rank}.pt") == {"on": True, "off": True}, rank
