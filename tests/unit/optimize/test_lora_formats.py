"""Every LoRA format people share loads as its reference reads it (tests/lora_reference.py): fused weights equal
diffusers' load_lora_weights + fuse_lora for the formats diffusers reads, ComfyUI's conventions for `.lora.down` and
`.diff`, PEFT's merge for LoKr and LoHa. Stacked LoRAs (fused, runtime, mixed) add up; keys not applied are reported
with the reason; a runtime LoRA's scale is set with no new preparation, and the DiT bench runs it at that scale."""
import argparse

import pytest
import torch

import lora_reference as ref
from stand_ins import PlainMemory
from ghostedit import EditRequest, LoraChoice, OptimizationConfig
from ghostedit.arguments import add_toggle_arguments, loras_from_args
from ghostedit.bench import dit as bench_dit
from ghostedit.engine import Engine
from ghostedit.lora_files import LoraError, read_lora_file
from ghostedit.optimize.lora import match_lora
from ghostedit.telemetry import RunRecorder

SCALE = 0.7
TOLERANCE = 1e-6


@pytest.fixture(scope="module")
def engine():
    return Engine("tiny", device="cpu", dtype="float32")


@pytest.fixture(scope="module")
def reference(engine, tmp_path_factory):
    """The diffusers transformer on the tiny weights, the LoRA factors for every linear, and one file per format."""
    folder = tmp_path_factory.mktemp("lora-formats")
    base_dit = engine.load().dit
    model = ref.diffusers_transformer(base_dit)
    factors = ref.random_factors(ref.linear_shapes(model))
    biases = {name: torch.randn(module.bias.shape, generator=torch.Generator().manual_seed(3)) * 0.1
              for name, module in model.named_modules() if isinstance(module, torch.nn.Linear)
              and module.bias is not None and name.startswith("transformer_blocks.1.")}
    files = {name: writer(factors, folder / f"{name}.safetensors")
             for name, writer in ref.WRITERS_READ_BY_DIFFUSERS.items()}
    files["lora-dot-down"] = ref.write_lora_dot_down(factors, folder / "lora-dot-down.safetensors")
    files["diff"] = ref.write_diff(factors, folder / "diff.safetensors", biases)
    other = ref.random_factors(ref.linear_shapes(model), seed=11)
    files["kohya-2"] = ref.write_kohya(other, folder / "kohya-2.safetensors")
    base = {name: value.float().clone() for name, value in base_dit.state_dict().items()}
    return dict(model=model, factors=factors, biases=biases, files=files, base=base, folder=folder)


def fused_weights(engine, *loras: LoraChoice) -> dict[str, torch.Tensor]:
    """The prepared DiT's parameters with these LoRAs written in (PEFT wrappers' names unwrapped)."""
    prepared, _ = engine.prepare(OptimizationConfig(loras=loras))
    return {name.replace(".base_layer", ""): value.detach().float().clone()
            for name, value in prepared.dit.state_dict().items() if "lora_" not in name}


def assert_same_weights(got: dict, want: dict, base: dict, changed_at_least: int):
    assert set(got) == set(want)
    worst = max((got[name] - want[name]).abs().max().item() for name in want)
    assert worst <= TOLERANCE, worst
    changed = [name for name in want if not torch.equal(want[name], base[name])]
    assert len(changed) >= changed_at_least  # the reference did apply the file


@pytest.mark.parametrize("style", list(ref.WRITERS_READ_BY_DIFFUSERS))
def test_formats_diffusers_reads_fuse_as_diffusers_fuses(engine, reference, style):
    path = reference["files"][style]
    want = ref.diffusers_fused(reference["model"], [(path, SCALE)])
    got = fused_weights(engine, LoraChoice.from_file(path, SCALE))
    assert_same_weights(got, want, reference["base"], changed_at_least=len(reference["factors"]))


def test_lora_dot_down_and_diff_files_fuse_as_comfyui_applies_them(engine, reference):
    base, factors = reference["base"], reference["factors"]
    got = fused_weights(engine, LoraChoice.from_file(reference["files"]["lora-dot-down"], SCALE))
    assert_same_weights(got, ref.comfy_low_rank(base, factors, SCALE), base, len(factors))
    got = fused_weights(engine, LoraChoice.from_file(reference["files"]["diff"], -SCALE))
    want = ref.comfy_diff(base, factors, reference["biases"], -SCALE)
    assert_same_weights(got, want, base, len(factors) + len(reference["biases"]))
    back = fused_weights(engine)  # the biases come back too
    assert all(torch.equal(back[name], base[name]) for name in base)


@pytest.mark.parametrize("kind", ["lokr", "loha"])
def test_lokr_and_loha_fuse_as_peft_merges_them(engine, reference, kind):
    """PEFT's own LoKr/LoHa layers on a copy of the DiT, random factors, merged: the file written from the same
    factors (LyCORIS keys, kohya names, alpha) fuses to the same weights."""
    import copy

    from peft import LoHaConfig, LoKrConfig, inject_adapter_in_model
    targets = ["transformer_blocks.0.attn.to_q", "transformer_blocks.1.img_mlp.net.0.proj",
               "transformer_blocks.1.txt_mlp.net.2"]
    alpha, rank = 3.0, 4
    config = (LoKrConfig(r=rank, alpha=alpha, target_modules=targets, decompose_factor=ref.LOKR_FACTOR)
              if kind == "lokr" else LoHaConfig(r=rank, alpha=alpha, target_modules=targets))
    model = inject_adapter_in_model(config, copy.deepcopy(engine.load().dit).float())
    generator, tensors = torch.Generator().manual_seed(5), {}
    for name in targets:
        layer = model.get_submodule(name)
        for part, parameters in layer.named_parameters():
            if part.startswith(("lokr_", "hada_")):
                with torch.no_grad():
                    parameters.copy_(torch.randn(parameters.shape, generator=generator) * 0.3)
                tensors[f"lora_unet_{name.replace('.', '_')}.{part.split('.')[0]}"] = parameters.detach().clone()
        tensors[f"lora_unet_{name.replace('.', '_')}.alpha"] = torch.tensor(alpha)
        layer.merge()
    from safetensors.torch import save_file
    path = reference["folder"] / f"{kind}.safetensors"
    save_file(tensors, path)
    got = fused_weights(engine, LoraChoice.from_file(path, 1.0))
    want = {name.replace(".base_layer", ""): value.float() for name, value in model.state_dict().items()
            if not any(part in name for part in ("lokr_", "hada_"))}
    assert_same_weights(got, want, reference["base"], changed_at_least=len(targets))


@pytest.mark.parametrize("style, words", [
    ("diffusers", "diffusers/PEFT"), ("ai-toolkit", "AI Toolkit"), ("kohya", "kohya/musubi-tuner"),
    ("diffsynth", "DiffSynth"), ("lightning", "Lightning (.lora_down/.lora_up, .alpha)"),
    ("lora-dot-down", ".lora.down/.lora.up"), ("diff", "full-weight delta (.diff/.diff_b)")])
def test_each_format_is_named_in_the_report(engine, reference, style, words):
    found = match_lora(engine.load().dit, read_lora_file(reference["files"][style]))
    assert found.formats == (words,) and not found.not_applied
    assert found.report.startswith(f"{words}: {len(reference['factors'])} layers matched")


def test_safetensors_metadata_is_kept_on_load(reference):
    loaded = read_lora_file(reference["files"]["diffusers"])
    assert '"transformer.lora_alpha": 8' in loaded.metadata["lora_adapter_metadata"]
    assert loaded.metadata["format"] == "pt"


def test_stacked_fused_loras_are_the_sum_of_the_reference_deltas(engine, reference):
    base, files = reference["base"], reference["files"]
    stack = [(files["diffusers"], 0.7), (files["kohya-2"], -0.4), (files["lightning"], 0.3)]
    want = dict(base)
    for path, scale in stack:
        alone = ref.diffusers_fused(reference["model"], [(path, scale)])
        want = {name: want[name] + (alone[name] - base[name]) for name in base}
    got = fused_weights(engine, *(LoraChoice.from_file(path, scale) for path, scale in stack))
    assert_same_weights(got, want, base, len(reference["factors"]))


def dit_output(engine, config: OptimizationConfig, inputs: dict) -> tuple[torch.Tensor, bool]:
    """One DiT forward through the DiT bench's own path (bench/dit.py), and whether it was a cache hit."""
    row, output, _ = bench_dit.bench_configuration(engine, config, inputs, 1, None, None)
    return output.float(), row["prepare_s"] == 0.0


def test_runtime_and_mixed_stacks_match_fused_and_a_runtime_scale_change_prepares_nothing(engine, reference):
    """Also the DiT bench's review find: a runtime LoRA is timed at its real scale, not at 0."""
    files = reference["files"]
    inputs = bench_dit.dit_inputs(engine.load().dit, 64, 64, 8, "cpu", torch.float32)
    a_fused, b_fused = LoraChoice.from_file(files["diffusers"], 0.7), LoraChoice.from_file(files["kohya-2"], -0.4)
    a_runtime = LoraChoice.from_file(files["diffusers"], 0.7, "runtime")
    b_runtime = LoraChoice.from_file(files["kohya-2"], -0.4, "runtime")
    plain, _ = dit_output(engine, OptimizationConfig(), inputs)
    fused, _ = dit_output(engine, OptimizationConfig(loras=(a_fused, b_fused)), inputs)
    mixed, _ = dit_output(engine, OptimizationConfig(loras=(a_fused, b_runtime)), inputs)
    runtime, _ = dit_output(engine, OptimizationConfig(loras=(a_runtime, b_runtime)), inputs)
    assert bench_dit.relative_error(fused, plain) > 0.01  # the LoRAs count
    assert bench_dit.relative_error(mixed, fused) < 1e-5
    assert bench_dit.relative_error(runtime, fused) < 1e-5

    rescaled = (LoraChoice.from_file(files["diffusers"], 1.3, "runtime"), b_runtime)
    recorder = RunRecorder("cpu")
    _, hit = engine.prepare(OptimizationConfig(loras=rescaled), recorder)
    assert hit and not recorder.telemetry.prepare_steps  # nothing prepared again
    runtime_rescaled, hit = dit_output(engine, OptimizationConfig(loras=rescaled), inputs)
    fused_rescaled, _ = dit_output(engine, OptimizationConfig(loras=(LoraChoice.from_file(files["diffusers"], 1.3),
                                                                     b_fused)), inputs)
    assert hit and bench_dit.relative_error(runtime_rescaled, fused_rescaled) < 1e-5


def test_runtime_mode_refuses_updates_that_are_not_low_rank_with_the_reason(engine, reference):
    diff = LoraChoice.from_file(reference["files"]["diff"], 1.0, "runtime")
    with pytest.raises(LoraError, match="cannot run in runtime mode: it holds bias deltas.*full updates.*fused mode"):
        engine.prepare(OptimizationConfig(loras=(diff,)))


def test_keys_not_applied_are_reported_with_the_reason_in_telemetry_and_the_run_summary(engine, reference, house):
    from safetensors.torch import save_file

    from ghostedit.ui.live import run_summary
    tensors = dict(read_lora_file(reference["files"]["kohya"]).tensors)
    tensors["lora_te_text_model_encoder_layers_0_self_attn_q_proj.lora_down.weight"] = torch.zeros(4, 64)
    tensors["lora_te_text_model_encoder_layers_0_self_attn_q_proj.lora_up.weight"] = torch.zeros(64, 4)
    tensors["transformer_blocks.0.attn.norm_q.diff"] = torch.zeros(32)       # a norm, not a linear layer
    tensors["transformer_blocks.9.attn.to_q.lora_A.weight"] = torch.zeros(4, 64)  # no such block
    tensors["transformer_blocks.0.attn.to_q.lora_B.weight"] = torch.zeros(64, 4)  # to_q again, in another style
    tensors["emb_params"] = torch.zeros(3)                                     # a textual-inversion leftover
    path = reference["folder"] / "with-extras.safetensors"
    save_file(tensors, path)
    result = engine.run(EditRequest(images=[house], prompt="ghost", width=64, height=64, steps=2),
                        OptimizationConfig(loras=(LoraChoice.from_file(path, 0.5),)))
    (lora,) = result.telemetry.summary()["loras"]
    assert lora["formats"] == ["PEFT (no prefix)", "full-weight delta (.diff/.diff_b)", "kohya/musubi-tuner"]
    assert lora["layers_matched"] == len(reference["factors"]) and lora["keys_not_applied"] == 6
    reasons = lora["not_applied"]
    assert "text-encoder key" in reasons["lora_te_text_model_encoder_layers_0_self_attn_q_proj.lora_down.weight"]
    assert "is a RMSNorm, not a linear layer" in reasons["transformer_blocks.0.attn.norm_q.diff"]
    assert "matched no linear layer" in reasons["transformer_blocks.9.attn.to_q.lora_A.weight"]
    assert "changed by other keys of this file already" in reasons["transformer_blocks.0.attn.to_q.lora_B.weight"]
    assert "not a LoRA key" in reasons["emb_params"]
    assert "6 keys not applied" in run_summary(result) and "with-extras" in run_summary(result)
    alone = match_lora(engine.load().dit, {"transformer_blocks.0.attn.to_k.lora_B.weight": torch.zeros(64, 4),
                                            "transformer_blocks.0.attn.to_q.lora_A.weight": torch.zeros(4, 64),
                                            "transformer_blocks.0.attn.to_q.lora_B.weight": torch.zeros(64, 4)})
    assert list(alone.layers) == ["transformer_blocks.0.attn.to_q"]
    assert "up (B) without its pair" in alone.not_applied["transformer_blocks.0.attn.to_k.lora_B.weight"]


def test_the_cli_stacks_loras_with_default_scale_and_mode(reference):
    parser = argparse.ArgumentParser()
    add_toggle_arguments(parser)
    files = reference["files"]
    args = parser.parse_args(["--lora", f"{files['kohya']}:0.5", "--lora", str(files["diffusers"]),
                              "--lora", f"{files['lightning']}:-1:fused", "--lora-scale", "0.8",
                              "--lora-mode", "runtime"])
    loras = loras_from_args(args)
    assert [(lora.name, lora.scale, lora.mode) for lora in loras] == [
        ("kohya", 0.5, "runtime"), ("diffusers", 0.8, "runtime"), ("lightning", -1.0, "fused")]


def test_the_panel_and_api_stack_three_loras(reference, tmp_path):
    from ghostedit.ui.settings import LORA_SLOTS, LoraLibrary, lora_parameter, panel_config
    library = LoraLibrary(tmp_path)
    names = [library.add(reference["files"][style], f"{style}.safetensors")
             for style in ("kohya", "diffsynth", "diff")]
    values = {}
    for slot, (name, mode, scale) in enumerate(zip(names, ("fused", "runtime", "fused"), (0.5, 1.2, -0.3)), 1):
        values.update({lora_parameter(slot): name, lora_parameter(slot, "mode"): mode,
                       lora_parameter(slot, "scale"): scale})
    config = panel_config(library, values)
    assert LORA_SLOTS == 3
    assert [(lora.name, lora.mode, lora.scale) for lora in config.loras] == [
        ("kohya", "fused", 0.5), ("diffsynth", "runtime", 1.2), ("diff", "fused", -0.3)]


def test_full_weight_and_bias_deltas_switch_into_a_compiled_dit_without_recompiling(engine, reference, house):
    """A .diff_b changes biases: written into the compiled DiT like weights, with no recompile, and giving what an
    uncompiled DiT with the same file gives."""
    import numpy as np
    from torch._dynamo.utils import counters
    request = EditRequest(images=[house], prompt="ghost", width=64, height=64, steps=2)
    diff = LoraChoice.from_file(reference["files"]["diff"], 0.5)
    compiled = OptimizationConfig(compile="regional")
    stock = engine.run(request, compiled)
    frames = counters["frames"]["ok"]
    runs = [engine.run(request, compiled.replace(loras=loras)) for loras in ((diff,), ())]
    assert counters["frames"]["ok"] == frames
    eager = engine.run(request, OptimizationConfig(loras=(diff,)))
    pixels = [np.asarray(result.image, dtype=np.int16) for result in (stock, *runs, eager)]
    assert np.abs(pixels[1] - pixels[3]).max() <= 1 and np.abs(pixels[1] - pixels[0]).mean() > 0.5
    assert np.array_equal(pixels[2], pixels[0])  # back to the base weights and biases exactly


@pytest.mark.parametrize("base_memory", ["as loaded", "parts end to end"])
def test_a_dit_with_fused_qkv_holds_the_reference_weights_in_its_joined_projections(engine, reference, base_memory):
    """fused-qkv joins each stream's q, k and v projections into one; a fused LoRA's q, k and v layers are written
    into its rows (before: the switch looked the q layer up and failed). Each joined weight and bias is the
    reference's three, one under another (ComfyUI's `diff` convention, biases included), and switching back to no
    LoRA restores the base's. A base laid out as on a GPU machine (pinned, each q, k and v end to end) is joined
    without a copy, and a LoRA written into the joined projection leaves the base as it was."""
    from ghostedit.models.qwen_image.dit import FUSED_PROJECTIONS
    from ghostedit.pinned import PinnedArena, pin_module
    if base_memory == "parts end to end":
        engine = Engine("tiny", device="cpu", dtype="float32")
        pin_module(engine.load().dit, PinnedArena(PlainMemory()), engine.load().dit.joinable_parts())
    base_dit = engine.load().dit
    base, factors, files = reference["base"], reference["factors"], reference["files"]
    config = OptimizationConfig.parse("rewrites=joint-layout+fused-qkv")
    with_lora = ref.comfy_diff(base, factors, reference["biases"], -SCALE)
    for loras, want in (((), base), ((LoraChoice.from_file(files["diff"], -SCALE),), with_lora), ((), base)):
        prepared, _ = engine.prepare(config.replace(loras=loras))
        got = {name: value.detach().float() for name, value in prepared.dit.state_dict().items()}
        for block in range(len(prepared.dit.transformer_blocks)):
            for fused, parts in FUSED_PROJECTIONS.items():
                for kind in ("weight", "bias"):
                    prefix = f"transformer_blocks.{block}.attn"
                    joined = torch.cat([want[f"{prefix}.{part}.{kind}"] for part in parts])
                    assert (got[f"{prefix}.{fused}.{kind}"] - joined).abs().max() <= TOLERANCE, (block, fused, kind)
        if not loras and not prepared.loras:  # freshly prepared: joined as views of the base's parts or copied
            joined_in_place = prepared.dit.transformer_blocks[0].attn.to_qkv.weight.data_ptr() == \
                base_dit.transformer_blocks[0].attn.to_q.weight.data_ptr()
            assert joined_in_place == (base_memory == "parts end to end")
    biases = [f"transformer_blocks.1.attn.{part}.bias" for part in FUSED_PROJECTIONS["to_qkv"]]
    assert any(not torch.equal(with_lora[name], base[name]) for name in biases)  # the reference changed a joined bias
    assert all(torch.equal(value.float(), base[name]) for name, value in base_dit.state_dict().items())
