"""A pool of engines, one per GPU, so that N edits run at once on N GPUs (or N CPU workers with `--workers N`, for
testing). Each worker is a process (torch.multiprocessing, spawn) holding its own Engine, with its own base weights
and prepared-pipeline cache. The pool answers the Engine's questions and runs edits like one Engine does:

- what can run here (options, check, placement) comes from a front Engine in this process, which never loads weights
  (every worker runs the same model on the same kind of device);
- run() hands the edit to an idle worker (one that has the configuration prepared when there is one), streams its
  progress events back, passes a cancel on, and returns its EditResult with the worker and its wall-clock interval
  in the telemetry (`telemetry.worker`);
- a worker that dies during an edit fails that edit with WorkerStoppedError (the other workers go on), and is
  started again for the next one.

The pool is there at once: the workers start (import torch and DiffSynth, each in its process) in the background,
so the app serves its page meanwhile; a run waits for the first worker ready, and questions about the workers'
state are answered by those ready. run_on_every_worker() runs one edit on every worker at once (the start-up
warm-up: engine/startup.py).

The caller keeps at most `size` edits in flight (the app's queue: the edit event's concurrency limit); a further
run() waits for a free worker.
"""
from __future__ import annotations

import itertools
import os
import pickle
import queue
import threading
import time
import traceback
from dataclasses import dataclass, field, replace

import torch
import torch.multiprocessing as mp

from ..config import EditRequest, OptimizationConfig
from ..device import device_name
from ..errors import GhostEditError
from ..telemetry import ProgressCallback
from . import Engine

START_TIMEOUT_S = 600   # a worker imports torch and DiffSynth before it answers; a loaded machine is slow
POLL_S = 0.2            # how often a waiting caller looks at cancel and at the worker's health
CALL_TIMEOUT_S = 60     # a question to a worker (its cache, its load count) is answered by a thread beside the run


class WorkerStoppedError(GhostEditError, RuntimeError):
    """The worker process running an edit died (killed, crashed, out of host memory): that edit is lost."""


class WorkerError(RuntimeError):
    """An error raised in a worker that could not travel back as itself; the message holds its traceback."""


def worker_devices(device: str, workers: int | None = None) -> list[str]:
    """The devices of the pool's workers. On CUDA: one worker per visible GPU (the first `workers` GPUs if given),
    or only `device` when it names one GPU ("cuda:1"). On the CPU: `workers` CPU workers (default 1). One device
    means: no pool, a plain Engine."""
    if workers is not None and workers < 1:
        raise ValueError(f"--workers must be at least 1; got {workers}")
    if not device.startswith("cuda"):
        return [device] * (workers or 1)
    if ":" in device:
        if workers not in (None, 1):
            raise ValueError(f"--device {device} names one GPU: --workers {workers} needs --device cuda")
        return [device]
    count = torch.cuda.device_count()
    if workers is not None and workers > count:
        raise ValueError(f"--workers {workers}: only {count} GPU(s) are visible")
    devices = [f"cuda:{index}" for index in range(workers or count)]
    return devices if len(devices) > 1 else [device]


@dataclass
class _Worker:
    index: int
    device: str
    process: object = None
    inbox: object = None
    pid: int | None = None
    runs: int = 0
    busy_since: float | None = None
    cached_keys: set = field(default_factory=set)  # what its cache held after its last edit
    ready_ident: int | None = None                 # the mailbox its "ready" message goes to

    @property
    def label(self) -> str:
        return f"worker {self.index} ({self.device})"


class WorkerPool:
    """Engines in worker processes behind the Engine's interface (see the module docstring)."""

    def __init__(self, source: str, devices: list[str], dtype: str | None = None):
        self.front = Engine(source, device=devices[0], dtype=dtype, import_now=False)  # it checks; workers run
        self.spec, self.device, self.dtypes = self.front.spec, devices[0], self.front.dtypes
        self._source, self._dtype = source, dtype
        self._context = mp.get_context("spawn")
        self._outbox = self._context.Queue()
        self._mailboxes: dict[object, queue.Queue] = {}
        self._ids = itertools.count()
        self._lock = threading.Condition()
        self._workers = [_Worker(index, device) for index, device in enumerate(devices)]
        self._idle: set[int] = set()                    # ready and not running anything
        self._failed: dict[int, BaseException] = {}     # workers that could not start, with why
        threading.Thread(target=self._route, name="ghostedit-pool-router", daemon=True).start()
        for worker in self._workers:
            self._start(worker)
            threading.Thread(target=self._become_ready, args=(worker,), name=f"ghostedit-start-{worker.index}",
                             daemon=True).start()

    def _become_ready(self, worker: _Worker) -> None:
        """Waits for the worker's process to answer, then lets runs have it."""
        try:
            self._wait_ready(worker)
        except BaseException as error:  # noqa: BLE001 - a run that finds no worker raises it
            with self._lock:
                self._failed[worker.index] = error
                self._lock.notify_all()
            return
        with self._lock:
            self._idle.add(worker.index)
            self._lock.notify_all()

    def wait_until_ready(self, timeout: float | None = None) -> bool:
        """Whether every worker has started (or failed to) within `timeout`."""
        with self._lock:
            return self._lock.wait_for(lambda: all(self._started(worker) for worker in self._workers), timeout)

    def _started(self, worker: _Worker) -> bool:
        return worker.pid is not None or worker.index in self._failed

    def _ready(self) -> list[_Worker]:
        return [worker for worker in self._workers if worker.pid is not None and worker.index not in self._failed]

    @property
    def size(self) -> int:
        return len(self._workers)

    # ---- what can run here: the front engine, which holds no weights ----

    @property
    def family(self):
        """The model's family (the workers all run the front engine's source)."""
        return self.front.family

    def options(self):
        return self.front.options()

    def check(self, config: OptimizationConfig) -> None:
        self.front.check(config)

    def check_request(self, request) -> None:
        self.front.check_request(request)

    def placement(self, config: OptimizationConfig = OptimizationConfig()):
        return self.front.placement(config)

    # ---- state held by the workers ----

    @property
    def load_count(self) -> int:
        """Loads done by the worker that has loaded least: 0 while any worker still starts or loads."""
        counts = self._ask_all("load_count")
        return min(counts) if counts and len(counts) == len(self._workers) else 0

    def expected_prepare_seconds(self, config: OptimizationConfig) -> float | None:
        """As Engine's, for the worker the next run would go to: 0 when one has it prepared (run() prefers it)."""
        known = [seconds for seconds in self._ask_all("expected_prepare_seconds", config) if seconds is not None]
        return min(known) if known else None

    def cached(self) -> list[dict]:
        """Every worker's prepared pipelines, each marked with its worker."""
        ready = self._ready()
        return [{**entry, "worker": worker.label}
                for worker, entries in zip(ready, [self._ask(worker, "cached") for worker in ready])
                for entry in entries]

    def free(self) -> int:
        """Drops every worker's prepared pipelines (a worker that is running an edit frees after it)."""
        return sum(self._ask(worker, "free", timeout=None) for worker in self._ready())

    def describe_workers(self) -> list[dict]:
        """Each worker: device, GPU name, process, started, alive, busy (seconds into its current edit) and runs
        done; why it could not start, if it could not."""
        now = time.time()
        return [{"worker": worker.index, "device": worker.device, "name": device_name(worker.device),
                 "pid": worker.pid, "started": worker.pid is not None, "alive": worker.process.is_alive(),
                 "runs": worker.runs, "busy_s": None if worker.busy_since is None else round(now - worker.busy_since, 1),
                 **({"error": str(self._failed[worker.index])} if worker.index in self._failed else {})}
                for worker in self._workers]

    # ---- runs ----

    def run(self, request: EditRequest, config: OptimizationConfig = OptimizationConfig(),
            on_progress: ProgressCallback | None = None, cancel: threading.Event | None = None):
        """One edit on an idle worker (Engine.run's contract); the result's telemetry names the worker."""
        worker = self._acquire(config)
        try:
            result, worker.cached_keys = self._run_on(worker, request, config, on_progress, cancel)
            worker.runs += 1
            return result
        finally:
            self._release(worker)

    def run_on_every_worker(self, request: EditRequest, config: OptimizationConfig,
                            on_progress: ProgressCallback | None = None) -> list:
        """The same edit on every worker at once, each as soon as it is free (the start-up warm-up); every worker's
        EditResult, or the first error."""
        results: list = [None] * len(self._workers)
        errors: list[BaseException] = []

        def on(worker: _Worker) -> None:
            try:
                self._take(worker)
            except BaseException as error:  # noqa: BLE001
                errors.append(error)
                return
            try:
                results[worker.index], worker.cached_keys = self._run_on(worker, request, config, on_progress, None)
            except BaseException as error:  # noqa: BLE001
                errors.append(error)
            finally:
                self._release(worker)
        threads = [threading.Thread(target=on, args=(worker,), name=f"ghostedit-on-{worker.index}", daemon=True)
                   for worker in self._workers]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        if errors:
            raise errors[0]
        return results

    def _take(self, worker: _Worker) -> None:
        """Waits until `worker` is idle and marks it busy; raises why it could not start, if it could not."""
        with self._lock:
            self._lock.wait_for(lambda: worker.index in self._idle or worker.index in self._failed)
            if worker.index in self._failed:
                raise self._failed[worker.index]
            self._busy(worker.index)

    def _busy(self, index: int) -> _Worker:
        self._idle.discard(index)
        worker = self._workers[index]
        worker.busy_since = time.time()
        return worker

    def _acquire(self, config: OptimizationConfig) -> _Worker:
        with self._lock:
            self._lock.wait_for(lambda: self._idle or len(self._failed) == len(self._workers))
            if not self._idle:
                raise next(iter(self._failed.values()))
            prepared = [index for index in self._idle if config.cache_key in self._workers[index].cached_keys]
            return self._busy(min(prepared or self._idle))

    def _release(self, worker: _Worker) -> None:
        with self._lock:
            worker.busy_since = None
            self._idle.add(worker.index)
            self._lock.notify_all()

    def _run_on(self, worker: _Worker, request, config, on_progress, cancel):
        ident, mailbox = self._mailbox()
        try:
            worker.inbox.put(("run", ident, (request, config)))
            cancel_sent = False
            while True:
                if cancel is not None and cancel.is_set() and not cancel_sent:
                    worker.inbox.put(("cancel", ident, None))
                    cancel_sent = True
                kind, payload = self._receive(worker, mailbox, "running this edit")  # a restarted worker
                # takes the edit sent before it was up: its inbox keeps it
                if kind == "progress":
                    if on_progress is not None:
                        on_progress(payload)
                elif kind == "result":
                    return payload
                else:
                    raise payload
        finally:
            self._mailboxes.pop(ident, None)

    # ---- messages ----

    def _mailbox(self) -> tuple[int, queue.Queue]:
        ident = next(self._ids)
        mailbox = self._mailboxes[ident] = queue.Queue()
        return ident, mailbox

    def _route(self) -> None:
        """Delivers each message from the workers to the caller waiting for it."""
        while True:
            ident, kind, payload = self._outbox.get()
            mailbox = self._mailboxes.get(ident)
            if mailbox is not None:  # a caller that stopped waiting (its worker died) gets nothing more
                mailbox.put((kind, payload))

    def _receive(self, worker: _Worker, mailbox: queue.Queue, doing: str, timeout: float | None = None):
        """The next message for this caller; WorkerStoppedError if the worker dies first (it is started again)."""
        waited = 0.0
        while True:
            try:
                return mailbox.get(timeout=POLL_S)
            except queue.Empty:
                waited += POLL_S
            if not worker.process.is_alive():
                code = worker.process.exitcode
                self._start(worker)
                threading.Thread(target=self._wait_ready, args=(worker,), daemon=True).start()
                raise WorkerStoppedError(
                    f"{worker.label} stopped (exit code {code}) while {doing}; the edit is lost. The worker is "
                    "starting again: run the edit once more.")
            if timeout is not None and waited > timeout:
                raise TimeoutError(f"{worker.label} did not answer within {timeout:.0f} s while {doing}")

    def _ask(self, worker: _Worker, method: str, *args, timeout: float | None = CALL_TIMEOUT_S):
        ident, mailbox = self._mailbox()
        try:
            worker.inbox.put(("call", ident, (method, args)))
            kind, payload = self._receive(worker, mailbox, f"answering {method}", timeout)
        finally:
            self._mailboxes.pop(ident, None)
        if kind == "error":
            raise payload
        return payload

    def _ask_all(self, method: str, *args) -> list:
        """Every started worker's answer (one still starting has nothing to tell)."""
        return [self._ask(worker, method, *args) for worker in self._ready()]

    # ---- worker processes ----

    def _start(self, worker: _Worker) -> None:
        worker.inbox = self._context.Queue()
        ident, _ = self._mailbox()
        worker.ready_ident = ident
        worker.process = self._context.Process(
            target=_worker_main, name=f"ghostedit-worker-{worker.index}", daemon=True,
            args=(worker.index, worker.device, self._source, self._dtype, worker.inbox, self._outbox, ident))
        worker.process.start()
        worker.cached_keys = set()

    def _wait_ready(self, worker: _Worker) -> None:
        mailbox = self._mailboxes[worker.ready_ident]
        try:
            kind, payload = mailbox.get(timeout=START_TIMEOUT_S)
        except queue.Empty:
            raise TimeoutError(f"{worker.label} did not start within {START_TIMEOUT_S} s") from None
        finally:
            self._mailboxes.pop(worker.ready_ident, None)
        if kind == "error":
            raise payload
        worker.pid = payload

    def close(self) -> None:
        """Stops every worker (their memory is freed with their process)."""
        for worker in self._workers:
            worker.inbox.put(None)
        for worker in self._workers:
            worker.process.join(timeout=30)
            if worker.process.is_alive():
                worker.process.terminate()


# ---- inside a worker process ----

def _worker_main(index: int, device: str, source: str, dtype: str | None, inbox, outbox, ready_ident: int) -> None:
    """A worker: its own Engine on its device. The main thread runs edits one at a time; a listener thread takes
    the messages, so a cancel or a question is answered while an edit runs."""
    try:
        if device.startswith("cuda"):
            torch.cuda.set_device(torch.device(device))  # code that says "cuda" means this worker's GPU
        engine = Engine(source, device=device, dtype=dtype)
    except BaseException as error:  # noqa: BLE001 - reported to the pool, which raises it
        outbox.put((ready_ident, "error", _portable(error)))
        return
    jobs: queue.Queue = queue.Queue()
    cancels: dict[int, threading.Event] = {}

    def listen():
        while (message := inbox.get()) is not None:
            kind, ident, payload = message
            if kind == "run":
                cancels[ident] = threading.Event()
                jobs.put((ident, payload))
            elif kind == "cancel" and ident in cancels:
                cancels[ident].set()
            elif kind == "call":  # in its own thread: free() waits for the engine's lock while an edit runs
                threading.Thread(target=_answer, args=(engine, ident, payload, outbox), daemon=True).start()
        jobs.put(None)

    threading.Thread(target=listen, name="ghostedit-worker-listener", daemon=True).start()
    threading.Thread(target=_exit_with_parent, name="ghostedit-worker-parent", daemon=True).start()
    outbox.put((ready_ident, "ready", os.getpid()))
    while (job := jobs.get()) is not None:
        ident, (request, config) = job
        _run_job(engine, index, ident, request, config, cancels[ident], outbox)
        del cancels[ident]


def _exit_with_parent() -> None:
    """Ends this worker when the app's process ends, however it ended (a SIGTERM runs no exit handlers there)."""
    mp.parent_process().join()
    os._exit(0)


def _run_job(engine, index: int, ident: int, request, config, cancel: threading.Event, outbox) -> None:
    started = time.time()
    try:
        label = _Worker(index, engine.device).label
        result = engine.run(request, config, cancel=cancel, on_progress=lambda event: outbox.put(
            (ident, "progress", replace(event, worker=label))))
    except BaseException as error:  # noqa: BLE001 - the caller in the app raises it
        if not isinstance(error, GhostEditError):
            traceback.print_exception(error)
        outbox.put((ident, "error", _portable(error)))
        return
    result.telemetry.worker = {"index": index, "device": engine.device, "name": device_name(engine.device),
                               "pid": os.getpid(), "started_at": started, "finished_at": time.time()}
    outbox.put((ident, "result", (result, {entry.key for entry in engine.cache.view()})))


def _answer(engine, ident: int, call: tuple, outbox) -> None:
    method, args = call
    try:
        value = getattr(engine, method)
        outbox.put((ident, "answer", value(*args) if callable(value) else value))
    except BaseException as error:  # noqa: BLE001
        outbox.put((ident, "error", _portable(error)))


def _portable(error: BaseException) -> BaseException:
    """The error itself when it survives pickling (GhostEdit's errors, RunCancelled), else a WorkerError that
    carries its traceback."""
    try:
        pickle.loads(pickle.dumps(error))
        return error
    except Exception:  # noqa: BLE001 - any pickling failure
        text = "".join(traceback.format_exception(error))
        return WorkerError(f"{type(error).__name__} in a worker: {error}\n{text}")
