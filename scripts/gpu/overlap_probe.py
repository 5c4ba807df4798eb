"""The text stream's GEMMs beside the image stream's memory-bound kernels, on a second CUDA stream: does the GPU
hide the text stream's small GEMMs (a few hundred rows, below the FP8 ceiling) behind the image stream's GELU and
LayerNorm, which wait on memory rather than on the tensor cores?

On the GPU machine (after `source scripts/gpu/setup.sh`):  python3 scripts/gpu/overlap_probe.py [--out DIR]
One block's feed-forward part, and its q/k/v projection with the LayerNorm before it, of both streams at 1024x1024
(8192 image rows, each --text-tokens of text rows, width 3072, hidden 12288), as the engine's kernels run it
(torch._scaled_mm rowwise FP8, GhostEdit's GELU-and-quantize kernel, the LayerNorm with its FP8 cast before the
up projection; the LayerNorm in eager PyTorch), 60 times over in one CUDA graph, timed by CUDA events around the
replay (median of 10 after warm-up). Variants: one after the other; the text stream's part on a second stream from
the block's start; the same, started once the image stream's up projection is done; each at the side stream's
default and high priority. Outputs are checked equal to one after the other. Writes overlap.json.
"""
from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import torch
import torch.nn.functional as F

from ghostedit.optimize.fp8_mlp import gelu_rowwise_fp8_launch
from ghostedit.telemetry import median_ms
from stream_gemm_probe import BLOCKS, FP8, HIDDEN, IMAGE, WIDTH, fp8_rows, scaled_mm  # beside this file


def quantized_norm(x):
    """LayerNorm, then torchao's rowwise FP8 cast: the kernels before an up projection (eager here)."""
    normed = F.layer_norm(x, (x.shape[-1],))
    scale = normed.abs().amax(1, keepdim=True).float().clamp(min=1e-12) / 448
    return (normed / scale).to(FP8), scale


class Stream:
    """One stream's feed-forward (or, with `up_width` 3 x 3072 and no down projection, its joined q/k/v
    projection): its input, weights and the kernels in the engine's order."""

    def __init__(self, rows: int, up_width: int = HIDDEN, down: bool = True):
        self.hidden = torch.randn(rows, WIDTH, device="cuda", dtype=torch.bfloat16)
        self.up, self.up_scale = fp8_rows(up_width, WIDTH)
        self.up_bias = torch.randn(up_width, device="cuda", dtype=torch.bfloat16) * 0.1
        self.down = fp8_rows(WIDTH, HIDDEN) + (torch.randn(WIDTH, device="cuda", dtype=torch.bfloat16) * 0.1,) \
            if down else None  # (weight, its row scales, bias)

    def up_projection(self):
        a, scale = quantized_norm(self.hidden)
        return scaled_mm(a, scale, self.up, self.up_scale, self.up_bias)

    def rest(self, up):
        if self.down is None:
            return up
        activation, scale = gelu_rowwise_fp8_launch(up)
        return scaled_mm(activation, scale, *self.down)

    def whole(self):
        return self.rest(self.up_projection())


def graphed(body, times: int = BLOCKS):
    """(ms of `body` run `times` over in one CUDA graph, the last output)."""
    body()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    outputs = []
    with torch.cuda.graph(graph):
        for _ in range(times):
            outputs = body()
    ms = median_ms(graph.replay, "cuda", repeats=10, warmup=3)
    graph.replay()
    torch.cuda.synchronize()
    return ms, [o.clone() for o in outputs]


def variants(text_rows: int, part: str) -> dict:
    image, text = (Stream(rows) if part == "feed-forward" else Stream(rows, 3 * WIDTH, down=False)
                   for rows in (IMAGE, text_rows))
    main = torch.cuda.current_stream

    def in_turn():
        return [image.whole(), text.whole()]

    def beside(side, after_image_up: bool):
        def body():
            if not after_image_up:
                side.wait_stream(main())
                with torch.cuda.stream(side):
                    text_out = text.whole()
            image_up = image.up_projection()
            if after_image_up:
                side.wait_stream(main())
                with torch.cuda.stream(side):
                    text_out = text.whole()
            image_out = image.rest(image_up)
            main().wait_stream(side)
            return [image_out, text_out]
        return body

    reference_ms, reference = graphed(in_turn)
    row = {"part": part, "text rows": text_rows, "one after the other ms": reference_ms,
           "image alone ms": graphed(lambda: [image.whole()])[0],
           "text alone ms": graphed(lambda: [text.whole()])[0]}
    for priority_name, priority in (("default", 0), ("high", -1)):
        for start_name, after in (("from the block's start", False), ("after the image up projection", True)):
            ms, outputs = graphed(beside(torch.cuda.Stream(priority=priority), after))
            name = f"text on a second stream {start_name}, {priority_name} priority"
            row[f"{name} ms"] = ms
            row[f"{name} equal"] = all(torch.equal(a, b) for a, b in zip(outputs, reference))
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.environ.get("OUT", "bench-results"))
    parser.add_argument("--text-tokens", type=int, nargs="+", default=[256, 214])
    args = parser.parse_args()
    out = Path(args.out) / "overlap"
    out.mkdir(parents=True, exist_ok=True)
    report = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": []}
    for rows in args.text_tokens:
        for part in ("feed-forward", "qkv"):
            report["rows"].append(variants(rows, part))
            torch.cuda.empty_cache()
            print(json.dumps(report["rows"][-1]), flush=True)
    (out / "overlap.json").write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
