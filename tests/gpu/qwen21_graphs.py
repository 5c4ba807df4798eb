"""Whether Qwen-Image-2.1's DiT replayed from real CUDA graphs (`cuda-graph`) gives its forwards run from Python bit
for bit, on the GPU: the tiny 2.1 in bfloat16 on CUDA, four-step edits with 0, 1 and 3 references, the prefix cache
on and off; a first edit warms and captures, the next (other references and noise of the same shapes) replays, each
prediction compared with torch.equal against the same edit run from Python. The CPU tier checks the same logic with
a capture stand-in (tests/unit/optimize/test_cuda_graphs.py); here the captured graphs read the addresses they were
captured with, which the stand-in cannot show: the prefix cache's kept tensors must be the ones the filling graph
wrote.

On the GPU machine (after `source scripts/gpu/setup.sh`):  python3 tests/gpu/qwen21_graphs.py
Prints one RESULT line of JSON."""
from __future__ import annotations

import contextlib
import json
from pathlib import Path

import torch
from PIL import Image, ImageOps

from ghostedit.config import OptimizationConfig
from ghostedit.engine import Engine
from ghostedit.models.seams import DitOptions
from ghostedit.optimize import cuda_graphs
from ghostedit.telemetry import RunRecorder

HOUSE = Path(__file__).resolve().parents[2] / "assets" / "examples" / "house.png"


def references(count: int, variant: int) -> list:
    house = Image.open(HOUSE).convert("RGB")
    pictures = [house, ImageOps.mirror(house), ImageOps.flip(house), house.rotate(180)]
    return [pictures[(index + variant) % len(pictures)] for index in range(count)]


def predictions(prepared, images: list, seed: int, prefix_cache: bool, graphs=None) -> list:
    pipe, found = prepared.pipe, []
    model_fn = pipe.model_fn
    pipe.model_fn = lambda **inputs: found.append(model_fn(**inputs).clone()) or found[-1]
    try:
        with torch.no_grad(), (graphs.running(("stock", None), RunRecorder("cuda")) if graphs else
                               contextlib.nullcontext()):
            pipe(prompt="a ghostly house", edit_image=images or None, height=256, width=256, seed=seed,
                 num_inference_steps=4, dit_options=DitOptions(graphs=graphs), prefix_cache=prefix_cache)
    finally:
        pipe.model_fn = model_fn
    return found


def main() -> None:
    prepared, _ = Engine("tiny-2.1", device="cuda", dtype="bfloat16").prepare(OptimizationConfig())
    cases = {}
    for count in (0, 1, 3):
        for prefix_cache in (True, False):
            graphs = cuda_graphs.ShapeGraphs()
            equal = []
            for variant, seed in ((0, 1), (1, 2)):
                images = references(count, variant)
                expected = predictions(prepared, images, seed, prefix_cache)
                replayed = predictions(prepared, images, seed, prefix_cache, graphs)
                equal.append([torch.equal(a, b) for a, b in zip(replayed, expected, strict=True)])
            cases[f"{count} references, prefix cache {'on' if prefix_cache else 'off'}"] = {
                "equal": equal, "captured": graphs.captured, "replayed": graphs.replayed}
    print("RESULT " + json.dumps({"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                                  "cases": cases}))


if __name__ == "__main__":
    main()
