"""Whether the DiT's forward replayed from CUDA graphs (`cuda-graph`) gives the forward run from Python bit for bit,
on the GPU, and what it takes: the full-size synthetic DiT prepared once with a configuration (best), four forwards
of varied inputs at one shape (latents, timestep, prompt) each way (run from Python; warmed, captured, then replayed),
with zero_cond_t off and on (Qwen-Image-Edit-2511: the forward builds a modulation index on the device, part of the
captured graph), each output compared with torch.equal, and the forward timed both ways.
With --same-as CONFIG, a second configuration prepared beside it (a lossless rewrite's configuration without the
rewrite): its replayed outputs are compared with the first's, input by input.

On the GPU machine (after `source scripts/gpu/setup.sh`):  python3 tests/gpu/graph_check.py [--out DIR]
Writes graph-check.json.
"""
from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import torch

from ghostedit.bench.dit import dit_inputs, running, without_cuda_graph
from ghostedit.config import OptimizationConfig
from ghostedit.engine import Engine
from ghostedit.telemetry import RunRecorder, median_ms


def varied(inputs: dict, seed: int) -> dict:
    generator = torch.Generator("cuda").manual_seed(seed)
    return {**inputs, **{name: torch.randn(inputs[name].shape, generator=generator, device="cuda",
                                           dtype=inputs[name].dtype) for name in ("latents", "prompt_emb")},
            "timestep": torch.tensor([100.0 * seed], device="cuda", dtype=inputs["timestep"].dtype)}


def outputs_and_ms(prepared, config, series: list[dict]) -> tuple[list[torch.Tensor], float, dict]:
    outputs = []
    for each in series:  # one run's options (and graphs) per input: the graphs are kept by the prepared pipeline
        with running(prepared, config, each, "cuda", RunRecorder("cuda")) as (call, ran):
            outputs.append(call().clone())
    with running(prepared, config, series[-1], "cuda", RunRecorder("cuda")) as (call, ran):
        ms = median_ms(call, "cuda", repeats=10, warmup=2)
    return outputs, ms, ran.get("words", {})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.environ.get("OUT", "bench-results"))
    parser.add_argument("--config", default="best")
    parser.add_argument("--same-as", help="a configuration whose outputs the first's must equal bit for bit")
    args = parser.parse_args()
    out = Path(args.out) / "graph-check"
    out.mkdir(parents=True, exist_ok=True)
    engine = Engine("synthetic", device="cuda", dit_only=True)
    config = OptimizationConfig.parse(args.config)
    prepared, _ = engine.prepare(config)
    other_config = OptimizationConfig.parse(args.same_as) if args.same_as else None
    other = engine.prepare(other_config)[0] if other_config else None
    base = dit_inputs(prepared.dit, 1024, 1024, 256, "cuda", torch.bfloat16)
    report = {"config": config.label, "gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "runs": {},
              "same_as": other_config.label if other_config else None}
    for zero_cond_t in (False, True):
        series = [{**varied(base, seed), "zero_cond_t": zero_cond_t} for seed in range(1, 5)]
        from_python, python_ms, _ = outputs_and_ms(prepared, without_cuda_graph(config), series)
        graphed, graphed_ms, words = outputs_and_ms(prepared, config, series)
        run = report["runs"][f"zero_cond_t={zero_cond_t}"] = {
            "bitwise_equal": [bool(torch.equal(a, b)) for a, b in zip(graphed, from_python)],
            "outputs_differ_between_inputs": not torch.equal(from_python[0], from_python[1]),
            "from_python_ms": python_ms, "graphed_ms": graphed_ms, "words": words}
        if other is not None:
            others, other_ms, _ = outputs_and_ms(other, other_config, series)
            run["equal_to_same_as"] = [bool(torch.equal(a, b)) for a, b in zip(graphed, others)]
            run["same_as_graphed_ms"] = other_ms
        print(f"zero_cond_t={zero_cond_t}", json.dumps(run), flush=True)
        (out / "graph-check.json").write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
