"""Stage and step timers and memory probes for one run.

Stage times are wall-clock after a device synchronize, so GPU work is counted where it happens. Denoising steps on a
CUDA GPU are timed by events in its stream (StepClock): nothing waits for the GPU between steps, so the CPU hands
over a step while the GPU runs the one before. On a machine without a GPU the memory figures are host memory
(process RSS), labelled as such.
"""
from __future__ import annotations

import contextlib
import functools
import statistics
import threading
import time
import warnings
from dataclasses import dataclass, field
from typing import Callable

import psutil
import torch

from .device import synchronize

GIB = 1024**3

# The order in which stages are shown; a run reports the ones it went through.
# The host's time between the stages before the denoising loop: the run's toggles put in place (graphs, the VAE's
# and the text encoder's run-time forms), DiffSynth's units around the encoders (shapes, noise, the prompt's
# template), the schedule: named, so that the stages add up to the run's total
SET_UP = "set-up"
STAGE_ORDER = ("load", "LoRA read", "prepare", "LoRA switch", "compile warm-up", "CUDA graph capture", SET_UP,
               "image encoding", "text encoding", "denoising", "decoding")
# An edit's own stages, timed on a GPU by events on its clock, as the denoising steps are: the CPU goes on into the
# next stage while the GPU finishes this one's work (the text encoder's processor while the VAE encodes, say), where
# a synchronizing timer would make the edit wait for its own measurement.
EVENT_TIMED_STAGES = ("image encoding", "text encoding")


def median_ms(fn, device: str, repeats: int, warmup: int = 0) -> float:
    """Median milliseconds of `fn` after `warmup` untimed calls: CUDA events on a GPU, the host clock otherwise."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        if device.startswith("cuda"):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        else:
            start = time.perf_counter()
            fn()
            times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times)


# A stage's range in a torch.profiler trace is named this prefix and the stage's name
STAGE_RANGE = "ghostedit stage: "


@dataclass
class MemorySample:
    kind: str                       # "gpu" or "host"
    allocated_gib: float            # torch allocated (GPU) or process RSS (host)
    reserved_gib: float | None      # torch reserved (GPU only)
    device_used_gib: float | None   # whole-device use through NVML (GPU only), other processes included
    host_rss_gib: float

    @property
    def label(self) -> str:
        return "GPU memory (torch allocated)" if self.kind == "gpu" else "host memory (process RSS)"


@functools.cache
def nvml_module():
    """nvidia-ml-py, initialized once per process; None where NVML is missing or refused (containers), in which case
    the torch figures still stand."""
    try:
        import pynvml
        pynvml.nvmlInit()
        return pynvml
    except Exception:  # pynvml raises its own NVMLError kinds, or ImportError
        return None


def nvml_handle(device: str):
    """NVML's handle of the GPU `device` names; None on a CPU or without NVML."""
    nvml = nvml_module() if device.startswith("cuda") else None
    if nvml is None:
        return None
    index = torch.device(device).index
    return nvml.nvmlDeviceGetHandleByIndex(torch.cuda.current_device() if index is None else index)


class ClockSampler:
    """The GPU's SM clock, power and the reasons NVML gives for a clock below its maximum, sampled on a thread while
    a measurement runs (`with ClockSampler(device) as clocks: ...; clocks.summary()`), so that a speed figure comes
    with the clock it ran at: an H100 running FP8 GEMMs reaches its power limit and lowers its clock, and the same
    configuration's figures then differ between runs. Samples while the GPU idled (the CPU's turn) are left out."""

    def __init__(self, device: str, interval_s: float = 0.05):
        self._handle = nvml_handle(device)
        self._interval_s = interval_s
        self._samples: list[tuple[int, float, int, int]] = []  # (SM MHz, W, degrees C, reasons)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, name="ghostedit-clock-sampler", daemon=True)

    def __enter__(self) -> "ClockSampler":
        if self._handle is not None:
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def _sample(self) -> None:
        nvml = nvml_module()
        try:
            while not self._stop.wait(self._interval_s):
                self._samples.append((nvml.nvmlDeviceGetClockInfo(self._handle, nvml.NVML_CLOCK_SM),
                                      nvml.nvmlDeviceGetPowerUsage(self._handle) / 1000,
                                      nvml.nvmlDeviceGetTemperature(self._handle, nvml.NVML_TEMPERATURE_GPU),
                                      nvml.nvmlDeviceGetCurrentClocksEventReasons(self._handle)))
        except Exception as error:  # NVMLError kinds, or an nvidia-ml-py without these calls: the measurement stands
            warnings.warn(f"the GPU clock stopped being sampled: {type(error).__name__}: {error}")

    def summary(self) -> dict | None:
        """Over the busy samples: the SM clock's median and lowest, the card's highest, the median power, the
        hottest reading, and the shares of samples held back by the power limit and by heat. None without NVML or
        without a busy sample."""
        if not self._samples:
            return None
        nvml = nvml_module()
        busy = [sample for sample in self._samples if not sample[3] & nvml.nvmlClocksEventReasonGpuIdle]
        if not busy:
            return None
        clocks, power, temperature, reasons = zip(*busy)
        thermal = (nvml.nvmlClocksEventReasonSwThermalSlowdown | nvml.nvmlClocksEventReasonHwThermalSlowdown
                   | nvml.nvmlClocksEventReasonHwSlowdown)
        return {"sm_clock_mhz": statistics.median(clocks), "sm_clock_lowest_mhz": min(clocks),
                "sm_clock_max_mhz": nvml.nvmlDeviceGetMaxClockInfo(self._handle, nvml.NVML_CLOCK_SM),
                "power_w": statistics.median(power), "temperature_c_highest": max(temperature),
                "power_capped_share": _share(reasons, nvml.nvmlClocksEventReasonSwPowerCap),
                "thermal_share": _share(reasons, thermal), "samples": len(busy), "interval_s": self._interval_s}


def _share(reasons, mask: int) -> float:
    return sum(1 for reason in reasons if reason & mask) / len(reasons)


class MemoryProbe:
    def __init__(self, device: str):
        self.device = device
        self.is_gpu = device.startswith("cuda")
        self._process = psutil.Process()
        self._nvml_handle = nvml_handle(device)

    def sample(self) -> MemorySample:
        rss = self._process.memory_info().rss / GIB
        if not self.is_gpu:
            return MemorySample("host", rss, None, None, rss)
        stats = _allocator_stats()
        return MemorySample("gpu", stats("allocated_bytes", "current") / GIB, stats("reserved_bytes", "current") / GIB,
                            self._device_used(), rss)

    def _device_used(self) -> float | None:
        if self._nvml_handle is None:
            return None
        return nvml_module().nvmlDeviceGetMemoryInfo(self._nvml_handle).used / GIB

    def reset_peak(self) -> None:
        if self.is_gpu:
            torch.cuda.reset_peak_memory_stats()

    def torch_peak(self) -> tuple[float, float] | None:
        if not self.is_gpu:
            return None
        stats = _allocator_stats()
        return stats("allocated_bytes", "peak") / GIB, stats("reserved_bytes", "peak") / GIB


def _allocator_stats() -> Callable[[str, str], int]:
    """The CUDA allocator's byte counts, read once: torch.cuda.memory_allocated() and its kin each flatten all of
    the allocator's statistics in Python (a millisecond per emit, a few per edit). Before CUDA starts, all zero."""
    stats = torch.cuda.memory_stats_as_nested_dict()

    def read(name: str, which: str) -> int:
        return stats.get(name, {}).get("all", {}).get(which, 0)
    return read


@dataclass
class ProgressEvent:
    """What a live view shows: delivered at every stage change and after every denoising step."""
    stage: str
    step: int
    total_steps: int
    step_seconds: float | None
    elapsed: float
    eta: float | None
    memory: MemorySample
    peak: MemorySample
    message: str = ""
    worker: str = ""  # the pool's worker running it, "worker 1 (cuda:1)" (engine/workers.py); "" without a pool
    download: dict | None = None  # during a download: downloads.DownloadProgress.as_dict()


ProgressCallback = Callable[[ProgressEvent], None]


@dataclass
class RunTelemetry:
    device: str
    stages: dict[str, float] = field(default_factory=dict)
    prepare_steps: dict[str, float] = field(default_factory=dict)
    step_seconds: list[float] = field(default_factory=list)
    warm_up_steps: list[int] = field(default_factory=list)  # steps whose first forward compiled (time left out)
    cache_hit: bool | None = None
    dtypes: dict[str, str] = field(default_factory=dict)  # each component's dtype (models/dtypes.py)
    placement: dict[str, str] = field(default_factory=dict)  # where each component lives (engine/placement.py)
    parallel: str = "single process"  # the ranks one edit ran on (ghostedit/parallel)
    notes: list[str] = field(default_factory=list)
    loras: list[dict] = field(default_factory=list)  # each LoRA: format, layers matched, keys not applied and why
    step_cache: dict | None = None  # what a step cache computed and skipped (optimize/step_cache.py)
    dit_tokens: list[int] = field(default_factory=list)  # tokens each DiT forward computed (2.1: the prefix cache)
    peak: MemorySample | None = None
    total_seconds: float = 0.0
    worker: dict = field(default_factory=dict)  # the pool's worker that ran it (engine/workers.py); {} without a pool

    def add_stage(self, name: str, seconds: float) -> None:
        self.stages[name] = self.stages.get(name, 0.0) + seconds

    @property
    def denoise_seconds_per_step(self) -> float | None:
        """The median step, leaving out steps that compiled when others did not."""
        steady = [s for i, s in enumerate(self.step_seconds) if i not in self.warm_up_steps] or self.step_seconds
        return statistics.median(steady) if steady else None

    def summary(self) -> dict:
        """A flat, JSON-ready view for tables, the API and the bench."""
        peak = self.peak
        return {
            "device": self.device,
            "cache_hit": self.cache_hit,
            "dtypes": dict(self.dtypes),
            "placement": dict(self.placement),
            "parallel": self.parallel,
            "total_s": self.total_seconds,
            # in the order they run; a stage STAGE_ORDER does not list comes last rather than not at all
            "stages_s": {name: self.stages[name] for name in sorted(self.stages, key=_stage_rank)},
            "prepare_steps_s": dict(self.prepare_steps),
            "step_s": list(self.step_seconds),
            "warm_up_steps": list(self.warm_up_steps),
            "denoise_s_per_step": self.denoise_seconds_per_step,
            "memory_kind": peak.label if peak else None,
            "peak_allocated_gib": peak.allocated_gib if peak else None,
            "peak_reserved_gib": peak.reserved_gib if peak else None,
            "peak_device_used_gib": peak.device_used_gib if peak else None,
            "peak_host_rss_gib": peak.host_rss_gib if peak else None,
            "notes": list(self.notes),
            "loras": [dict(lora) for lora in self.loras],
            "worker": dict(self.worker) or None,
            "step_cache": self.step_cache,
            "dit_tokens": list(self.dit_tokens),
        }


class RunCancelled(RuntimeError):
    """The caller cancelled the run; it stopped at a step boundary."""


class StepClock:
    """Marks the boundaries of denoising steps. On a CUDA GPU, events in its stream: the CPU goes on to the next step
    without waiting, and a step's time is read once the GPU has passed its end (steps_ahead = 1). Elsewhere the wall
    clock after a synchronize, so a step is timed as it ends."""

    def __init__(self, device: str):
        self.device = device
        self.on_gpu = torch.device(device).type == "cuda"
        self.steps_ahead = 1 if self.on_gpu else 0

    def mark(self):
        if self.on_gpu:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        synchronize(self.device)
        return time.perf_counter()

    def seconds(self, start, end) -> float:
        if self.on_gpu:
            end.synchronize()
            return start.elapsed_time(end) / 1000
        return end - start


class RunRecorder:
    """Times stages and steps of one run, tracks memory peaks, forwards progress to a callback, and stops the run
    at the next step boundary once `cancel` is set."""

    def __init__(self, device: str, on_progress: ProgressCallback | None = None, cancel=None):
        self.device = device
        self.cancel = cancel
        self.telemetry = RunTelemetry(device)
        self.on_progress = on_progress
        self.probe = MemoryProbe(device)
        self.probe.reset_peak()
        self._peak = self.probe.sample()
        self._start = time.perf_counter()
        self.total_steps = 0
        self._steps_done = 0
        self._excluded_from_step = 0.0
        self._step_warmed_up = False
        self._denoise_end = 0.0
        self._clock = StepClock(device)
        self._event_stages = []     # (name, start event, end event) of EVENT_TIMED_STAGES, read at finish
        self._unfinished_steps = []  # a GPU's last step, read once decoding is done
        self._stage_depth = 0        # stages open now (a compile warm-up inside a step's forward is inside one)
        self._named_until = self._start  # the host's clock when the last outermost stage before the loop ended
        self._looping = False

    def elapsed(self) -> float:
        return time.perf_counter() - self._start

    def _sample(self) -> MemorySample:
        now = self.probe.sample()
        torch_peak = self.probe.torch_peak()
        peak = self._peak
        self._peak = MemorySample(
            now.kind,
            torch_peak[0] if torch_peak else max(peak.allocated_gib, now.allocated_gib),
            torch_peak[1] if torch_peak else None,
            _max_or_none(peak.device_used_gib, now.device_used_gib),
            max(peak.host_rss_gib, now.host_rss_gib),
        )
        return now

    def check_cancelled(self) -> None:
        if self.cancel is not None and self.cancel.is_set():
            raise RunCancelled(f"cancelled after {self._steps_done} of {self.total_steps} steps")

    def download_progress(self, item) -> None:
        """A model download's plan (before the first byte) or progress (downloads.py), as "download" events."""
        if hasattr(item, "as_dict"):
            self.emit("download", item.words, download=item.as_dict())
        else:
            self.emit("download", f"downloading {item.summary}")

    def emit(self, stage: str, message: str = "", step_seconds: float | None = None, download: dict | None = None) -> None:
        memory = self._sample()
        if self.on_progress is None:
            return
        eta = None
        if step_seconds is not None and self.total_steps:
            eta = self.telemetry.denoise_seconds_per_step * (self.total_steps - self._steps_done)
        self.on_progress(ProgressEvent(stage, self._steps_done, self.total_steps, step_seconds,
                                       self.elapsed(), eta, memory, self._peak, message, download=download))

    @contextlib.contextmanager
    def stage(self, name: str, message: str = "", into_prepare: bool = False, out_of_step: bool = False,
              warm_up: bool = False):
        """Time a stage; `into_prepare` files it as a named prepare step (fuse, quantize, compile...). Inside a
        denoising step, `out_of_step`: one-time work (capturing a graph) left out of the step's time; `warm_up`: a
        compiling first call, left out too, and its step left out of the median step time, since the step's other
        work may not run as it will later. A stage's time starts once the device has done the work handed to it
        before: a step timed on the GPU's clock does not contain that wait, nor the steps before."""
        self.check_cancelled()
        with self._named():
            self.emit("preparing" if into_prepare else name, message or name)
            if self._clock.on_gpu and name in EVENT_TIMED_STAGES and not (into_prepare or out_of_step or warm_up):
                start = self._clock.mark()
                with torch.profiler.record_function(f"{STAGE_RANGE}{name}"):
                    yield
                self._event_stages.append((name, start, self._clock.mark()))
                return
            synchronize(self.device)
            start = time.perf_counter()
            try:
                with torch.profiler.record_function(f"{STAGE_RANGE}{name}"):  # for lab/probes/profile_edit.py
                    yield
            finally:
                synchronize(self.device)
                seconds = time.perf_counter() - start
                if into_prepare:
                    self.telemetry.prepare_steps[name] = self.telemetry.prepare_steps.get(name, 0.0) + seconds
                    self.telemetry.add_stage("prepare", seconds)
                else:
                    self.telemetry.add_stage(name, seconds)
                if out_of_step or warm_up:
                    self._excluded_from_step += seconds
                self._step_warmed_up |= warm_up

    @contextlib.contextmanager
    def _named(self):
        """A stage's span of the host's clock: the time since the last outermost one before the loop ended is set-up."""
        self._name_set_up()
        self._stage_depth += 1
        try:
            yield
        finally:
            self._stage_depth -= 1
            if not self._stage_depth:
                self._named_until = time.perf_counter()

    def _name_set_up(self) -> None:
        """The host's time since the last outermost stage before the denoising loop ended, filed as set-up."""
        if self._stage_depth or self._looping:
            return
        now = time.perf_counter()
        self.telemetry.add_stage(SET_UP, now - self._named_until)
        self._named_until = now

    def timed_steps(self, timesteps):
        """Wraps the denoising loop's iterable (DiffSynth's progress_bar_cmd): times each step as it finishes. On a
        GPU a step is timed when the GPU has done it, while the CPU hands over the next one."""
        self._name_set_up()
        self._looping = True
        self.total_steps = len(timesteps)
        self._steps_done = 0
        self.emit("denoising", f"step 0/{self.total_steps}")
        clock = self._clock
        unfinished = self._unfinished_steps = []  # steps handed to the device, not timed yet
        for timestep in timesteps:
            self.check_cancelled()
            start = clock.mark()
            self._excluded_from_step, self._step_warmed_up = 0.0, False
            with torch.profiler.record_function(f"{STAGE_RANGE}denoising"):
                yield timestep
            unfinished.append((start, clock.mark(), self._excluded_from_step, self._step_warmed_up))
            while len(unfinished) > clock.steps_ahead:
                self._step_finished(clock, *unfinished.pop(0))
        if not clock.on_gpu:  # a GPU's last step is read after decoding, which the CPU hands over meanwhile
            self._steps_finished()
        self._denoise_end = time.perf_counter()
        self._decoding_range = contextlib.ExitStack()  # open from here to decoding_done (DiffSynth's own call)
        self._decoding_range.enter_context(torch.profiler.record_function(f"{STAGE_RANGE}decoding"))
        self.emit("decoding", "decoding")

    def _step_finished(self, clock: StepClock, start, end, excluded: float, warmed_up: bool) -> None:
        seconds = clock.seconds(start, end) - excluded
        if warmed_up:
            self.telemetry.warm_up_steps.append(len(self.telemetry.step_seconds))
        self.telemetry.step_seconds.append(seconds)
        self.telemetry.add_stage("denoising", seconds)
        self._steps_done += 1
        self.emit("denoising", f"step {self._steps_done}/{self.total_steps}", step_seconds=seconds)

    def _steps_finished(self) -> None:
        while self._unfinished_steps:
            self._step_finished(self._clock, *self._unfinished_steps.pop(0))

    def decoding_done(self) -> None:
        """DiffSynth decodes right after the loop, inside the same call: the rest of that call is decoding (on a
        GPU, from the last step's end on its clock)."""
        if self._clock.on_gpu and self._unfinished_steps:
            last_step_end = self._unfinished_steps[-1][1]
            decoded = self._clock.mark()
            self._steps_finished()
            seconds = self._clock.seconds(last_step_end, decoded)
        else:
            synchronize(self.device)
            seconds = time.perf_counter() - self._denoise_end
        self._decoding_range.close()
        self.telemetry.add_stage("decoding", seconds)

    def finish(self) -> RunTelemetry:
        synchronize(self.device)
        self._steps_finished()
        for name, start, end in self._event_stages:
            self.telemetry.add_stage(name, self._clock.seconds(start, end))
        self._event_stages.clear()
        self._sample()
        self.telemetry.peak = self._peak
        self.telemetry.total_seconds = self.elapsed()
        self.emit("done", "done")
        return self.telemetry


def _stage_rank(name: str) -> int:
    return STAGE_ORDER.index(name) if name in STAGE_ORDER else len(STAGE_ORDER)


def _max_or_none(a: float | None, b: float | None) -> float | None:
    values = [v for v in (a, b) if v is not None]
    return max(values) if values else None
