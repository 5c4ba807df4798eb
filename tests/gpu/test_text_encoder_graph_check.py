"""The text encoder's layers replayed from CUDA graphs (`text-encoder=graphed`) give the prompt embedding run from
Python bit for bit, for Qwen-Image-2.1's Qwen3-VL and the Edit models' Qwen2.5-VL: text_encoder_graph_check.py on
the tiny models, three prompts each, captured in a first pass and replayed in a second."""
import json

from gpu_scripts import run_script


def test_the_replayed_text_encoder_gives_the_embedding_run_from_python_bit_for_bit(tmp_path):
    run_script("text_encoder_graph_check.py", "--out", str(tmp_path))
    report = json.loads((tmp_path / "text-encoder-graph-check" / "text-encoder-graph-check.json").read_text())
    assert set(report["models"]) == {"tiny-2.1", "tiny"}
    assert [report["models"][model]["vision_windows_joined"] for model in ("tiny-2.1", "tiny")] == [False, True]
    for model, check in report["models"].items():
        captured, replayed = check["passes"]
        assert captured["bitwise_equal"] == replayed["bitwise_equal"] == [True] * 3, model
        assert ", 0 captured" not in captured["words"], (model, captured["words"])
        replays, calls = replayed["words"].split(" text-encoder")[0].split(" of ")
        assert int(replays) == int(calls) > 0, (model, replayed["words"])   # the second pass all from graphs
