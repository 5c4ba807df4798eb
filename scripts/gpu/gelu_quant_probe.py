"""The feed-forward layer's GELU and FP8 quantization alone, at the DiT's shape: Inductor's fused kernel (what the
compiled blocks run without the `fused-gelu-quant` rewrite) against GhostEdit's Triton kernel
(ghostedit/optimize/fp8_mlp.py: one row per program, held in registers) at several warp counts and against two
other layouts, candidates kept here (a block of rows read in chunks twice; the row's input range first, then one
GELU per value); then the whole feed-forward layer both ways, compiled as the blocks are.

On the GPU machine (after `source scripts/gpu/setup.sh`):  python3 scripts/gpu/gelu_quant_probe.py [--out DIR]
The GELU's input is an up projection's output at 1024x1024: 8192 image rows (and 256 text rows) of 12288 values.
Per kernel: the median of CUDA-event timings after warm-up, the memory bandwidth it reaches (reading the bf16 rows,
writing the FP8 rows and their scales), and how its output differs from torchao's quantization of the same GELU
(computed in float32 and rounded to bf16, as the compiled code does): the share of FP8 values that differ and the
largest scale difference. Writes gelu-quant.json.
"""
from __future__ import annotations

import argparse
import itertools
import json
import os
from pathlib import Path

import torch
import triton
import triton.language as tl
from torchao.quantization import Float8DynamicActivationFloat8WeightConfig, PerRow, quantize_
from torchao.quantization.quant_primitives import _choose_scale_float8, _quantize_affine_float8

from ghostedit.optimize import fp8_mlp
from ghostedit.telemetry import median_ms

DIM, HIDDEN = 3072, 12288
ROWS_OF = {"image": 8192, "text": 256}
SWEEP = {"rows": (1, 2), "columns": (1024, 2048, 4096), "warps": (4, 8, 16)}
GELU_ARGMIN = -0.7512  # DiffSynth's GELU falls to its minimum, -0.1636, there and rises on both sides


@triton.jit
def _gelu(x):
    return (x * tl.sigmoid(1.702 * x)).to(tl.bfloat16).to(tl.float32)


@triton.jit
def two_pass_kernel(x_ptr, out_ptr, scale_ptr, fp8_max, smallest_amax, n_columns: tl.constexpr,
                    ROWS: tl.constexpr, COLUMNS: tl.constexpr):
    """Candidate: a block of rows per program, read in chunks twice (the second time from L2): once for each row's
    largest |GELU|, once to quantize."""
    rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    offsets = rows[:, None] * n_columns
    amax = tl.zeros([ROWS], dtype=tl.float32)
    for start in range(0, n_columns, COLUMNS):
        columns = start + tl.arange(0, COLUMNS)
        amax = tl.maximum(amax, tl.max(tl.abs(_gelu(tl.load(x_ptr + offsets + columns[None, :]).to(tl.float32))), 1))
    scale = tl.maximum(amax, smallest_amax) / fp8_max
    tl.store(scale_ptr + rows, scale)
    for start in range(0, n_columns, COLUMNS):
        columns = start + tl.arange(0, COLUMNS)
        gelu = _gelu(tl.load(x_ptr + offsets + columns[None, :]).to(tl.float32))
        quantized = tl.clamp(gelu / scale[:, None], -fp8_max, fp8_max)
        tl.store(out_ptr + offsets + columns[None, :], quantized.to(tl.float8e4nv))


@triton.jit
def bounds_kernel(x_ptr, out_ptr, scale_ptr, fp8_max, smallest_amax, gelu_argmin, n_columns: tl.constexpr,
                  COLUMNS: tl.constexpr):
    """Candidate: the first pass finds the row's smallest and largest input only (no GELU), the largest |GELU| from
    those (the GELU rises on both sides of its minimum), the second quantizes. Where the minimum lies inside the
    row's range and outweighs the largest input's GELU, the scale is an upper bound, not torchao's."""
    row = tl.program_id(0).to(tl.int64)
    low = tl.full([COLUMNS], float("inf"), tl.float32)
    high = tl.full([COLUMNS], float("-inf"), tl.float32)
    for start in range(0, n_columns, COLUMNS):
        x = tl.load(x_ptr + row * n_columns + start + tl.arange(0, COLUMNS)).to(tl.float32)
        low, high = tl.minimum(low, x), tl.maximum(high, x)
    low, high = tl.min(low, axis=0), tl.max(high, axis=0)
    inner = tl.minimum(tl.maximum(gelu_argmin, low), high)
    amax = tl.maximum(tl.maximum(tl.abs(_gelu(low)), tl.abs(_gelu(high))), tl.abs(_gelu(inner)))
    scale = tl.maximum(amax, smallest_amax) / fp8_max
    tl.store(scale_ptr + row, scale)
    for start in range(0, n_columns, COLUMNS):
        columns = start + tl.arange(0, COLUMNS)
        gelu = _gelu(tl.load(x_ptr + row * n_columns + columns).to(tl.float32))
        tl.store(out_ptr + row * n_columns + columns, tl.clamp(gelu / scale, -fp8_max, fp8_max).to(tl.float8e4nv))


def candidate(kernel, x: torch.Tensor, warps: int, rows_per_program: int = 1, **constants):
    """A candidate kernel's output for `x` (its rows a multiple of `rows_per_program`)."""
    rows, columns = x.shape
    out = torch.empty_like(x, dtype=fp8_mlp.FP8)
    scale = torch.empty((rows, 1), dtype=torch.float32, device=x.device)
    extra = (GELU_ARGMIN,) if kernel is bounds_kernel else ()
    kernel[(rows // rows_per_program,)](x, out, scale, fp8_mlp.FP8_MAX, fp8_mlp.SMALLEST_AMAX, *extra,
                                        n_columns=columns, num_warps=warps, **constants)
    return out, scale


def torchao_rowwise(values: torch.Tensor):
    """torchao's rowwise FP8 quantization, as its FP8 linear quantizes an activation: (FP8 values, scales)."""
    scale = _choose_scale_float8(values, [1, values.shape[-1]], fp8_mlp.FP8)
    return _quantize_affine_float8(values, scale, fp8_mlp.FP8), scale


def quantized_gelu(x: torch.Tensor):
    """DiffSynth's GELU quantized by torchao, as compiled blocks run it without the fused-gelu-quant rewrite."""
    return torchao_rowwise(x * torch.sigmoid(1.702 * x))


def float32_reference(x: torch.Tensor):
    """The same with the GELU computed in float32 and rounded to bf16 once."""
    return torchao_rowwise((x.float() * torch.sigmoid(1.702 * x.float())).to(torch.bfloat16))


def differences(result, reference) -> dict:
    (values, scale), (ref_values, ref_scale) = result, reference
    return {"fp8_values_differing": float((values.view(torch.uint8) != ref_values.view(torch.uint8)).float().mean()),
            "largest_scale_rel_difference": float(((scale - ref_scale).abs() / ref_scale).max())}


def timed(name: str, run, rows: int, reference=None) -> dict:
    """Times `run`; with `reference`, also how its output differs from it."""
    ms = median_ms(run, "cuda", repeats=50, warmup=5)
    moved = rows * HIDDEN * (2 + 1) + rows * 4
    entry = {"ms": ms, "gb_per_s": moved / ms / 1e6, **(differences(run(), reference) if reference else {})}
    print(f"{name:44s} {ms * 1000:8.1f} us  {entry['gb_per_s']:7.0f} GB/s  "
          + " ".join(f"{key} {value:.2e}" for key, value in entry.items() if key not in ("ms", "gb_per_s")), flush=True)
    return entry


def kernels(stream: str) -> dict:
    rows = ROWS_OF[stream]
    generator = torch.Generator("cuda").manual_seed(0)
    x = (torch.randn(rows, HIDDEN, device="cuda", generator=generator) * 2).to(torch.bfloat16)
    reference = float32_reference(x)
    inductor = torch.compile(quantized_gelu, fullgraph=True, options={"triton.multi_kernel": 1})
    results = {"inductor (best configuration)": timed(f"{stream}: inductor", lambda: inductor(x), rows, reference),
               # the same bytes moved by PyTorch's cast alone: the bandwidth a memory-bound kernel can reach here
               "cast alone (read bf16, write fp8)": timed(f"{stream}: cast alone", lambda: x.to(fp8_mlp.FP8), rows)}
    for warps in (8, 16, 32):
        name = "ghostedit" + (" (the engine's setting)" if warps == fp8_mlp.WARPS else f" warps={warps}")
        results[name] = timed(f"{stream}: {name}", lambda: fp8_mlp.gelu_rowwise_fp8_launch(x, warps), rows, reference)
    for block_rows, columns, warps in itertools.product(*SWEEP.values()):
        name = f"two passes rows={block_rows} columns={columns} warps={warps}"
        results[name] = timed(f"{stream}: {name}", lambda: candidate(
            two_pass_kernel, x, warps, block_rows, ROWS=block_rows, COLUMNS=columns), rows, reference)
    for columns, warps in itertools.product((1024, 2048, 4096), (4, 8)):
        name = f"bounds columns={columns} warps={warps}"
        results[name] = timed(f"{stream}: {name}", lambda: candidate(bounds_kernel, x, warps, COLUMNS=columns),
                              rows, reference)
    return results


def feed_forward() -> dict:
    """One image-stream feed-forward layer (DiffSynth's QwenFeedForward, random weights, torchao FP8), compiled as
    the blocks are, both ways."""
    from diffsynth.models.qwen_image_dit import QwenFeedForward
    torch.manual_seed(0)
    layer = QwenFeedForward(DIM, DIM).to("cuda", torch.bfloat16).eval()
    quantize_(layer, Float8DynamicActivationFloat8WeightConfig(granularity=PerRow(), set_inductor_config=False))
    hidden = torch.randn(1, ROWS_OF["image"], DIM, device="cuda", dtype=torch.bfloat16)
    options = {"triton.multi_kernel": 1}
    with torch.no_grad():
        torchao_path = torch.compile(layer.forward, fullgraph=True, options=options)
        expected = torchao_path(hidden)
        results = {"torchao + inductor": {"ms": median_ms(lambda: torchao_path(hidden), "cuda", repeats=30, warmup=3)}}
        fused_forward = torch.compile(lambda h: fp8_mlp.fp8_mlp_forward(layer, h), fullgraph=True, options=options)
        fused = fused_forward(hidden)
        results["fused GELU quantization"] = {
            "ms": median_ms(lambda: fused_forward(hidden), "cuda", repeats=30, warmup=3),
            "rel_error_vs_torchao": float((fused.float() - expected.float()).norm() / expected.float().norm())}
    for name, entry in results.items():
        print(f"feed-forward, {name:28s} {entry['ms'] * 1000:8.1f} us  {entry}", flush=True)
    return results


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=os.environ.get("OUT", "bench-results") + "/gelu-quant")
    args = parser.parse_args()
    results = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "hidden": HIDDEN,
               "engine_warps": fp8_mlp.WARPS,
               "kernels": {stream: kernels(stream) for stream in ROWS_OF}, "feed_forward": feed_forward()}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "gelu-quant.json").write_text(json.dumps(results, indent=1))
    print(f"wrote {out / 'gelu-quant.json'}")


if __name__ == "__main__":
    main()
