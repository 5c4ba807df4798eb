"""Whether sampling the GPU's clock on a thread (telemetry.ClockSampler, around every row the bench times) slows the
edits it samples: warm edits of one configuration, with and without the sampler in turns whose order alternates,
each edit's total and stages, and their medians.

On the GPU machine (after `source scripts/gpu/setup.sh`):
    python3 scripts/gpu/clock_sampler_probe.py [--config best] [--rounds 8] [--side 1024] [--steps 4] [--cfg 1]
        [--out DIR]
Full-size synthetic model (`--model tiny --device cpu` rehearses on a CPU, where nothing is sampled). Writes
DIR/clock-sampler/results.json.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import statistics
from pathlib import Path

from ghostedit import OptimizationConfig
from ghostedit.bench.output import environment
from ghostedit.bench.pipeline import add_edit_probe_arguments, edit_probe, stage_medians
from ghostedit.telemetry import EDIT_STAGES, ClockSampler


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_edit_probe_arguments(parser)
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--untimed", type=int, default=3, help="edits before the timed ones: the first prepares and "
                        "compiles, the second captures the graphs (at least 1)")
    args = parser.parse_args()
    engine, request = edit_probe(args)
    config = OptimizationConfig.parse(args.config)
    for _ in range(max(args.untimed, 1)):  # prepare and compile, capture the graphs, warm edits
        engine.run(request, config)
    sampled = {"without": contextlib.nullcontext, "with": lambda: ClockSampler(engine.device)}
    edits = {name: [] for name in sampled}
    for round_index in range(args.rounds):
        for name in (list(sampled) if round_index % 2 == 0 else list(sampled)[::-1]):
            with sampled[name]():
                edits[name].append(engine.run(request, config).telemetry.summary())
    medians = {name: {"total_s": statistics.median(s["total_s"] for s in summaries),
                      **stage_medians(summaries, EDIT_STAGES)}
               for name, summaries in edits.items()}
    found = {"config": config.label, "text": config.text, "side": args.side, "steps": args.steps, "cfg": args.cfg,
             "rounds": args.rounds, "medians": medians,
             "edits": {name: [{"total_s": s["total_s"], **s["stages_s"]} for s in summaries]
                       for name, summaries in edits.items()},
             "environment": environment()}
    out = Path(args.out) / "clock-sampler"
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(found, indent=2, default=str))
    for name, median in medians.items():
        print(name, {key: round(value, 4) for key, value in median.items()})
    for name, summaries in found["edits"].items():
        print(name, [round(s["total_s"], 3) for s in summaries])
        print(name, "text encoding", [round(s.get("text encoding", 0), 3) for s in summaries])


if __name__ == "__main__":
    main()
