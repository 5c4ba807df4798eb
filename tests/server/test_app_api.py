"""The real app on 127.0.0.1 (tiny model), driven through its named API endpoints with gradio_client."""
import math
import time

import numpy as np
import pytest
from gradio_client import handle_file
from gradio_client.exceptions import AppError
from gradio_client.utils import Status
from PIL import Image

from app_client import (BEFORE_AFTER, IMAGES, RUN_JSON, STATUS, SUMMARY, TABLE, client, lossless, reached, rows,
                        wait_until, watch)
from conftest import ASSETS

SMALL = dict(steps=3, width=128, height=128)


def inputs(**overrides) -> dict:
    return {"image": handle_file(str(ASSETS / "house.png")), "prompt": "make it a haunted house at night",
            **SMALL, **overrides}


def test_starts_within_30_cpu_seconds(app, artifacts):
    (artifacts / "app-startup.txt").write_text(f"wall {app.startup_wall_s:.1f} s, cpu {app.startup_cpu_s:.1f} s\n")
    # CPU time, not wall time: other jobs on a shared CI machine stretch the wall clock, not the work
    assert app.startup_cpu_s < 30


def test_default_edit_answers_once_with_progress_at_its_steps(app):
    """Only an image and an instruction: the model's default steps and size. The answer comes once (a streamed
    answer's files gradio_client fetches twice); while the run goes, Gradio's progress updates follow the steps, at
    most four a second (handlers.STREAM_INTERVAL_S), each with the stage, s/step, ETA and memory."""
    job = client(app).submit(image=handle_file(str(ASSETS / "house.png")), prompt="make it night",
                             api_name="/edit")
    final = job.result()
    assert len(job.outputs()) == 1
    many = client(app).submit(image=handle_file(str(ASSETS / "house.png")), prompt="make it night", steps=60,
                              api_name="/edit")  # long enough for several updates whatever the machine's speed
    [shown] = watch([many])
    steps = [update.index for update in shown]
    assert len(steps) >= 2 and steps == sorted(steps) and set(steps) <= set(range(0, 61)), steps
    assert {(update.length, update.unit) for update in shown} == {(60, "steps")}
    assert all(update.desc.split(" · ")[0] in ("denoising", "decoding") and "/step · elapsed " in update.desc
               and " · ETA " in update.desc and "host memory (process RSS): " in update.desc
               for update in shown), [update.desc for update in shown]
    assert any(" s/step · " in update.desc for update in shown if update.desc.startswith("denoising"))
    assert len(many.outputs()) == 1 and many.result()[RUN_JSON]["state"] == "done"
    telemetry = final[RUN_JSON]["telemetry"]
    assert final[RUN_JSON]["state"] == "done" and len(telemetry["step_s"]) == 4
    before, after = (Image.open(path) for path in final[BEFORE_AFTER])
    assert before.size == after.size == (256, 256)
    assert "Done in" in final[STATUS] and "Prepared pipeline" in final[SUMMARY]


def test_two_configurations_give_two_comparison_rows(app):
    session = client(app)
    session.predict(**inputs(), api_name="/edit")
    second = session.predict(**inputs(fp8="storage"), api_name="/edit")
    baseline, fp8 = rows(second[TABLE])  # exactly two: other tests' sessions never show here
    assert baseline["run"] == "#1 (baseline)" and baseline["configuration"] == "stock"
    assert fp8["configuration"] == "fp8-storage"
    assert fp8["speedup e2e ×"] > 0 and fp8["speedup s/step ×"] > 0
    assert fp8["PSNR dB"] == fp8["SSIM"] == "pending"  # the edit answers before the image metrics are made
    table, (png_path,) = session.predict(api_name="/comparison")  # and the latest /edit's output
    baseline, fp8 = rows(table)
    assert 25 < float(fp8["PSNR dB"]) < math.inf and 0 < fp8["SSIM"] < 1
    assert baseline["PSNR dB"] == "identical" and baseline["SSIM"] == 1
    assert Image.open(png_path).format == "PNG"


def test_views_are_jpeg_and_the_download_is_the_lossless_png(app):
    """The before/after and a batch's images travel as JPEG (quick to encode), a single image once, as the pair's
    second (each file is one more request for the client); /comparison gives the latest run's output as a PNG, the
    engine's pixels, which the JPEG view is close to."""
    session = client(app)
    result = session.predict(**inputs(seed=5), api_name="/edit")
    before, after = result[BEFORE_AFTER]
    assert Image.open(before).format == Image.open(after).format == "JPEG"
    assert result[IMAGES] == []
    (png,) = lossless(session)
    assert Image.open(png).format == "PNG" and Image.open(png).size == Image.open(after).size
    view, made = (np.asarray(Image.open(path).convert("RGB"), dtype=np.float64) for path in (after, png))
    assert 10 * math.log10(255**2 / np.mean((view - made) ** 2)) > 30  # quality 95: close to the output
    batch = session.predict(**inputs(seed=5, steps=2), count=2, api_name="/edit")
    assert len(batch[IMAGES]) == 2 and all(Image.open(item["image"]).format == "JPEG" for item in batch[IMAGES])


def test_identical_second_run_is_a_cache_hit(app):
    session = client(app)
    first = session.predict(**inputs(rewrites=["joint-layout"]), api_name="/edit")
    second = session.predict(**inputs(rewrites=["joint-layout"]), api_name="/edit")
    assert first[RUN_JSON]["telemetry"]["cache_hit"] is False
    assert second[RUN_JSON]["telemetry"]["cache_hit"] is True
    assert [row["cache"] for row in rows(second[TABLE])] == ["miss", "hit"]
    assert "cache hit" in second[SUMMARY]


def test_run_variants_fills_the_comparison(app):
    session = client(app)
    result = session.predict(**inputs(lora="built-in/tiny_lora_peft.safetensors"),
                             variants=["baseline", "lora-fused", "lora-runtime"], api_name="/run_variants")
    table = rows(result[TABLE])
    assert [row["configuration"] for row in table] == [
        "stock", "lora-tiny_lora_peft-fused ×1", "lora-tiny_lora_peft-runtime ×1"]
    assert table[0]["run"].endswith("(baseline)")
    fused, runtime = rows(session.predict(api_name="/comparison")[0])[1:]  # with the image metrics
    assert float(fused["PSNR dB"]) < 40  # the LoRA changes the picture
    assert fused["speedup s/step ×"] > 0 and runtime["speedup s/step ×"] > 0
    assert result[RUN_JSON]["state"] == "done" and len(result[RUN_JSON]["runs"]) == 3


@pytest.mark.parametrize("overrides, message", [
    (dict(fp8="torchao"), "needs a CUDA GPU"),
    (dict(attention="fa3"), "needs a CUDA GPU"),
    (dict(width=100), "multiple of 16"),
    (dict(prompt="  "), "prompt is empty"),
    (dict(lora="../../etc/passwd"), "not a LoRA name"),
    (dict(lora="missing.safetensors"), "no LoRA named"),
    (dict(compile="off", rewrites=["inductor-cdt"]), "inductor-cdt needs compile set to anything but off"),
])
def test_refused_runs_say_why_and_the_app_keeps_serving(app, overrides, message):
    session = client(app)
    with pytest.raises(AppError, match=message):
        session.predict(**inputs(**overrides), api_name="/edit")
    assert session.predict(**inputs(), api_name="/edit")[RUN_JSON]["state"] == "done"


def test_variant_needing_an_unset_toggle_is_refused(app):
    with pytest.raises(AppError, match="stock setting"):
        client(app).predict(**inputs(), variants=["baseline", "fp8"], api_name="/run_variants")


def test_queue_runs_one_job_at_a_time_and_shows_the_place(app):
    first = client(app).submit(**inputs(steps=40), api_name="/edit")
    wait_until(lambda: reached(first, stage="denoising"))
    second = client(app).submit(**inputs(), api_name="/edit")
    seen = []  # the second job's status while the first one is still running
    while not first.done():
        seen.append(second.status())
        time.sleep(0.05)
    queued = [status for status in seen if status.code == Status.IN_QUEUE]
    assert queued and queued[-1].rank == 0 and queued[-1].queue_size >= 1, seen[-5:]
    assert second.result()[RUN_JSON]["state"] == "done"


def test_cancel_stops_the_run_at_a_step_and_keeps_the_previous_result(app):
    session = client(app)
    job = session.submit(**inputs(steps=100), api_name="/edit")
    wait_until(lambda: reached(job, step=1))
    session.predict(api_name="/cancel")
    final = job.result()
    assert final[RUN_JSON]["state"] == "cancelled" and "Cancelled" in final[STATUS]
    assert "of 100 steps" in final[RUN_JSON]["message"]
    # neither the start nor the cancel clears the before/after pair (None would): the previous result stays up
    assert all(out[BEFORE_AFTER] is not None for out in job.outputs())


def test_several_images_per_run_with_consecutive_seeds(app):
    final = client(app).predict(**inputs(steps=2, seed=41), count=2, api_name="/edit")
    assert [row["seed"] for row in rows(final[TABLE])] == [41, 42]
    assert [item["caption"].split(" ·")[0] for item in final[IMAGES]] == ["seed 41", "seed 42"]
    assert all(Image.open(item["image"]).size == (128, 128) for item in final[IMAGES])
    with pytest.raises(AppError, match="count must be a whole number from 1 to 8"):
        client(app).predict(**inputs(), count=9, api_name="/edit")
    with pytest.raises(AppError, match="one image per variant"):  # refused, not silently ignored
        client(app).predict(**inputs(), count=2, variants=["baseline"], api_name="/run_variants")


def test_the_log_is_quiet_and_names_the_share_option(app):
    client(app).predict(**inputs(steps=2), api_name="/edit")  # the model is loaded by now
    log = app.log.read_text()
    assert "This is not an error" not in log and "Loaded model" not in log
    assert "--share" in log and "share=True" not in log


def test_lora_upload_is_saved_under_a_safe_name(app, tmp_path):
    from ghostedit.models.tiny import ensure_tiny_lora
    upload = tmp_path / "my ghost style!.safetensors"
    upload.write_bytes(ensure_tiny_lora("kohya").read_bytes())
    dropdown, message = client(app).predict(handle_file(str(upload)), api_name="/upload_lora")
    assert (app.lora_dir / "my_ghost_style.safetensors").read_bytes() == upload.read_bytes()
    assert "my_ghost_style.safetensors" in message
    result = client(app).predict(**inputs(lora="my_ghost_style.safetensors", lora_mode="runtime"), api_name="/edit")
    assert "24 layers matched" in result[RUN_JSON]["prepared_report"]["LoRA my_ghost_style"]
    (lora,) = result[RUN_JSON]["telemetry"]["loras"]  # what the file held, for API clients
    assert (lora["name"], lora["mode"], lora["formats"], lora["layers_matched"], lora["keys_not_applied"]) == \
        ("my_ghost_style", "runtime", ["kohya/musubi-tuner"], 24, 0)


def test_lora_upload_refuses_a_file_that_is_not_safetensors(app, tmp_path):
    fake = tmp_path / "evil.safetensors"
    fake.write_bytes(b"\x80\x04not a safetensors file")
    with pytest.raises(AppError, match="not a safetensors file"):
        client(app).predict(handle_file(str(fake)), api_name="/upload_lora")
    assert not (app.lora_dir / "evil.safetensors").exists()


def test_options_system_and_free_cache(app):
    session = client(app)
    options = session.predict(api_name="/options")
    assert options["options"]["fp8"]["storage"]["available"] is True
    assert "needs a CUDA GPU" in options["options"]["attention"]["sage"]["reason"]
    assert "built-in/tiny_lora_peft.safetensors" in options["loras"]
    session.predict(**inputs(), api_name="/edit")
    system = session.predict(api_name="/system")
    assert system["hardware"]["device"] == "cpu" and system["hardware"]["gpus"] == []
    assert system["libraries"]["gradio"] and system["cached_pipelines"]
    freed = session.predict(api_name="/free_cache")
    assert freed["cached_pipelines"] == [] and isinstance(freed["freed_gib"], float)
    assert session.predict(**inputs(), api_name="/edit")[RUN_JSON]["telemetry"]["cache_hit"] is False


def test_the_api_pages_example_runs_as_written(app, monkeypatch, capsys):
    """docs/api.md's client example, run against the app as a reader would run it from the repository's root (only
    the address is this app's): its progress lines, then the second edit's telemetry and the comparison table."""
    import re
    from pathlib import Path
    repo = Path(__file__).resolve().parents[2]
    example = re.search(r"```python\n(.*?)```", (repo / "docs" / "api.md").read_text(), re.S).group(1)
    assert '"http://127.0.0.1:7860/"' in example
    monkeypatch.chdir(repo)
    exec(compile(example.replace('"http://127.0.0.1:7860/"', repr(app.url)), "docs/api.md", "exec"), {})
    printed = capsys.readouterr().out.splitlines()
    assert any(re.match(r"\d+/40 ", line) for line in printed), printed
    assert any(line.endswith(" True") or line.endswith(" False") for line in printed), printed  # the cache_hit
    assert any(line.startswith("{") and "SSIM" in line for line in printed), printed
