"""Attention alone at the DiT's shape: every backend available here, exact and lossy, timed and checked.

On the GPU machine (after `source scripts/gpu/setup.sh`):  python3 scripts/gpu/attention_probe.py [--out DIR]
A 1024x1024 edit: 24 heads of 128, 8192 image + 256 text tokens, q and k of unit RMS per head (as after the DiT's
RMSNorm) and v of unit variance. Per backend: the median of CUDA-event timings after warm-up, TFLOP/s, and the
relative error against float32 attention. For cudnn-fp8 also the kernel alone (inputs already in FP8) and the
whole path compiled (quantizing q, k and v, the kernel, rescaling the output), as the compiled blocks run it.
Writes attention.json.
"""
from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import torch

from ghostedit.optimize import attention, fp8_attention
from ghostedit.telemetry import median_ms

HEADS, HEAD_DIM, TOKENS = 24, 128, 8192 + 256


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=os.environ.get("OUT", "bench-results") + "/attention")
    args = parser.parse_args()
    generator = torch.Generator("cuda").manual_seed(0)
    q, k, v = (torch.randn(1, HEADS, TOKENS, HEAD_DIM, device="cuda", dtype=torch.bfloat16, generator=generator)
               for _ in range(3))
    reference = torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float())
    flops = 4 * TOKENS * TOKENS * HEAD_DIM * HEADS

    def row(name, run, output=None):
        ms = median_ms(run, "cuda", repeats=20, warmup=3)
        result = output if output is not None else run()
        error = float((result.float() - reference).norm() / reference.norm())
        entry = {"ms": ms, "tflops": flops / ms / 1e9, "rel_error_vs_fp32": error}
        print(f"{name:28s} {ms:7.3f} ms  {entry['tflops']:6.0f} TFLOP/s  rel. error {error:.4f}", flush=True)
        return entry

    results = {"shape": {"heads": HEADS, "head_dim": HEAD_DIM, "tokens": TOKENS}, "gpu": torch.cuda.get_device_name(),
               "torch": torch.__version__, "backends": {}, "unavailable": {}}
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
        parts = [[t.transpose(1, 2)] for t in (q8, k8, v8)]  # the op takes [batch, seq, heads, head_dim] parts

        def kernel_alone():
            return fp8_attention.cudnn_fp8_attention(*parts, qd, kd, vd)
        results["backends"]["cudnn-fp8 kernel alone"] = row(
            "cudnn-fp8 kernel alone", kernel_alone, (kernel_alone().float() * vd).transpose(1, 2))
        compiled = torch.compile(fp8_attention.attention)
        results["backends"]["cudnn-fp8 compiled"] = row("cudnn-fp8 compiled (quantize + kernel)",
                                                        lambda: compiled(q, k, v).transpose(1, 2))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "attention.json").write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
