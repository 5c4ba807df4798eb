"""The engine: base weights loaded once per model source, a prepared pipeline per optimization configuration
(built on first use, reused after, evicted least-recently-used under a memory budget), and instrumented runs.

One job runs on the device at a time; every public method takes the engine's lock, so concurrent callers are safe.
The read-only cached() and expected_prepare_seconds() take no lock: the System tab and the prepare notice answer at
once during someone else's run.
"""
from __future__ import annotations

import gc
import json
import logging
import re
import threading
import time
import traceback
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import torch
from PIL import Image

from . import images as image_utils
from .config import SIZE_RANGE, EditRequest, OptimizationConfig
from .device import Availability, UnavailableOptionError, default_device, empty_cache
from .errors import GpuOutOfMemoryError, error_summary
from .models import ModelSpec, availability as model_availability, load_base_pipeline, resolve
from .models.dtypes import component_dtypes, dtype_name
from .optimize import attention, compile as compile_opt, fp8, lora as lora_opt, offload
from .paths import ghostedit_home, write_atomically
from .recipe import prepare_dit
from .telemetry import GIB, ProgressCallback, RunCancelled, RunRecorder, RunTelemetry
from .tensors import storage_bytes, storage_pointers

# DiffSynth pipeline units whose time is a stage of its own
UNIT_STAGES = {"QwenImageUnit_PromptEmbedder": "text encoding", "QwenImageUnit_EditImageEmbedder": "image encoding"}
# Text tokens assumed when timing attention backends for "auto" before the prompt is encoded
AUTO_ATTENTION_TEXT_TOKENS = 256
OUT_OF_MEMORY_RETRY_NOTE = ("ran out of GPU memory on the first try: every cached pipeline was freed and the edit "
                            "was run again")

logger = logging.getLogger(__name__)


@dataclass
class PreparedPipeline:
    config: OptimizationConfig
    pipe: object                      # a diffsynth QwenImagePipeline sharing the base's encoders and VAE
    owned_bytes: int                  # memory this configuration adds to the base weights
    report: dict[str, str]            # what each toggle did, in words
    prepare_seconds: dict[str, float]
    warnings: list[str] = field(default_factory=list)
    warmed_shapes: set = field(default_factory=set)

    @property
    def dit(self):
        return self.pipe.dit


@dataclass
class EditResult:
    image: Image.Image
    inputs: list[Image.Image]         # the input images as the model saw them
    request: EditRequest
    config: OptimizationConfig
    width: int
    height: int
    attention_backend: str            # the backend that ran ("auto" resolved)
    prepared_report: dict[str, str]
    telemetry: RunTelemetry


class Engine:
    def __init__(self, source: str = "tiny", device: str | None = None, cache_budget_gib: float | None = None,
                 dtype: str | None = None, host_memory: tuple[str, ...] = ()):
        """`dtype`: "bfloat16" or "float32" for every component; None: what is fast on the device (models/dtypes.py).
        `host_memory` names what stays in host memory instead of on the device (see optimize/offload.py):
        "base-dit" and/or "text-encoder". Both together let an FP8 DiT run on a 24 GB card."""
        self.spec: ModelSpec = resolve(source)
        self.device = device or default_device()
        self.host_memory = offload.checked(host_memory)
        self.dtypes = component_dtypes(self.device, dtype)
        self.torch_dtype = self.dtypes["dit"]
        self.cache_budget_gib = cache_budget_gib
        self._lock = threading.RLock()
        self._base = None
        self._base_pointers: set[int] = set()
        self._prepared: OrderedDict[OptimizationConfig, PreparedPipeline] = OrderedDict()  # changed under the lock
        # The same pipelines, most recently used first, replaced whole after every change: read without the lock
        self._cache_view: tuple[PreparedPipeline, ...] = ()
        self.load_count = 0

    # ---- what can run here ----

    def options(self) -> dict[str, dict[str, Availability]]:
        """Every toggle's choices with whether each can run on this machine, and why not."""
        from .config import ATTENTION_BACKENDS, COMPILE_MODES, FP8_MODES, INDUCTOR_REWRITES, REWRITES
        compile_ok = compile_opt.availability("regional", self.device)
        return {
            "fp8": {mode: fp8.availability(mode, self.device) for mode in FP8_MODES},
            "attention": {name: attention.availability(name, self.device) for name in ATTENTION_BACKENDS},
            "compile": {mode: compile_opt.availability(mode, self.device) for mode in COMPILE_MODES},
            "rewrites": {name: compile_ok if name in INDUCTOR_REWRITES else Availability.yes() for name in REWRITES},
        }

    def check(self, config: OptimizationConfig) -> None:
        """Raises UnavailableOptionError with the reason if `config` cannot run here; never falls back."""
        checks = [("model", model_availability(self.spec, self.device)),
                  (f"FP8 mode {config.fp8}", fp8.availability(config.fp8, self.device)),
                  (f"attention {config.attention}", attention.availability(config.attention, self.device)),
                  (f"compile {config.compile}", compile_opt.availability(config.compile, self.device))]
        for what, available in checks:
            if not available.ok:
                raise UnavailableOptionError(f"{what} is unavailable: {available.reason}")

    # ---- base weights and prepared pipelines ----

    def load(self, recorder: RunRecorder | None = None):
        with self._lock:
            if self._base is None:
                recorder = recorder or RunRecorder(self.device)
                with recorder.stage("load", f"loading {self.spec.description}"):
                    self._base = load_base_pipeline(self.spec, self.device, self.dtypes)
                    attention.install()
                    offload.keep_in_host_memory(self._base, self.host_memory, self.device)
                self._base_pointers = storage_pointers(self._base.dit)
                self.load_count += 1
            return self._base

    def prepare(self, config: OptimizationConfig, recorder: RunRecorder | None = None) -> tuple[PreparedPipeline, bool]:
        """The prepared pipeline for `config` and whether it came from the cache. Out of GPU memory, it frees every
        prepared pipeline and tries once more, as run does."""
        with self._lock:
            return self._recovering_memory(lambda: self._prepare(config, recorder or RunRecorder(self.device)),
                                           f"preparing {config.label}")[0]

    def _prepare(self, config: OptimizationConfig, recorder: RunRecorder) -> tuple[PreparedPipeline, bool]:
        self.check(config)
        with self._lock:
            key = config.cache_key
            if key in self._prepared:
                self._prepared.move_to_end(key)
                self._publish_cache_view()
                return self._prepared[key], True
            prepared = self._build(key, recorder, self.load(recorder))
            self._prepared[key] = prepared
            self._publish_cache_view()
            self._evict_over_budget(keep=key)
            return prepared, False

    def _publish_cache_view(self) -> None:
        self._cache_view = tuple(reversed(self._prepared.values()))

    def _build(self, config: OptimizationConfig, recorder: RunRecorder, base) -> PreparedPipeline:
        dit, report = prepare_dit(base.dit, config, recorder, self.device)
        report["attention"] = self._attention_words(config.attention)
        return PreparedPipeline(config, _pipeline_with_dit(base, dit), storage_bytes(dit, exclude=self._base_pointers),
                                report, dict(recorder.telemetry.prepare_steps))

    def _attention_words(self, backend: str) -> str:
        if backend == "diffsynth":
            return f"DiffSynth default ({attention.diffsynth_default()})"
        if backend == "auto":
            return "auto (fastest measured here at the run's shape)"
        return backend

    def _budget_bytes(self) -> int:
        if self.cache_budget_gib is not None:
            return int(self.cache_budget_gib * GIB)
        if self.device.startswith("cuda"):
            free, total = torch.cuda.mem_get_info()
            # keep a quarter of the card for activations
            return max(0, int(free + self._owned_bytes() - 0.25 * total))
        return int(0.5 * psutil.virtual_memory().available + self._owned_bytes())

    def _owned_bytes(self) -> int:
        return sum(p.owned_bytes for p in self._prepared.values())

    def _evict_over_budget(self, keep: OptimizationConfig) -> None:
        budget = self._budget_bytes()
        for key in list(self._prepared):
            if self._owned_bytes() <= budget:
                break
            if key != keep:
                self._evict(key)

    def _evict(self, key: OptimizationConfig) -> None:
        prepared = self._prepared.pop(key)
        self._publish_cache_view()
        prepared.pipe.dit = None
        del prepared
        gc.collect()
        empty_cache(self.device)

    def free(self) -> int:
        """Drops every prepared pipeline (the base stays) and returns the bytes they held."""
        with self._lock:
            freed = self._owned_bytes()
            for key in list(self._prepared):
                self._evict(key)
            return freed

    def cached(self) -> list[dict]:
        """The prepared pipelines, most recently used first; answers at once, even during a run."""
        return [{"config": p.config.label, "owned_gib": p.owned_bytes / GIB, "report": dict(p.report),
                 "prepare_s": sum(p.prepare_seconds.values())} for p in self._cache_view]

    # ---- runs ----

    def run(self, request: EditRequest, config: OptimizationConfig = OptimizationConfig(),
            on_progress: ProgressCallback | None = None, cancel: threading.Event | None = None) -> EditResult:
        """One edit. `on_progress` gets a ProgressEvent at every stage and step; setting `cancel` stops the run at
        the next stage or step boundary with RunCancelled. Out of GPU memory while preparing or running, every
        prepared pipeline is freed and the edit run once more (its telemetry notes say so); a second failure raises
        GpuOutOfMemoryError. After a failure or a cancel, the run's memory is free when the error reaches the
        caller, and the engine serves the next request as usual."""
        size = f"{request.width}x{request.height}" if request.width else "default-size"
        with self._lock:
            result, retried = self._recovering_memory(
                lambda: self._run(request, config, RunRecorder(self.device, on_progress, cancel)),
                f"running a {size} edit with {config.label}")
        if retried:
            result.telemetry.notes.append(OUT_OF_MEMORY_RETRY_NOTE)
        return result

    def _recovering_memory(self, attempt, what: str):
        """`attempt()` and whether it was retried after running out of memory, with every prepared pipeline freed
        in between. Out-of-memory and cancel errors leave without their traceback: its frames hold the failed
        attempt's tensors, which must be freed before the retry, not whenever the caller drops the error."""
        result, error = _outcome(attempt)
        retried = isinstance(error, torch.OutOfMemoryError)
        if retried:
            self._free_after_out_of_memory()
            result, error = _outcome(attempt)
        if isinstance(error, torch.OutOfMemoryError):
            self._free_after_out_of_memory()
            error = GpuOutOfMemoryError(self._out_of_memory_message(what, error))
        if error is not None:
            gc.collect()
            empty_cache(self.device)
            raise error
        return result, retried

    def _free_after_out_of_memory(self) -> None:
        freed = self.free()
        logger.warning("out of memory: freed %.2f GiB of prepared pipelines", freed / GIB)

    def _out_of_memory_message(self, what: str, error: torch.OutOfMemoryError) -> str:
        memory = "GPU memory" if self.device.startswith("cuda") else "memory"
        wanted = re.search(r"Tried to allocate ([\d.]+ \w+)", str(error))
        needed = f" (it needed another {wanted[1]})" if wanted else ""
        return (f"out of {memory} while {what}{needed}: GhostEdit freed every cached pipeline and tried once more, "
                "and it still did not fit. Try a smaller output size, fewer input images, or FP8 storage weights")

    def _run(self, request: EditRequest, config: OptimizationConfig, recorder: RunRecorder) -> EditResult:
        compile_opt.configure_dynamo()  # in this thread: the app runs each edit in a thread of its own
        prepared, hit = self._prepare(config, recorder)
        recorder.telemetry.cache_hit = hit
        recorder.telemetry.dtypes = {name: dtype_name(dtype) for name, dtype in self.dtypes.items()}
        recorder.telemetry.notes.extend(prepared.warnings)
        width, height, inputs = self._fit_inputs(request)
        recorder.telemetry.notes.extend(f"input image {index}: {note}" for index, image in enumerate(request.images, 1)
                                        for note in image_utils.image_notes(image))
        backend = self._resolve_attention(config.attention, prepared, width, height, inputs)
        if lora_opt.has_runtime_lora(prepared.dit):
            lora_opt.set_runtime_lora_scale(prepared.dit, config.lora.scale)
        with attention.active(backend), _instrumented(prepared, recorder):
            image = prepared.pipe(prompt=request.prompt, negative_prompt=request.negative_prompt,
                                  cfg_scale=request.cfg_scale, edit_image=inputs, edit_image_auto_resize=False,
                                  height=height, width=width, seed=request.seed,
                                  num_inference_steps=request.steps, progress_bar_cmd=recorder.timed_steps)
            recorder.decoding_done()
        telemetry = recorder.finish()
        if not hit:
            self._remember_prepare_time(config, telemetry)
        return EditResult(image, inputs, request, config, width, height, backend, dict(prepared.report), telemetry)

    # ---- how long preparing takes, as measured on this machine before ----

    def _prepare_times_file(self):
        return ghostedit_home() / "prepare-times.json"

    def _prepare_time_key(self, config: OptimizationConfig) -> str:
        device = torch.cuda.get_device_name() if self.device.startswith("cuda") else "cpu"
        return f"{self.spec.source} | {device} | {config.cache_key.label}"

    def _remember_prepare_time(self, config: OptimizationConfig, telemetry: RunTelemetry) -> None:
        seconds = telemetry.stages.get("prepare", 0.0) + telemetry.stages.get("compile warm-up", 0.0)
        path = self._prepare_times_file()
        times = json.loads(path.read_text()) if path.exists() else {}
        times[self._prepare_time_key(config)] = seconds
        # expected_prepare_seconds reads it without the lock
        write_atomically(path, lambda temporary: Path(temporary).write_text(json.dumps(times, indent=1)))

    def expected_prepare_seconds(self, config: OptimizationConfig) -> float | None:
        """Preparation plus compile warm-up as last measured here for this configuration; None if never measured,
        0 if it is prepared and warm now. Answers at once, even during a run."""
        prepared = next((p for p in self._cache_view if p.config == config.cache_key), None)
        if prepared is not None and (config.compile == "off" or prepared.warmed_shapes):
            return 0.0
        path = self._prepare_times_file()
        times = json.loads(path.read_text()) if path.exists() else {}
        return times.get(self._prepare_time_key(config))

    def _fit_inputs(self, request: EditRequest):
        """The output size (the request's, else the first image's aspect ratio at the model's default area) and the
        inputs (RGB, checked by EditRequest) resized to about that area, each keeping its aspect ratio."""
        max_side = SIZE_RANGE[1]
        if request.width:
            width, height = request.width, request.height
        else:
            width, height = image_utils.size_for_area(*request.images[0].size, self.spec.default_area, max_side)
        inputs = [image_utils.fit(image, image_utils.size_for_area(*image.size, width * height, max_side))
                  for image in request.images]
        return width, height, inputs

    def _resolve_attention(self, backend: str, prepared: PreparedPipeline, width: int, height: int, inputs) -> str:
        image_tokens = sum(w * h // 256 for w, h in [(width, height)] + [image.size for image in inputs])
        winner, words = attention.resolve(backend, prepared.dit, image_tokens + AUTO_ATTENTION_TEXT_TOKENS,
                                          self.device)
        if backend == "auto":
            prepared.report["attention"] = words
        return winner


def _outcome(attempt):
    """(result, None), or (None, error) for running out of memory or being cancelled, the error detached from the
    frames of the failed attempt (its traceback and any exception it interrupted)."""
    try:
        return attempt(), None
    except (torch.OutOfMemoryError, RunCancelled) as error:
        if isinstance(error, torch.OutOfMemoryError):
            logger.warning("out of memory:\n%s", traceback.format_exc())  # text only: a record would keep the frames
        error.__traceback__ = error.__context__ = error.__cause__ = None
        return None, error


def _pipeline_with_dit(base, dit):
    from diffsynth.pipelines.qwen_image import QwenImagePipeline

    pipe = QwenImagePipeline(device=base.device, torch_dtype=base.torch_dtype)
    for name in ("text_encoder", "vae", "tokenizer", "processor", "blockwise_controlnet"):
        setattr(pipe, name, getattr(base, name))
    pipe.dit = dit
    return pipe


class _instrumented:
    """Times DiffSynth's pipeline units and DiT calls for one run: text/image encoding as stages, the first DiT
    call of a compiled model at each new shape as the compile warm-up (kept out of the step times), and an FP8
    model's forward context. A compile failure reverts to eager with a warning in the result, never silently."""

    def __init__(self, prepared: PreparedPipeline, recorder: RunRecorder):
        self.prepared, self.recorder = prepared, recorder

    def __enter__(self):
        pipe = self.prepared.pipe
        self.unit_runner, self.model_fn = pipe.unit_runner, pipe.model_fn
        pipe.unit_runner, pipe.model_fn = self._timed_unit_runner, self._timed_model_fn
        return self

    def __exit__(self, *exc):
        self.prepared.pipe.unit_runner, self.prepared.pipe.model_fn = self.unit_runner, self.model_fn

    def _timed_unit_runner(self, unit, *args):
        stage = UNIT_STAGES.get(type(unit).__name__)
        if stage is None:
            return self.unit_runner(unit, *args)
        with self.recorder.stage(stage):
            return self.unit_runner(unit, *args)

    def _timed_model_fn(self, **inputs):
        prepared = self.prepared
        with fp8.forward_context(prepared.dit, prepared.config.fp8):
            shape = _shape_signature(inputs)
            if prepared.config.compile != "off" and shape not in prepared.warmed_shapes:
                self._warm_up(inputs)
                prepared.warmed_shapes.add(shape)
            return self.model_fn(**inputs)

    def _warm_up(self, inputs):
        start = time.perf_counter()
        try:
            with self.recorder.stage("compile warm-up", "compiling (first call at this shape)"):
                self.model_fn(**inputs)
        except Exception as error:
            if not compile_opt.is_compile_error(error):
                raise
            compile_opt.revert_to_eager(self.prepared.dit)
            warning = (f"torch.compile failed ({type(error).__name__}: {error_summary(error)}); "
                       "this configuration runs in eager mode")
            self.prepared.warnings.append(warning)
            self.prepared.report["compile"] = "failed: eager"
            self.recorder.telemetry.notes.append(warning)
        self.recorder.exclude_from_current_step(time.perf_counter() - start)


def _shape_signature(inputs: dict) -> tuple:
    def shapes(value):
        if isinstance(value, torch.Tensor):
            return tuple(value.shape)
        if isinstance(value, (list, tuple)):
            return tuple(shapes(v) for v in value)
        return None
    return tuple((name, shapes(value)) for name, value in sorted(inputs.items()) if shapes(value) is not None)
