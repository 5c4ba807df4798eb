"""The `ghostedit` command line as a newcomer reads it: help for every option, readable `options` columns, the same
default model as the app; quick answers to --help and options; every refusal one `error:` line before the model
loads; the model recognised said at load; no third-party noise."""
import argparse
import os
import re
import resource
import subprocess
import sys

import pytest

from conftest import ASSETS, REPO
from ghostedit import LoraChoice
from ghostedit.arguments import model_and_device
from ghostedit.cli import build_parser, options_text
from ghostedit.models import default_source
from ghostedit.ui.serve import add_serve_arguments


def subcommands() -> dict[str, argparse.ArgumentParser]:
    return build_parser()._subparsers._group_actions[0].choices


@pytest.mark.parametrize("command", ["edit", "options", "bench", "serve"])
def test_every_option_has_help_text(command):
    undocumented = [action.option_strings for action in subcommands()[command]._actions
                    if action.option_strings and not (action.help or "").strip()]
    assert not undocumented, f"`ghostedit {command} --help` says nothing about {undocumented}"


def test_edit_help_names_what_each_request_option_means():
    text = " ".join(subcommands()["edit"].format_help().split())
    for words in ("--cfg CFG true classifier-free guidance", "--seed SEED noise seed", "--width WIDTH output width",
                  "--height HEIGHT output height", "--out OUT where to write the edited image"):
        assert words in text


def test_options_columns_are_separated():
    """Every line under a setting is "  choice   words: state": never the choice run into its words."""
    lines = [line for line in options_text("cpu").splitlines() if line.startswith("  ")]
    assert lines
    for line in lines:
        assert re.fullmatch(r"  \S+ {2,}\S.*: (available|unavailable, .+)", line), line
    assert "inductor-multi-kernelavailable" not in options_text("cpu")


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_cli_and_app_pick_the_default_model_by_one_rule(device):
    cli_args = subcommands()["edit"].parse_args(["--image", "x.png", "--prompt", "p", "--out", "o.png",
                                                 "--device", device])
    app_parser = argparse.ArgumentParser()
    add_serve_arguments(app_parser)
    app_args = app_parser.parse_args(["--device", device])
    assert model_and_device(cli_args) == model_and_device(app_args) == (default_source(device), device)
    chosen = app_parser.parse_args(["--device", device, "--model", "synthetic"])
    assert model_and_device(chosen) == ("synthetic", device)


def test_runtime_lora_label_shows_its_scale(tmp_path):
    from ghostedit.models.tiny import ensure_tiny_lora
    label = LoraChoice.from_file(ensure_tiny_lora("peft"), 0.8, "runtime").label
    assert label.endswith("runtime ×0.8") and "@" not in label


def test_qwen_image_21_generates_from_the_prompt_alone_and_edits_transparent_references(tmp_path, capsys):
    """`ghostedit edit` on a 2.1 folder (the tiny one, in the released layout) without --image (text-to-image) and
    with two transparent references: the licence line first, a PNG with its alpha channel, the prefix cache's
    tokens in the telemetry JSON."""
    import json

    import numpy as np
    from PIL import Image

    from ghostedit.cli import main
    from ghostedit.models.qwen_image_21.tiny import ensure_tiny_model

    rgba = np.zeros((48, 64, 4), dtype=np.uint8)
    rgba[..., 0], rgba[:, 32:, 3] = 200, 255
    Image.fromarray(rgba, "RGBA").save(tmp_path / "half.png")
    generated, edited = tmp_path / "generated.png", tmp_path / "edited.png"
    assert main(["edit", "--model", str(ensure_tiny_model()), "--device", "cpu", "--prompt", "a lighthouse",
                 "--steps", "2", "--width", "64", "--height", "64", "--out", str(generated)]) == 0
    printed = capsys.readouterr().out
    assert ("licence: Qwen-Image-2.1 is released under the Qwen Research License (non-commercial use only)"
            in printed.splitlines()[:2]), "the licence is said at load, before anything runs"
    assert "CFG 1," in printed, "2.1 runs without guidance by default"
    assert Image.open(generated).mode == "RGBA" and Image.open(generated).size == (64, 64)
    assert main(["edit", "--model", "tiny-2.1", "--device", "cpu", "--prompt", "make it blue", "--steps", "2",
                 "--image", str(tmp_path / "half.png"), "--image", str(tmp_path / "half.png"),
                 "--out", str(edited), "--json", str(tmp_path / "run.json")]) == 0
    assert Image.open(edited).mode == "RGBA"
    tokens = json.loads((tmp_path / "run.json").read_text())["dit_tokens"]
    assert len(tokens) == 2 and tokens[1] < tokens[0]


# ---- issue 43: quick answers, refusals before the model loads, no library noise ----

def run_cli(*argv, cwd=None) -> tuple[subprocess.CompletedProcess, float]:
    """`python -m ghostedit ARGV` in a process of its own, and the CPU seconds it took (the wall clock of a shared
    machine says more about the other jobs than about the command)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run([sys.executable, "-m", "ghostedit", *argv], capture_output=True, text=True, cwd=cwd,
                          timeout=600, env={**os.environ, "PYTHONPATH": str(REPO)})
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return done, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def modules_after(argv: list[str]) -> set[str]:
    """Which heavy libraries `ghostedit ARGV` imported."""
    code = (f"import sys\nfrom ghostedit.cli import main\ntry:\n    main({argv!r})\nexcept SystemExit:\n    pass\n"
            "print('MODULES', *sorted({name.split('.')[0] for name in sys.modules}))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    line = next(line for line in done.stdout.splitlines() if line.startswith("MODULES"))
    return set(line.split()[1:]) & {"torch", "diffsynth", "transformers", "gradio"}


def test_help_answers_at_once_without_torch():
    done, cpu = run_cli("--help")
    assert done.returncode == 0 and "options" in done.stdout and "edit" in done.stdout
    assert cpu < 2, f"ghostedit --help took {cpu:.2f} CPU seconds"
    assert modules_after(["--help"]) == set()


def test_options_answers_in_two_seconds_without_loading_a_model():
    done, cpu = run_cli("options", "--device", "cpu")
    assert done.returncode == 0, done.stderr
    assert "torchao (FP8 compute): unavailable, torchao FP8 compute needs a CUDA GPU" in done.stdout
    assert cpu < 2, f"ghostedit options took {cpu:.2f} CPU seconds"
    assert modules_after(["options", "--device", "cpu"]) == {"torch"}  # no DiffSynth, no model


@pytest.fixture(scope="module")
def refused_inputs(tmp_path_factory):
    folder = tmp_path_factory.mktemp("refused")
    (folder / "notes.txt").write_text("a shopping list, not an image")
    (folder / "broken.safetensors").write_bytes(os.urandom(300))
    (folder / "not-a-model").mkdir()
    return folder


@pytest.mark.parametrize("arguments, reason", [
    (["--fp8", "torchao"], "fp8 torchao is unavailable: torchao FP8 compute needs a CUDA GPU"),
    (["--image", "notes.txt"], "not an image GhostEdit can read"),
    (["--lora", "broken.safetensors"], "broken.safetensors is not a safetensors file"),
    (["--width", "100", "--height", "128"], "width must be a multiple of 16; got 100"),
    (["--model", "not-a-model"], "is not a Qwen-Image model folder: it has no model_index.json"),
    (["--steps", "0"], "steps"),
], ids=["unavailable-option", "not-an-image", "corrupt-lora", "width-100", "folder-without-model-index", "steps-0"])
def test_each_refusal_is_one_error_line_before_the_model_loads(refused_inputs, arguments, reason):
    image = [] if "--image" in arguments else ["--image", str(ASSETS / "house.png")]
    done, _ = run_cli("edit", *image, "--prompt", "make it night", "--out", "out.png", "--device", "cpu",
                      *arguments, cwd=refused_inputs)
    assert done.returncode == 2, done.stdout + done.stderr
    errors = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(errors) == 1 and errors[0].startswith("error: ") and reason in errors[0], done.stderr
    assert "[load]" not in done.stdout and "Traceback" not in done.stderr  # refused before the model loads


def test_an_edit_says_which_model_it_recognised_and_prints_no_download_box(tmp_path):
    from reference_checkpoints import build
    folder = build(tmp_path, "Qwen-Image-Edit-2511")
    done, _ = run_cli("edit", "--model", str(folder), "--image", str(ASSETS / "house.png"), "--prompt",
                      "make it night", "--steps", "2", "--width", "64", "--height", "64", "--out",
                      str(tmp_path / "out.png"), "--device", "cpu")
    assert done.returncode == 0, done.stderr
    first = done.stdout.splitlines()[0]
    assert first.startswith("model: ") and ("recognised as Qwen-Image-Edit-2511 (QwenImageEditPlusPipeline in "
                                            "model_index.json, zero_cond_t true in transformer/config.json)") in first
    assert first in done.stdout.split("[load]")[0]  # said before the load
    printed = done.stdout + done.stderr
    assert "Download from" not in printed and "ModelScope" not in printed and "modelscope" not in printed
    assert "rope" not in printed


def test_the_known_harmless_rope_warnings_are_silenced_and_only_they():
    """transformers 5 warns twice about the released text encoder's `rope_scaling`; quiet.py silences exactly
    those words (checked against what transformers prints without it)."""
    code = ("import sys\n{quiet}from transformers import Qwen2_5_VLConfig\n"
            "rope = {{'mrope_section': [16, 24, 24], 'rope_type': 'default', 'type': 'default'}}\n"
            "Qwen2_5_VLConfig(rope_scaling=rope, vision_config={{}}, text_config={{'rope_scaling': rope}})\n")
    for quiet, expected in (("", True), ("from ghostedit.quiet import quiet_library_warnings\n"
                                         "quiet_library_warnings()\n", False)):
        done = subprocess.run([sys.executable, "-c", code.format(quiet=quiet)], capture_output=True, text=True,
                              timeout=300, env={**os.environ, "PYTHONPATH": str(REPO)})
        assert done.returncode == 0, done.stderr
        warned = ("`rope_scaling` is deprecated" in done.stderr,
                  "Unrecognized keys in `rope_parameters`" in done.stderr)
        assert warned == (expected, expected), done.stderr


def test_size_help_follows_the_image_each_model_takes_its_size_from():
    from ghostedit.models.family import QWEN_IMAGE_EDIT, QWEN_IMAGE_EDIT_2509, QWEN_IMAGE_EDIT_2511
    assert QWEN_IMAGE_EDIT.condition.size_from == "first"
    assert QWEN_IMAGE_EDIT_2509.condition.size_from == QWEN_IMAGE_EDIT_2511.condition.size_from == "last"
    text = " ".join(subcommands()["edit"].format_help().split())
    assert ("the first image's for Qwen-Image-Edit and for a masked edit, the last one's for 2509, 2511 and 2.1"
            in text)
