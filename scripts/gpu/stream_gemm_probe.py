"""The text stream's FP8 GEMMs and the modulation GEMVs of one DiT block, laid out three ways each: as the engine
runs them (one torch._scaled_mm per stream and layer), as one grouped GEMM of both streams
(torch.nn.functional.scaled_grouped_mm), with the text stream's GEMM on a second stream beside the image
stream's; and the 120 modulation GEMVs of a forward one by one against one GEMV over their joined weights.

On the GPU machine (after `source scripts/gpu/setup.sh`):  python3 scripts/gpu/stream_gemm_probe.py [--out DIR]
Each variant is captured in a CUDA graph 60 times over (a forward's blocks) and timed by CUDA events around the
replay, median of 10 after warm-up; outputs are checked against the one-by-one GEMMs. Writes stream-gemm.json.
"""
from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import torch
import torch.nn.functional as F

from ghostedit.telemetry import median_ms

FP8 = torch.float8_e4m3fn
IMAGE, TEXT, WIDTH, HIDDEN, BLOCKS = 8192, 256, 3072, 12288, 60
LAYERS = {"qkv": (WIDTH, 3 * WIDTH), "out": (WIDTH, WIDTH), "fc1": (WIDTH, HIDDEN), "fc2": (HIDDEN, WIDTH)}


def fp8_rows(rows: int, columns: int):
    values = torch.randn(rows, columns, device="cuda")
    scale = values.abs().amax(1, keepdim=True) / 448
    return (values / scale).to(FP8), scale


def scaled_mm(a, scale_a, weight, scale_weight, bias=None):
    """torchao's rowwise FP8 linear as the engine runs it: torch._scaled_mm on [rows, in] and [out, in]."""
    return torch._scaled_mm(a, weight.t(), scale_a=scale_a, scale_b=scale_weight.t(), bias=bias,
                            out_dtype=torch.bfloat16, use_fast_accum=True)


def graphed_ms(body, times: int = BLOCKS) -> float:
    """`body` run `times` times over in one CUDA graph, the replay timed."""
    body()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(times):
            body()
    return median_ms(graph.replay, "cuda", repeats=10, warmup=3)


def layer_variants(k: int, n: int) -> dict:
    image_a, image_sa = fp8_rows(IMAGE, k)
    text_a, text_sa = fp8_rows(TEXT, k)
    image_w, image_sw = fp8_rows(n, k)
    text_w, text_sw = fp8_rows(n, k)
    image_bias, text_bias = (torch.randn(n, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    joined_a, joined_sa = torch.cat([text_a, image_a]), torch.cat([text_sa, image_sa]).flatten()
    weights = torch.stack([text_w, image_w]).transpose(-2, -1)     # [2, k, n], each column-major
    weight_scales = torch.stack([text_sw, image_sw]).flatten(1)     # [2, n]
    offsets = torch.tensor([TEXT, TEXT + IMAGE], device="cuda", dtype=torch.int32)

    def image(bias=image_bias):
        return scaled_mm(image_a, image_sa, image_w, image_sw, bias)

    def text(bias=text_bias):
        return scaled_mm(text_a, text_sa, text_w, text_sw, bias)

    def grouped():
        return F.scaled_grouped_mm(joined_a, weights, joined_sa, F.ScalingType.RowWise, weight_scales,
                                   F.ScalingType.RowWise, offs=offsets, output_dtype=torch.bfloat16,
                                   use_fast_accum=True)
    side = torch.cuda.Stream()

    def two_streams():
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            text_out = text()
        image_out = image()
        torch.cuda.current_stream().wait_stream(side)
        return text_out, image_out

    row = {"image alone": graphed_ms(image), "text alone": graphed_ms(text),
           "one after the other": graphed_ms(lambda: (image(), text())),
           "one after the other, no bias": graphed_ms(lambda: (image(None), text(None))),
           "text on a second stream": graphed_ms(two_streams)}
    try:
        reference = torch.cat([text(None), image(None)])
        output = grouped()
        row["grouped, no bias"] = graphed_ms(grouped)
        row["grouped rel. error"] = float((output.float() - reference.float()).norm() / reference.float().norm())
    except Exception as error:  # noqa: BLE001 - the probe reports what the grouped GEMM refuses
        row["grouped error"] = f"{type(error).__name__}: {str(error)[:300]}"
    flops = 2 * k * n * (IMAGE + TEXT) * BLOCKS
    row["TFLOP/s one after the other"] = flops / row["one after the other"] / 1e9
    return row


def modulation_variants() -> dict:
    layers = 2 * BLOCKS
    n = 6 * WIDTH
    joined_w, joined_sw = fp8_rows(layers * n, WIDTH)
    a, sa = fp8_rows(1, WIDTH)
    parts = [(joined_w[i * n:(i + 1) * n], joined_sw[i * n:(i + 1) * n]) for i in range(layers)]

    def mm(w, sw):
        return scaled_mm(a, sa, w, sw)
    by_layer = graphed_ms(lambda: [mm(w, sw) for w, sw in parts], times=1)
    joined = graphed_ms(lambda: mm(joined_w, joined_sw), times=1)
    reference = torch.cat([mm(w, sw) for w, sw in parts], dim=1)
    error = float((mm(joined_w, joined_sw).float() - reference.float()).norm() / reference.float().norm())
    gbytes = joined_w.numel() / 1e9
    return {"layer by layer ms": by_layer, "joined ms": joined, "rel. error": error,
            "GB/s layer by layer": gbytes / by_layer * 1e3, "GB/s joined": gbytes / joined * 1e3}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.environ.get("OUT", "bench-results"))
    args = parser.parse_args()
    out = Path(args.out) / "stream-gemm"
    out.mkdir(parents=True, exist_ok=True)
    report = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "layers": {}}
    for name, (k, n) in LAYERS.items():
        report["layers"][name] = layer_variants(k, n)
        print(name, json.dumps(report["layers"][name]), flush=True)
        torch.cuda.empty_cache()
    report["modulation"] = modulation_variants()
    print("modulation", json.dumps(report["modulation"]), flush=True)
    (out / "stream-gemm.json").write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
