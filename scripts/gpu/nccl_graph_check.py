"""Whether the Ulysses split's NCCL collectives run inside a CUDA graph on two GPUs, alone, in seconds: the check to
run before `parallel_bench.sh split` (which runs it first), whose split forward with cuda-graph captures its
all-to-alls and which no run has finished yet (lab/LOG.md, section 9).

Started by torchrun on 2 GPUs, each rank holds its own tokens of q, k and v and sends them through the split's
attention (ghostedit/parallel/ulysses.py: the all-to-all to heads, an elementwise "attention" q + k + v over every
token, the all-to-all back), which must give each rank q + k + v of its own tokens. That forward runs eagerly (NCCL's
communicators made), is captured as the engine captures a forward (ghostedit/optimize/cuda_graphs.py, CudaCapture:
a stream of its own, thread-local capture mode), then replayed on new values written into the captured inputs. Each
stage is printed by every rank as it ends; a collective that waits past --collective-timeout fails the run, and
while it runs each rank prints its Python stacks every --hang-report seconds (where a run that is stopped waited).

    torchrun --standalone --nproc-per-node 2 scripts/gpu/nccl_graph_check.py [--out DIR]
Rank 0 writes DIR/nccl-graph-check.json: each stage's result, equal on every rank or not. `--device cpu` rehearses
the eager forward on two gloo processes (a CPU has no CUDA graph to capture).
"""
from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import torch

from ghostedit import parallel
from ghostedit.optimize.cuda_graphs import CudaCapture
from ghostedit.parallel.ulysses import Ulysses

import rank_report  # beside this script

HEADS, HEAD_DIM, TOKENS = 24, 128, 4096 + 7   # the Edit DiT's heads; uneven shards, as a prompt makes them
REPLAYS = 3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.environ.get("OUT", "bench-results"))
    parser.add_argument("--device", default="cuda")
    rank_report.add_arguments(parser, collective_timeout_s=60.0, hang_report_s=30.0)
    args = parser.parse_args()
    rank_report.started(args.hang_report)
    mesh = parallel.setup("ulysses", False, args.device, collective_timeout_s=args.collective_timeout)
    on_gpu = args.device.startswith("cuda")
    device = f"cuda:{torch.cuda.current_device()}" if on_gpu else args.device
    progress = rank_report.progress_printer(mesh.rank)

    split = Ulysses.of(mesh, HEADS).over(TOKENS)
    generator = torch.Generator(device).manual_seed(mesh.rank)
    inputs = [torch.randn(1, split.own_tokens, HEADS, HEAD_DIM, generator=generator, device=device,
                          dtype=torch.bfloat16) for _ in range(3)]

    def forward() -> tuple[torch.Tensor]:
        return (split.attention([tuple(inputs)], [True], lambda streams: sum(streams[0])),)

    def expected() -> torch.Tensor:
        return inputs[0] + inputs[1] + inputs[2]

    stages, replay, outputs = {}, None, None
    try:
        stages["eager"] = bool(torch.equal(forward()[0], expected()))
        progress(f"eager forward: {'equal' if stages['eager'] else 'NOT equal'} to q + k + v")
        if not on_gpu:
            return
        capture = CudaCapture()
        with capture.warming():
            forward()
        torch.cuda.synchronize()
        progress("warmed on the capture's stream")
        replay, outputs, _ = capture.capture(forward, None)
        torch.cuda.synchronize()
        progress("captured")
        replays = []
        for _ in range(REPLAYS):
            for tensor in inputs:  # new values at the captured addresses
                tensor.copy_(torch.randn(tensor.shape, generator=generator, device=device, dtype=tensor.dtype))
            replay()
            torch.cuda.synchronize()
            replays.append(bool(torch.equal(outputs[0], expected())))
        stages["replays"] = replays
        progress(f"replayed {REPLAYS} times: {replays}")
    finally:
        replayed = all(stages.get("replays", [False])) if on_gpu else True
        agreed = torch.tensor([float(stages.get("eager", False) and replayed)], device=device)
        torch.distributed.all_reduce(agreed, op=torch.distributed.ReduceOp.MIN)
        if mesh.is_writer:
            out = Path(args.out)
            out.mkdir(parents=True, exist_ok=True)
            report = {"device": torch.cuda.get_device_name() if on_gpu else args.device, "torch": torch.__version__,
                      "backend": mesh.backend, "ranks": mesh.world_size,
                      "stages": stages, "equal_on_every_rank": bool(agreed.item())}
            (out / "nccl-graph-check.json").write_text(json.dumps(report, indent=1))
            print(json.dumps(report), flush=True)
        replay = outputs = None  # the graph before the process group (parallel.teardown says why)
        parallel.teardown()
        progress("process group closed")
        rank_report.ended()


if __name__ == "__main__":
    main()
