"""The app's layer over the engine, without a server: live view, history and comparison, settings, LoRA folder."""
import json
import re
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
    # every step's event once, and the latest again at each tick of a second without a new one (a slow step)
    assert steps == sorted(steps) and sorted(set(steps)) == [1, 2, 3]


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
    table = history.table()  # as an edit answers: the image metrics are not computed on its way
    assert table["PSNR dB"].tolist() == ["pending", "pending", ""] and table["SSIM"].tolist()[:2] == ["pending"] * 2
    assert [run.number for run in history.pending_metrics()] == [1, 2]
    assert history.compute_metrics() == 2 and history.compute_metrics() == 0
    table = history.table()
    baseline, fp8, other_seed = table.to_dict("records")
    assert baseline["run"] == "#1 (baseline)" and baseline["PSNR dB"] == "identical" and baseline["SSIM"] == 1.0
    assert fp8["speedup s/step ×"] > 0 and 25 < float(fp8["PSNR dB"]) and 0 < fp8["SSIM"] < 1
    assert other_seed["PSNR dB"] == "" and pd.isna(other_seed["speedup e2e ×"])  # not the same edit
    history.set_baseline(2)
    assert history.table()["run"].tolist() == ["#1", "#2 (baseline)", "#3"]
    assert history.compute_metrics() == 2  # against the new baseline
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


def test_unavailable_choices_are_marked_in_one_line_with_their_reason_apart(engine):
    """A choice this machine cannot run says so in one short line; its reason is shown on hover (and in the System
    tab), not inside the label."""
    from ghostedit.ui.settings import unavailable_reasons
    choices = dict((value, label) for label, value in toggle_choices("fp8", engine.options()["fp8"]))
    assert choices["storage"] == "storage (FP8 weights, bf16 compute)"
    assert choices["torchao"] == "torchao (FP8 compute) · not on this machine"
    reasons = unavailable_reasons(engine.options())
    assert reasons[choices["torchao"]] == "torchao FP8 compute needs a CUDA GPU; this machine runs on the CPU"
    assert choices["storage"] not in reasons and all("\n" not in label for label in reasons)


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


def test_lora_files_are_hashed_before_their_first_use(tmp_path, monkeypatch):
    """A LoRA is identified by its content: the library hashes the folder's files in the background once start-up
    has warmed (the app's weights load from the same disk) and a stored upload at once, so that a run's first use
    of a file does not read it whole on the request's path (in the H200 latency run, docs/benchmarks/latency-4/,
    each LoRA's first switch spent 0.55 s in the handler outside the engine, where its content was hashed)."""
    from ghostedit import config
    folder = tmp_path / "loras"
    folder.mkdir()
    (folder / "present.safetensors").write_bytes(ensure_tiny_lora("peft").read_bytes())
    warmed = threading.Event()
    library = LoraLibrary(folder, hash_after=warmed.wait)  # as the app's: after its start-up warm-up
    library.hashing.join(timeout=0.5)
    assert library.hashing.is_alive(), "hashed while the start-up warm-up loads weights from the same disk"
    warmed.set()
    library.hashing.join(timeout=30)
    upload = tmp_path / "upload.bin"
    upload.write_bytes(ensure_tiny_lora("kohya").read_bytes())
    uploaded = library.add(upload, "uploaded.safetensors")

    def read_again(*_):
        raise AssertionError("a LoRA file was read again for its hash")
    monkeypatch.setattr(config.hashlib, "file_digest", read_again)
    for name in ("present.safetensors", uploaded):
        assert len(LoraChoice.from_file(library.path(name)).sha256) == 64


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
    assert gpu.on_gpu(edit, None) is edit  # `spaces` is not installed here (tests/server/test_space.py brings a stand-in)


# ---- issue 15: what a newcomer found wrong or missing ----

def fake_request(session="tests"):
    from types import SimpleNamespace
    return SimpleNamespace(session_hash=session)


def no_progress(*args, **kwargs):
    pass


def test_failed_model_load_leaves_the_loading_status(tmp_path, house):
    """The last status before the error toast says the run failed and why: not "Loading the model" with a frozen
    timer."""
    import gradio as gr

    from ghostedit.engine import Engine
    from ghostedit.ui.handlers import Handlers
    from reference_checkpoints import write_configs
    weightless = write_configs(tmp_path / "model", "Qwen-Image-Edit-2509")  # recognised; its weights are missing
    handlers = Handlers(Engine(str(weightless), device="cpu"), tmp_path / "loras")
    import base64
    from conftest import ASSETS
    data_url = "data:image/png;base64," + base64.b64encode((ASSETS / "house.png").read_bytes()).decode()
    values = {"image": {"url": data_url}, "prompt": "make it night", "steps": 2, "cfg_scale": 4, "seed": 0,
              "width": 128, "height": 128}
    seen = []
    with pytest.raises(gr.Error) as raised:
        for update in handlers.edit(values, History(), fake_request(), no_progress):
            seen.append(update)
    statuses = [update[0] for update in seen]
    assert "Loading" not in statuses[-1] and "⏳" not in statuses[-1]
    assert "❌" in statuses[-1] and raised.value.message in statuses[-1]
    assert seen[-1][3]["state"] == "failed"


def test_time_chart_counts_compiling_and_every_second_of_the_run(results):
    history = History()
    for result in results[:2]:
        history.add(result)
    compiled = history.runs[1]
    compiled.telemetry = {**compiled.telemetry, "total_s": compiled.telemetry["total_s"] + 72.0,
                          "stages_s": {**compiled.telemetry["stages_s"], "compile warm-up": 72.0}}
    chart = history.stage_chart()
    for run in history.runs:
        bar = chart[chart["run"] == f"#{run.number}"]
        assert bar["seconds"].sum() == pytest.approx(run.telemetry["total_s"], abs=0.01)
    assert chart[(chart["run"] == f"#{compiled.number}") & (chart["stage"] == "compiling")]["seconds"].item() == 72.0
    assert set(chart["run"]) == {"#1", "#2"}  # short axis labels, never cut; the configuration is in the tooltip
    assert list(chart["configuration"].unique()) == [run.configuration for run in history.runs]


def test_the_stage_legend_names_compiling():
    from ghostedit.ui.layout import STAGE_COLORS, _stage_legend
    assert "compiling" in STAGE_COLORS and "other" in STAGE_COLORS
    assert "compiling</span>" in _stage_legend()


def test_a_configuration_that_compiles_is_warned_about_before_it_runs(tmp_path):
    from ghostedit.engine import Engine
    from ghostedit.ui.handlers import Handlers
    handlers = Handlers(Engine("tiny", device="cpu"), tmp_path / "loras")  # nothing prepared yet
    assert "compiles the DiT" in handlers.prepare_notice(OptimizationConfig(compile="regional"))
    assert "compiles" not in handlers.prepare_notice(OptimizationConfig())


def test_live_status_has_a_progress_bar(engine, house):
    events = []
    engine.run(request(house, steps=3), on_progress=events.append)
    step = next(e for e in events if e.stage == "denoising" and e.step == 2)
    assert '<progress class="ghost-progress" value="2" max="3"' in live.live_status(live.Live(step, 1.0))
    loading = next(e for e in events if not e.total_steps)
    assert "<progress" in live.live_status(live.Live(loading, 1.0))  # indeterminate while no steps are known


def test_history_has_prompt_and_seed_and_gives_the_settings_back(results, tmp_path):
    from ghostedit.ui.settings import reused_values
    history = History()
    for result in results:
        history.add(result)
    table = history.table()
    assert list(table["prompt"]) == ["make it a haunted house"] * 3 and list(table["seed"]) == [0, 0, 1]
    run = history.run(2)
    values = reused_values(LoraLibrary(tmp_path), run.params, run.toggles)
    assert values["fp8"] == "storage" and values["seed"] == 0 and values["steps"] == 2 and values["width"] == 128
    assert values["lora"] == NO_LORA


def test_reused_settings_bring_back_a_lora_of_the_library(engine, house, tmp_path):
    from ghostedit.ui.settings import reused_values
    library = LoraLibrary(tmp_path)
    name = library.add(ensure_tiny_lora("peft"), "ghost.safetensors")
    result = engine.run(request(house), OptimizationConfig(loras=(LoraChoice.from_file(library.path(name), 0.8,
                                                                                         "runtime"),)))
    history = History()
    run = history.add(result)
    values = reused_values(library, run.params, run.toggles)
    assert (values["lora"], values["lora_mode"], values["lora_scale"]) == (name, "runtime", 0.8)
    assert "runtime ×0.8" in history.table()["configuration"].item()


def test_aspect_presets_and_several_seeds():
    from ghostedit.errors import InvalidRequestError
    from ghostedit.ui.settings import FROM_INPUT, image_count, preset_size, seeded_requests
    assert preset_size(FROM_INPUT, 256 * 256) == (0, 0)
    assert preset_size("1:1", 1024 * 1024) == (1024, 1024)
    width, height = preset_size("16:9", 1024 * 1024)
    assert width % 16 == height % 16 == 0 and abs(width / height - 16 / 9) < 0.03
    assert abs(width * height - 1024 * 1024) / (1024 * 1024) < 0.03
    assert image_count(None) == 1 and image_count(3) == 3
    for bad in (0, 9, 1.5, "2", True):
        with pytest.raises(InvalidRequestError, match="count"):
            image_count(bad)
    from PIL import Image
    edit = EditRequest(images=[Image.new("RGB", (64, 64))], prompt="x", seed=4294967294)
    assert [e.seed for e in seeded_requests(edit, 3)] == [4294967294, 4294967295, 0]


def test_table_columns_are_as_wide_as_their_longest_word():
    from ghostedit.ui.tables import CHAR_PX, column_widths
    frame = pd.DataFrame({"run": ["#1 (baseline)"], "configuration": ["lora-tiny_lora_peft-runtime ×0.8"],
                          "speedup s/step ×": [1.0]})
    widths = column_widths(frame)
    assert widths[1] >= len("lora-tiny_lora_peft-runtime") * CHAR_PX
    assert widths[2] >= len("speedup") * CHAR_PX


def test_prepare_notices_run_one_at_a_time_in_the_order_asked_for(engine, tmp_path):
    """Every event that writes the prepare notice (a toggle's change, after a run, a model switch, a preset, a Hub
    LoRA, the page's load) waits in one queue of one: side by side, the notice asked for before a change could
    finish after it and show the settings no longer chosen."""
    from ghostedit.ui.layout import build_app
    demo = build_app(engine, tmp_path / "loras")
    notice = next(block for block in demo.blocks.values() if getattr(block, "elem_id", None) == "prepare_notice")
    writers = [fn for fn in demo.fns.values() if notice in fn.outputs]
    assert len(writers) >= 8  # the toggles' changes and the events above
    assert {(fn.concurrency_id, fn.concurrency_limit) for fn in writers} == {("notice", 1)}


# ---- issue 43: the page a person sees ----

def test_the_time_chart_has_every_stage_of_every_run_from_the_first_and_none_before(results):
    """Gradio's plot fixes its series when it first draws: every stage is in every run's rows (0 s where a run had
    none), in one order (last stage first: the plot stacks its first series on top); nothing at all before a run
    (an empty frame would make the seconds a category)."""
    from ghostedit.ui.history import CHART_STAGES
    history = History()
    assert history.stage_chart() is None and history.memory_chart() is None
    for result in results:
        history.add(result)
    chart = history.stage_chart()
    for run in history.runs:
        bar = chart[chart["run"] == f"#{run.number}"]
        assert list(bar["stage"]) == list(reversed(CHART_STAGES))
        assert bar["seconds"].dtype == float and bar["seconds"].sum() == pytest.approx(run.telemetry["total_s"],
                                                                                     abs=0.01)
    assert list(chart["configuration"].unique()) == ["stock", "fp8-storage", "stock (2)"]  # named, never "#1"
    assert history.memory_chart()["peak GiB"].dtype == float


def test_the_comparison_is_led_by_the_configuration_and_names_each_figure_on_a_card(results):
    from ghostedit.ui.tables import comparison_html
    history = History()
    for result in results:
        history.add(result)
    html_text = comparison_html(history.compact_rows(), history.memory_kind())
    headers = re.findall(r'<th scope="col">([^<]*)</th>', html_text)
    assert headers[0] == "configuration" and {"s / step", "speed-up / step", "PSNR dB", "SSIM"} <= set(headers)
    assert "peak RAM GiB (process RSS)" in headers  # on the CPU: what the memory figure measures
    assert html_text.count('data-label="PSNR dB"') == 3 and "seed 1" in html_text  # the edit, on hover
    assert "No runs yet" in comparison_html([], "")


def test_section_summaries_and_slots():
    from ghostedit.ui.settings import generation_summary, lora_summary, slots_shown
    assert (generation_summary(4, 4.0, 0, 0, 0, 1)
            == "Generation · 4 steps · CFG 4 · seed 0 · size from the input · 1 image")
    assert generation_summary(2, 1.5, 7, 128, 256, 3).endswith("CFG 1.5 · seed 7 · 128×256 · 3 images")
    assert lora_summary({}) == "LoRAs · none"
    assert lora_summary({"lora": "built-in/tiny_lora_peft.safetensors", "lora_mode": "runtime", "lora_scale": 0.5,
                         "lora_2": NO_LORA}) == "LoRAs · tiny_lora_peft (runtime ×0.5)"
    assert slots_shown(0, [None, None]) == 0 and slots_shown(0, [None, None], add=True) == 1
    assert slots_shown(0, [None, "x.png"]) == 2 and slots_shown(2, [None, None], add=True) == 2


def test_a_refusal_is_said_in_the_status_on_the_page_and_raised_to_a_client(tmp_path, house):
    """The same refusal: on the page (Gradio's front end marks its calls `x-gradio-user: app`) the status panel
    says it and nothing is raised; an API client gets the error."""
    import gradio as gr
    from types import SimpleNamespace

    from ghostedit.engine import Engine
    from ghostedit.ui.handlers import Handlers
    handlers = Handlers(Engine("tiny", device="cpu"), tmp_path / "loras")
    values = {"image": None, "prompt": "make it night", "steps": 2, "cfg_scale": 4, "seed": 0}
    page = SimpleNamespace(session_hash="page", headers={"x-gradio-user": "app"})
    (status, *_), = list(handlers.edit(values, History(), page, no_progress))
    assert status.startswith("### ⛔ Cannot run this") and "takes 1 to 3 input images; got 0" in status
    client = SimpleNamespace(session_hash="client", headers={"x-gradio-user": "api"})
    with pytest.raises(gr.Error, match="takes 1 to 3 input images; got 0"):
        list(handlers.edit(values, History(), client, no_progress))


def test_a_batch_ends_with_its_total_and_a_cancel_says_what_was_kept(results):
    from ghostedit.telemetry import RunCancelled
    said = live.batch_status(results, 12.345)
    assert said.startswith("### ✅ 3 images in 12.35 s") and "image 3" in said
    assert "This run made no image" in live.cancelled_status(RunCancelled("cancelled after 3 of 9 steps"), 0)
    assert "The 2 images of this run finished before it are kept" in live.cancelled_status(RunCancelled("x"), 2)
