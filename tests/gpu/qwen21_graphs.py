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

import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the tests' support modules, as pytest has them
from qwen21_edits import predictions, references  # noqa: E402
from ghostedit.config import OptimizationConfig  # noqa: E402
from ghostedit.engine import Engine  # noqa: E402
from ghostedit.optimize import cuda_graphs  # noqa: E402


def main() -> None:
    prepared, _ = Engine("tiny-2.1", device="cuda", dtype="bfloat16").prepare(OptimizationConfig())
    cases = {}
    for count in (0, 1, 3):
        for prefix_cache in (True, False):
            graphs = cuda_graphs.ShapeGraphs()
            equal = []
            for variant, seed in ((0, 1), (1, 2)):
                images = references(count, variant)
                expected = predictions(prepared, images, seed, prefix_cache, side=256, device="cuda")
                replayed = predictions(prepared, images, seed, prefix_cache, graphs, side=256, device="cuda")
                equal.append([torch.equal(a, b) for a, b in zip(replayed, expected, strict=True)])
            cases[f"{count} references, prefix cache {'on' if prefix_cache else 'off'}"] = {
                "equal": equal, "captured": graphs.captured, "replayed": graphs.replayed}
    print("RESULT " + json.dumps({"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                                  "cases": cases}))


if __name__ == "__main__":
    main()
