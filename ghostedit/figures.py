"""Measured figures for display, read from the committed bench results (docs/benchmarks/<part>/results.json, each
with the device and date it was measured on): nothing shown here is typed in. Where no committed result holds a
figure, nothing is shown."""
from __future__ import annotations

import functools
import json
from pathlib import Path

from .config import OptimizationConfig
from .optimize import registry

RESULTS = Path(__file__).resolve().parent.parent / "docs" / "benchmarks"


@functools.cache
def results(part: str) -> dict | None:
    """The committed results of a bench part ("dit", "e2e", "memory", ...), or None."""
    path = RESULTS / part / "results.json"
    return json.loads(path.read_text()) if path.exists() else None


def row(part: str, config: OptimizationConfig) -> dict | None:
    """The row a bench part measured for `config` (matched by the configuration's text), or None."""
    found = results(part)
    if found is None:
        return None
    return next((r for r in found["rows"] if r.get("text") == config.text), None)


def measured_on(part: str) -> str:
    environment = results(part)["environment"]
    return f"{environment.get('gpu', 'CPU')}, torch {environment['torch']}, {environment['date']}"


def toggle_info(setting: str) -> str | None:
    """One DiT forward with each choice of a setting alone, against stock, and the best configuration, as the
    committed DiT bench measured them; None when it measured none of them."""
    stock, best = row("dit", OptimizationConfig()), row("dit", OptimizationConfig.parse("best"))
    if stock is None:
        return None
    parts = []
    for value in _choices(setting):
        measured = row("dit", OptimizationConfig(**{setting: value}))
        if measured is not None:
            parts.append(f"{registry.words(setting, value[0] if isinstance(value, tuple) else value)} "
                         f"{measured['ms_per_forward']:.0f} ms ({stock['ms_per_forward'] / measured['ms_per_forward']:.2f}x)")
    if not parts:
        return None
    text = (f"Measured on {measured_on('dit')}, one DiT forward at a {results('dit')['size'][0]}² edit, each alone "
            f"against stock {stock['ms_per_forward']:.0f} ms: " + "; ".join(parts))
    if best is not None:
        text += f". The best configuration: {best['ms_per_forward']:.0f} ms ({best['speedup']:.2f}x)"
    return text + "."


def _choices(setting: str) -> list:
    if setting in registry.groups():
        return [(flag.name,) for flag in registry.groups()[setting]]
    toggle = registry.get(setting)
    return [value for value in toggle.values if value != toggle.default]
