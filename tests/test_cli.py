"""The `ghostedit` command line as a newcomer reads it: help for every option, readable `options` columns, and the
same default model as the app."""
import argparse
import re

import pytest

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


def test_options_columns_are_separated(engine):
    """Every line under a setting is "  choice   state": never the choice run into its state."""
    lines = [line for line in options_text(engine).splitlines() if line.startswith("  ")]
    assert lines
    for line in lines:
        assert re.fullmatch(r"  \S+ {2,}\S.*", line), line
    assert "inductor-multi-kernelavailable" not in options_text(engine)


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
    assert printed.splitlines()[0] == ("licence: Qwen-Image-2.1 is released under the Qwen Research License "
                                       "(non-commercial use only)")
    assert "CFG 1," in printed, "2.1 runs without guidance by default"
    assert Image.open(generated).mode == "RGBA" and Image.open(generated).size == (64, 64)
    assert main(["edit", "--model", "tiny-2.1", "--device", "cpu", "--prompt", "make it blue", "--steps", "2",
                 "--image", str(tmp_path / "half.png"), "--image", str(tmp_path / "half.png"),
                 "--out", str(edited), "--json", str(tmp_path / "run.json")]) == 0
    assert Image.open(edited).mode == "RGBA"
    tokens = json.loads((tmp_path / "run.json").read_text())["dit_tokens"]
    assert len(tokens) == 2 and tokens[1] < tokens[0]
