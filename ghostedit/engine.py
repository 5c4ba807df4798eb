"""The engine: base weights loaded once per model source, a prepared pipeline per optimization configuration
(built on first use, reused after, evicted least-recently-used under a memory budget), and instrumented runs.

One job runs on the device at a time; every public method takes the engine's lock, so concurrent callers are safe.
"""
from __future__ import annotations

import copy
import gc
import json
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field

import psutil
import torch
from PIL import Image

from . import images as image_utils
from .config import EditRequest, OptimizationConfig
from .device import Availability, UnavailableOptionError, default_device, empty_cache
from .models import ModelSpec, availability as model_availability, load_base_pipeline, resolve
from .optimize import attention, compile as compile_opt, fp8, lora as lora_opt
from .paths import ghostedit_home
from .telemetry import ProgressCallback, RunCancelled, RunRecorder, RunTelemetry
from .tensors import storage_bytes, storage_pointers

GIB = 1024**3
# DiffSynth pipeline units whose time is a stage of its own
UNIT_STAGES = {"QwenImageUnit_PromptEmbedder": "text encoding", "QwenImageUnit_EditImageEmbedder": "image encoding"}
# Text tokens assumed when timing attention backends for "auto" before the prompt is encoded
AUTO_ATTENTION_TEXT_TOKENS = 256


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
                 torch_dtype: torch.dtype = torch.bfloat16):
        self.spec: ModelSpec = resolve(source)
        self.device = device or default_device()
        self.torch_dtype = torch_dtype
        self.cache_budget_gib = cache_budget_gib
        self._lock = threading.RLock()
        self._base = None
        self._base_pointers: set[int] = set()
        self._prepared: OrderedDict[OptimizationConfig, PreparedPipeline] = OrderedDict()
        self.load_count = 0

    # ---- what can run here ----

    def options(self) -> dict[str, dict[str, Availability]]:
        """Every toggle's choices with whether each can run on this machine, and why not."""
        from .config import ATTENTION_BACKENDS, COMPILE_MODES, FP8_MODES
        return {
            "fp8": {mode: fp8.availability(mode, self.device) for mode in FP8_MODES},
            "attention": {name: attention.availability(name, self.device) for name in ATTENTION_BACKENDS},
            "compile": {mode: compile_opt.availability(mode, self.device) for mode in COMPILE_MODES},
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
                    self._base = load_base_pipeline(self.spec, self.device, self.torch_dtype)
                    attention.install()
                self._base_pointers = storage_pointers(self._base.dit)
                self.load_count += 1
            return self._base

    def prepare(self, config: OptimizationConfig, recorder: RunRecorder | None = None) -> tuple[PreparedPipeline, bool]:
        """The prepared pipeline for `config` and whether it came from the cache."""
        self.check(config)
        with self._lock:
            key = config.cache_key
            if key in self._prepared:
                self._prepared.move_to_end(key)
                return self._prepared[key], True
            recorder = recorder or RunRecorder(self.device)
            prepared = self._build(key, recorder, self.load(recorder))
            self._prepared[key] = prepared
            self._evict_over_budget(keep=key)
            return prepared, False

    def _build(self, config: OptimizationConfig, recorder: RunRecorder, base) -> PreparedPipeline:
        """The recipe, one named step per toggle: lossless steps (LoRA, compile) and the lossy one (FP8) apart.
        Works on a copy that shares the base's tensors and only ever replaces them, so a failure leaves the base
        and the cache as they were."""
        report = {}
        with recorder.stage("copy", "copying the DiT (weights shared)", into_prepare=True):
            dit = _clone_sharing_weights(base.dit)
        if config.lora is not None:
            with recorder.stage("read LoRA", "reading the LoRA", into_prepare=True):
                matched = lora_opt.match_lora(dit, lora_opt.read_lora_file(config.lora.path))
            if config.lora.mode == "fused":
                with recorder.stage("fuse LoRA", "fusing the LoRA into bf16 weights", into_prepare=True):
                    lora_opt.fuse_lora(dit, matched, config.lora.scale)
            else:
                with recorder.stage("attach LoRA", "attaching runtime LoRA layers", into_prepare=True):
                    lora_opt.attach_runtime_lora(dit, matched)
            report["lora"] = f"{config.lora.name}: {matched.report}, {config.lora.mode}"
        # Lossy: FP8 comes after any fusing, so a LoRA is merged into bf16 weights, never into quantized ones.
        with recorder.stage("quantize", "quantizing to FP8", into_prepare=True):
            report["fp8"] = fp8.apply_fp8(dit, config.fp8).text
        if config.compile != "off":
            with recorder.stage("compile", "setting up torch.compile", into_prepare=True):
                blocks = compile_opt.compile_regions(dit, config.compile)
            report["compile"] = f"{config.compile}: {blocks} transformer blocks (compiled on first call)"
        report["attention"] = self._attention_words(config.attention)
        pipe = _pipeline_with_dit(base, dit)
        return PreparedPipeline(config, pipe, storage_bytes(dit, exclude=self._base_pointers), report,
                                dict(recorder.telemetry.prepare_steps))

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
        with self._lock:
            return [{"config": p.config.label, "owned_gib": p.owned_bytes / GIB, "report": dict(p.report),
                     "prepare_s": sum(p.prepare_seconds.values())} for p in reversed(self._prepared.values())]

    # ---- runs ----

    def run(self, request: EditRequest, config: OptimizationConfig = OptimizationConfig(),
            on_progress: ProgressCallback | None = None, cancel: threading.Event | None = None) -> EditResult:
        """One edit. `on_progress` gets a ProgressEvent at every stage and step; setting `cancel` stops the run at
        the next stage or step boundary with RunCancelled."""
        with self._lock:
            recorder = RunRecorder(self.device, on_progress, cancel)
            try:
                return self._run(request, config, recorder)
            except RunCancelled:
                gc.collect()
                empty_cache(self.device)
                raise

    def _run(self, request: EditRequest, config: OptimizationConfig, recorder: RunRecorder) -> EditResult:
        prepared, hit = self.prepare(config, recorder)
        recorder.telemetry.cache_hit = hit
        recorder.telemetry.notes.extend(prepared.warnings)
        width, height, inputs = self._fit_inputs(request)
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
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(times, indent=1))

    def expected_prepare_seconds(self, config: OptimizationConfig) -> float | None:
        """Preparation plus compile warm-up as last measured here for this configuration; None if never measured,
        0 if it is prepared and warm now."""
        with self._lock:
            if config.cache_key in self._prepared and (config.compile == "off" or self._prepared[config.cache_key].warmed_shapes):
                return 0.0
        path = self._prepare_times_file()
        times = json.loads(path.read_text()) if path.exists() else {}
        return times.get(self._prepare_time_key(config))

    def _fit_inputs(self, request: EditRequest):
        first = image_utils.to_rgb(request.images[0])
        if request.width and request.height:
            width, height = request.width, request.height
        else:
            width, height = image_utils.size_for_area(*first.size, self.spec.default_area)
        inputs = [image_utils.fit(image, image_utils.size_for_area(*image.size, width * height))
                  for image in request.images]
        return width, height, inputs

    def _resolve_attention(self, backend: str, prepared: PreparedPipeline, width: int, height: int, inputs) -> str:
        if backend != "auto":
            return backend
        attn = prepared.dit.transformer_blocks[0].attn
        image_tokens = sum(w * h // 256 for w, h in [(width, height)] + [image.size for image in inputs])
        winner, timings = attention.fastest_backend(self.device, attn.num_heads, attn.head_dim,
                                                    image_tokens + AUTO_ATTENTION_TEXT_TOKENS)
        prepared.report["attention"] = "auto → " + winner + " (" + ", ".join(
            f"{name} {ms:.2f} ms" for name, ms in sorted(timings.items(), key=lambda item: item[1])) + ")"
        return winner


def _clone_sharing_weights(module: torch.nn.Module) -> torch.nn.Module:
    """A copy of the module tree whose parameters are new Parameter objects over the same storage: replacing a
    weight in the copy (fusing, quantizing) leaves the original untouched, and unchanged weights cost nothing."""
    memo = {id(p): torch.nn.Parameter(p.data, requires_grad=False) for p in module.parameters()}
    memo.update({id(b): b for b in module.buffers()})
    return copy.deepcopy(module, memo)


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
            warning = (f"torch.compile failed ({type(error).__name__}: {str(error).splitlines()[0][:300]}); "
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
