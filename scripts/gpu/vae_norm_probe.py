"""The VAE's RMS norm and the SiLU after it at the shapes of a 1024x1024 decode: as released (GhostEdit's float32
norm of the reference, then SiLU: eight passes), GhostEdit's kernel (vae=image-fused) in two layouts and a few
settings, and PyTorch's plain copy of the same bytes; each kernel's bits against the released computation's.

On the GPU machine (after `source scripts/gpu/setup.sh`):  python3 scripts/gpu/vae_norm_probe.py [--out DIR]
Channels-last bf16 inputs of unit variance and a norm with random gamma per shape (Qwen-Image's decoder: 384
channels at 128 and 256 px, 192 at 512, 96 at 1024). Median of CUDA-event timings after warm-up; GB/s counts one
read and one write. Writes DIR/vae-norm/results.json.
"""
from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import torch

from ghostedit.bench.output import environment
from ghostedit.models.exact import Float32RMSNorm
from ghostedit.optimize import vae_frames
from ghostedit.telemetry import median_ms

SHAPES = ((384, 128), (384, 256), (192, 512), (96, 1024))   # (channels, side)
SETTINGS = [  # (label, chunk or None for the engine's choice, values per program, warps)
    ("one masked block per row", "masked", 8192, 8),
    *[(f"chunks, {values} values, {warps} warps", None, values, warps)
      for values in (4096, 8192, 16384) for warps in (4, 8)],
]


def released(norm, x):
    return torch.nn.functional.silu(norm(x))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.environ.get("OUT", "bench-results"))
    args = parser.parse_args()
    generator = torch.Generator("cuda").manual_seed(0)
    rows_found = []
    for channels, side in SHAPES:
        norm = Float32RMSNorm(channels, images=False).to("cuda", torch.bfloat16)
        with torch.no_grad():
            norm.gamma.copy_(torch.randn(norm.gamma.shape, generator=generator, device="cuda"))
        x = torch.randn((1, channels, 1, side, side), generator=generator, device="cuda", dtype=torch.bfloat16)
        x = x.contiguous(memory_format=torch.channels_last_3d)
        rows = x.movedim(1, -1).reshape(-1, channels)
        gigabytes = 2 * x.numel() * x.element_size() / 1e9
        with torch.no_grad():
            expected = released(norm, x).movedim(1, -1).reshape(-1, channels)

            def add(label, run, output=None):
                ms = median_ms(run, "cuda", repeats=20, warmup=3)
                row = {"channels": channels, "side": side, "kernel": label, "us": ms * 1000,
                       "gb_per_s": gigabytes / (ms / 1000)}
                if output is not None:
                    out = output()
                    row["differing_share"] = float((out != expected).float().mean())
                    row["max_abs_diff"] = float((out.float() - expected.float()).abs().max())
                rows_found.append(row)
                print(json.dumps(row), flush=True)

            add("released (float32 norm, scale, gamma, SiLU)", lambda: released(norm, x))
            add("PyTorch's copy, the same bytes", lambda: x.clone())
            gamma = norm.gamma.reshape(-1)
            for label, chunk, values, warps in SETTINGS:
                chunk = 1 << (channels - 1).bit_length() if chunk == "masked" else chunk  # one block, masked

                def run(chunk=chunk, values=values, warps=warps):
                    return vae_frames.channel_rms_norm_launch(rows, gamma, None, float(norm.scale), True, chunk,
                                                              values, warps)
                add(label, run, run)
    out = Path(args.out) / "vae-norm"
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps({"rows": rows_found, "environment": environment()}, indent=2))


if __name__ == "__main__":
    main()
