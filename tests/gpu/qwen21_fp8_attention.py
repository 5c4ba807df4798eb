"""Qwen-Image-2.1 with cuDNN's FP8 attention against the exact backend, on the GPU, at the released model's head size
(32 heads of 128) and a 1024x1024 edit with one reference (text around it: the block-causal spans), in two parts:

seam   the attention seam alone (models/seams.py) on random q, k, v shaped as the model's (q and k RMS-normalized, so
       their scales come from the same bound as the model's): the step that fills the prefix cache (FP8 for the
       reference's span and the target's, exact SDPA for the causal text spans, which must equal the exact path's
       bit for bit) and a step from the cache (the target over the cached prefix, one FP8 call), each region's
       output against the exact backend's (sdpa-flash);
dit    the full-size synthetic 2.1 DiT (dit_only) prepared with `baseline` (exact attention) and with
       `attention=cudnn-fp8` (q and k scales from their norms' bounds), three denoising steps with the prefix cache
       on (the first step fills it, the others read it) and off (every step over every token): each step's
       prediction against the exact one's of the same cache setting, the exact path's own spread between cache on
       and off (the same function, other kernel shapes: bf16 rounding, which random weights amplify), and the FP8
       kernel's calls at each step (filling: the reference's span and the target's in each block; cached: one);
rewrites the same DiT with torchao's FP8 GEMMs and the FP8 attention, without and with the rewrites ported from the
       Edit DiT, three steps with the prefix cache on: carried-residual alone (lossless: each step's prediction
       against the one without it, bit for bit expected), fused-qk-norm-rope (the Triton kernel at the cached
       steps) and fp8-attention-out on top of it, each step's prediction against the one without the rewrite (the
       filling step computes as without it) and against the exact attention's, beside the FP8 attention's own
       error there.

On the GPU machine (after `source scripts/gpu/setup.sh`):  python3 tests/gpu/qwen21_fp8_attention.py [--out DIR]
Writes qwen21-fp8-attention.json.
"""
from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import torch

from ghostedit.bench.dit import relative_error
from ghostedit.config import OptimizationConfig
from ghostedit.engine import Engine
from ghostedit.engine.runner import dit_run
from ghostedit.kernels import fp8_attention
from ghostedit.models.qwen_image_21.dit import layout, step_forward
from ghostedit.models.seams import DitOptions, PrefixKVCache, Segments, attention, normed_bound
from ghostedit.telemetry import RunRecorder
from gpu_scripts import dit_21_inputs

CONFIGS = {"exact": "baseline", "fp8": "attention=cudnn-fp8"}
FP8_GEMMS = "fp8=torchao,rewrites=real-rope+fused-qkv"
REWRITES = {"exact": FP8_GEMMS, "fp8": f"attention=cudnn-fp8,{FP8_GEMMS}",
            "carried": f"attention=cudnn-fp8,{FP8_GEMMS}+carried-residual",
            "fused": f"attention=cudnn-fp8,{FP8_GEMMS}+fused-qk-norm-rope",
            "fused-out": f"attention=cudnn-fp8,{FP8_GEMMS}+fused-qk-norm-rope+fp8-attention-out"}
SIDE_TOKENS = 64                        # 1024 px / 16: a 64 x 64 latent grid, the reference's and the target's
TEXT_BEFORE, TEXT_AFTER = 24, 40        # prompt tokens before and after the reference's slots
TIMESTEPS = (0.9, 0.5, 0.2)


HEADS, HEAD_DIM = 32, 128


def seam_check() -> dict:
    """The seam's FP8 path against the exact one on one attention layer's random q, k, v: relative errors by region,
    and whether the causal text spans are the exact path's bits."""
    generator = torch.Generator("cuda").manual_seed(0)
    image = SIDE_TOKENS * SIDE_TOKENS
    before, after = TEXT_BEFORE, TEXT_BEFORE + image + TEXT_AFTER
    length = after + image
    spans = ((0, before, True), (before, before + image, False), (before + image, after, True))

    def normed():  # an RMS-normalized row per head, as q and k leave the model's norms (weights of 1)
        x = torch.randn(1, length, HEADS, HEAD_DIM, generator=generator, device="cuda")
        return (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True))).bfloat16()
    q, k = normed(), normed()
    v = torch.randn(1, length, HEADS, HEAD_DIM, generator=generator, device="cuda", dtype=torch.bfloat16)
    bound_scale = fp8_attention.fp8_scale(normed_bound((torch.nn.RMSNorm(HEAD_DIM, device="cuda"),), HEAD_DIM))
    fp8, exact = DitOptions(attention="cudnn-fp8"), DitOptions(attention="sdpa-flash")
    with torch.no_grad():
        filling = [attention([(q, k, v)], options, mask=Segments(spans), fp8_scales=(bound_scale, bound_scale))
                   for options in (fp8, exact)]
        target = (q[:, after:], k[:, after:], v[:, after:])
        prefix = (k[:, :after], v[:, :after])
        cached = [attention([target], options, prefix=prefix, fp8_scales=(bound_scale, bound_scale))
                  for options in (fp8, exact)]
    text = [*range(0, before), *range(before + image, after)]
    return {"text_spans_bitwise_equal": bool(torch.equal(filling[0][:, text], filling[1][:, text])),
            "reference_span": relative_error(*(out[:, before:before + image] for out in filling)),
            "target_filling": relative_error(*(out[:, after:] for out in filling)),
            "target_cached": relative_error(*cached)}


def steps(engine, config: OptimizationConfig, given: dict, cache: bool) -> tuple[list[torch.Tensor], list[int], dict]:
    """Each step's prediction, the FP8 kernel's calls at each step, and what the run's contexts resolved."""
    prepared, _ = engine.prepare(config)
    dit = prepared.dit
    calls, kernel = [], fp8_attention.cudnn_fp8_attention

    def counted(*arguments):
        calls[-1] += 1
        return kernel(*arguments)
    fp8_attention.cudnn_fp8_attention = counted
    predictions = []
    try:
        length = TEXT_BEFORE + TEXT_AFTER + 2 * SIDE_TOKENS * SIDE_TOKENS
        with torch.no_grad(), dit_run(prepared, config, "cuda", length, RunRecorder("cuda")) as (options, ran):
            options = options.replace(prefix_cache=PrefixKVCache() if cache else None)
            layout_ = layout(given["image_mask"], given["shapes"], None, dit.rope, "cuda", options)
            for step, (t, latents) in enumerate(zip(TIMESTEPS, given["latents"])):
                calls.append(0)
                prediction, _ = step_forward(dit, latents, given["prompt"],
                                             torch.tensor([t], device="cuda", dtype=torch.bfloat16), layout_, step,
                                             options)
                predictions.append(prediction.float())
    finally:
        fp8_attention.cudnn_fp8_attention = kernel
    return predictions, calls, ran.get("words", {})


def rewrites_check(engine, given: dict) -> dict:
    """The ported rewrites' forwards against the same forward without each, with the prefix cache on: each step's
    relative error, the FP8 kernel's calls and what the run said."""
    runs = {name: steps(engine, OptimizationConfig.parse(text), given, True) for name, text in REWRITES.items()}
    predictions = {name: run[0] for name, run in runs.items()}

    def against(ours, theirs):
        return [relative_error(a, b) for a, b in zip(predictions[ours], predictions[theirs])]
    return {"carried_bitwise_equal": [bool(torch.equal(a, b)) for a, b in zip(predictions["carried"],
                                                                              predictions["fp8"])],
            "fp8_attention_against_exact": against("fp8", "exact"),
            "fused_against_fp8": against("fused", "fp8"), "fused_against_exact": against("fused", "exact"),
            "fused_out_against_fused": against("fused-out", "fused"),
            "fused_out_against_exact": against("fused-out", "exact"),
            "fp8_calls": {name: run[1] for name, run in runs.items()},
            "words": {name: run[2] for name, run in runs.items()}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.environ.get("OUT", "bench-results"))
    args = parser.parse_args()
    out = Path(args.out) / "qwen21-fp8-attention"
    out.mkdir(parents=True, exist_ok=True)
    report = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "seam": seam_check(), "runs": {}}
    print("seam", json.dumps(report["seam"]), flush=True)
    engine = Engine("synthetic-2.1", device="cuda", dit_only=True)
    given = dit_21_inputs(engine.load().dit, SIDE_TOKENS, 1, TEXT_BEFORE, TEXT_AFTER, len(TIMESTEPS), "cuda")
    report["blocks"] = len(engine.load().dit.blocks)
    exact = {}
    for cache in ("on", "off"):
        exact[cache], _, _ = steps(engine, OptimizationConfig.parse(CONFIGS["exact"]), given, cache == "on")
        fp8, calls, words = steps(engine, OptimizationConfig.parse(CONFIGS["fp8"]), given, cache == "on")
        run = report["runs"][f"prefix cache {cache}"] = {
            "relative_error": [relative_error(ours, theirs) for ours, theirs in zip(fp8, exact[cache])],
            "finite": all(bool(torch.isfinite(prediction).all()) for prediction in fp8),
            "fp8_calls": calls, "attention": words.get("attention")}
        print(f"prefix cache {cache}", json.dumps(run), flush=True)
    report["exact_cache_on_against_off"] = [relative_error(on, off) for on, off in zip(exact["on"], exact["off"])]
    report["rewrites"] = rewrites_check(engine, given)
    print("rewrites", json.dumps(report["rewrites"]), flush=True)
    (out / "qwen21-fp8-attention.json").write_text(json.dumps(report, indent=2))
    print("exact, prefix cache on against off", json.dumps(report["exact_cache_on_against_off"]), flush=True)


if __name__ == "__main__":
    main()
