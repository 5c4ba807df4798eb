"""What the engine tells about itself without running anything: every option's availability on this machine, the
prepared pipelines in the cache, where each component lives, and how long preparing a configuration took here last
time (kept in GHOSTEDIT_HOME/prepare-times.json across restarts)."""
from __future__ import annotations

import json
import threading
from pathlib import Path


from ..device import device_name
from ..optimize import registry
from ..paths import ghostedit_home, write_atomically
from ..telemetry import GIB, RunTelemetry


class PrepareTimes:
    """Preparation plus compile warm-up per (model, device, prepared configuration), as last measured here. Read
    from disk once; answers without the engine's lock."""

    def __init__(self, source: str, device: str):
        self.source = source
        self.device_name = device_name(device)
        self.path = ghostedit_home() / "prepare-times.json"
        self._lock = threading.Lock()
        self._times = json.loads(self.path.read_text()) if self.path.exists() else {}

    def _key(self, config) -> str:
        return f"{self.source} | {self.device_name} | {config.prepared_label}"

    def remember(self, config, telemetry: RunTelemetry) -> None:
        seconds = telemetry.stages.get("prepare", 0.0) + telemetry.stages.get("compile warm-up", 0.0)
        with self._lock:
            self._times = {**self._times, self._key(config): seconds}
            times = self._times
        write_atomically(self.path, lambda temporary: Path(temporary).write_text(json.dumps(times, indent=1)))

    def expected(self, config) -> float | None:
        return self._times.get(self._key(config))


def options(device: str, family: str | None = None) -> dict:
    """Every setting's choices with whether each can run here (and on the DiT family `family`), and why not."""
    return registry.options(device, family)


def cached(view) -> list[dict]:
    """The prepared pipelines, most recently used first."""
    return [{"config": prepared.label, "owned_gib": prepared.owned_bytes / GIB, "report": dict(prepared.report),
             "prepare_s": sum(prepared.prepare_seconds.values())} for prepared in view]
