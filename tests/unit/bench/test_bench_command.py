"""`ghostedit bench` as scripts/gpu/bench.sh runs it, on the tiny model: what each level writes, and the process
timeline that says where a bench process's wall time went."""
import contextlib
import json
import subprocess
import sys

import pytest
import torch

from ghostedit.bench import command, qwen_image_21
from ghostedit.cli import build_parser


def bench(tmp_path, *arguments) -> dict:
    args = build_parser().parse_args(["bench", "--model", "tiny", "--device", "cpu", "--out-dir", str(tmp_path),
                                      *arguments])
    assert args.run(args) == 0
    assert (tmp_path / "table.md").exists() and (tmp_path / "chart.png").exists()
    return json.loads((tmp_path / "results.json").read_text())


def marks(results: dict) -> list[str]:
    times = [mark["s"] for mark in results["process_timeline"]]
    assert times == sorted(times) and times[0] > 0, times  # seconds since the process started, in order
    return [mark["after"] for mark in results["process_timeline"]]


def test_the_dit_level_writes_each_shape_and_where_its_process_time_went(tmp_path, capsys):
    results = bench(tmp_path, "--level", "dit", "--shapes", "64", "64:2", "--repeats", "1",
                    "--configs", "baseline", "fp8=storage")
    assert [(row["config"], row["shape"]) for row in results["rows"]] == [
        ("stock", "64x64"), ("stock", "64x64, 2 images"), ("fp8-storage", "64x64"),
        ("fp8-storage", "64x64, 2 images")]
    # which kernel DiffSynth's own attention ran (FlashAttention-3 where installed), as an edit's result says it
    assert results["rows"][0]["report"]["attention"].startswith("DiffSynth default (")
    assert marks(results) == ["python and the CLI", "engine imported", "configurations checked", "weights built",
                              "stock at 64x64", "stock at 64x64, 2 images", "fp8-storage at 64x64",
                              "fp8-storage at 64x64, 2 images"]
    printed = capsys.readouterr().out.splitlines()[-1]
    assert printed.startswith("process timeline (s since start): python and the CLI ")
    assert printed.split(", ")[-1].startswith("results written ")
    # the host the figures were measured on, CPU included: its imports and a first use's compile run there
    host = results["environment"]
    assert host["cpu_cores"] >= 1 and host["cpu"] not in ("", "x86_64", "aarch64"), host


def test_the_dit_level_takes_the_encoders_settings_of_a_preset_with_no_encoder_loaded(tmp_path):
    """best sets the VAE's and the text encoder's run-time toggles; a DiT forward has neither to act on."""
    results = bench(tmp_path, "--level", "dit", "--shapes", "64", "--repeats", "1",
                    "--configs", "baseline", "vae=image,text-encoder=joined-windows")
    assert [row["config"] for row in results["rows"]] == ["stock", "text-encoder-joined-windows + vae-image"]
    assert results["rows"][1]["rel_error"] == 0.0   # the same DiT forward


def test_the_dit_experiments_time_the_whole_forward_beside_its_blocks(tmp_path):
    results = bench(tmp_path, "--level", "dit", "--shapes", "64", "--repeats", "1", "--configs", "baseline",
                    "--experiments")
    experiments = results["experiments"]
    assert experiments["forward_ms"] > 0 and experiments["block_loop_ms"] > 0
    assert experiments["cfg_two_forwards_ms"] > 0


def test_the_pipeline_level_marks_each_configuration(tmp_path):
    results = bench(tmp_path, "--level", "pipeline", "--steps", "2", "--width", "64", "--height", "64",
                    "--repeats", "0", "--configs", "baseline", "fp8=storage")
    assert [row["config"] for row in results["rows"]] == ["stock", "fp8-storage"]
    assert marks(results)[3:] == ["weights built", "stock", "fp8-storage"]


def test_a_baseline_measured_in_another_process_is_every_rows_reference(tmp_path, monkeypatch):
    """bench.sh runs stock and best in processes of their own: best's run reads stock's row and image."""
    request = ("--level", "pipeline", "--steps", "2", "--width", "64", "--height", "64", "--repeats", "1")
    stock = bench(tmp_path / "stock", *request, "--configs", "baseline")
    runs = counted_runs(monkeypatch)
    later = bench(tmp_path / "later", *request, "--baseline-from", str(tmp_path / "stock"), "--configs", "fp8=storage")
    assert runs == [(2, "fp8-storage")] * 2  # stock is not run again
    assert later["baseline_from"] == "stock" and [row["config"] for row in later["rows"]] == ["stock", "fp8-storage"]
    copied, measured = later["rows"]
    assert copied["measured_in"] == "stock" and copied["end_to_end_s"] == stock["rows"][0]["end_to_end_s"]
    assert measured["speedup_e2e"] == pytest.approx(copied["end_to_end_s"] / measured["end_to_end_s"])
    assert 20 < measured["psnr_db"] < float("inf")  # against stock's image, read from its folder
    edits = measured["edits_s"]  # each timed edit's total and stages, the medians' inputs
    assert len(edits) == 1 and edits[0]["total"] == measured["end_to_end_s"]
    assert edits[0]["denoising"] == measured["stages_s"]["denoising"]
    with pytest.raises(SystemExit, match=r"differs from this one in steps \(2 there, 3 here\)"):
        bench(tmp_path / "refused", "--level", "pipeline", "--steps", "3", "--width", "64", "--height", "64",
              "--repeats", "1", "--baseline-from", str(tmp_path / "stock"), "--configs", "fp8=storage")


def counted_runs(monkeypatch) -> list[tuple[int, str]]:
    """(steps, configuration) of every edit the engine runs from here on."""
    from ghostedit.engine import Engine
    runs = []
    run = Engine.run

    def counted_run(self, request, config, *args, **kwargs):
        runs.append((request.steps, config.label))
        return run(self, request, config, *args, **kwargs)
    monkeypatch.setattr(Engine, "run", counted_run)
    return runs


def test_cold_rows_come_after_a_short_edit_that_sets_up_the_libraries(monkeypatch, tmp_path):
    steps = counted_runs(monkeypatch)
    results = bench(tmp_path, "--level", "pipeline", "--steps", "3", "--width", "64", "--height", "64",
                    "--repeats", "0", "--configs", "baseline", "fp8=storage")
    assert steps == [(2, "stock"), (3, "stock"), (3, "fp8-storage")]
    assert results["cold_rows_after"] == "an unmeasured 2-step edit"  # docs/benchmarks.md says so above the table
    steps.clear()
    bench(tmp_path, "--level", "pipeline", "--steps", "3", "--width", "64", "--height", "64", "--repeats", "1",
          "--configs", "baseline")
    assert steps == [(3, "stock"), (3, "stock")]  # warm rows: the cold run already set the libraries up


@contextlib.contextmanager
def measured_peak(device):
    yield {"allocated_gib": 1.5, "reserved_gib": 2.0}


def test_runs_chained_with_then_share_one_process_and_its_weights(tmp_path, monkeypatch):
    from ghostedit.models import loading
    builds = []
    build = loading.load_base_pipeline

    def counted_build(*args, **kwargs):
        builds.append(args[0].source)
        return build(*args, **kwargs)
    monkeypatch.setattr(loading, "load_base_pipeline", counted_build)
    monkeypatch.setattr(command, "peak_memory", measured_peak)  # a CPU measures no peak: one stands in
    runs = counted_runs(monkeypatch)
    first = bench(tmp_path / "four", "--level", "pipeline", "--steps", "3", "--width", "64", "--height", "64",
                  "--repeats", "1", "--configs", "baseline", "fp8=storage",
                  "--then", "--out-dir", str(tmp_path / "forty"), "--steps", "4", "--repeats", "0",
                  "--configs", "baseline")
    second = json.loads((tmp_path / "forty" / "results.json").read_text())
    assert [row["config"] for row in first["rows"]] == ["stock", "fp8-storage"] and first["steps"] == 3
    assert [row["config"] for row in second["rows"]] == ["stock"] and second["steps"] == 4
    assert second["repeats"] == 0 and second["size"] == [64, 64]  # given anew, and inherited
    assert first["process"] == second["process"]
    assert marks(second)[:len(marks(first))] == marks(first)  # one process timeline, the second run's marks after
    assert marks(second)[len(marks(first)):] == ["results written", "weights built", "stock"]
    assert builds == ["tiny"]  # the weights were built once, for both runs
    assert first["load_peak_gib"] == 1.5 and second["load_peak_gib"] is None  # the second run loaded nothing
    # its cold rows come after the first run's edits: no second set-up edit
    assert second["cold_rows_after"] == "the edits of the process's earlier run"
    assert runs.count((4, "stock")) == 1 and (2, "stock") not in runs


def test_a_chained_run_cannot_change_what_the_runs_share(tmp_path):
    from ghostedit.bench.command import runs_of
    parse = build_parser().parse_args
    with pytest.raises(SystemExit, match="cannot change --model, --level"):
        runs_of(parse(["bench", "--model", "tiny", "--out-dir", str(tmp_path / "a"),
                       "--then", "--model", "synthetic", "--level", "dit", "--out-dir", str(tmp_path / "b")]))
    with pytest.raises(SystemExit, match="its own --out-dir"):
        runs_of(parse(["bench", "--model", "tiny", "--out-dir", str(tmp_path / "a"), "--then", "--steps", "3"]))


@pytest.mark.parametrize("skip", [False, True], ids=["teardown", "no teardown"])
def test_a_scripted_bench_process_can_leave_without_its_teardown(tmp_path, skip):
    """The process's own exit handlers stand for the teardown: with --skip-teardown they do not run, and the
    results are whole."""
    script = ("import atexit, sys; atexit.register(lambda: print('teardown ran', flush=True)); "
              "from ghostedit.cli import main; sys.exit(main(sys.argv[1:]))")
    command = [sys.executable, "-c", script, "bench", "--model", "tiny", "--device", "cpu", "--level", "dit",
               "--shapes", "64", "--repeats", "1", "--out-dir", str(tmp_path)] + (["--skip-teardown"] if skip else [])
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert ("teardown ran" in done.stdout) is not skip
    assert done.stdout.rstrip().splitlines()[-1 if skip else -2].startswith("process timeline")
    assert json.loads((tmp_path / "results.json").read_text())["rows"][0]["config"] == "stock"


def test_the_lora_switch_level_runs_as_bench_sh_runs_it(tmp_path):
    """bench.sh all's lora-switch process (no --steps): every switch timed, none recompiling."""
    args = build_parser().parse_args(["bench", "--model", "tiny", "--device", "cpu", "--out-dir", str(tmp_path),
                                      "--level", "lora-switch", "--width", "64", "--height", "64", "--cfg", "1",
                                      "--lora-rank", "4", "--configs", "baseline"])
    assert args.run(args) == 0
    results = json.loads((tmp_path / "results.json").read_text())
    assert [row["switch"] for row in results["rows"]] == [
        "first LoRA (none to A)", "A to B", "B to A + B stacked", "back to none", "none to A again"]
    assert all(row["switch_s"] > 0 and row["new_compiled_frames"] == 0 for row in results["rows"])
    assert results["runtime_scale"]["cache_hit"]


def test_the_masked_row_runs_as_bench_sh_chains_it(tmp_path, monkeypatch):
    """bench.sh e2e's best process ends with the same edit under the house's mask, without the unmasked baseline
    it inherits (`--baseline-from ""`); a masked baseline is refused for an unmasked run, and the mask is for whole
    edits only."""
    from ghostedit.bench.pipeline import DEFAULT_IMAGE
    mask = str(DEFAULT_IMAGE.with_name("house-mask.png"))
    request = ("--level", "pipeline", "--steps", "2", "--width", "64", "--height", "64", "--repeats", "1")
    from ghostedit.engine import Engine
    runs, run = [], Engine.run

    def recorded_run(self, edit, *args, **kwargs):
        runs.append(edit)
        return run(self, edit, *args, **kwargs)
    monkeypatch.setattr(Engine, "run", recorded_run)
    bench(tmp_path / "plain", *request, "--configs", "baseline",
          "--then", "--out-dir", str(tmp_path / "mask"), "--baseline-from", "", "--mask", mask, "--strength", "0.8")
    masked = json.loads((tmp_path / "mask" / "results.json").read_text())
    assert masked["start"] == {"mask": "house-mask.png", "strength": 0.8} and "baseline_from" not in masked
    assert [edit.mask is not None for edit in runs] == [False, False, True, True]
    with pytest.raises(SystemExit, match="differs from this one in start"):
        bench(tmp_path / "refused", *request, "--baseline-from", str(tmp_path / "mask"), "--configs", "baseline")
    with pytest.raises(SystemExit, match="for --level pipeline"):
        bench(tmp_path / "dit", "--level", "dit", "--shapes", "64", "--mask", mask)


def test_the_2_1_level_runs_each_case_on_stock_diffsynth_and_on_each_configuration(tmp_path, capsys):
    """`--level 2.1` (scripts/gpu/bench.sh qwen21) on the tiny 2.1, its cases at 64 px: stock DiffSynth first (its
    DiT over the same weights), then GhostEdit's configurations, each with its first and cached steps and tokens.
    Each stage before a row is marked and printed as it ends (a process killed at its time limit says where)."""
    args = build_parser().parse_args(["bench", "--model", "tiny-2.1", "--device", "cpu", "--out-dir", str(tmp_path),
                                      "--level", "2.1", "--width", "64", "--cases", "turbo-1024-1ref", "t2i-1024",
                                      "--configs", "baseline", "prefix-cache=off"])
    assert args.run(args) == 0
    rows = json.loads((tmp_path / "results.json").read_text())["rows"]
    assert [(row["case"], row["config"]) for row in rows] == [
        (case, config) for case in ("turbo-1024-1ref", "t2i-1024")
        for config in ("DiffSynth (stock)", "GhostEdit stock", "GhostEdit prefix-cache-off")]
    stock, ours, uncached = rows[:3]
    assert len(ours["step_s"]) == 8 and ours["tokens_cached"] == 16 < ours["tokens_first"]
    assert stock["tokens_cached"] == 16, "stock's cache computes the target's 4x4 tokens too"
    assert uncached["tokens_cached"] == uncached["tokens_first"]
    assert ours["speedup_cached"] > 0 and (tmp_path / "table.md").read_text().count("\n") == 8
    for row in rows:  # the run's time in parts: before the steps, each step, after them
        parts = row["before_steps_s"] + sum(row["step_s"]) + row["after_steps_s"]
        assert row["before_steps_s"] > 0 and row["after_steps_s"] > 0 and abs(parts - row["end_to_end_s"]) < 1e-3
    first_row = "DiffSynth (stock) at turbo-1024-1ref"
    assert marks(json.loads((tmp_path / "results.json").read_text()))[2:9] == [
        "configurations checked", "weights built (cpu placement)", "stock prepared", "prefix-cache-off prepared",
        f"{first_row} begins", first_row, "GhostEdit stock at turbo-1024-1ref begins"]
    assert any(line.startswith("· ") and line.endswith(f" s: {first_row} begins")
               for line in capsys.readouterr().out.splitlines())


def test_the_2_1_level_says_where_stock_diffsynth_ran_out_of_memory_and_goes_on(tmp_path, monkeypatch):
    """DiffSynth's own pipeline ran out of the H100's memory at 2048 with four references (docs/benchmarks.md, 9):
    its row says so and GhostEdit's configurations still run the case."""
    timed = qwen_image_21._timed

    def stock_out_of_memory(pipe, case, arguments, device, tokens):
        if "dit_options" not in arguments:  # DiffSynth's pipeline gets no GhostEdit options
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 1.88 GiB.")
        return timed(pipe, case, arguments, device, tokens)
    monkeypatch.setattr(qwen_image_21, "_timed", stock_out_of_memory)
    args = build_parser().parse_args(["bench", "--model", "tiny-2.1", "--device", "cpu", "--out-dir", str(tmp_path),
                                      "--level", "2.1", "--width", "64", "--cases", "turbo-1024-1ref",
                                      "--configs", "baseline"])
    assert args.run(args) == 0
    stock, ours = json.loads((tmp_path / "results.json").read_text())["rows"]
    assert stock["error"] == "out of memory: CUDA out of memory. Tried to allocate 1.88 GiB."
    assert ours["config"] == "GhostEdit stock" and ours["speedup_cached"] is None and len(ours["step_s"]) == 8
    assert "out of memory" in (tmp_path / "table.md").read_text()
