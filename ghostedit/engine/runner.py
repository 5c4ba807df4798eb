"""One edit on a prepared pipeline, instrumented: the toggles' run-time contexts around DiffSynth's pipeline call and
the run's DiT options they set (`dit_run`), DiffSynth's text and image encoding timed as stages, every DiT forward
through `forward` with those options (the same function the DiT-level bench times), and the first forward of a
compiled DiT at a new shape counted as the compile warm-up.

The warm-up is the first real forward, not an extra one: its time goes to the "compile warm-up" stage and is left
out of its step's time, and that step is left out of the median step time when there are others. A compile failure
reverts the DiT to eager with a warning in the result, never silently.
"""
from __future__ import annotations

import contextlib
import functools
from dataclasses import dataclass

import torch
from PIL import Image

from .. import images as image_utils, parallel
from ..config import SIZE_RANGE, EditRequest
from ..device import UnavailableOptionError
from ..errors import error_summary
from ..models import exact
from ..models.family import QWEN_IMAGE_21_DIT
from ..models.seams import DitOptions
from ..optimize import compile as compile_blocks, lora as lora_layers, packages, registry
from ..telemetry import RunRecorder, RunTelemetry
from .prepare import PreparedPipeline

# DiffSynth pipeline units whose time is a stage of its own
UNIT_STAGES = {"PromptEmbedder": "text encoding", "EditImageEmbedder": "image encoding",
               "StartEmbedder": "image encoding", "QwenImage21Unit_PromptEmbedder": "text encoding"}
# Text tokens assumed for the sequence length of a DiT forward before the prompt is encoded ("auto" attention)
TEXT_TOKENS_ESTIMATE = 256


@dataclass
class EditResult:
    image: Image.Image
    family: object                    # models.family.Family: how the model saw the inputs
    request: EditRequest
    config: object                    # OptimizationConfig
    width: int
    height: int
    attention_backend: str            # the backend that ran ("auto" resolved)
    prepared_report: dict[str, str]
    telemetry: RunTelemetry

    @functools.cached_property
    def inputs(self) -> list[Image.Image]:
        """The input images as the model saw them (the VAE's condition images; none for text-to-image), made when
        asked for: outside the run's time, which resizes them once inside the pipeline."""
        return exact.condition_images(self.family, self.request.images)


def forward(model_fn, inputs: dict) -> torch.Tensor:
    """One DiT forward as DiffSynth's pipeline makes it: its model_fn with the prepared DiT and the run's options
    among the inputs. The engine's runs and the DiT-level bench both come through here, inside `dit_run`.

    DiffSynth's model_fn reads the prompt's length off its mask (`.tolist()`): on a GPU mask that makes the CPU
    wait for all the GPU's queued work at every forward, and the GPU then idles while Python prepares the next
    blocks. It gets the mask from host memory instead, copied once per mask (the pipeline hands the same one to
    every step). Entity prompts use the mask on the device: they keep it there."""
    if inputs.get("entity_prompt_emb") is None and inputs.get("prompt_emb_mask") is not None:
        inputs = {**inputs, "prompt_emb_mask": _on_host(inputs["prompt_emb_mask"])}
    return model_fn(**inputs)


def _on_host(tensor: torch.Tensor) -> torch.Tensor:
    """A host copy of `tensor`, kept on it until it changes in place."""
    if tensor.device.type == "cpu":
        return tensor
    kept = getattr(tensor, "_ghostedit_on_host", None)
    if kept is None or kept[0] != tensor._version:
        kept = tensor._ghostedit_on_host = (tensor._version, tensor.cpu())
    return kept[1]


@contextlib.contextmanager
def dit_run(prepared: PreparedPipeline, config, device: str, sequence_length: int, recorder: RunRecorder,
            mesh=None, step_cache_threshold: float | None = None):
    """Inside, the run-time contexts of every toggle (attention backend, FP8 autocast, compile settings...) for a run
    or a bench at this sequence length: yields the run's DiT options they set (with the sequence split of `mesh`,
    the process mesh of a parallel edit) and what they resolved."""
    context = registry.RunContext(prepared, config, device, sequence_length, recorder, mesh, step_cache_threshold)
    if lora_layers.has_runtime_lora(prepared.dit):
        lora_layers.set_runtime_scales(prepared.dit, {lora.sha256: lora.scale for lora in config.runtime_loras})
    with registry.run_contexts(config, context):
        yield DitOptions(**context.options, sequence_split=parallel.Ulysses.of(mesh, prepared.dit.heads)), context.ran


def run_edit(prepared: PreparedPipeline, request: EditRequest, config, recorder: RunRecorder, spec,
             device: str, mesh=None, step_cache_threshold: float | None = None) -> EditResult:
    family = prepared.pipe.family
    width, height, condition_sizes = fit_inputs(request, family)
    recorder.telemetry.notes.extend(prepared.warnings)
    recorder.telemetry.notes.extend(f"input image {index}: {note}" for index, image in enumerate(request.images, 1)
                                    for note in image_utils.image_notes(image))
    sequence_length = sum(w * h // 256 for w, h in [(width, height), *condition_sizes])
    recorder.telemetry.parallel = parallel.describe(mesh)
    start = exact.Start.of(request, (width, height))  # None: a plain edit
    if family.dit == QWEN_IMAGE_21_DIT:
        refuse_for_2_1(family, start)
    with dit_run(prepared, config, device, sequence_length + TEXT_TOKENS_ESTIMATE, recorder, mesh,
                 step_cache_threshold) as (options, ran), \
            _Instrumented(prepared, recorder, options), parallel.edit_context(prepared.pipe, mesh, request.cfg_scale):
        image = prepared.pipe(**pipeline_arguments(request, family, config, width, height, recorder.telemetry, start,
                                                   options),
                              progress_bar_cmd=lambda timesteps: recorder.timed_steps(on_device(timesteps, device)))
        image = start.finished(image) if start else image
        recorder.decoding_done()
    return EditResult(image, family, request, config, width, height, ran.get("attention", "diffsynth"),
                      {**prepared.report, **ran.get("words", {})}, recorder.finish())


def refuse_for_2_1(family, start) -> None:
    """What Qwen-Image-2.1's pipeline does not run, refused with the reason before anything starts."""
    if start is not None:
        raise UnavailableOptionError(f"{family.name} takes no mask or strength: they follow diffusers' "
                                     "QwenImageEditInpaintPipeline, written for the Edit models")


def pipeline_arguments(request: EditRequest, family, config, width: int, height: int, telemetry, start,
                       options: DitOptions) -> dict:
    """What the family's pipeline is called with: the Edit models' DiffSynth QwenImagePipeline (with `start`, the
    image a masked or partial-strength edit starts from; the run's DiT options reach its forward through
    _Instrumented), or Qwen-Image-2.1's (which takes the run's DiT options itself, adds its prefix cache to them,
    and counts the tokens each DiT forward computed into the telemetry)."""
    common = {"prompt": request.prompt, "negative_prompt": request.negative_prompt, "cfg_scale": request.cfg_scale,
              "height": height, "width": width, "seed": request.seed, "num_inference_steps": request.steps}
    if family.dit == QWEN_IMAGE_21_DIT:
        return {**common, "edit_image": list(request.images) or None, "dit_options": options,
                "prefix_cache": config.value("prefix-cache") == "on", "count_tokens": telemetry.dit_tokens.append}
    return {**common, "edit_image": list(request.images), "edit_image_auto_resize": False,
            "zero_cond_t": family.zero_cond_t, "input_image": start, "denoising_strength": request.strength}


def on_device(timesteps: torch.Tensor, device: str) -> torch.Tensor:
    """The schedule's timesteps copied to the device at once, for DiffSynth's denoising loop: it copies each step's
    timestep to the device (a copy that makes the CPU wait for the GPU there), and one already on the device it
    only casts."""
    return timesteps.to(device, non_blocking=True)


def fit_inputs(request: EditRequest, family):
    """The output size (the request's, else the family's default: its area at the aspect ratio of the input image
    the reference takes it from, or of the first where the edit starts from it, at most SIZE_RANGE's side) and the
    sizes of the condition images the VAE encodes (each input resized once from its original by the family's rule,
    as the reference does, in the pipeline)."""
    family.check_request(request)
    multiple = family.size_multiple
    if request.width:
        width, height = request.width, request.height
    else:
        sized_by = request.images[:1] if request.starts_from_image else request.images
        width, height = family.default_size([image.size for image in sized_by])
        if max(width, height) > SIZE_RANGE[1]:
            width, height = image_utils.size_for_area(width, height, width * height, SIZE_RANGE[1])
            width, height = width // multiple * multiple, height // multiple * multiple
    return width, height, exact.condition_sizes(family, request.images,
                                                (width, height) if request.starts_from_image else None)


def package_compiled_code(prepared: PreparedPipeline, device: str) -> None:
    """After a compiled DiT's first call at a shape: its compiled code kept as the configuration's package."""
    if compile_blocks.is_compiled(prepared.dit):
        packages.save(prepared.label, device)


class _Instrumented:
    """Times DiffSynth's pipeline units (text and image encoding) and routes every DiT call through `forward` with
    the run's options, the first call of a compiled DiT at each new shape timed as the compile warm-up."""

    def __init__(self, prepared: PreparedPipeline, recorder: RunRecorder, options: DitOptions):
        self.prepared, self.recorder, self.options = prepared, recorder, options

    def __enter__(self):
        pipe = self.prepared.pipe
        self.unit_runner, self.model_fn = pipe.unit_runner, pipe.model_fn
        pipe.unit_runner, pipe.model_fn = self._timed_unit_runner, self._model_fn
        return self

    def __exit__(self, *exc):
        self.prepared.pipe.unit_runner, self.prepared.pipe.model_fn = self.unit_runner, self.model_fn

    def _timed_unit_runner(self, unit, *args):
        stage = UNIT_STAGES.get(type(unit).__name__)
        if stage is None:
            return self.unit_runner(unit, *args)
        with self.recorder.stage(stage):
            return self.unit_runner(unit, *args)

    def _model_fn(self, **inputs):
        inputs.setdefault("options", self.options)  # a pipeline that carries them keeps its own (2.1's: with the
        # prefix cache of its call)
        shape = _shape_signature(inputs)
        if not compile_blocks.is_compiled(self.prepared.dit) or shape in self.prepared.warmed_shapes:
            return forward(self.model_fn, inputs)
        with self.recorder.stage("compile warm-up", "compiling (first call at this shape)", warm_up=True):
            output = self._first_compiled_forward(inputs)
            package_compiled_code(self.prepared, self.recorder.device)
        self.prepared.warmed_shapes.add(shape)
        return output

    def _first_compiled_forward(self, inputs):
        try:
            return forward(self.model_fn, inputs)
        except Exception as error:
            if not compile_blocks.is_compile_error(error):
                raise
            failure = error
        compile_blocks.revert_to_eager(self.prepared.dit)
        warning = (f"torch.compile failed ({type(failure).__name__}: {error_summary(failure)}); "
                   "this configuration runs in eager mode")
        self.prepared.warnings.append(warning)
        self.prepared.report["compile"] = "failed: eager"
        self.recorder.telemetry.notes.append(warning)
        return forward(self.model_fn, inputs)


def _shape_signature(inputs: dict) -> tuple:
    def shapes(value):
        if isinstance(value, torch.Tensor):
            return tuple(value.shape)
        if isinstance(value, (list, tuple)):
            return tuple(shapes(v) for v in value)
        return None
    signature = tuple((name, shapes(value)) for name, value in sorted(inputs.items()) if shapes(value) is not None)
    cache = inputs["options"].prefix_cache  # 2.1's: a forward that fills it and one that reads it differ inside
    return signature if cache is None else (*signature, ("prefix cache", cache.shape_key(inputs["progress_id"])))
