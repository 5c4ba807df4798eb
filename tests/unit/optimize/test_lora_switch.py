"""Fused LoRAs are written into a prepared pipeline in place: switching needs no new preparation and no recompile,
and gives what a fresh preparation with that LoRA gives."""
import numpy as np
from torch._dynamo.utils import counters

from ghostedit import EditRequest, LoraChoice, OptimizationConfig
from ghostedit.engine import Engine
from ghostedit.models.tiny import ensure_tiny_lora

SMALL = dict(width=64, height=64, steps=2)


def pixels(result):
    return np.asarray(result.image, dtype=np.int16)


def test_switching_fused_loras_in_place_matches_fresh_preparation_and_never_recompiles(house):
    request = EditRequest(images=[house], prompt="make it a ghost", **SMALL)
    a = LoraChoice.from_file(ensure_tiny_lora("peft"), 0.8)
    b = LoraChoice.from_file(ensure_tiny_lora("kohya"), -0.6)
    config = OptimizationConfig(compile="regional", rewrites=("real-rope",))
    engine = Engine("tiny", device="cpu")
    stock = engine.run(request, config)
    frames = counters["frames"]["ok"]
    runs = {name: engine.run(request, config.replace(loras=loras))
            for name, loras in (("a", (a,)), ("b", (b,)), ("a+b", (a, b)), ("none", ()), ("a again", (a,)))}
    assert counters["frames"]["ok"] == frames  # nothing compiled again
    assert all(run.telemetry.cache_hit for run in runs.values())
    assert all("compile warm-up" not in run.telemetry.stages for run in runs.values())
    assert runs["a"].telemetry.stages["LoRA switch"] > 0
    assert np.array_equal(pixels(runs["none"]), pixels(stock))  # back to the base weights exactly
    assert np.array_equal(pixels(runs["a again"]), pixels(runs["a"]))
    fresh = Engine("tiny", device="cpu")
    for name, loras in (("a", (a,)), ("a+b", (a, b))):
        from_scratch = fresh.run(request, config.replace(loras=loras))
        assert np.abs(pixels(from_scratch) - pixels(runs[name])).max() <= 1, name
    assert np.abs(pixels(runs["a+b"]) - pixels(runs["a"])).mean() > 0.5  # the second LoRA counts


def test_fused_and_runtime_loras_stack(house):
    request = EditRequest(images=[house], prompt="make it a ghost", **SMALL)
    a = LoraChoice.from_file(ensure_tiny_lora("peft"), 0.7)
    b_runtime = LoraChoice.from_file(ensure_tiny_lora("kohya"), 0.5, "runtime")
    b_fused = LoraChoice.from_file(ensure_tiny_lora("kohya"), 0.5)
    engine = Engine("tiny", device="cpu", dtype="float32")
    mixed = engine.run(request, OptimizationConfig(loras=(a, b_runtime)))
    fused = engine.run(request, OptimizationConfig(loras=(a, b_fused)))
    assert np.abs(pixels(mixed) - pixels(fused)).max() <= 1
    assert "LoRA tiny_lora_peft (fused)" in mixed.prepared_report and "LoRA tiny_lora_kohya" in mixed.prepared_report


def test_a_lora_switched_into_fp8_weights_is_quantized_as_a_fresh_fp8_layer():
    """The LoRA is fused in float32 into the base weight, then quantized exactly as preparation quantizes, and
    written into the FP8 tensors the prepared DiT holds; back to none restores the quantized base bit for bit."""
    import torch
    from torchao.quantization import quantize_

    from ghostedit.models.tiny import tiny_lora_deltas
    from ghostedit.telemetry import RunRecorder
    engine = Engine("tiny", device="cpu")
    base = engine.load().dit
    config = OptimizationConfig(fp8="storage")
    prepared, _ = engine.prepare(config)
    name = "transformer_blocks.1.img_mlp.net.0.proj"
    layer = prepared.dit.get_submodule(name)
    held = [tensor.data_ptr() for tensor in (layer.weight.qdata, layer.weight.scale)]
    quantized_base = layer.weight.qdata.clone()

    a = LoraChoice.from_file(ensure_tiny_lora("peft"), 0.8)
    engine.prepare(config.replace(loras=(a,)), RunRecorder("cpu"))
    down, up = tiny_lora_deltas()[name]
    expected = torch.nn.Linear(down.shape[1], up.shape[0], bias=False, dtype=torch.bfloat16)
    with torch.no_grad():
        expected.weight.copy_(base.get_submodule(name).weight.float()
                              + 0.8 * up.bfloat16().float() @ down.bfloat16().float())
    quantize_(expected, layer.ghostedit_fp8_config)
    assert torch.equal(layer.weight.qdata.view(torch.uint8), expected.weight.qdata.view(torch.uint8))
    assert torch.equal(layer.weight.scale, expected.weight.scale)
    assert [tensor.data_ptr() for tensor in (layer.weight.qdata, layer.weight.scale)] == held  # the same tensors
    engine.prepare(config)
    assert torch.equal(layer.weight.qdata.view(torch.uint8), quantized_base.view(torch.uint8))


def test_a_lora_switched_into_fused_qkv_fp8_weights_is_quantized_as_the_joined_fresh_layer():
    """With fused-qkv, a LoRA's q, k and v deltas are merged into their parts in float32, joined, and quantized as
    preparation quantizes the joined projection (rowwise scales: each row as its part would be); back to none
    restores the quantized joined base bit for bit, in the same tensors."""
    import torch
    from torchao.quantization import quantize_

    from ghostedit.models.tiny import tiny_lora_deltas
    from ghostedit.models.qwen_image.dit import FUSED_PROJECTIONS
    engine = Engine("tiny", device="cpu")
    base = engine.load().dit
    config = OptimizationConfig.parse("fp8=storage,rewrites=joint-layout+fused-qkv")
    prepared, _ = engine.prepare(config)
    attention = "transformer_blocks.1.attn"
    layer = prepared.dit.get_submodule(f"{attention}.to_qkv")
    held = [tensor.data_ptr() for tensor in (layer.weight.qdata, layer.weight.scale)]
    quantized_base = layer.weight.qdata.clone()

    engine.prepare(config.replace(loras=(LoraChoice.from_file(ensure_tiny_lora("peft"), 0.8),)))
    deltas = tiny_lora_deltas()
    parts = [f"{attention}.{part}" for part in FUSED_PROJECTIONS["to_qkv"]]
    merged = [base.get_submodule(part).weight.float() + 0.8 * deltas[part][1].bfloat16().float()
              @ deltas[part][0].bfloat16().float() for part in parts]
    expected = torch.nn.Linear(merged[0].shape[1], sum(w.shape[0] for w in merged), bias=False, dtype=torch.bfloat16)
    with torch.no_grad():
        expected.weight.copy_(torch.cat(merged))
    quantize_(expected, layer.ghostedit_fp8_config)
    assert torch.equal(layer.weight.qdata.view(torch.uint8), expected.weight.qdata.view(torch.uint8))
    assert torch.equal(layer.weight.scale, expected.weight.scale)
    assert [tensor.data_ptr() for tensor in (layer.weight.qdata, layer.weight.scale)] == held
    engine.prepare(config)
    assert torch.equal(layer.weight.qdata.view(torch.uint8), quantized_base.view(torch.uint8))
