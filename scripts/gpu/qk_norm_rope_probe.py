"""The FP8 attention's q and k preparation alone, at the DiT's shape: what the compiled blocks run without the
`fused-qk-norm-rope` rewrite (Inductor's kernels for RMSNorm, RoPE and the FP8 cast of each stream, then the byte
copy that joins text and image) against GhostEdit's kernel (ghostedit/optimize/fp8_qk.py) at several tile sizes, and
PyTorch's plain cast of the same tensors (the bytes the work has to move, at the rate a simple kernel reaches).

On the GPU machine (after `source scripts/gpu/setup.sh`):  python3 scripts/gpu/qk_norm_rope_probe.py [--out DIR]
At 1024x1024: 8192 image and 256 text tokens, 24 heads of 128, q and k each. Per variant: the median of CUDA-event
timings after warm-up (which counts the CPU's launches where they outlast the GPU's work), the GPU time of its
kernels alone (torch.profiler), the memory bandwidth that kernel time reaches (reading q and k in bf16, writing them
in FP8), and the share of its FP8 values that differ from the compiled code's. Writes qk-norm-rope.json.
"""
from __future__ import annotations

import argparse
import itertools
import json
import os
from pathlib import Path

import torch
from diffsynth.models.general_modules import RMSNorm

from ghostedit.optimize import fp8_attention, fp8_qk, rewrites
from ghostedit.telemetry import median_ms

HEADS, HEAD_DIM = 24, 128
TOKENS = {"text": 256, "image": 8192}
SWEEP = {"tokens": (1, 2, 4, 8), "warps": (1, 2, 4, 8)}


def streams() -> dict:
    """Per stream: q and k as a projection writes them, their RMSNorms, and the real rotary cos and sin."""
    generator = torch.Generator(device="cuda").manual_seed(0)
    found = {}
    for stream, tokens in TOKENS.items():
        qk = [torch.randn(1, tokens, HEADS, HEAD_DIM, device="cuda", generator=generator).to(torch.bfloat16) * 3
              for _ in range(2)]
        norms = [RMSNorm(HEAD_DIM, eps=1e-6).cuda().to(torch.bfloat16) for _ in range(2)]
        for norm in norms:
            norm.weight.data = 1 + 0.2 * torch.randn(HEAD_DIM, device="cuda", generator=generator).to(torch.bfloat16)
        angles = torch.randn(tokens, HEAD_DIM // 2, device="cuda", generator=generator)
        cos, sin = rewrites._as_cos_sin(torch.polar(torch.ones_like(angles), angles))
        found[stream] = {"qk": qk, "norms": norms, "cos": cos, "sin": sin}
    return found


def scales(found: dict) -> list[torch.Tensor]:
    """The FP8 scales of q and k from their bounds, as rewrites.qk_bounds works them out."""
    return [fp8_attention.fp8_scale(torch.stack([s["norms"][which].weight.float().abs().amax()
                                                 for s in found.values()]).amax() * HEAD_DIM ** 0.5 * 1.02)
            for which in (0, 1)]


def compiled_reference(found: dict, qk_scales):
    """The blocks' code without the rewrite: each stream's q and k normalized, rotated and cast by compiled code
    (dynamic shapes, as the engine compiles the blocks), then joined as bytes by the FP8 attention's op."""
    rewrites.install()

    def prepare(q, k, q_norm, k_norm, cos, sin, q_scale, k_scale):
        freqs = (cos.unsqueeze(1), sin.unsqueeze(1))
        return tuple(fp8_attention._scaled_fp8(rewrites._rotary(norm(x), freqs), scale)[0]
                     for x, norm, scale in ((q, q_norm, q_scale), (k, k_norm, k_scale)))
    compiled = torch.compile(prepare, dynamic=True)

    def run():
        casts = [compiled(*s["qk"], *s["norms"], s["cos"], s["sin"], *qk_scales) for s in found.values()]
        return [fp8_attention._joined([cast[which] for cast in casts]) for which in (0, 1)]
    return run


def kernel_variant(found: dict, qk_scales, tokens: int, warps: int):
    streams = list(found.values())

    def run():
        return list(fp8_qk.qk_norm_rope_fp8_launch(
            [s["qk"][0] for s in streams], [s["qk"][1] for s in streams], [s["norms"][0].weight for s in streams],
            [s["norms"][1].weight for s in streams], [s["cos"] for s in streams], [s["sin"] for s in streams],
            *qk_scales, 1e-6, tokens=tokens, warps=warps))
    return run


def cast_alone(found: dict):
    def run():
        return [x.to(torch.float8_e4m3fn) for s in found.values() for x in s["qk"]]
    return run


def kernel_ms(run, calls: int = 10) -> float:
    """The GPU time of `run`'s kernels per call (torch.profiler), without the gaps between them."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            run()
        torch.cuda.synchronize()
    return sum(event.device_time for event in prof.events()
               if event.device_type == torch.autograd.DeviceType.CUDA) / 1000 / calls


def timed(run, reference=None) -> dict:
    moved = sum(3 * 2 * TOKENS[stream] * HEADS * HEAD_DIM for stream in TOKENS)  # q and k: bf16 read, FP8 written
    result = {"ms": median_ms(run, "cuda", repeats=50, warmup=5), "kernel_ms": kernel_ms(run)}
    result["gb_per_s"] = moved / result["kernel_ms"] / 1e6
    if reference is not None:
        result["fp8_values_differing"] = sum((a.view(torch.uint8) != b.view(torch.uint8)).float().mean().item()
                                             for a, b in zip(run(), reference)) / 2
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.environ.get("OUT", "bench-results"))
    args = parser.parse_args()
    found = streams()
    qk_scales = scales(found)
    reference_run = compiled_reference(found, qk_scales)
    reference = reference_run()
    variants = {"compiled code and the join (without the rewrite)": timed(reference_run),
                "cast alone (read bf16, write fp8)": timed(cast_alone(found))}
    for tokens, warps in itertools.product(SWEEP["tokens"], SWEEP["warps"]):
        variants[f"ghostedit tokens={tokens} warps={warps}"] = timed(
            kernel_variant(found, qk_scales, tokens, warps), reference)
    for name, result in variants.items():
        print(f"{name:55s} {result['ms'] * 1000:8.1f} us, kernels {result['kernel_ms'] * 1000:8.1f} us "
              f"{result['gb_per_s']:7.0f} GB/s {result.get('fp8_values_differing', '')}", flush=True)
    out = Path(args.out) / "qk-norm-rope"
    out.mkdir(parents=True, exist_ok=True)
    report = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "tokens": TOKENS, "heads": HEADS,
              "head_dim": HEAD_DIM, "engine_tokens": fp8_qk.TOKENS, "engine_warps": fp8_qk.WARPS, "variants": variants}
    (out / "qk-norm-rope.json").write_text(json.dumps(report, indent=1))
    print(f"wrote {out / 'qk-norm-rope.json'}")


if __name__ == "__main__":
    main()
