"""The Hugging Face Space path (ui/gpu.py, ui/space.py) on the CPU with a stand-in `spaces` package
(tests/spaces_standin, which records every call and the GPU seconds it asked for): on "ZeroGPU" the app loads the
weights and compiles the stock DiT's blocks ahead of time at start-up (capture, export, compile, apply to every block
with its own weights), then each edit asks for the seconds its steps, size, CFG and configuration need, runs on the
compiled blocks and gives the image the plain engine gives."""
import json
import math
import os

import numpy as np
import pytest
from PIL import Image

from app_client import RUN_JSON, lossless
from app_server import REPO, running_app
from ghostedit import EditRequest
from ghostedit.ui import gpu
from ghostedit.ui.gpu import GPU_SECONDS_MAX, gpu_seconds

STANDIN = REPO / "tests" / "spaces_standin"
HOUSE = REPO / "assets" / "examples" / "house.png"
MP = 1024 * 1024


def seconds(**arguments):
    return gpu_seconds(arguments, default_area=MP, default_steps=40)


def test_gpu_seconds_follow_steps_size_cfg_and_configuration():
    forward_s, prepare_s = gpu.measured_costs("off", False)   # from the committed H100 run of the page's configs
    stock = seconds(steps=40, width=1024, height=1024, cfg_scale=4.0)
    assert stock == math.ceil((gpu.START_S + prepare_s + gpu.encode_decode_s() + 40 * 2 * forward_s) * gpu.MARGIN)
    assert seconds(steps=40, cfg_scale=4.0) == stock                             # size 0: the model's default area
    assert seconds(steps=8, width=1024, height=1024, cfg_scale=4.0) < stock
    assert seconds(steps=40, width=512, height=512, cfg_scale=4.0) < stock
    assert seconds(steps=40, width=1024, height=1024, cfg_scale=1.0) < stock    # one forward per step
    assert seconds(steps=40, width=1024, height=1024, cfg_scale=4.0, fp8="torchao", compile="regional") < stock
    assert seconds(steps=4, width=1024, height=1024, cfg_scale=4.0, fp8="storage") > seconds(
        steps=4, width=1024, height=1024, cfg_scale=4.0)                      # FP8 storage alone is slower
    with_loras = seconds(steps=40, width=1024, height=1024, cfg_scale=4.0, lora="a.safetensors", lora_mode="fused",
                         lora_2="b.safetensors", lora_2_scale=0.5, lora_3="none")
    assert with_loras > stock and with_loras <= stock + math.ceil(2 * gpu.lora_switch_s() * gpu.MARGIN) + 1
    assert seconds(steps=40, fp8="te") == GPU_SECONDS_MAX                     # never measured: the most
    assert gpu_seconds({"steps": 40}, MP, 40, runs=8) == GPU_SECONDS_MAX


def _log(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.fixture(scope="module")
def zero_gpu_app(tmp_path_factory):
    folder = tmp_path_factory.mktemp("space")
    log = folder / "spaces.jsonl"
    launcher = folder / "app_on_zero_gpu.py"  # app.py as a Space runs it, with the stand-in `spaces` importable
    launcher.write_text(f"import sys\nsys.path[:0] = [{str(STANDIN)!r}, {str(REPO)!r}]\nimport app\n"
                        "if __name__ == '__main__':\n    app.main(sys.argv[1:])\n")
    with running_app(folder, launcher, {"SPACES_ZERO_GPU": "true", "SPACES_STANDIN_LOG": str(log)}) as running:
        yield running, log


def test_zero_gpu_start_up_loads_and_compiles_ahead_of_time(zero_gpu_app):
    running, log = zero_gpu_app
    started = _log(log)  # everything before the first request: start-up
    assert [(e["event"], e.get("function"), e.get("duration")) for e in started] == [
        ("gpu call", "compile_block", 1500), ("aoti_capture", None, None), ("aoti_compile", None, None),
        ("gpu call end", "compile_block", None), ("aoti_apply", None, None), ("aoti_apply", None, None)]
    assert set(started[1]["kwargs"]) >= {"image", "text", "temb", "image_rotary_emb"}
    assert started[2]["inductor_configs"]["max_autotune"] is True
    server_log = running.log.read_text()
    assert "weights of tiny loaded at start-up" in server_log
    assert "2 DiT blocks of the stock configuration compiled ahead of time (AoTInductor)" in server_log


def test_each_edit_asks_for_its_seconds_and_runs_on_the_compiled_blocks(zero_gpu_app, engine):
    from gradio_client import Client, handle_file
    running, log = zero_gpu_app
    client = Client(running.url, verbose=False)
    requests = [dict(steps=3, width=128, height=160, cfg_scale=4.0, seed=9),
                dict(steps=8, width=384, height=384, cfg_scale=4.0, seed=10)]
    before = len(_log(log))
    outputs = []
    for request in requests:
        output = client.predict(image=handle_file(str(HOUSE)), prompt="make it night", api_name="/edit", **request)
        outputs.append((output, lossless(client)[0]))  # the view is a JPEG: the PNG has the engine's pixels
    calls = [event for event in _log(log)[before:] if event["event"] == "gpu call"]
    assert [call["function"] for call in calls] == ["edit", "edit"]
    for call, request in zip(calls, requests):
        assert call["duration"] == gpu_seconds(request, 256 * 256, 4)
    assert calls[0]["duration"] != calls[1]["duration"]
    for (output, after), request in zip(outputs, requests):
        run = output[RUN_JSON]
        telemetry = run["telemetry"]
        assert telemetry["cache_hit"] is True                    # prepared at start-up, outside the GPU window
        assert telemetry["stages_s"].get("load", 0.0) < 0.05     # the weights were there already
        assert "ahead of time" in run["prepared_report"]["compile"]
        alone = engine.run(EditRequest(images=[Image.open(HOUSE)], prompt="make it night", **request))
        assert np.abs(np.asarray(Image.open(after).convert("RGB"), dtype=np.int16)
                      - np.asarray(alone.image, dtype=np.int16)).max() <= 1
    options = client.predict(api_name="/options")["options"]["compile"]
    assert not options["regional"]["available"] and "ZeroGPU" in options["regional"]["reason"]
    assert not os.environ.get("SPACES_ZERO_GPU")  # the test process itself is no Space
