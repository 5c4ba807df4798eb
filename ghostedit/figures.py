"""Measured figures for display, read from the committed bench results (docs/benchmarks/<part>/results.json, each
with the device and date it was measured on): nothing shown here is typed in. Where no committed result holds a
figure, nothing is shown."""
from __future__ import annotations

import functools
import json
from pathlib import Path

from .config import OptimizationConfig
from .errors import InvalidRequestError
from .optimize import registry

RESULTS = Path(__file__).resolve().parent.parent / "docs" / "benchmarks"
PAGE_RUN = "card-full"   # every configuration the page offers, one after another on one card


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
    """Seconds per step of a whole edit with each choice of a setting alone, against stock, and with the best
    configuration, as the committed run of every configuration the page offers measured them (part "card-full");
    None when it measured none of the setting's choices."""
    stock, best = row(PAGE_RUN, OptimizationConfig()), row(PAGE_RUN, OptimizationConfig.parse("best"))
    if stock is None:
        return None
    parts = []
    for value in _choices(setting):
        try:
            alone = OptimizationConfig(**{setting: value})
        except InvalidRequestError:  # a choice that needs another setting was never run alone
            continue
        measured = row(PAGE_RUN, alone)
        if measured is not None:
            parts.append(f"{registry.words(setting, value[0] if isinstance(value, tuple) else value)} "
                         f"{measured['s_per_step']:.2f} s/step ({stock['s_per_step'] / measured['s_per_step']:.2f}x)")
    if not parts:
        return None
    side = results(PAGE_RUN)["size"][0]
    text = (f"Measured on {measured_on(PAGE_RUN)}, a {side}x{side} edit with true CFG, each alone against stock "
            f"{stock['s_per_step']:.2f} s/step: " + "; ".join(parts))
    if best is not None:
        text += f". The best configuration: {best['s_per_step']:.2f} s/step"
    return text + "."


def _choices(setting: str) -> list:
    if setting in registry.groups():
        return [(flag.name,) for flag in registry.groups()[setting]]
    toggle = registry.get(setting)
    return [value for value in toggle.values if value != toggle.default]
