"""The models GhostEdit runs exactly as their reference does (diffusers' pipeline named in the repo's model_index.json),
one entry each, and how a folder is recognised as one of them from its own configs, never from its name.

An entry says everything that differs between the models of the family: its released repo, the Lightning LoRA
distilled for it, which DiffSynth pipeline computes it, the prompt template, how the input images reach the text encoder and the VAE (ConditionRule), whether the DiT runs with
`zero_cond_t`, and the defaults of a request. Qwen-Image-2.1 and its Turbo (diffusers' QwenImage21Pipeline, DiffSynth's
QwenImage21Pipeline on GhostEdit's own DiT) are entries of a DiT family of their own: text-to-image as well as edits
with up to 10 references, RGBA, sides in multiples of 32, the schedule read from the folder's scheduler config and
Turbo's `sample_sigmas` from its model_index.json. What GhostEdit cannot run exactly is refused by `detect`, naming
what is missing or different.
"""
from __future__ import annotations

import importlib
import json
import math
from dataclasses import dataclass, field, replace
from pathlib import Path

from ..errors import GhostEditError, InvalidRequestError

VAE_SCALE = 8          # the VAE's spatial downsampling; DiT patches are 2x2 latents
SIZE_MULTIPLE = 2 * VAE_SCALE


class UnsupportedModel(GhostEditError, ValueError):
    """A folder GhostEdit cannot run as its reference runs it."""


@dataclass(frozen=True)
class ConditionRule:
    """How each input image is resized for the two encoders, from the original each time (diffusers'
    `calculate_dimensions`: the image's aspect ratio at `area`, sides rounded to multiples of 32).
    `vl_area`: the image the text encoder sees; None: the VAE's image itself.
    `vae_area`: the image the VAE encodes as the DiT's condition.
    `size_from`: which input image sets the default output size ("first" or "last")."""
    vae_area: int
    vl_area: int | None
    size_from: str


@dataclass(frozen=True)
class Computation:
    """How GhostEdit computes a family, as dotted paths (imported when a model loads, not when this table is read)."""
    pipeline: str               # DiffSynth's pipeline class
    exact: str                  # GhostEdit's subclass of it that computes as the reference
    checkpoint: str             # folder -> (family, DiffSynth ModelConfigs of the weights, tokenizer, processor)
    transformer_class: str      # the transformer config's "_class_name" it runs
    scheduler: dict = field(hash=False)  # the schedule it computes: the scheduler config must say the same


QWEN_IMAGE_DIT = "qwen-image"        # the Edit models' DiT (DiffSynth's QwenImageDiT)
QWEN_IMAGE_21_DIT = "qwen-image-2.1"  # 2.1's single-stream block-causal DiT (models/qwen_image_21/dit.py)
QWEN_RESEARCH_LICENSE = "Qwen Research License (non-commercial use only)"


@dataclass(frozen=True)
class Family:
    name: str
    pipeline_class: str         # model_index.json "_class_name" of the reference pipeline
    computation: Computation
    template: str               # "edit": one image in the system template; "edit-plus": "Picture N:" per image
    max_images: int
    condition: ConditionRule
    zero_cond_t: bool           # the DiT's timestep for condition tokens is 0 (transformer config)
    default_steps: int
    default_area: int           # output pixels when the request gives no size
    repo: str | None = None     # the released Hugging Face repo id
    lightning: tuple[str, str] | None = None  # lightx2v's Lightning LoRA: (repo, file with {steps})
    lightning_steps: tuple[int, ...] = (4, 8)   # the step counts lightx2v publishes that LoRA for
    dit: str = QWEN_IMAGE_DIT   # the DiT family (which toggles apply: optimize/registry.py)
    min_images: int = 1         # 0: text-to-image too
    size_multiple: int = SIZE_MULTIPLE  # output sides are multiples of this
    rgba: bool = False          # inputs keep their alpha channel, outputs have one
    licence: str | None = None  # shown when the model is chosen, where it is not Apache 2.0
    default_cfg: float = 4.0    # a request's CFG scale unless it gives one (2.1: 1, no guidance)
    schedule: dict | None = field(default=None, hash=False, compare=False)  # the folder's scheduler config (2.1)
    sample_sigmas: tuple[float, ...] | None = None  # model_index.json's fixed schedule (Turbo)
    # what the Lightning LoRA's schedule changes in the model's own (the Edit models': LIGHTNING_SHIFT)
    lightning_schedule_changes: dict = field(default_factory=lambda: dict(LIGHTNING_SHIFT), hash=False, compare=False)

    def check_request(self, request) -> None:
        """Refuses (InvalidRequestError) a request this model cannot run: its number of input images, its steps on
        a fixed schedule, its size's multiple. Said before a run starts, and checked again by the run."""
        count = len(request.images)
        if not self.min_images <= count <= self.max_images:
            takes = (f"{self.max_images}" if self.min_images == self.max_images
                     else f"{self.min_images} to {self.max_images}")
            generates = "" if self.min_images == 0 else " (it does not generate from the prompt alone)"
            raise InvalidRequestError(f"{self.name} takes {takes} input images; got {count}{generates}")
        if self.sample_sigmas is not None and request.steps != len(self.sample_sigmas):
            raise InvalidRequestError(f"{self.name} runs the {len(self.sample_sigmas)} fixed sigmas of its "
                                      f"model_index.json: steps must be {len(self.sample_sigmas)}; got {request.steps}")
        if request.width and (request.width % self.size_multiple or request.height % self.size_multiple):
            raise InvalidRequestError(f"{self.name} takes sides in multiples of {self.size_multiple}; got "
                                      f"{request.width}x{request.height}")

    def default_size(self, image_sizes: list[tuple[int, int]]) -> tuple[int, int]:
        """The output size a request without one gets: the family's area at the aspect ratio of the input image
        the reference takes it from (square without images)."""
        if not image_sizes:
            side = round(self.default_area ** 0.5)
            return side // self.size_multiple * self.size_multiple, side // self.size_multiple * self.size_multiple
        width, height = image_sizes[0 if self.condition.size_from == "first" else -1]
        width, height = dimensions(self.default_area, width / height)
        return width // self.size_multiple * self.size_multiple, height // self.size_multiple * self.size_multiple

    def lightning_schedule(self) -> dict:
        """The schedule the family's Lightning LoRA was distilled for: the model's own with the LoRA's changes."""
        return {**(self.schedule or self.computation.scheduler), **self.lightning_schedule_changes}

    @property
    def steps_fixed(self) -> bool:
        """Whether the step count is the model's own (Turbo: one step per sample sigma)."""
        return self.sample_sigmas is not None


def dimensions(area: int, ratio: float) -> tuple[int, int]:
    """diffusers' `calculate_dimensions`: width/height = ratio at about `area` pixels, multiples of 32."""
    width = (area * ratio) ** 0.5
    height = width / ratio
    return round(width / 32) * 32, round(height / 32) * 32


# What DiffSynth's QwenImagePipeline computes: its "Qwen-Image" schedule and its QwenImageDiT
SCHEDULER = {"_class_name": "FlowMatchEulerDiscreteScheduler", "base_image_seq_len": 256, "max_image_seq_len": 8192,
             "base_shift": 0.5, "max_shift": 0.9, "shift_terminal": 0.02, "use_dynamic_shifting": True,
             "time_shift_type": "exponential", "num_train_timesteps": 1000, "invert_sigmas": False,
             "stochastic_sampling": False, "use_karras_sigmas": False, "use_exponential_sigmas": False,
             "use_beta_sigmas": False}
# The schedule lightx2v distilled the Edit models' Lightning LoRAs for (their README's scheduler config): the shift
# fixed at log(3) whatever the image size, no terminal shift. Its Qwen-Image-2.1 LoRA's card says four steps with the
# model's dynamic exponential shift and no terminal stretching: LIGHTNING_SHIFT_21, the one change
LIGHTNING_SHIFT = {"base_shift": math.log(3), "max_shift": math.log(3), "shift_terminal": None}
LIGHTNING_SCHEDULER = {**SCHEDULER, **LIGHTNING_SHIFT}
LIGHTNING_SHIFT_21 = {"shift_terminal": None}
QWEN_IMAGE = Computation(
    pipeline="diffsynth.pipelines.qwen_image.QwenImagePipeline", exact="ghostedit.models.exact.ExactPipeline",
    checkpoint="ghostedit.models.checkpoint.model_configs", transformer_class="QwenImageTransformer2DModel",
    scheduler=SCHEDULER)

EDIT_TEMPLATE = "edit"
EDIT_PLUS_TEMPLATE = "edit-plus"

QWEN_IMAGE_EDIT = Family(
    name="Qwen-Image-Edit", pipeline_class="QwenImageEditPipeline", computation=QWEN_IMAGE,
    template=EDIT_TEMPLATE, max_images=1,
    condition=ConditionRule(vae_area=1024 * 1024, vl_area=None, size_from="first"),
    zero_cond_t=False, default_steps=50, default_area=1024 * 1024, repo="Qwen/Qwen-Image-Edit",
    lightning=("lightx2v/Qwen-Image-Lightning", "Qwen-Image-Edit-Lightning-{steps}steps-V1.0-bf16.safetensors"))
QWEN_IMAGE_EDIT_2509 = Family(
    name="Qwen-Image-Edit-2509", pipeline_class="QwenImageEditPlusPipeline", computation=QWEN_IMAGE,
    template=EDIT_PLUS_TEMPLATE, max_images=3,
    condition=ConditionRule(vae_area=1024 * 1024, vl_area=384 * 384, size_from="last"),
    zero_cond_t=False, default_steps=40, default_area=1024 * 1024, repo="Qwen/Qwen-Image-Edit-2509",
    lightning=("lightx2v/Qwen-Image-Lightning",
               "Qwen-Image-Edit-2509/Qwen-Image-Edit-2509-Lightning-{steps}steps-V1.0-bf16.safetensors"))
QWEN_IMAGE_EDIT_2511 = replace(
    QWEN_IMAGE_EDIT_2509, name="Qwen-Image-Edit-2511", zero_cond_t=True, repo="Qwen/Qwen-Image-Edit-2511",
    lightning=("lightx2v/Qwen-Image-Edit-2511-Lightning", "Qwen-Image-Edit-2511-Lightning-{steps}steps-V1.0-bf16.safetensors"))

# Qwen-Image-2.1: what diffusers' QwenImage21Pipeline computes. Its schedule is the folder's scheduler config (the
# schedule's shape must be one diffusers' FlowMatchEulerDiscreteScheduler computes as GhostEdit does: these keys)
SCHEDULER_21 = {"_class_name": "FlowMatchEulerDiscreteScheduler", "time_shift_type": "exponential",
                "invert_sigmas": False, "stochastic_sampling": False, "use_karras_sigmas": False,
                "use_exponential_sigmas": False, "use_beta_sigmas": False}
# The released scheduler config as GhostEdit assumes it where no folder gives one (the embedded models; a repo id
# before download): DiffSynth's "Qwen-Image" template, which its QwenImage21Pipeline runs
RELEASED_SCHEDULE_21 = {key: value for key, value in SCHEDULER.items() if key != "_class_name"}
# Qwen/Qwen-Image-2.1-Turbo's model_index.json `sample_sigmas` (the terminal 0 left out), as DiffSynth's example
TURBO_SIGMAS = (1.0, 0.978453, 0.95418, 0.926626, 0.89508, 0.845148, 0.704534, 0.414568)
QWEN_IMAGE_21_COMPUTATION = Computation(
    pipeline="diffsynth.pipelines.qwen_image_21.QwenImage21Pipeline",
    exact="ghostedit.models.qwen_image_21.pipeline.ExactPipeline21",
    checkpoint="ghostedit.models.qwen_image_21.checkpoint.model_configs",
    transformer_class="QwenImage21Transformer2DModel", scheduler=SCHEDULER_21)
QWEN_IMAGE_21 = Family(
    name="Qwen-Image-2.1", pipeline_class="QwenImage21Pipeline", computation=QWEN_IMAGE_21_COMPUTATION,
    template="2.1", max_images=10,
    condition=ConditionRule(vae_area=1024 * 1024, vl_area=None, size_from="last"),
    zero_cond_t=False, default_steps=40, default_area=1024 * 1024, repo="Qwen/Qwen-Image-2.1",
    dit=QWEN_IMAGE_21_DIT, min_images=0, size_multiple=32, rgba=True, licence=QWEN_RESEARCH_LICENSE,
    default_cfg=1.0, schedule=RELEASED_SCHEDULE_21,
    lightning=("lightx2v/Qwen-Image-2.1-Lightning", "pytorch_lora_weights.safetensors"), lightning_steps=(4,),
    lightning_schedule_changes=LIGHTNING_SHIFT_21)
# Turbo's, as GhostEdit assumes it where no folder gives one: its sigmas used as they are (shift 1)
TURBO_SCHEDULE_21 = {**RELEASED_SCHEDULE_21, "use_dynamic_shifting": False, "shift": 1.0, "shift_terminal": None}
QWEN_IMAGE_21_TURBO = replace(QWEN_IMAGE_21, name="Qwen-Image-2.1-Turbo", repo="Qwen/Qwen-Image-2.1-Turbo",
                              default_steps=len(TURBO_SIGMAS), sample_sigmas=TURBO_SIGMAS,
                              schedule=TURBO_SCHEDULE_21, lightning=None)  # the Turbo is itself the few-step DiT

FAMILIES = (QWEN_IMAGE_EDIT, QWEN_IMAGE_EDIT_2509, QWEN_IMAGE_EDIT_2511, QWEN_IMAGE_21, QWEN_IMAGE_21_TURBO)

# The embedded tiny model and the synthetic one compute as 2509 does; the tiny one at a quarter of the sides
TINY = replace(QWEN_IMAGE_EDIT_2509, name="tiny", default_steps=4, default_area=256 * 256, repo=None, lightning=None,
               condition=replace(QWEN_IMAGE_EDIT_2509.condition, vae_area=256 * 256, vl_area=96 * 96))
SYNTHETIC = replace(QWEN_IMAGE_EDIT_2509, name="synthetic", repo=None, lightning=None)
# The embedded 2.1 models compute as 2.1 (and Turbo) do; the tiny ones at a quarter of the sides
TINY_21 = replace(QWEN_IMAGE_21, name="tiny-2.1", default_steps=4, default_area=256 * 256, repo=None, lightning=None,
                  condition=replace(QWEN_IMAGE_21.condition, vae_area=256 * 256))
TINY_21_TURBO = replace(TINY_21, name="tiny-2.1-turbo", default_steps=len(TURBO_SIGMAS), sample_sigmas=TURBO_SIGMAS,
                        schedule=TURBO_SCHEDULE_21)
SYNTHETIC_21 = replace(QWEN_IMAGE_21, name="synthetic-2.1", repo=None, lightning=None)
SYNTHETIC_21_TURBO = replace(QWEN_IMAGE_21_TURBO, name="synthetic-2.1-turbo", repo=None)

RELEASED = {family.repo: family for family in FAMILIES}

UNSUPPORTED_TRANSFORMER_OPTIONS = ("guidance_embeds", "use_additional_t_cond", "use_layer3d_rope")
COMPONENTS = {"transformer": "config.json", "text_encoder": "config.json", "vae": "config.json",
              "scheduler": "scheduler_config.json", "processor": "preprocessor_config.json"}
# The files `detect` reads: a repo's configs, without its weights
CONFIG_FILES = ("model_index.json",) + tuple(f"{name}/{file}" for name, file in COMPONENTS.items())


def read_json(folder: Path, relative: str) -> dict:
    """A config of the model folder; its absence is a refusal that names it."""
    try:
        return json.loads((Path(folder) / relative).read_text())
    except FileNotFoundError:
        raise UnsupportedModel(f"{folder} is not a Qwen-Image model folder: it has no {relative}") from None


def detect(folder: Path) -> Family:
    """The family entry of the model in `folder` (the released layout: model_index.json, transformer/, ...)."""
    folder = Path(folder)
    pipeline_class = read_json(folder, "model_index.json").get("_class_name")
    candidates = [family for family in FAMILIES if family.pipeline_class == pipeline_class]
    supported = ", ".join(f"{f.name} ({f.pipeline_class}, zero_cond_t={f.zero_cond_t})" for f in FAMILIES)
    if not candidates:
        raise UnsupportedModel(f"{folder}: model_index.json names {pipeline_class!r}; GhostEdit runs exactly: "
                               f"{supported}")
    configs = {name: read_json(folder, f"{name}/{file}") for name, file in COMPONENTS.items()}
    engine = candidates[0].computation
    transformer = configs["transformer"]
    if transformer.get("_class_name") != engine.transformer_class:
        raise UnsupportedModel(f"{folder}: transformer/config.json is a {transformer.get('_class_name')!r}; "
                               f"{pipeline_class} runs on {engine.transformer_class}")
    options = [name for name in UNSUPPORTED_TRANSFORMER_OPTIONS if transformer.get(name)]
    if options:
        raise UnsupportedModel(f"{folder}: the transformer sets {', '.join(options)}, which GhostEdit's engine "
                               f"({engine.pipeline.rsplit('.', 1)[1]} for edits) does not run")
    schedule = {key: configs["scheduler"].get(key) for key in engine.scheduler}
    different = {key: value for key, value in schedule.items() if value != engine.scheduler[key]}
    if different:
        raise UnsupportedModel(f"{folder}: scheduler/scheduler_config.json differs from the schedule GhostEdit "
                               f"computes in {different} (expected {({k: engine.scheduler[k] for k in different})})")
    if engine is QWEN_IMAGE_21_COMPUTATION:  # Turbo is the one whose model_index.json fixes the sigmas
        sigmas = read_json(folder, "model_index.json").get("sample_sigmas")
        family = QWEN_IMAGE_21_TURBO if sigmas else QWEN_IMAGE_21
        return replace(family, schedule=configs["scheduler"], sample_sigmas=tuple(sigmas) if sigmas else None,
                       default_steps=len(sigmas) if sigmas else family.default_steps)
    zero_cond_t = bool(transformer.get("zero_cond_t", False))
    for family in candidates:
        if family.zero_cond_t == zero_cond_t:
            return family
    raise UnsupportedModel(f"{folder}: model_index.json names {pipeline_class!r} with zero_cond_t={zero_cond_t}; "
                           f"GhostEdit runs exactly: {supported}")


def family_words(family: Family) -> str:
    """Which model a folder was recognised as and what told it apart (2509 and 2511 differ by one flag); for the
    tiny and synthetic models, what they compute as."""
    flag = "true" if family.zero_cond_t else "false"
    if family.repo is None:
        return f"{family.name}: random weights, computed as {family.pipeline_class} with zero_cond_t {flag}"
    return f"{family.name} ({family.pipeline_class} in model_index.json, zero_cond_t {flag} in transformer/config.json)"


def load(dotted: str):
    """The class or function at a dotted path of a Computation."""
    module, name = dotted.rsplit(".", 1)
    return getattr(importlib.import_module(module), name)


def exact_pipeline(pipe, family: Family):
    """A loaded DiffSynth pipeline of the family's kind, made to compute as the family's reference."""
    exact = load(family.computation.exact)
    if not isinstance(pipe, load(family.computation.pipeline)):
        raise TypeError(f"{family.name} runs on {family.computation.pipeline}, not {type(pipe).__name__}")
    pipe.__class__ = exact
    pipe.use_family(family)
    return pipe
