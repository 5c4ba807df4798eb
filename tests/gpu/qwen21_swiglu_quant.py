"""Qwen-Image-2.1's fused SwiGLU quantization (`fused-swiglu-quant`) against the path without it, on the GPU, in two
parts:

kernel  the kernel (kernels/swiglu_quant.py) on random gate and up rows of the released model's width (12288), as
        many as a 1024x1024 edit with one reference computes at the step that fills the prefix cache, with a row of
        zeros and a row whose gate spans -100 to 100 (the SiLU's tails, exp(-x) overflowing) among them, against
        what runs without it: eager silu(gate) * up quantized as torchao's FP8 linear quantizes its input (the down
        projection's own act_quant_kwargs): the scales and the FP8 values' bytes compared, and the down projection
        (seams.fp8_linear on the kernel's output against the torchao layer on eager's product);
dit     the full-size synthetic 2.1 DiT (dit_only) with torchao's FP8 GEMMs, without and with fused-swiglu-quant,
        three denoising steps with the prefix cache on (the first fills it, the others read it), eager: each step's
        prediction with the rewrite against the one without, the first block's feed-forward output at the first step
        (the same input either way) against the one without, and the kernel's calls at each step.

On the GPU machine (after `source scripts/gpu/setup.sh`):  python3 tests/gpu/qwen21_swiglu_quant.py [--out DIR]
Writes qwen21-swiglu-quant.json.
"""
from __future__ import annotations

import json

import torch
import torch.nn.functional as F
from torchao.quantization.quantize_.common.quantize_tensor_kwargs import _choose_quant_func_and_quantize_tensor

from ghostedit.bench.dit import relative_error
from ghostedit.config import OptimizationConfig
from ghostedit.engine import Engine
from ghostedit.engine.runner import dit_run
from ghostedit.kernels.fp8 import FP8_MAX, SMALLEST_AMAX
from ghostedit.kernels.swiglu_quant import swiglu_rowwise_fp8
from ghostedit.models.qwen_image_21 import dit as dit_21
from ghostedit.models.seams import DitOptions, PrefixKVCache, fp8_linear
from ghostedit.optimize.fp8 import apply_fp8
from ghostedit.telemetry import RunRecorder
from gpu_scripts import dit_21_inputs, output_folder

FP8_GEMMS = "fp8=torchao,rewrites=real-rope+fused-qkv"
CONFIGS = {"without": FP8_GEMMS, "with": f"{FP8_GEMMS}+fused-swiglu-quant"}
SIDE_TOKENS = 64                        # 1024 px / 16: a 64 x 64 latent grid, the reference's and the target's
TEXT_BEFORE, TEXT_AFTER = 24, 40        # prompt tokens before and after the reference's slots
TIMESTEPS = (0.9, 0.5, 0.2)
DIM, HIDDEN = 4096, 12288               # the released DiT's width and its feed-forward's


def kernel_check() -> dict:
    """The kernel's output against eager silu(gate) * up quantized by torchao, and the down projection of each."""
    generator = torch.Generator("cuda").manual_seed(0)
    rows = TEXT_BEFORE + TEXT_AFTER + 2 * SIDE_TOKENS * SIDE_TOKENS
    gate = (torch.randn(rows, HIDDEN, generator=generator, device="cuda") * 3).bfloat16()
    up = torch.randn(rows, HIDDEN, generator=generator, device="cuda").bfloat16()
    gate[0], up[0] = 0, 0   # the kernel's tiny scale; torchao's is 0, its values NaN: compared apart
    gate[1] = torch.linspace(-100, 100, HIDDEN, device="cuda")
    down = torch.nn.Sequential(torch.nn.Linear(HIDDEN, DIM, bias=False, device="cuda", dtype=torch.bfloat16))
    apply_fp8(down, "torchao", "cuda")
    layer = down[0]
    with torch.no_grad():
        swiglu = F.silu(gate) * up
        expected = _choose_quant_func_and_quantize_tensor(swiglu, layer.weight.act_quant_kwargs)
        values, scales = swiglu_rowwise_fp8(gate, up)
        # from row 16, where the forward's own tensors would start: on the slice from row 1 (its scales 4 bytes past
        # their allocation) cuBLASLt refused the FP8 GEMM on an H200 (CUBLAS_STATUS_NOT_SUPPORTED)
        ours, theirs = fp8_linear(layer, values[16:], scales[16:]), layer(swiglu[16:])
    codes, expected_codes = values[1:].view(torch.uint8).int(), expected.qdata[1:].view(torch.uint8).int()
    differ = codes != expected_codes
    return {"rows": rows, "values": differ.numel(),
            "scales_equal": bool(torch.equal(scales[1:], expected.scale[1:])),
            "scales_differing": int((scales[1:] != expected.scale[1:]).sum()),
            "values_differing": int(differ.sum()),
            # adjacent codes of one sign: one FP8 step apart
            "differing_values_adjacent": bool(((codes - expected_codes).abs()[differ] == 1).all()),
            "zero_row": {"values_zero": bool((values[0].float() == 0).all()), "scale": scales[0].item(),
                         "floor": SMALLEST_AMAX / FP8_MAX},
            "down_projection_equal": bool(torch.equal(ours, theirs)),
            "down_projection_error": relative_error(ours.float(), theirs.float())}


def steps(engine, text: str, given: dict) -> dict:
    """Each step's prediction of the configuration `text` (prefix cache on), the first block's feed-forward output at
    the first step, the kernel's calls at each step and what the run said."""
    config = OptimizationConfig.parse(text)
    prepared, _ = engine.prepare(config)
    dit = prepared.dit
    calls, feed_forward, predictions = [], [], []
    kernel, forward = dit_21.swiglu_rowwise_fp8, dit_21.FeedForward.forward

    def counted(*arguments):
        calls[-1] += 1
        return kernel(*arguments)

    def recorded(self, x, options=DitOptions()):
        out = forward(self, x, options)
        if not feed_forward:
            feed_forward.append(out.float())
        return out
    dit_21.swiglu_rowwise_fp8, dit_21.FeedForward.forward = counted, recorded
    try:
        length = TEXT_BEFORE + TEXT_AFTER + 2 * SIDE_TOKENS * SIDE_TOKENS
        with torch.no_grad(), dit_run(prepared, config, "cuda", length, RunRecorder("cuda")) as (options, ran):
            options = options.replace(prefix_cache=PrefixKVCache())
            layout_ = dit_21.layout(given["image_mask"], given["shapes"], None, dit.rope, "cuda", options)
            for step, (t, latents) in enumerate(zip(TIMESTEPS, given["latents"])):
                calls.append(0)
                prediction, _ = dit_21.step_forward(dit, latents, given["prompt"],
                                                    torch.tensor([t], device="cuda", dtype=torch.bfloat16), layout_,
                                                    step, options)
                predictions.append(prediction.float())
    finally:
        dit_21.swiglu_rowwise_fp8, dit_21.FeedForward.forward = kernel, forward
    return {"predictions": predictions, "first_feed_forward": feed_forward[0], "calls": calls,
            "words": ran.get("words", {})}


def dit_check() -> dict:
    """The full-size synthetic 2.1 DiT with the rewrite against without it, step by step."""
    engine = Engine("synthetic-2.1", device="cuda", dit_only=True)
    given = dit_21_inputs(engine.load().dit, SIDE_TOKENS, 1, TEXT_BEFORE, TEXT_AFTER, len(TIMESTEPS), "cuda")
    runs = {name: steps(engine, text, given) for name, text in CONFIGS.items()}
    ours, theirs = runs["with"], runs["without"]
    return {"blocks": len(engine.load().dit.blocks),
            "relative_error": [relative_error(a, b) for a, b in zip(ours["predictions"], theirs["predictions"])],
            "bitwise_equal": [bool(torch.equal(a, b)) for a, b in zip(ours["predictions"], theirs["predictions"])],
            "finite": all(bool(torch.isfinite(prediction).all()) for prediction in ours["predictions"]),
            "first_feed_forward_error": relative_error(ours["first_feed_forward"], theirs["first_feed_forward"]),
            "calls": {name: run["calls"] for name, run in runs.items()},
            "words": {name: run["words"] for name, run in runs.items()}}


def main() -> None:
    out = output_folder(__doc__.splitlines()[0], "qwen21-swiglu-quant")
    report = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "kernel": kernel_check()}
    print("kernel", json.dumps(report["kernel"]), flush=True)
    report["dit"] = dit_check()
    print("dit", json.dumps(report["dit"]), flush=True)
    (out / "qwen21-swiglu-quant.json").write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
