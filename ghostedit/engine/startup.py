"""Start-up: the engine made ready in the background while the app already serves, so that the first edit after
`python app.py` runs as warm as any later one.

For each start-up configuration, one warm-up edit on a small dummy input at the model's default size, CFG on, the
fewest steps: it loads the base weights (the first time), prepares the configuration (a compiled one loads the
package an earlier start left in $GHOSTEDIT_HOME/compiled, or compiles and leaves one for the next start:
optimize/packages.py), and makes the first calls of the image and text encoders, the DiT and the VAE, each of which
costs its first caller seconds on a GPU (kernel selection, graph capture, compile). A pool of workers
(engine/workers.py) warms every worker at once.

An edit asked for meanwhile waits for the engine as behind any other run; `status()` says at any time what start-up
is doing (the page shows it)."""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

from PIL import Image

from ..config import EditRequest, OptimizationConfig
from .workers import WorkerPool

WARM_UP_STEPS = 2   # the fewest the schedules run (models/exact.py)
WARM_UP_CFG = 4.0   # true CFG: the negative prompt's encoding and the DiT's unconditional call are warmed too
WARM_UP_SIDE = 64   # the dummy input's side: the condition images are resized to the model's areas anyway
OFF = "off"


def warm_up_request() -> EditRequest:
    """A square dummy input (a gradient, so the image encoder sees structure) with a short instruction; the output
    at the model's default size for a square input, as the page's default edit."""
    gradient = Image.linear_gradient("L").resize((WARM_UP_SIDE, WARM_UP_SIDE))
    image = Image.merge("RGB", (gradient, gradient.rotate(90), gradient.rotate(180)))
    return EditRequest(images=(image,), prompt="make it a snowy night", steps=WARM_UP_STEPS, cfg_scale=WARM_UP_CFG)


def configurations(texts: list[str] | None) -> list[OptimizationConfig]:
    """The start-up configurations from their text ("stock", "best", settings...; "off": none); None: the page's
    default configuration. Text that names no configuration is refused (InvalidRequestError)."""
    if texts is None:
        return [OptimizationConfig()]
    if texts == [OFF]:
        return []
    return [OptimizationConfig.parse(text) for text in texts]


@dataclass
class Warmed:
    config: str
    seconds: float           # the warm-up edit's wall time (every worker's, with a pool)
    stages: dict             # its stages (the slowest worker's, with a pool)


@dataclass
class StartUp:
    engine: object
    configs: list[OptimizationConfig]
    state: str = "waiting"   # waiting, warming, ready, failed, off
    current: str = ""        # the configuration being warmed
    started: float = 0.0
    finished: float | None = None
    error: str = ""
    warmed: list[Warmed] = field(default_factory=list)
    events: dict = field(default_factory=dict)   # the latest progress event, per worker ("" without a pool)
    page_start: dict = field(default_factory=dict)  # the app's start before its page answered (ui/serve.py)

    def check(self) -> "StartUp":
        """Refuses at once (UnavailableOptionError) a configuration that cannot run here."""
        for config in self.configs:
            self.engine.check(config)
        return self

    def start(self) -> "StartUp":
        """Starts warming in the background (the app calls it once its server answers: the warm-up's work would
        otherwise slow the page's start); refuses at once a configuration that cannot run here."""
        self.check()
        self.started = time.perf_counter()
        if not self.configs:
            self.state, self.finished = OFF, self.started
            return self
        self.state = "warming"
        threading.Thread(target=self._run, name="ghostedit-startup", daemon=True).start()
        return self

    @property
    def busy(self) -> bool:
        """Warming, or about to (created with configurations, not started yet)."""
        return self.state == "warming" or (self.state == "waiting" and bool(self.configs))

    def _run(self) -> None:
        request = warm_up_request()
        try:
            for config in self.configs:
                self.current, self.events = config.label, {}
                began = time.perf_counter()
                results = _warm(self.engine, request, config, self._progress)
                slowest = max(results, key=lambda result: result.telemetry.total_seconds)
                self.warmed.append(Warmed(config.label, time.perf_counter() - began,
                                          slowest.telemetry.summary()["stages_s"]))
                print(f"start-up: {config.label} warmed in {self.warmed[-1].seconds:.1f} s ("
                      + ", ".join(f"{stage} {seconds:.2f}" for stage, seconds in self.warmed[-1].stages.items())
                      + ")", flush=True)
            self.state = "ready"
        except Exception as error:  # noqa: BLE001 - start-up fails alone: edits still run (and say why they fail)
            self.state, self.error = "failed", f"{type(error).__name__}: {error}"
            print(f"start-up: warming {self.current} failed: {self.error}", flush=True)
        finally:
            self.finished = time.perf_counter()

    def _progress(self, event) -> None:
        self.events[event.worker] = event

    def wait(self, timeout: float | None = None) -> bool:
        """Waits until start-up has ended (ready, failed or off); whether it has."""
        deadline = None if timeout is None else time.perf_counter() + timeout
        while self.busy and (deadline is None or time.perf_counter() < deadline):
            time.sleep(0.05)
        return not self.busy

    def status(self) -> dict:
        """What start-up is doing or did, JSON-ready: state, the configuration being warmed, seconds so far, each
        worker's latest stage (with its download progress), the configurations warmed and their stages; and the
        app's own start before its page answered, step by step (`page_start`: ui/start_timeline.py's StartTimeline)."""
        end = self.finished if self.finished is not None else time.perf_counter()
        return {"state": self.state, "configuration": self.current or (self.configs[0].label if self.configs else ""),
                "elapsed_s": end - self.started if self.started else 0.0,
                "error": self.error or None,
                "now": {worker: {"stage": event.stage, "message": event.message, "download": event.download}
                        for worker, event in dict(self.events).items()} if self.busy else {},
                "warmed": [{"configuration": warmed.config, "seconds": warmed.seconds, "stages_s": warmed.stages}
                           for warmed in self.warmed],
                "page_start": self.page_start}


def _warm(engine, request: EditRequest, config: OptimizationConfig, on_progress) -> list:
    """The warm-up edit on the engine, or on every worker of a pool at once."""
    if isinstance(engine, WorkerPool):
        return engine.run_on_every_worker(request, config, on_progress)
    return [engine.run(request, config, on_progress=on_progress)]
