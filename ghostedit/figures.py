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
CACHE_RUN = "e2e-40"     # the best configuration with and without the step cache, 40 steps, CFG 4


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
    else what the 40-step run measured of it (cache_info); None when neither measured any of its choices."""
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
        return cache_info(setting)
    side = results(PAGE_RUN)["size"][0]
    text = (f"Measured on {measured_on(PAGE_RUN)}, a {side}x{side} edit with true CFG, each alone against stock "
            f"{stock['s_per_step']:.2f} s/step: " + "; ".join(parts))
    if best is not None:
        text += f". The best configuration: {best['s_per_step']:.2f} s/step"
    return text + "."


def cache_info(setting: str) -> str | None:
    """A lossy run-time setting (the step cache) on the best configuration in the committed 40-step run: its time and
    its image against the same run without it; None where that run has none of its choices."""
    found = results(CACHE_RUN)
    if found is None or setting in registry.groups():
        return None
    for value in _choices(setting):
        try:
            measured = row(CACHE_RUN, OptimizationConfig.parse(f"best,{setting}={value}"))
        except InvalidRequestError:  # a choice the best configuration cannot take
            continue
        if measured and "cache_speedup_e2e" in measured:
            return (f"Measured on {measured_on(CACHE_RUN)}, {found['steps']} steps CFG {found['cfg_scale']:g} with "
                    f"the best configuration, at threshold {measured['cache_threshold']:g}: "
                    f"{measured['forwards_computed']} of {measured['step_cache']['forwards']} DiT forwards computed, "
                    f"{measured['cache_speedup_e2e']:.2f}x end to end, PSNR {measured['cache_psnr_db']:.1f} dB and "
                    f"SSIM {measured['cache_ssim']:.3f} against the run without it. {measured['cache_quality_note']}.")
    return None


def _choices(setting: str) -> list:
    if setting in registry.groups():
        return [(flag.name,) for flag in registry.groups()[setting]]
    toggle = registry.get(setting)
    return [value for value in toggle.values if value != toggle.default]
