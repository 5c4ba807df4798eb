"""Whether the sequence split (Ulysses) gives the one-GPU DiT forward bit for bit on two GPUs, and how fast each is:
started by torchrun on 2 GPUs (scripts/gpu/parallel_bench.sh split), every rank builds the full-size synthetic DiT,
prepares each configuration (best, exact), and runs the same seeded inputs twice: alone on its GPU (the one-GPU
forward) and split over both (the Ulysses mesh: its image tokens, FP8 q/k/v and the attention output go through NCCL
all-to-alls, and the forward replays from CUDA graphs where the configuration has cuda-graph). Each pair is compared
with torch.equal and timed (CUDA events, median after warm-up). The speedup of a forward is one GPU's ms over the
split's; a CFG-parallel edit's steps are two such forwards at once (scripts/gpu/parallel_bench.sh cfg).

    torchrun --standalone --nproc-per-node 2 scripts/gpu/split_check.py --out DIR [--configs best exact]
        [--without cuda-graph]
Rank 0 writes DIR/split-check.json and prints each row. --model tiny --device cpu rehearses on gloo.
"""
from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import torch

from ghostedit import OptimizationConfig, parallel
from ghostedit.bench.dit import dit_inputs, running
from ghostedit.device import device_name
from ghostedit.engine import Engine
from ghostedit.telemetry import RunRecorder, median_ms

import rank_report  # beside this script


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.environ.get("OUT", "bench-results"))
    parser.add_argument("--configs", nargs="+", default=["best", "exact"])
    parser.add_argument("--shapes", nargs="+", default=["1024", "1024:3"], metavar="SIDE[:IMAGES]")
    parser.add_argument("--text-tokens", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--model", default="synthetic")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--without", nargs="+", default=[], metavar="REWRITE",
                        help="rewrites taken out of every configuration (cuda-graph: where the split's collectives "
                             "do not replay from a CUDA graph, scripts/gpu/nccl_graph_check.py)")
    rank_report.add_arguments(parser, collective_timeout_s=300.0, hang_report_s=120.0)
    args = parser.parse_args()
    rank_report.started(args.hang_report)
    device = args.device
    mesh = parallel.setup("ulysses", False, device, collective_timeout_s=args.collective_timeout)
    progress = rank_report.progress_printer(mesh.rank)
    if device.startswith("cuda"):
        device = f"cuda:{torch.cuda.current_device()}"
    rows = []
    engine = Engine(args.model, device=device, dit_only=True)
    try:
        base = engine.load(OptimizationConfig())
        progress("weights built")
        for text in args.configs:
            engine.free()
            config = OptimizationConfig.parse(text)
            config = config.replace(rewrites=tuple(flag for flag in config.flags("rewrites")
                                                   if flag not in args.without))
            text += "".join(f" without {flag}" for flag in args.without)
            for shape in args.shapes:
                side, _, images = shape.partition(":")
                inputs = dit_inputs(base.dit, int(side), int(side), args.text_tokens, device, engine.torch_dtype,
                                    seed=0, edit_images=int(images or 1))
                prepared, _ = engine.prepare(config)
                progress(f"{text} at {shape}: prepared")
                row = {"config": text, "shape": shape}
                outputs = {}
                for name, on in (("one_gpu", None), ("split", mesh)):
                    with running(prepared, config, inputs, device, RunRecorder(device), on) as (call, ran):
                        outputs[name] = call().clone()
                        progress(f"{text} at {shape}, {name}: first forward done")
                        row[f"{name}_ms"] = median_ms(call, device, args.repeats, warmup=2)
                        progress(f"{text} at {shape}, {name}: timed")
                        row[f"{name}_words"] = ran.get("words", {})
                row["bit_equal"] = bool(torch.equal(outputs["one_gpu"], outputs["split"]))
                row["max_abs_difference"] = float((outputs["one_gpu"].float() - outputs["split"].float()).abs().max())
                row["speedup"] = row["one_gpu_ms"] / row["split_ms"]
                agreed = torch.tensor([float(row["bit_equal"])], device=device)
                torch.distributed.all_reduce(agreed, op=torch.distributed.ReduceOp.MIN)
                row["bit_equal_on_every_rank"] = bool(agreed.item())
                rows.append(row)
                if mesh.is_writer:
                    print(json.dumps({key: row[key] for key in ("config", "shape", "one_gpu_ms", "split_ms",
                                                                  "speedup", "bit_equal_on_every_rank",
                                                                  "max_abs_difference")}), flush=True)
        if mesh.is_writer:
            out = Path(args.out)
            out.mkdir(parents=True, exist_ok=True)
            (out / "split-check.json").write_text(json.dumps(
                {"gpu": device_name(device), "torch": torch.__version__, "ranks": mesh.world_size,
                 "backend": mesh.backend, "rows": rows}, indent=1, default=str))
    finally:
        parallel.teardown(engine)
        rank_report.ended()


if __name__ == "__main__":
    main()
