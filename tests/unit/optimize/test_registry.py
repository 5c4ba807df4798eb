"""The toggle registry: one declaration per toggle, read by the configuration, the cache key, the recipe, the CLI,
the options API and the page; and the defects of hand-kept copies, each fixed."""
import argparse
import contextlib

import pytest
import torch

from ghostedit import EditRequest, OptimizationConfig
from ghostedit.cli import build_parser, options_text
from ghostedit.device import Availability
from ghostedit.engine import Engine
from ghostedit.optimize import registry
from ghostedit.optimize.registry import OFF, ON, Choice, Toggle
from ghostedit.ui.settings import variant_configs

SMALL = dict(width=64, height=64, steps=2)


@pytest.fixture
def test_toggle():
    """A toggle that exists only in this test: it scales the DiT's output projection when on (a prepare step),
    records every run it wraps (a run-time context), and says it cannot run at "fast" here."""
    seen = []

    def prepare(context, value):
        if value != OFF:
            with context.stage("test step", "scaling the output projection"):
                context.dit.proj_out.weight = torch.nn.Parameter(context.dit.proj_out.weight * 0.5,
                                                                 requires_grad=False)
            context.report["test-toggle"] = f"halved the output projection ({value})"

    @contextlib.contextmanager
    def around_run(context, value):
        seen.append(value)
        yield

    toggle = Toggle(name="test-toggle", label="Test toggle", help="a toggle defined in a test",
                    choices=(Choice(OFF, "off"), Choice("half", "half the output projection"),
                             Choice("fast", "a choice this machine cannot run")),
                    order=40, prepare=prepare, run_context=around_run,
                    availability=lambda value, device: Availability.no("it is only a test") if value == "fast"
                    else Availability.yes())
    registry.register(toggle)
    yield seen
    registry.unregister("test-toggle")


def test_a_toggle_defined_in_a_test_is_in_the_cli_the_options_api_and_the_page(test_toggle, house):
    parser = build_parser()
    help_text = parser._subparsers._group_actions[0].choices["edit"].format_help()
    assert "--test-toggle {off,half,fast}" in help_text and "a toggle defined in a test" in help_text
    args = parser.parse_args(["edit", "--image", "x.png", "--prompt", "p", "--out", "y.png", "--test-toggle", "half"])
    from ghostedit.arguments import config_from_args
    config = config_from_args(args)
    assert config.value("test-toggle") == "half" and "test-toggle-half" in config.label

    engine = Engine("tiny", device="cpu")
    options = engine.options()["test-toggle"]
    assert options["half"].ok and options["fast"].reason == "it is only a test"
    assert "test-toggle" in options_text("cpu") and "unavailable, it is only a test" in options_text("cpu")

    from ghostedit.ui.layout import build_app
    from ghostedit.ui.handlers import Handlers
    handlers = Handlers(engine, lora_dir=__import__("tempfile").mkdtemp())
    assert handlers.api_options()["options"]["test-toggle"]["fast"] == {"available": False,
                                                                        "reason": "it is only a test"}
    assert "test-toggle" in handlers.api_options()["variants"]
    demo = build_app(engine, __import__("pathlib").Path(__import__("tempfile").mkdtemp()))
    dropdowns = [block for block in demo.blocks.values() if getattr(block, "elem_id", None) == "test_toggle"]
    assert len(dropdowns) == 1 and [value for _, value in dropdowns[0].choices] == ["off", "half", "fast"]
    from ghostedit.ui.settings import unavailable_reasons
    label = dict((v, k) for k, v in dropdowns[0].choices)["fast"]
    assert label.endswith("not on this machine") and unavailable_reasons(engine.options())[label] == "it is only a test"
    api_info = demo.get_api_info()["named_endpoints"]["/edit"]["parameters"]
    assert "test_toggle" in [parameter["parameter_name"] for parameter in api_info]

    plain = engine.run(EditRequest(images=[house], prompt="make it night", **SMALL))
    halved = engine.run(EditRequest(images=[house], prompt="make it night", **SMALL), config)
    assert halved.telemetry.cache_hit is False and "test step" in halved.telemetry.prepare_steps
    assert halved.prepared_report["test-toggle"] == "halved the output projection (half)"
    assert test_toggle == ["off", "half"]
    assert plain.image.tobytes() != halved.image.tobytes()


def test_switching_an_exact_attention_backend_prepares_nothing():
    """Before: the cache key held the attention backend, so each switch prepared (and compiled) again."""
    exact = [OptimizationConfig(attention=name).cache_key for name in ("diffsynth", "sdpa-math", "auto", "fa4")]
    assert len(set(exact)) == 1
    fp8 = [OptimizationConfig(attention=name).cache_key for name in ("cudnn-fp8", "fa3-fp8")]
    assert len(set(fp8)) == 2 and not set(fp8) & set(exact)  # each FP8 attention prepares its own DiT


def test_transformer_engine_leaves_the_fused_text_projection_in_bf16():
    """Before: with fused-qkv, the text stream's fused projection (add_qkv) went to TE and failed (its token count
    is the prompt's length, not a multiple of 16)."""
    from ghostedit.optimize.te import image_stream_targets
    names = ["transformer_blocks.0.attn.to_qkv", "transformer_blocks.0.attn.add_qkv",
             "transformer_blocks.0.attn.to_out.0", "transformer_blocks.0.txt_mlp.net.2"]
    chosen = [name for name, _ in image_stream_targets({name: None for name in names})]
    assert chosen == ["transformer_blocks.0.attn.to_qkv", "transformer_blocks.0.attn.to_out.0"]


def test_a_rewrites_variant_brings_the_compile_its_inductor_setting_needs():
    """Before: "+ rewrites" with inductor-multi-kernel failed ("needs compile on"): the page built variants by its
    own rules."""
    panel = OptimizationConfig(compile="regional", rewrites=("real-rope", "inductor-multi-kernel"))
    runs = dict(variant_configs(["baseline", "rewrites", "compile"], panel)[0])
    assert runs["rewrites"] == OptimizationConfig(compile="regional", rewrites=("real-rope", "inductor-multi-kernel"))
    assert runs["compile"] == OptimizationConfig(compile="regional")


def test_a_compiled_first_step_costs_no_extra_forward_and_auto_attention_is_timed_in_a_stage(house, monkeypatch):
    """Before: the warm-up ran one more DiT forward per new shape (two with CFG), and the "auto" attention timing
    was in no stage."""
    from ghostedit.engine import runner
    calls = []
    forward = runner.forward
    monkeypatch.setattr(runner, "forward", lambda model_fn, inputs: calls.append(1) or forward(model_fn, inputs))
    engine = Engine("tiny", device="cpu")
    result = engine.run(EditRequest(images=[house], prompt="make it night", cfg_scale=4.0, **SMALL),
                        OptimizationConfig(compile="regional", attention="auto"))
    assert len(calls) == 2 * SMALL["steps"]  # two forwards (CFG) per step, not one more
    assert result.telemetry.stages["compile warm-up"] > 0 and result.telemetry.warm_up_steps == [0]
    assert "attention auto" in result.telemetry.prepare_steps
    assert sum(result.telemetry.stages.values()) == pytest.approx(result.telemetry.total_seconds, rel=0.05)


def test_settings_the_registry_does_not_know_are_refused():
    with pytest.raises(ValueError, match="unknown setting 'turbo'"):
        OptimizationConfig(turbo="on")
    with pytest.raises(ValueError, match="fp8 must be one of|FP8 must be one of"):
        OptimizationConfig(fp8="fp4")
    with pytest.raises(ValueError, match="needs compile set to anything but off"):
        OptimizationConfig(rewrites=("inductor-multi-kernel",))
    assert OptimizationConfig(attention="cudnn-fp8").flags("rewrites") == ("joint-layout",)  # implied


def test_presets_name_the_best_configuration_once():
    from ghostedit.optimize.presets import BEST, EXACT
    assert OptimizationConfig.parse("best") == OptimizationConfig.parse(BEST)
    fp8_attention_rewrites = {"fused-qk-norm-rope", "fp8-attention-out"}  # they need the FP8 attention
    best = OptimizationConfig.parse("best")
    assert best.replace(attention="diffsynth", rewrites=tuple(set(best.flags("rewrites")) - fp8_attention_rewrites)) \
        == OptimizationConfig.parse(EXACT)
    assert OptimizationConfig.parse(OptimizationConfig.parse("best").text) == OptimizationConfig.parse("best")


def test_the_best_configuration_for_runtime_loras_drops_only_the_rewrites_that_refuse_them():
    from ghostedit.config import LoraChoice
    best = OptimizationConfig.parse("best")
    runtime_lora = LoraChoice("a.safetensors", "0" * 64, 0.5, "runtime")
    with pytest.raises(ValueError, match="needs fused LoRAs"):
        best.replace(loras=(runtime_lora,))
    for_runtime = best.for_runtime_loras()
    assert set(best.flags("rewrites")) - set(for_runtime.flags("rewrites")) == {"fused-qkv", "fused-gelu-quant",
                                                                                "fp8-attention-out"}
    assert {**best.settings(), "rewrites": ()} == {**for_runtime.settings(), "rewrites": ()}  # nothing else moved
    assert for_runtime.replace(loras=(runtime_lora,)).runtime_loras == (runtime_lora,)


def test_a_toggles_begin_runs_before_the_preparation_steps_and_compile_starts_its_workers_there(monkeypatch):
    """`begin` is work a toggle starts before the first preparation step, to overlap the steps: compile starts
    Inductor's compile workers there on a GPU (their start took seconds of a cold first call), not on a CPU (the
    C++ backend compiles without them) and not with compile off."""
    from types import SimpleNamespace
    events = []
    monkeypatch.setattr("torch._inductor.async_compile.maybe_warm_pool", lambda: events.append("workers started"))
    for device, mode in (("cpu", "regional"), ("cuda", "off"), ("cuda", "regional")):
        registry.get("compile").begin(SimpleNamespace(device=device), mode)
    assert events == ["workers started"]
    events.clear()
    registry.register(Toggle(name="test-begin", label="Test begin", help="records its begin and its step",
                             choices=(Choice(OFF, "off"), Choice(ON, "on")), order=10,
                             begin=lambda context, value: events.append(f"begin {value}"),
                             prepare=lambda context, value: events.append(f"step {value}")))
    try:
        Engine("tiny", device="cpu").prepare(OptimizationConfig.parse("test-begin=on"))
    finally:
        registry.unregister("test-begin")
    assert events == ["begin on", "step on"]
