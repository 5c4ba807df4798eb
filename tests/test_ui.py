"""The app's layer over the engine, without a server: live view, history and comparison, settings, LoRA folder."""
import json
import threading

import pandas as pd
import pytest

from ghostedit import EditRequest, LoraChoice, OptimizationConfig
from ghostedit.models.tiny import ensure_tiny_lora
from ghostedit.ui import gpu, live
from ghostedit.ui.history import History
from ghostedit.ui.settings import (NO_LORA, LoraLibrary, edit_request, toggle_choices, variant_configs)


def request(image, **overrides):
    return EditRequest(images=[image], prompt="make it a haunted house", **{"width": 128, "height": 128, "steps": 2,
                                                                          **overrides})


@pytest.fixture(scope="module")
def results(engine, house):
    """Baseline, FP8 storage on the same edit, and the baseline on another seed (a different edit)."""
    return [engine.run(request(house)), engine.run(request(house), OptimizationConfig(fp8="storage")),
            engine.run(request(house, seed=1))]


def test_stream_run_yields_live_updates_then_the_result(engine, house):
    items = list(live.stream_run(engine, request(house, steps=3), OptimizationConfig(), threading.Event()))
    *updates, result = items
    assert all(isinstance(item, live.Live) for item in updates)
    assert result.image.size == (128, 128)
    steps = [item.event.step for item in updates if item.event.stage == "denoising" and item.event.step_seconds]
    assert steps == [1, 2, 3]


def test_stream_run_cancels_when_nobody_listens(engine, house):
    cancel = threading.Event()
    stream = live.stream_run(engine, request(house, steps=50), OptimizationConfig(), cancel)
    next(stream)
    stream.close()
    assert cancel.is_set()
    engine.run(request(house))  # the engine is free again: the cancelled run let go of it


def test_engine_errors_come_out_of_the_stream(engine, house):
    with pytest.raises(Exception, match="needs a CUDA GPU"):
        list(live.stream_run(engine, request(house), OptimizationConfig(fp8="torchao"), threading.Event()))


def test_live_status_shows_step_timing_and_labels_host_memory(engine, house):
    events = []
    engine.run(request(house, steps=3), on_progress=events.append)
    step = next(e for e in events if e.stage == "denoising" and e.step == 2)
    text = live.live_status(live.Live(step, 1.5), heading="")
    assert "Denoising · step 2/3" in text and f"{step.step_seconds:.2f} s" in text and "1.5 s" in text
    assert "host memory (process RSS): no GPU" in text
    assert live.stage_words("compile warm-up") == "compiling"
    assert live.progress_json(live.Live(step, 1.5))["step"] == 2


def test_history_compares_the_same_edit_against_the_baseline(results):
    history = History()
    for result in results:
        history.add(result)
    table = history.table()
    baseline, fp8, other_seed = table.to_dict("records")
    assert baseline["run"] == "#1 (baseline)" and baseline["PSNR dB"] == "identical"
    assert fp8["speedup s/step ×"] > 0 and 25 < float(fp8["PSNR dB"]) and 0 < fp8["SSIM"] < 1
    assert other_seed["PSNR dB"] == "" and pd.isna(other_seed["speedup e2e ×"])  # not the same edit
    history.set_baseline(2)
    assert history.table()["run"].tolist() == ["#1", "#2 (baseline)", "#3"]
    assert history.table().loc[0, "PSNR dB"] == fp8["PSNR dB"]


def test_end_to_end_speedup_leaves_out_model_loading(results):
    history = History()
    for result in results[:2]:
        history.add(result)
    first, second = history.runs
    expected = first.seconds_without_load / second.seconds_without_load
    assert history.comparison(second)["speedup_e2e"] == pytest.approx(expected)


def test_history_exports_csv_and_json(results, tmp_path):
    history = History()
    for result in results:
        history.add(result)
    csv_path, json_path = history.write_exports(tmp_path)
    assert pd.read_csv(csv_path)["configuration"].tolist() == ["stock", "fp8-storage", "stock"]
    exported = json.loads(json_path.read_text())
    assert [run["baseline"] for run in exported["runs"]] == [True, False, False]
    assert exported["runs"][0]["versus_baseline"]["psnr_db"] == "identical"
    assert exported["runs"][1]["telemetry"]["step_s"] and exported["runs"][2]["versus_baseline"] == {}


def test_history_keeps_a_baseline_when_cleared_and_refilled(results):
    history = History()
    history.add(results[0])
    history.clear()
    assert history.table().empty and history.baseline() is None
    record = history.add(results[1])
    assert history.baseline_number == record.number == 2


def test_variants_add_one_panel_setting_each_and_run_duplicates_once():
    lora = LoraChoice.from_file(ensure_tiny_lora("peft"), 0.5, "runtime")
    panel = OptimizationConfig(loras=(lora,), fp8="storage", compile="regional")
    runs, notes = variant_configs(["all", "baseline", "fp8", "lora-fused", "compile"], panel)
    assert [name for name, _ in runs] == ["baseline", "lora-fused", "fp8", "compile", "all"]
    configs = dict(runs)
    assert configs["baseline"] == OptimizationConfig()
    assert configs["lora-fused"].loras[0].mode == "fused" and configs["lora-fused"].loras[0].scale == 0.5
    assert configs["fp8"] == OptimizationConfig(fp8="storage") and configs["all"] == panel
    assert notes == []
    runs, notes = variant_configs(["baseline", "all"], OptimizationConfig())
    assert len(runs) == 1 and "same configuration" in notes[0]


@pytest.mark.parametrize("names, message", [
    (["fp8"], "stock setting"), (["rewrites"], "stock setting"), (["lora-fused"], "no LoRA is picked"),
    ([], "at least one"), (["turbo"], "unknown"),
])
def test_variants_that_cannot_mean_anything_are_refused(names, message):
    with pytest.raises(ValueError, match=message):
        variant_configs(names, OptimizationConfig())


def test_unavailable_choices_carry_their_reason(engine):
    choices = dict((value, label) for label, value in toggle_choices("fp8", engine.options()["fp8"]))
    assert choices["storage"] == "storage (FP8 weights, bf16 compute)"
    assert choices["torchao"].endswith(
        "unavailable: torchao FP8 compute needs a CUDA GPU; this machine runs on the CPU")


def test_lora_library_lists_resolves_and_stores_uploads(tmp_path):
    library = LoraLibrary(tmp_path / "loras", builtin={"tiny.safetensors": ("tiny", lambda: ensure_tiny_lora("peft"))})
    upload = tmp_path / "upload.bin"
    upload.write_bytes(ensure_tiny_lora("kohya").read_bytes())
    name = library.add(upload, "../../my LoRA (v2).safetensors")
    assert name == "my_LoRA_v2.safetensors" and library.add(upload, "my LoRA (v2).safetensors") == name
    assert [value for _, value in library.choices()] == [NO_LORA, name, "built-in/tiny.safetensors"]
    assert library.path(name) == (tmp_path / "loras" / name).resolve()
    assert library.path("built-in/tiny.safetensors") == ensure_tiny_lora("peft")
    assert library.path(NO_LORA) is None


@pytest.mark.parametrize("name, message", [
    ("../x.safetensors", "not a LoRA name"), ("/etc/passwd", "not a LoRA name"),
    ("missing.safetensors", "no LoRA named"), ("built-in/other.safetensors", "not a LoRA name"),
])
def test_lora_library_refuses_names_outside_its_folder(tmp_path, name, message):
    with pytest.raises(ValueError, match=message):
        LoraLibrary(tmp_path).path(name)


def test_lora_library_refuses_files_that_are_not_safetensors(tmp_path):
    library = LoraLibrary(tmp_path / "loras")
    pickle_file = tmp_path / "model.safetensors"
    pickle_file.write_bytes(b"\x80\x04K\x01.")
    with pytest.raises(ValueError, match="not a safetensors file"):
        library.add(pickle_file, "model.safetensors")
    assert list((tmp_path / "loras").iterdir()) == []


def test_edit_request_reads_zero_size_as_automatic(house):
    edit = edit_request([house, None, None], "make it night", None, 4, 4.0, 7, 0, 0)
    assert (edit.width, edit.height, edit.seed, len(edit.images)) == (None, None, 7, 1)


def test_outside_a_space_gpu_entry_points_are_unchanged():
    def edit(steps):
        return steps
    assert gpu.on_gpu(edit, None) is edit  # `spaces` is not installed here (tests/test_space.py brings a stand-in)
