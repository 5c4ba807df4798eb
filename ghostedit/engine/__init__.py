"""The engine: one model source, its prepared pipelines and its runs, behind one lock. The rooms:

store.py      the base weights, loaded once and placed on the GPU or in host memory (placement.py decides)
prepare.py    the recipe from the base DiT to a configuration's DiT (steps read from the toggle registry)
cache.py      the prepared pipelines, least recently used evicted under a memory budget
loras.py      fused LoRAs written into a prepared DiT in place (switching needs no new preparation)
runner.py     one instrumented edit, and the DiT forward the bench times too
recovery.py   out of memory: free the cache and try once more
report.py     options, the cache, placement and preparation times, in words

One job runs on the device at a time: every public method takes the lock. cached(), placement() and
expected_prepare_seconds() read published state without it, so the page answers at once during a run. What a run
chooses travels down to the DiT's forward in the run's options (models/seams.py): engines of other configurations,
and other models, share a process without sharing run state.
"""
from __future__ import annotations

import contextlib
import threading
from typing import TYPE_CHECKING

from ..config import EditRequest, OptimizationConfig
from ..diffsynth_patches import check_version
from ..device import Availability, UnavailableOptionError, default_device
from ..models import ModelSpec, availability as model_availability, resolve
from ..models.dtypes import component_dtypes, dtype_name
from ..optimize import lora as lora_layers, registry
from ..tensors import storage_bytes
from ..telemetry import ProgressCallback, RunRecorder
from . import placement as placements, report
from .cache import PreparedCache
from .loras import LoraFiles, switch_fused_loras
from .prepare import PreparedPipeline, prepare_dit
from .recovery import OUT_OF_MEMORY_RETRY_NOTE, recovering_memory
from .store import ModelStore

if TYPE_CHECKING:  # runner.py imports DiffSynth: the annotations only name it
    from .runner import EditResult

__all__ = ["Engine", "PreparedPipeline", "import_run_code"]


def import_run_code() -> None:
    """Imports what loading and running need beyond the engine itself: DiffSynth's pipelines and loader, seconds
    (DiffSynth's attention module calls torch.compile at its import: Dynamo and Inductor load). An Engine does it when
    made, so that no run's stages count it; the app makes its engine with import_now=False, serves its page, and
    calls this after (ui/__init__.py, serve_in_background)."""
    # here, not at the top of this file: the app's page is built and served without them
    from ..models import loading  # noqa: F401
    from . import runner  # noqa: F401


class Engine:
    def __init__(self, source: str = "tiny", device: str | None = None, cache_budget_gib: float | None = None,
                 dtype: str | None = None, dit_only: bool = False, mesh=None, import_now: bool = True):
        """`dtype`: "bfloat16" or "float32" for every component; None: what is fast on the device (models/dtypes.py).
        Where the weights live follows each configuration's `memory` setting (placement.py). `dit_only`: load the
        DiT alone (the DiT-level bench). `mesh`: this process's share of a parallel edit (parallel.setup), None in
        one process. `import_now`: import DiffSynth now (import_run_code); False: at the first load, or when the
        caller calls import_run_code (the app, after its page serves)."""
        if import_now:
            import_run_code()
        check_version()  # at start: GhostEdit's changes inside DiffSynth hold for one version
        self.spec: ModelSpec = resolve(source)
        self.device = device or default_device()
        self.dtype_choice = dtype
        self.dtypes = component_dtypes(self.device, dtype)
        self.torch_dtype = self.dtypes["dit"]
        self.store = ModelStore(self.spec, self.device, self.dtypes, dit_only)
        self.cache = PreparedCache(self.device, cache_budget_gib)
        self.loras = LoraFiles()
        self.prepare_times = report.PrepareTimes(self.spec.source, self.device)
        self.mesh = mesh
        # the bench on random weights: every skipping step-cache choice at this threshold (toggles/step_cache.py)
        self.step_cache_threshold: float | None = None
        self._lock = threading.RLock()

    # ---- what can run here ----

    @property
    def load_count(self) -> int:
        return self.store.load_count

    @property
    def family(self):
        """The model's family: the loaded one, or what the source is known as before loading (None for a repo id
        that is not a released one, until its files are read)."""
        pipe = self.store.pipe
        return pipe.family if pipe is not None else self.spec.known_family

    def options(self) -> dict[str, dict[str, Availability]]:
        """Every setting's choices with whether each can run on this machine and this model, and why not."""
        return report.options(self.device, self.family.dit if self.family else None)

    def check(self, config: OptimizationConfig) -> None:
        """Raises UnavailableOptionError with the reason if `config` cannot run here; never falls back."""
        checks = [("model", model_availability(self.spec, self.device))]
        checks += [(f"{toggle.group or toggle.name} {toggle.name if toggle.group else value}",
                    registry.availability(toggle, value, self.device))
                   for toggle in registry.toggles() if (value := config.value(toggle.name)) != toggle.default
                   or toggle.group is None]
        if self.family is not None:
            checks += [(f"{toggle.group or toggle.name} {toggle.name if toggle.group else value} on "
                        f"{self.family.name}", registry.family_availability(toggle, value, self.family.dit))
                       for toggle in registry.toggles() if (value := config.value(toggle.name)) != toggle.default
                       or toggle.group is None]
        checks.append(("memory", placements.fits(self.placement(config), self.store.sizes(), config)))
        for what, available in checks:
            if not available.ok:
                raise UnavailableOptionError(f"{what} is unavailable: {available.reason}")

    def check_request(self, request: EditRequest) -> None:
        """Refuses, with the reason, a request the model cannot run (its number of images, its steps on a fixed
        schedule, its size), where the model's family is known before loading; a run checks it again."""
        if self.family is not None:
            self.family.check_request(request)

    def placement(self, config: OptimizationConfig = OptimizationConfig()) -> placements.Placement:
        """Where each component lives (or would, for this configuration's memory mode), and why."""
        return self.store.plan(config.value("memory"))

    # ---- base weights and prepared pipelines ----

    def load(self, config: OptimizationConfig = OptimizationConfig(), recorder: RunRecorder | None = None):
        with self._lock:
            if self.store.placement is not None and self.store.plan(config.value("memory")) != self.store.placement:
                self.cache.free()  # their DiTs were built for the old placement
                self.store.replace(config.value("memory"))
            return self.store.load(config.value("memory"), recorder or RunRecorder(self.device))

    def prepare(self, config: OptimizationConfig, recorder: RunRecorder | None = None) -> tuple[PreparedPipeline, bool]:
        """The prepared pipeline for `config` (its fused LoRAs written in) and whether it came from the cache. Out
        of GPU memory, it frees every prepared pipeline and tries once more, as run does."""
        with self._lock:
            return recovering_memory(lambda: self._prepare(config, recorder or RunRecorder(self.device)),
                                     f"preparing {config.label}", self.free, self.device, self.mesh)[0]

    def _prepare(self, config: OptimizationConfig, recorder: RunRecorder) -> tuple[PreparedPipeline, bool]:
        self.check(config)
        base = self.load(config, recorder)
        unread = [lora.name for lora in config.loras if lora not in self.loras]
        with recorder.stage("LoRA read", f"reading {', '.join(unread)}") if unread else contextlib.nullcontext():
            recorder.telemetry.loras = self._matched_loras(config, base)
        prepared = self.cache.get(config.cache_key)
        hit = prepared is not None
        if not hit:
            self.cache.make_room(self._expected_bytes(config))
            prepared = self._build(config, recorder, base)
            self.cache.put(prepared)
        switched = switch_fused_loras(prepared, config.fused_loras, base.dit, self.loras, recorder, self.device)
        if switched or not hit:  # counted over every tensor of the DiT: not again for each run
            prepared.owned_bytes = storage_bytes(prepared.dit, exclude=self.store.base_pointers)
        return prepared, hit

    def _matched_loras(self, config: OptimizationConfig, base) -> list[dict]:
        """Reads and matches every LoRA before anything is prepared (one that cannot apply leaves the cache as it
        was); returns what each matched and what it left out, for the run's telemetry."""
        described = []
        for lora in config.loras:
            found = self.loras.matched(lora, base.dit, self.device)
            if lora.mode == "runtime":
                lora_layers.check_runtime(found, lora.name)
            described.append({"name": lora.name, "mode": lora.mode, "scale": lora.scale, **found.describe()})
        return described

    def _build(self, config: OptimizationConfig, recorder: RunRecorder, base) -> PreparedPipeline:
        dit, words = prepare_dit(base.dit, config, recorder, self.device)
        return PreparedPipeline(config.cache_key, config, _pipeline_with_dit(base, dit),
                                storage_bytes(dit, exclude=self.store.base_pointers), words,
                                dict(recorder.telemetry.prepare_steps))

    def _expected_bytes(self, config: OptimizationConfig) -> int:
        if self.store.placement.base_on_gpu and config.value("fp8") == "off":
            return 0
        return self.store.sizes().prepared_dit(config)

    def free(self) -> int:
        """Drops every prepared pipeline (the base stays) and returns the bytes they held."""
        with self._lock:
            return self.cache.free()

    def close(self) -> None:
        """Drops the prepared pipelines and the base weights (a model switch): a later run would load them again."""
        with self._lock:
            self.cache.free()
            self.store.unload()

    def cached(self) -> list[dict]:
        """The prepared pipelines, most recently used first; answers at once, even during a run."""
        return report.cached(self.cache.view())

    def expected_prepare_seconds(self, config: OptimizationConfig) -> float | None:
        """Preparation plus compile warm-up as last measured here for this configuration; None if never measured,
        0 if it is prepared and warm now. Answers at once, even during a run."""
        prepared = next((p for p in self.cache.view() if p.key == config.cache_key), None)
        if prepared is not None and (config.value("compile") == "off" or prepared.warmed_shapes):
            return 0.0
        return self.prepare_times.expected(config)

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
            result, retried = recovering_memory(
                lambda: self._run(request, config, RunRecorder(self.device, on_progress, cancel)),
                f"running a {size} edit with {config.label}", self.free, self.device, self.mesh)
        if retried:
            result.telemetry.notes.append(OUT_OF_MEMORY_RETRY_NOTE)
        return result

    def _run(self, request: EditRequest, config: OptimizationConfig, recorder: RunRecorder) -> EditResult:
        prepared, hit = self._prepare(config, recorder)
        telemetry = recorder.telemetry
        telemetry.cache_hit = hit
        telemetry.dtypes = {name: dtype_name(dtype) for name, dtype in self.dtypes.items()}
        telemetry.placement = {name: where["where"] for name, where in self.store.placement.describe().items()}
        from .runner import run_edit  # imported by import_run_code (not at the top: the app's page needs it not)
        result = run_edit(prepared, request, config, recorder, self.spec, self.device, self.mesh,
                          self.step_cache_threshold)
        if not hit:
            self.prepare_times.remember(config, result.telemetry)
        return result


def _pipeline_with_dit(base, dit):
    """A pipeline of the base's kind over the base's encoders, VAE and processors, with its own DiT."""
    pipe = type(base)(device=base.device, torch_dtype=base.torch_dtype)
    for name in ("text_encoder", "vae", "tokenizer", "processor", "blockwise_controlnet", "controlnet", "units"):
        if hasattr(base, name):  # 2.1's pipeline has a controlnet where the Edit one has a blockwise one
            setattr(pipe, name, getattr(base, name))
    pipe.use_family(base.family)  # its own schedule, as the family computes it
    pipe.dit = dit
    return pipe
