"""Attention alone at the DiT's shape: every backend available here, exact and lossy, timed and checked.

On the GPU machine (after `source scripts/gpu/setup.sh`):  python3 lab/probes/attention_probe.py [--out DIR]
A 1024x1024 edit: 24 heads of 128, 8192 image + 256 text tokens (or each length of --text-tokens), q and k of unit
RMS per head (as after the DiT's RMSNorm) and v of unit variance. Per backend: the median of CUDA-event timings
after warm-up, TFLOP/s, and the relative error against float32 attention. For each FP8 attention also the kernel
alone (inputs already in FP8, in the engine's [batch, seq, heads, head_dim] layout) and the whole path compiled
(quantizing q, k and v, the kernel, rescaling the output), as the compiled blocks run it. Writes attention.json.
"""
from __future__ import annotations

import argparse
import functools
import json
import os
from pathlib import Path

import torch

from ghostedit.kernels import attention, fp8_attention
from ghostedit.telemetry import median_ms

HEADS, HEAD_DIM, IMAGE_TOKENS = 24, 128, 8192


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=os.environ.get("OUT", "bench-results") + "/attention")
    parser.add_argument("--text-tokens", type=int, nargs="+", default=[256],
                        help="prompt lengths; the first one's results are the file's top level, the others' under "
                             "'lengths'")
    args = parser.parse_args()
    first, *others = (probe(IMAGE_TOKENS + text) for text in args.text_tokens)
    results = {**first, "gpu": torch.cuda.get_device_name(), "torch": torch.__version__}
    if others:
        results["lengths"] = others
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "attention.json").write_text(json.dumps(results, indent=2))


def probe(tokens: int) -> dict:
    """Every backend at this joint sequence length."""
    print(f"-- {tokens} tokens", flush=True)
    generator = torch.Generator("cuda").manual_seed(0)
    q, k, v = (torch.randn(1, HEADS, tokens, HEAD_DIM, device="cuda", dtype=torch.bfloat16, generator=generator)
               for _ in range(3))
    reference = torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float())
    flops = 4 * tokens * tokens * HEAD_DIM * HEADS

    def row(name, run, output=None):
        ms = median_ms(run, "cuda", repeats=20, warmup=3)
        result = output if output is not None else run()
        error = float((result.float() - reference).norm() / reference.norm())
        entry = {"ms": ms, "tflops": flops / ms / 1e9, "rel_error_vs_fp32": error}
        print(f"{name:28s} {ms:7.3f} ms  {entry['tflops']:6.0f} TFLOP/s  rel. error {error:.4f}", flush=True)
        return entry

    results = {"shape": {"heads": HEADS, "head_dim": HEAD_DIM, "tokens": tokens, "image_tokens": IMAGE_TOKENS},
               "backends": {}, "unavailable": {}}
    for backend in attention.CONCRETE_BACKENDS:
        available = attention.availability(backend, "cuda")
        if not available.ok:
            results["unavailable"][backend] = available.reason
            print(f"{backend:28s} unavailable: {available.reason}", flush=True)
            continue
        results["backends"][backend] = row(backend, lambda: attention.attend(q, k, v, backend))
    if "cudnn-fp8" in results["backends"]:
        results["cudnn_version"] = fp8_attention.cudnn_frontend().backend_version()
    (q8, qd), (k8, kd), (v8, vd) = (fp8_attention.to_fp8(t, fp8_attention.largest_magnitude(t)) for t in (q, k, v))
    parts = [[t.transpose(1, 2).contiguous()] for t in (q8, k8, v8)]  # as the engine's kernels write them
    # each FP8 kernel's output and the factor that gives its real values: cuDNN's in FP8, FA3's in bf16
    kernels = {"cudnn-fp8": (fp8_attention.cudnn_fp8_attention, vd),
               "fa3-fp8": (fp8_attention.fa3_fp8_attention, torch.ones_like(vd))}
    for backend in attention.FP8_BACKENDS:
        if backend not in results["backends"]:
            continue
        kernel, output_descale = kernels[backend]

        def kernel_alone():
            return kernel(*parts, qd, kd, vd)
        results["backends"][f"{backend} kernel alone"] = row(
            f"{backend} kernel alone", kernel_alone, (kernel_alone().float() * output_descale).transpose(1, 2))
        compiled = torch.compile(functools.partial(fp8_attention.attention, backend=backend))
        results["backends"][f"{backend} compiled"] = row(f"{backend} compiled (quantize + kernel)",
                                                         lambda: compiled(q, k, v).transpose(1, 2))
    return results


if __name__ == "__main__":
    main()
