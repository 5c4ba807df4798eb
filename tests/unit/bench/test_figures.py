"""Measured figures are generated from the committed bench results: each figure block of README.md,
docs/benchmarks.md and lab/LOG.md equals what its results say now, no measured figure stands outside a block, the
UI's source holds none (it reads them through ghostedit/figures.py), and the package data the app reads them from
(ghostedit/data/figures.json) is what the results say and holds all it reads."""
import re
from pathlib import Path

import pytest

from ghostedit import figures
from ghostedit.optimize import registry
from lab.docs import render as docs

ROOT = Path(__file__).resolve().parents[3]
# A number with the unit of a measurement: milliseconds, seconds (per step), GiB, TFLOP/s, or a speedup
FIGURE = re.compile(r"\b\d+(\.\d+)?\s?(ms|s/step|s per step|GiB|TFLOP/s)\b|\b\d+\.\d+x\b|\b\d+(\.\d+)? s\b")


@pytest.mark.parametrize("path", docs.FILES, ids=lambda path: path.name)
def test_every_block_is_what_the_results_say(path):
    text = path.read_text()
    found = docs.blocks(text)
    assert found, f"{path.name} has no figure block"
    for name, body in found:
        assert body == docs.SECTIONS[name](), (
            f"the '{name}' block of {path.name} differs from the committed results: run python -m lab.docs")


@pytest.mark.parametrize("path", docs.FILES, ids=lambda path: path.name)
def test_no_figure_outside_a_block(path):
    outside = docs.BLOCK.sub("", path.read_text())
    stray = [line for line in outside.splitlines() if FIGURE.search(line)]
    assert not stray, f"measured figures in {path.name} with no results behind them: {stray}"


def test_the_ui_types_no_figure():
    for source in sorted((ROOT / "ghostedit" / "ui").glob("*.py")):
        strings = re.findall(r"\"[^\"\n]*\"|'[^'\n]*'", source.read_text())
        stray = [string for string in strings if FIGURE.search(string)]
        assert not stray, f"{source.name} types measured figures: {stray}"


def test_a_changed_result_changes_its_block(monkeypatch):
    committed = docs.results
    changed = {**committed("lora-switch"), "rows": [dict(row) for row in committed("lora-switch")["rows"]]}
    changed["rows"][0]["switch_s"] = 99.5
    monkeypatch.setattr(docs, "results", lambda part: changed if part == "lora-switch" else committed(part))
    committed_page = docs.FILES[1].read_text()
    assert "99.500" not in committed_page
    assert "99.500" in docs.rewrite(committed_page)  # so the committed page no longer matches its results


def test_the_package_data_is_what_the_results_say():
    assert docs.PACKAGE_DATA.read_text() == docs.package_data(), (
        "ghostedit/data/figures.json differs from the committed results: run python -m lab.docs")


def test_the_app_shows_from_the_package_data_what_the_results_say(monkeypatch):
    """Each toggle's measured info and ZeroGPU's durations, read from the package data, equal what the whole
    committed results give: the package data holds every key the app reads (figures.READS)."""
    from ghostedit.ui import gpu

    def shown() -> tuple[dict, list]:
        for cached in (gpu.measured_costs, gpu.encode_decode_s, gpu.lora_switch_s):
            cached.cache_clear()
        info = {setting: figures.toggle_info(setting) for setting in registry.settings()}
        seconds = [gpu.gpu_seconds(arguments, 1024 * 1024, 40) for arguments in (
            {}, {"steps": 4, "cfg_scale": 1}, {"fp8": "torchao", "compile": "regional", "width": 512, "height": 512},
            {"fp8": "storage", "lora": "a.safetensors", "lora_2": "b.safetensors"})]
        return info, seconds

    from_package = shown()
    assert "Measured on" in from_package[0]["fp8"] and "Measured on" in from_package[0]["step-cache"]
    monkeypatch.setattr(figures, "results", lambda part: docs.results(part) if part in figures.READS else None)
    try:
        assert shown() == from_package
    finally:
        monkeypatch.undo()
        shown()  # gpu.py's caches as the package data fills them, for the tests after this one


def test_the_step_cache_shows_its_measured_gain_and_image_difference():
    from ghostedit.config import OptimizationConfig
    cached = figures.row(figures.CACHE_RUN, OptimizationConfig.parse("best,step-cache=fbcache-0.08"))
    info = figures.toggle_info("step-cache")
    assert f"{cached['cache_speedup_e2e']:.2f}x end to end" in info
    assert f"PSNR {cached['cache_psnr_db']:.1f} dB" in info and "random weights" in info


def test_runs_chained_in_one_process_are_one_row_of_the_process_block(monkeypatch):
    committed = docs.results
    started = {"e2e-4-stock": 1.0, "e2e-40-stock": 1.0, "e2e-4": 2.0, "e2e-40": 2.0}  # two processes, two runs each
    chained = {part: {**committed(part), "process": {"pid": 1, "started": when}} for part, when in started.items()}
    monkeypatch.setattr(docs, "results", lambda part: chained.get(part) or committed(part))
    assert docs.processes(docs.SPEED_PARTS)[-2:] == [["e2e-4-stock", "e2e-40-stock"], ["e2e-4", "e2e-40"]]
    block = docs.process_time()
    assert "| e2e-4-stock + e2e-40-stock " in block and "| e2e-4 + e2e-40 " in block
    assert f"| all {len(docs.SPEED_PARTS) - 2} " in block


def test_the_dit_block_says_how_much_of_the_forward_is_outside_the_blocks(monkeypatch):
    committed = docs.results
    dit = committed("dit")
    changed = {**dit, "experiments": {**dit["experiments"], "forward_ms": 215.0, "block_loop_ms": 204.8}}
    monkeypatch.setattr(docs, "results", lambda part: changed if part == "dit" else committed(part))
    assert "the whole forward 215.0 ms, 10.2 ms of it outside the blocks" in docs.dit_shapes()
    changed["experiments"]["forward_ms"] = 204.6  # two medians, of runs that vary
    assert "the whole forward 204.6 ms, no longer than its blocks" in docs.dit_shapes()


def test_a_result_measured_before_a_preset_gained_a_rewrite_is_named_for_it():
    from ghostedit.config import OptimizationConfig
    best = OptimizationConfig.parse("best")
    older = best.replace(rewrites=tuple(flag for flag in best.flags("rewrites") if flag != "fp8-attention-out"))
    assert docs.name({"text": older.text, "config": older.label}) == "best without fp8-attention-out"
    oldest = older.replace(rewrites=tuple(flag for flag in older.flags("rewrites") if flag != "fused-qk-norm-rope"))
    assert docs.name({"text": oldest.text, "config": oldest.label}) == \
        "best without fp8-attention-out and fused-qk-norm-rope"
    bare = OptimizationConfig(fp8="torchao", compile="regional")  # more than two rewrites left out: its own label
    assert docs.name({"text": bare.text, "config": bare.label}) == bare.label
