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
