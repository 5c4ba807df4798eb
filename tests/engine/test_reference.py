"""GhostEdit against the model's reference: each tiny checkpoint in a released repo's layout (reference_checkpoints.py)
edited through GhostEdit's real-model path (`Engine(folder)`, CPU) and through diffusers' pipeline named in its
model_index.json (CPU), both in float32 (and one case both in bf16), with the same images, prompt, seed, size, steps
and CFG. Every stage is compared (prompt embeddings, condition latents, each step's guided prediction, the decoded
image), so a failure says where.

An edit that starts from its image (a mask, a strength) is held the same way against diffusers'
QwenImageEditInpaintPipeline on the Qwen-Image-Edit checkpoint (its only model), strength alone as that pipeline
with an all-white mask (the same computation: its blend then keeps nothing); each stage also compares the latents
the denoising starts from. For 2509/2511 with several images diffusers has no pipeline with a mask:
tests/unit/base/test_masks.py holds that rule's pieces against the inpaint pipeline's own functions.

The reference is the model as released, on transformers 4.x: there the prompt's image tokens get 3-D rotary
positions, which transformers 5 gives only when `mm_token_type_ids` is passed, so the reference's text encoder call
gets it added. Both sides resize by the same areas (1024x1024 for the VAE, 384x384 for the text encoder in 2509 and
2511): the test records the areas each side asks for and checks they agree, and computes at 1/16 of each area (a
quarter of each side; bf16 1/64) to keep the test fast.
"""
from __future__ import annotations

import functools

import numpy as np
import pytest
import torch
from einops import rearrange
from PIL import Image

from reference_checkpoints import MODELS, MODELS_21, build, build_21

AREA_DIVISOR = {"float32": 16, "bfloat16": 64}  # bf16 convolutions are slow on a CPU: smaller condition images
STEPS = 2
PROMPT = "Make the sky blue and add a red hat to the cat"
MAX_LEVELS, MEAN_LEVELS = 2, 1.0  # the target: what a person cannot see
# Bounds on what rounding could leave if the two sides' kernels summed in another order (measured here: every stage
# and every pixel identical, in float32 and in bf16); each difference found between DiffSynth and the reference
# exceeds them (1-D positions for the prompt's image tokens 2e-3, the sigmoid activation 9e-3 and DiffSynth's own
# sigmas 8e-5 in the predictions, the unscaled CFG 0.1, truncated 8-bit output 0.5 levels on average)
STAGE_TOLERANCE = {"prompt embedding": 1e-5, "latents": 1e-5, "prediction": 1e-5}
ROUNDING_MEAN_LEVELS = 0.05

# (model, input images, CFG scale, output size or None for the model's default, dtype of both sides)
CASES = [
    ("Qwen-Image-Edit", 1, 4.0, (128, 128), "float32"),
    ("Qwen-Image-Edit", 1, 1.0, (160, 96), "float32"),
    ("Qwen-Image-Edit-2509", 3, 1.0, None, "float32"),  # the default size: square, from the last image
    ("Qwen-Image-Edit-2509", 1, 4.0, (160, 96), "float32"),
    ("Qwen-Image-Edit-2511", 3, 4.0, (128, 128), "float32"),
    ("Qwen-Image-Edit-2511", 1, 1.0, (96, 160), "float32"),
    ("Qwen-Image-Edit-2511", 2, 4.0, (96, 64), "bfloat16"),
]


@pytest.fixture(scope="session")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("reference-checkpoints")
    return {**{repo: build(root, repo) for repo in MODELS}, **{repo: build_21(root, repo) for repo in MODELS_21}}


@pytest.fixture(scope="session")
def engines(folders):
    """GhostEdit's engine on a folder, loaded as `--model FOLDER --dtype DTYPE` loads it; one per session each."""
    from ghostedit.engine import Engine

    cache = {}
    return lambda repo, dtype: cache.get((repo, dtype)) or cache.setdefault(
        (repo, dtype), Engine(str(folders[repo]), device="cpu", dtype=dtype))


@pytest.fixture(scope="session")
def references(folders):
    """diffusers' pipeline named in a folder's model_index.json, in `dtype`, its text encoder as released."""
    import diffusers

    cache = {}

    def reference(repo, dtype):
        if (repo, dtype) not in cache:
            pipe = getattr(diffusers, MODELS[repo][0]).from_pretrained(str(folders[repo]),
                                                                       torch_dtype=getattr(torch, dtype))
            pipe.set_progress_bar_config(disable=True)
            _with_mm_token_type_ids(pipe.text_encoder)
            cache[repo, dtype] = pipe
        return cache[repo, dtype]
    return reference


def _images(count: int) -> list[Image.Image]:
    """Smooth, different inputs of different aspect ratios (the last one sets the 2509/2511 default size)."""
    sizes = [(200, 150), (120, 180), (160, 160)]
    images = []
    for index in range(count):
        width, height = sizes[index]
        y, x = np.mgrid[0:height, 0:width].astype(np.float32)
        channels = [np.sin(x / (9 + 4 * index) + c) * np.cos(y / (13 - 3 * index) - c) for c in (0.0, 1.3, 2.6)]
        images.append(Image.fromarray(((np.stack(channels, -1) * 0.5 + 0.5) * 255).astype(np.uint8)))
    return images


def _packed(latents: torch.Tensor) -> torch.Tensor:
    return rearrange(latents, "B C (H P) (W Q) -> B (H W) (C P Q)", P=2, Q=2)


class AreaRecorder:
    """Replaces a module's `calculate_dimensions`-like function: records the areas asked for and computes at a
    1/divisor of each."""

    def __init__(self, monkeypatch, module, name: str, divisor: int):
        self.asked: set[int] = set()
        original = getattr(module, name)

        def scaled(area, ratio):
            self.asked.add(area)
            return original(area // divisor, ratio)
        monkeypatch.setattr(module, name, scaled)


def _ghostedit(engine, images, cfg, size, monkeypatch, divisor, steps=STEPS, **start) -> tuple[dict, set]:
    """GhostEdit's stages and image; `start`: the request's mask, strength and padding_mask_crop."""
    from ghostedit.config import EditRequest
    from ghostedit.models import exact, family

    areas = AreaRecorder(monkeypatch, exact, "dimensions", divisor)
    default_areas = AreaRecorder(monkeypatch, family, "dimensions", divisor)
    stages = {"prompt": [], "condition": None, "predictions": [], "start": None}
    recorded = functools.partial(_recorded, monkeypatch)
    recorded(exact.PromptEmbedder, "process", lambda out: stages["prompt"].append(out["prompt_emb"]))
    recorded(exact.EditImageEmbedder, "process", lambda out: stages.__setitem__(
        "condition", torch.cat([_packed(latents) for latents in out["edit_latents"]], dim=1)))
    recorded(exact.ExactPipeline, "cfg_guided_model_fn", lambda out: stages["predictions"].append(_packed(out)))
    recorded(exact.StartEmbedder, "process", lambda out: stages.__setitem__(  # a plain edit's start is its noise
        "start", _packed(out["latents"]) if "inpainting" in out else None))
    width, height = size or (None, None)
    result = engine.run(EditRequest(images=images, prompt=PROMPT, steps=steps, cfg_scale=cfg, seed=7, width=width,
                                    height=height, **start))
    stages["image"] = np.asarray(result.image)
    return stages, areas.asked | default_areas.asked, engine.spec.family


def _reference(pipe, images, cfg, size, monkeypatch, divisor, steps=STEPS, **call) -> tuple[dict, set]:
    """The reference's stages and image; `call`: the inpaint pipeline's mask_image, strength, padding_mask_crop."""
    from diffusers.pipelines.qwenimage import (pipeline_qwenimage_edit, pipeline_qwenimage_edit_inpaint,
                                               pipeline_qwenimage_edit_plus)

    name = type(pipe).__name__
    module = (pipeline_qwenimage_edit_plus if "Plus" in name else
              pipeline_qwenimage_edit_inpaint if "Inpaint" in name else pipeline_qwenimage_edit)
    areas = AreaRecorder(monkeypatch, module, "calculate_dimensions", divisor)
    stages = _reference_stages(pipe, monkeypatch)
    width, height = size or (None, None)
    image = pipe(image=images if len(images) > 1 or module is pipeline_qwenimage_edit_plus else images[0],
                 prompt=PROMPT, negative_prompt="" if cfg > 1 else None, true_cfg_scale=cfg, width=width,
                 height=height, num_inference_steps=steps, generator=torch.Generator().manual_seed(7),
                 **call).images[0]
    stages["image"] = np.asarray(image)
    return stages, areas.asked


def _reference_stages(pipe, monkeypatch) -> dict:
    """What a diffusers pipeline computes at each stage, recorded as it runs: the prompt embeddings, the condition
    latents, the inpaint pipeline's start latents and each step's (guided) prediction."""
    stages = {"prompt": [], "condition": None, "predictions": [], "start": None}
    encode_prompt, prepare_latents, step = pipe.encode_prompt, pipe.prepare_latents, pipe.scheduler.step

    def recorded_encode(*args, **kwargs):
        output = encode_prompt(*args, **kwargs)
        stages["prompt"].append(output[0])
        return output

    def recorded_latents(*args, **kwargs):
        output = prepare_latents(*args, **kwargs)
        stages["condition"] = output[-1]  # the inpaint pipeline's start latents, noise, condition; the others'
        if len(output) == 3:              # start and condition
            stages["start"] = output[0]
        return output

    def recorded_step(model_output, *args, **kwargs):
        stages["predictions"].append(model_output)
        return step(model_output, *args, **kwargs)
    monkeypatch.setattr(pipe, "encode_prompt", recorded_encode)
    monkeypatch.setattr(pipe, "prepare_latents", recorded_latents)
    monkeypatch.setattr(pipe.scheduler, "step", recorded_step)
    return stages


def _with_mm_token_type_ids(text_encoder) -> None:
    """The text encoder as released (transformers 4.x): image tokens marked so they get 3-D rotary positions."""
    forward, image_token = text_encoder.forward, text_encoder.config.image_token_id

    def marked(*args, input_ids=None, **kwargs):
        kwargs.setdefault("mm_token_type_ids", (input_ids == image_token).int())
        return forward(*args, input_ids=input_ids, **kwargs)
    text_encoder.forward = marked


def _difference(stage: str, ours: torch.Tensor, theirs: torch.Tensor) -> float:
    """Largest difference relative to the reference's largest value."""
    assert ours.shape == theirs.shape, f"{stage}: shape {tuple(ours.shape)}, the reference's {tuple(theirs.shape)}"
    return ((ours.float() - theirs.float()).abs().max() / theirs.float().abs().max().clamp_min(1e-12)).item()


def _case_ids(cases, images: str) -> list[str]:
    return [f"{r}-{n}{images}-cfg{c:g}-{f'{s[0]}x{s[1]}' if s else 'default'}-{d}" for r, n, c, s, d in cases]


@pytest.mark.parametrize("repo, count, cfg, size, dtype", CASES, ids=_case_ids(CASES, "img"))
def test_edit_matches_reference(engines, references, repo, count, cfg, size, dtype, monkeypatch):
    images = _images(count)
    divisor = AREA_DIVISOR[dtype]
    ours, our_areas, family = _ghostedit(engines(repo, dtype), images, cfg, size, monkeypatch, divisor)
    theirs, their_areas = _reference(references(repo, dtype), images, cfg, size, monkeypatch, divisor)
    assert family.name == repo
    assert our_areas == their_areas, "the two sides resize to different areas"
    if size is None:  # the default size follows the aspect ratio of the last image (square), not the first one
        assert ours["image"].shape[0] == ours["image"].shape[1]
    _assert_same(ours, theirs, cfg, STEPS, f"{repo} {dtype} {count} image(s) cfg {cfg:g} {size}")


def _assert_same(ours: dict, theirs: dict, cfg: float, steps: int, case: str) -> None:
    """Every stage within float32 rounding of the reference's, the image within MAX_LEVELS and MEAN_LEVELS."""
    report = {}
    assert len(ours["prompt"]) == len(theirs["prompt"]) == (2 if cfg > 1 else 1)
    for which, (a, b) in zip(("positive", "negative"), zip(ours["prompt"], theirs["prompt"])):
        report[f"{which} prompt embedding"] = _difference(f"{which} prompt embedding", a, b)
    report["condition latents"] = _difference("condition latents", ours["condition"], theirs["condition"])
    assert (ours["start"] is None) == (theirs["start"] is None)
    if ours["start"] is not None:
        report["start latents"] = _difference("start latents", ours["start"], theirs["start"])
    assert len(ours["predictions"]) == len(theirs["predictions"]) == steps
    for step, (a, b) in enumerate(zip(ours["predictions"], theirs["predictions"])):
        report[f"step {step} prediction"] = _difference(f"step {step} prediction", a, b)
    assert ours["image"].shape == theirs["image"].shape, "output sizes differ"
    levels = np.abs(ours["image"].astype(np.int16) - theirs["image"].astype(np.int16))
    words = ", ".join(f"{stage} {value:.1e}" for stage, value in report.items())
    print(f"\n{case}: {words}; image max {levels.max()} mean {levels.mean():.4f}")
    for stage, value in report.items():  # the first stage that differs beyond float32 rounding is the cause
        tolerance = next(t for kind, t in STAGE_TOLERANCE.items() if stage.endswith(kind))
        assert value < tolerance, f"{stage} differs from the reference by {value:.1e} (relative); stages: {words}"
    assert levels.max() <= MAX_LEVELS and levels.mean() <= MEAN_LEVELS, \
        f"image differs by {levels.max()} levels at most, {levels.mean():.3f} on average; stages: {words}"
    assert levels.mean() <= ROUNDING_MEAN_LEVELS, f"image differs by {levels.mean():.3f} levels on average: more "\
        f"than float32 rounding leaves (8-bit rounding?); stages: {words}"


# ---- starting from the image: masks and strength, against QwenImageEditInpaintPipeline ----

START_SIZE = (288, 224)  # the Qwen-Image-Edit output size of this aspect ratio at 1/16 of the area: not resized
# (mask: "box" binary, "soft" RGB with grey edges, None: strength alone; mask size: "output", "half" of it;
# strength; steps; CFG; padding_mask_crop)
START_CASES = [
    ("box", "output", 1.0, 2, 4.0, None),
    ("soft", "half", 0.6, 4, 1.0, None),     # starts at step int(4 - 2.4) = 1: three steps
    (None, None, 0.5, 4, 4.0, None),         # strength alone (img2img): two steps
    ("box", "output", 0.8, 4, 1.0, 12),      # the crop around the mask, laid over the image
]


def _mask(kind: str, size: tuple[int, int]) -> Image.Image:
    """A box over a third of the image: binary in L, or in RGB with a grey ramp at its edges."""
    width, height = size
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    inside = np.minimum.reduce([x - width * 0.4, width * 0.75 - x, y - height * 0.3, height * 0.7 - y])
    if kind == "box":
        return Image.fromarray(np.where(inside >= 0, 255, 0).astype(np.uint8), "L")
    ramp = np.clip(inside / (width * 0.05) * 255 + 128, 0, 255).astype(np.uint8)
    return Image.fromarray(np.stack([ramp, ramp, np.flipud(ramp)], -1), "RGB")


@pytest.mark.parametrize("mask_kind, mask_size, strength, steps, cfg, crop", START_CASES,
                         ids=[f"{m or 'no'}-mask-{s:g}-{n}steps-cfg{c:g}" + (f"-crop{p}" if p is not None else "")
                              for m, _, s, n, c, p in START_CASES])
def test_start_matches_inpaint_reference(engines, references, mask_kind, mask_size, strength, steps, cfg, crop,
                                         monkeypatch):
    import copy

    from diffusers import QwenImageEditInpaintPipeline

    repo, divisor = "Qwen-Image-Edit", AREA_DIVISOR["float32"]
    image = _images(1)[0].resize(START_SIZE, Image.LANCZOS)
    mask = None
    if mask_kind is not None:
        mask = _mask(mask_kind, START_SIZE if mask_size == "output" else (START_SIZE[0] // 2, START_SIZE[1] // 2))
    ours, our_areas, _ = _ghostedit(engines(repo, "float32"), [image], cfg, None, monkeypatch, divisor, steps=steps,
                                    mask=mask, strength=strength, padding_mask_crop=crop)
    components = references(repo, "float32").components
    pipe = QwenImageEditInpaintPipeline(**{**components, "scheduler": copy.deepcopy(components["scheduler"])})
    pipe.set_progress_bar_config(disable=True)
    white = Image.new("L", START_SIZE, 255)  # strength alone: a blend that keeps nothing
    theirs, their_areas = _reference(pipe, [image], cfg, None, monkeypatch, divisor, steps=steps,
                                     mask_image=white if mask is None else mask, strength=strength,
                                     padding_mask_crop=crop)
    assert our_areas == their_areas, "the two sides resize to different areas"
    assert ours["image"].shape[:2] == START_SIZE[::-1]
    ran = len(theirs["predictions"])
    assert ran == steps - int(max(steps - steps * strength, 0))
    _assert_same(ours, theirs, cfg, ran, f"{repo} mask {mask_kind} strength {strength:g} crop {crop}")


@pytest.mark.parametrize("repo", ["Qwen-Image-Edit-2509", "Qwen-Image-Edit-2511"])
def test_a_masked_edit_of_three_images_holds_the_inpaint_pipelines_pieces(engines, references, repo, monkeypatch):
    """2509 and 2511 with three images and a mask on the first: no diffusers pipeline computes it, so the rule's
    pieces are held against QwenImageEditInpaintPipeline's own functions on the checkpoint's VAE and scheduler:
    the output size (the first image's aspect ratio), the start (prepare_latents after get_timesteps: the first
    image encoded as a posterior sample, the noise, their mix at the first sigma), the mask on the latents' grid
    (prepare_mask_latents), the first image's condition (the start's latents), and after every step the latents
    outside the mask (the start's noised by scale_noise to the next sigma, its own after the last)."""
    import copy

    from diffusers import QwenImageEditInpaintPipeline
    from diffusers.pipelines.qwenimage import pipeline_qwenimage_edit_inpaint as inpaint

    from ghostedit.config import EditRequest
    from ghostedit.models import exact, family

    steps, strength, divisor = 4, 0.75, AREA_DIVISOR["float32"]
    images = _images(3)
    mask = _mask("soft", images[0].size)
    AreaRecorder(monkeypatch, exact, "dimensions", divisor)
    AreaRecorder(monkeypatch, family, "dimensions", divisor)
    ours = {"steps": []}
    start_process, step, embed = exact.StartEmbedder.process, exact.ExactPipeline.step, exact.EditImageEmbedder.process

    def recorded_start(self, *args, **kwargs):
        output = start_process(self, *args, **kwargs)
        ours.update(output)
        return output

    def recorded_step(self, *args, **kwargs):
        ours["steps"].append(step(self, *args, **kwargs))
        return ours["steps"][-1]

    def recorded_embed(self, *args, **kwargs):
        output = embed(self, *args, **kwargs)
        ours["condition"] = output["edit_latents"]
        return output
    monkeypatch.setattr(exact.StartEmbedder, "process", recorded_start)
    monkeypatch.setattr(exact.ExactPipeline, "step", recorded_step)
    monkeypatch.setattr(exact.EditImageEmbedder, "process", recorded_embed)
    result = engines(repo, "float32").run(EditRequest(images=images, prompt=PROMPT, steps=steps, cfg_scale=1.0,
                                                      seed=7, mask=mask, strength=strength))

    components = references(repo, "float32").components
    pipe = QwenImageEditInpaintPipeline(**{**components, "scheduler": copy.deepcopy(components["scheduler"])})
    width, height, _ = inpaint.calculate_dimensions(1024 * 1024 // divisor, images[0].width / images[0].height)
    assert (result.width, result.height) == (width // 16 * 16, height // 16 * 16), "not the first image's ratio"
    width, height = result.width, result.height
    image = pipe.image_processor.preprocess(pipe.image_processor.resize(images[0], height, width), height=height,
                                            width=width).to(torch.float32)
    sequence = (height // 16) * (width // 16)
    config = pipe.scheduler.config
    inpaint.retrieve_timesteps(pipe.scheduler, steps, "cpu", sigmas=np.linspace(1.0, 1 / steps, steps),
                               mu=inpaint.calculate_shift(sequence, config.base_image_seq_len,
                                                          config.max_image_seq_len, config.base_shift,
                                                          config.max_shift))
    timesteps, ran = pipe.get_timesteps(steps, strength, "cpu")
    generator = torch.Generator().manual_seed(7)
    start, noise, start_latents = pipe.prepare_latents(image, timesteps[:1], 1, 16, height, width, torch.float32,
                                                       "cpu", generator)
    condition = pipe.mask_processor.preprocess(mask, height=height, width=width)
    packed_mask, _ = pipe.prepare_mask_latents(condition, image * (condition < 0.5), 1, 16, 1, height, width,
                                               torch.float32, "cpu", generator)
    inpainting = ours["inpainting"]
    assert torch.equal(_packed(ours["latents"]), start) and torch.equal(_packed(ours["noise"]), noise)
    assert torch.equal(_packed(inpainting.latents), start_latents)
    assert torch.equal(_packed(inpainting.mask.repeat(1, 16, 1, 1)), packed_mask)
    assert torch.equal(ours["condition"][0], inpainting.latents) and len(ours["condition"]) == 3
    assert len(ours["steps"]) == ran == 3
    first = steps - ran
    for index, latents in enumerate(ours["steps"]):
        if index == ran - 1:
            kept = start_latents
        else:
            pipe.scheduler._step_index = first + index + 1  # where the reference's loop has it after this step
            kept = pipe.scheduler.scale_noise(start_latents, torch.tensor([timesteps[index + 1]]), noise)
        outside = packed_mask == 0
        assert torch.equal(_packed(latents)[outside], kept[outside]), f"step {index}: the mask's outside"
        assert not torch.equal(_packed(latents)[~outside], kept[~outside])


# ---- recognising a model from its own files ----

def _copy(folder, destination):
    import shutil
    shutil.copytree(folder, destination)
    return destination


def test_model_is_recognised_from_its_configs_not_its_name(folders, tmp_path):
    from ghostedit.models import resolve

    misleading = _copy(folders["Qwen-Image-Edit-2511"], tmp_path / "Qwen-Image-Edit-2509")
    spec = resolve(str(misleading))
    assert spec.kind == "local" and spec.family.name == "Qwen-Image-Edit-2511" and spec.family.zero_cond_t
    assert resolve(str(folders["Qwen-Image-Edit"])).family.max_images == 1


@pytest.mark.parametrize("change, named", [
    (lambda f: (f / "model_index.json").unlink(), "model_index.json"),
    (lambda f: _edit_json(f / "transformer" / "config.json", use_layer3d_rope=True), "use_layer3d_rope"),
    (lambda f: _edit_json(f / "scheduler" / "scheduler_config.json", max_shift=1.15), "max_shift"),
    (lambda f: _edit_json(f / "model_index.json", _class_name="QwenImageLayeredPipeline"), "QwenImageLayeredPipeline"),
], ids=["no-model-index", "layer3d-rope", "other-schedule", "other-pipeline"])
def test_a_model_that_cannot_run_exactly_is_refused_by_name(folders, tmp_path, change, named):
    from ghostedit.models import resolve
    from ghostedit.models.family import UnsupportedModel

    folder = _copy(folders["Qwen-Image-Edit-2509"], tmp_path / "model")
    change(folder)
    with pytest.raises(UnsupportedModel, match=named):
        resolve(str(folder))


def _edit_json(path, **changes):
    import json
    path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))


# ---- Qwen-Image-2.1 and its Turbo: GhostEdit's own DiT and pipeline against diffusers' QwenImage21Pipeline ----
# diffusers' 2.1 pipeline passes the processor's `mm_token_type_ids` to the text encoder itself (transformers 5's
# processor returns them), so its text encoder is called as released; the test checks that both sides pass them.
# Both sides resize by the same areas (1024x1024 for each reference and a default output), computed here at 1/16 of
# them (bf16 1/64); text-to-image gives its size.

STEPS_21 = {"Qwen-Image-2.1": 2, "Qwen-Image-2.1-Turbo": 8}  # Turbo: its 8 sample sigmas
# (model, references, CFG scale, output size or None for the model's default, dtype of both sides)
CASES_21 = [
    ("Qwen-Image-2.1", 0, 1.0, (128, 96), "float32"),           # text-to-image
    ("Qwen-Image-2.1", 1, 4.0, None, "float32"),                # CFG with a negative prompt; the size from the image
    ("Qwen-Image-2.1", 3, 1.0, None, "float32"),                # three references: the size from the last one
    ("Qwen-Image-2.1-Turbo", 1, 1.0, (96, 128), "float32"),     # Turbo's fixed sigmas
    ("Qwen-Image-2.1", 2, 4.0, (96, 64), "bfloat16"),
]


@pytest.fixture(scope="session")
def references_21(folders):
    """diffusers' QwenImage21Pipeline on a 2.1 folder, in `dtype`."""
    import diffusers

    cache = {}

    def reference(repo, dtype):
        if (repo, dtype) not in cache:
            pipe = diffusers.QwenImage21Pipeline.from_pretrained(str(folders[repo]), torch_dtype=getattr(torch, dtype))
            pipe.set_progress_bar_config(disable=True)
            cache[repo, dtype] = pipe
        return cache[repo, dtype]
    return reference


def _images_21(count: int) -> list[Image.Image]:
    """_images with an alpha channel (a ramp across each image): 2.1's VAE reads all four channels."""
    images = []
    for image in _images(count):
        alpha = np.linspace(64, 255, image.size[0], dtype=np.float32)[None, :].repeat(image.size[1], 0)
        images.append(Image.fromarray(np.dstack([np.asarray(image), alpha.astype(np.uint8)]), "RGBA"))
    return images


def _recorded(monkeypatch, cls, name: str, keep) -> None:
    """`cls.name` hands each of its outputs to `keep` too."""
    original = getattr(cls, name)

    def wrapper(self, *args, **kwargs):
        output = original(self, *args, **kwargs)
        keep(output)
        return output
    monkeypatch.setattr(cls, name, wrapper)


def _text_encoder_calls(monkeypatch, text_encoder) -> list[dict]:
    """The keyword arguments of every call of `text_encoder`'s forward."""
    calls, forward = [], text_encoder.forward

    def recorded(*args, **kwargs):
        calls.append(kwargs)
        return forward(*args, **kwargs)
    monkeypatch.setattr(text_encoder, "forward", recorded)
    return calls


def _ghostedit_21(engine, images, cfg, size, steps, monkeypatch, divisor):
    from diffsynth.pipelines.qwen_image_21 import QwenImage21Unit_PromptEmbedder, patchify

    from ghostedit.config import EditRequest
    from ghostedit.models import exact, family
    from ghostedit.models.qwen_image_21 import pipeline

    areas = AreaRecorder(monkeypatch, exact, "dimensions", divisor)
    default_areas = AreaRecorder(monkeypatch, family, "dimensions", divisor)
    stages = {"prompt": [], "condition": None, "predictions": []}
    _recorded(monkeypatch, QwenImage21Unit_PromptEmbedder, "process",
              lambda out: stages["prompt"].append(out["prompt_embeds"]))
    _recorded(monkeypatch, pipeline.EditImageEmbedder, "process", lambda out: stages.__setitem__(
        "condition", torch.cat([patchify(latents) for latents in out["edit_latents"]], 1) if images else None))
    _recorded(monkeypatch, pipeline.ExactPipeline21, "cfg_guided_model_fn",
              lambda out: stages["predictions"].append(patchify(out)))
    engine.load()
    calls = _text_encoder_calls(monkeypatch, engine.store.pipe.text_encoder.model)
    width, height = size or (None, None)
    result = engine.run(EditRequest(images=images, prompt=PROMPT, negative_prompt="", steps=steps, cfg_scale=cfg,
                                    seed=7, width=width, height=height, keep_alpha=True))
    stages["image"] = np.asarray(result.image)
    stages["mm_token_type_ids"] = [call.get("mm_token_type_ids") is not None for call in calls]
    return stages, areas.asked | default_areas.asked, result


def _reference_21(pipe, images, cfg, size, steps, monkeypatch, divisor):
    from diffusers.pipelines.qwenimage21 import pipeline_qwenimage21

    areas = AreaRecorder(monkeypatch, pipeline_qwenimage21, "calculate_dimensions", divisor)
    stages = _reference_stages(pipe, monkeypatch)
    calls = _text_encoder_calls(monkeypatch, pipe.text_encoder)
    width, height = size or (None, None)
    image = pipe(prompt=PROMPT, image=images or None, negative_prompt="" if cfg > 1 else None, true_cfg_scale=cfg,
                 width=width, height=height, num_inference_steps=steps,
                 generator=torch.Generator().manual_seed(7), use_kv_cache=True).images[0]
    stages["image"] = np.asarray(image)
    stages["mm_token_type_ids"] = [call.get("mm_token_type_ids") is not None for call in calls]
    return stages, areas.asked


@pytest.mark.parametrize("repo, count, cfg, size, dtype", CASES_21, ids=_case_ids(CASES_21, "ref"))
def test_qwen_image_21_matches_reference(engines, references_21, repo, count, cfg, size, dtype, monkeypatch):
    images = _images_21(count)
    divisor = AREA_DIVISOR[dtype]
    ours, our_areas, result = _ghostedit_21(engines(repo, dtype), images, cfg, size, STEPS_21[repo], monkeypatch,
                                            divisor)
    theirs, their_areas = _reference_21(references_21(repo, dtype), images, cfg, size, STEPS_21[repo], monkeypatch,
                                        divisor)
    assert result.family.name == repo
    assert our_areas == their_areas, "the two sides resize to different areas"
    assert ours["mm_token_type_ids"] == theirs["mm_token_type_ids"] == [True] * (2 if cfg > 1 else 1), \
        "the text encoder is not called as released (3-D positions for image tokens need mm_token_type_ids)"

    report = {}
    assert len(ours["prompt"]) == len(theirs["prompt"]) == (2 if cfg > 1 else 1)
    for which, (a, b) in zip(("positive", "negative"), zip(ours["prompt"], theirs["prompt"])):
        report[f"{which} prompt embedding"] = _difference(f"{which} prompt embedding", a, b)
    if count:
        report["reference latents"] = _difference("reference latents", ours["condition"], theirs["condition"])
    else:
        assert ours["condition"] is None and theirs["condition"] is None
    assert len(ours["predictions"]) == len(theirs["predictions"]) == STEPS_21[repo]
    for step, (a, b) in enumerate(zip(ours["predictions"], theirs["predictions"])):
        report[f"step {step} prediction"] = _difference(f"step {step} prediction", a, b)
    assert ours["image"].shape == theirs["image"].shape, "output sizes differ"
    assert ours["image"].shape[-1] == 4, "2.1's output keeps its alpha channel"
    tokens = result.telemetry.dit_tokens
    forwards = 2 if cfg > 1 else 1
    assert len(tokens) == forwards * STEPS_21[repo] and all(n < tokens[0] for n in tokens[forwards:]), \
        f"the prefix cache computes the target's tokens alone after the first step: {tokens}"
    levels = np.abs(ours["image"].astype(np.int16) - theirs["image"].astype(np.int16))
    words = ", ".join(f"{stage} {value:.1e}" for stage, value in report.items())
    print(f"\n{repo} {dtype} {count} reference(s) cfg {cfg:g} {size}: {words}; image max {levels.max()} "
          f"mean {levels.mean():.4f}")
    for stage, value in report.items():
        tolerance = next(t for kind, t in {**STAGE_TOLERANCE, "reference latents": 1e-5}.items()
                         if stage.endswith(kind))
        assert value < tolerance, f"{stage} differs from the reference by {value:.1e} (relative); stages: {words}"
    assert levels.max() <= MAX_LEVELS and levels.mean() <= MEAN_LEVELS, \
        f"image differs by {levels.max()} levels at most, {levels.mean():.3f} on average; stages: {words}"
    assert levels.mean() <= ROUNDING_MEAN_LEVELS, f"image differs by {levels.mean():.3f} levels on average; {words}"


def test_qwen_image_21_is_recognised_from_its_configs(folders, tmp_path):
    from ghostedit.models import resolve

    misleading = _copy(folders["Qwen-Image-2.1-Turbo"], tmp_path / "Qwen-Image-2.1")
    turbo = resolve(str(misleading)).family
    assert turbo.name == "Qwen-Image-2.1-Turbo" and turbo.default_steps == 8 and len(turbo.sample_sigmas) == 8
    base = resolve(str(folders["Qwen-Image-2.1"])).family
    assert base.name == "Qwen-Image-2.1" and base.sample_sigmas is None and base.max_images == 10
    assert base.min_images == 0 and base.rgba and "non-commercial" in base.licence
