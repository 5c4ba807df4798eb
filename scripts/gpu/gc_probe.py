"""Do Python's garbage-collection pauses explain the noisy text-encoding stage of warm edits? Times each warm edit's
stages beside the GC pauses inside it (gc.callbacks), then the same after gc.freeze() (the objects alive then, among
them the compiled code's, are left out of later collections; the engine froze those alive at load already).

On the GPU machine (after `source scripts/gpu/setup.sh`):  python3 scripts/gpu/gc_probe.py [--runs 6] [--out DIR]
Full-size synthetic model, best configuration, 1024x1024, 4 steps, CFG 1. Writes gc-probe.json.
"""
from __future__ import annotations

import argparse
import gc
import json
from pathlib import Path

from ghostedit import OptimizationConfig
from ghostedit.bench.gc_pauses import CollectorPauses
from ghostedit.bench.pipeline import add_edit_probe_arguments, edit_probe


def timed_runs(engine, request, config, runs: int, pauses: CollectorPauses) -> list[dict]:
    rows = []
    for _ in range(runs):
        pauses.take()
        summary = engine.run(request, config).telemetry.summary()
        collected = pauses.take()
        rows.append({"total_s": summary["total_s"], "stages_s": summary["stages_s"],
                     "gc_s": collected["seconds"], "gc_counts": collected["counts"]})
        print(json.dumps(rows[-1]), flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_edit_probe_arguments(parser)
    parser.add_argument("--runs", type=int, default=6)
    args = parser.parse_args()
    engine, request = edit_probe(args)
    config = OptimizationConfig.parse(args.config)
    engine.run(request, config)  # load, prepare, compile
    engine.run(request, config)
    pauses = CollectorPauses()
    found = {"config": config.label, "tracked_objects": len(gc.get_objects()), "thresholds": gc.get_threshold()}
    found["unfrozen"] = timed_runs(engine, request, config, args.runs, pauses)
    gc.freeze()
    found["frozen_objects"] = gc.get_freeze_count()
    found["frozen"] = timed_runs(engine, request, config, args.runs, pauses)
    out = Path(args.out) / "gc-probe"
    out.mkdir(parents=True, exist_ok=True)
    (out / "gc-probe.json").write_text(json.dumps(found, indent=1))
    print({key: found[key] for key in ("tracked_objects", "frozen_objects", "thresholds")})


if __name__ == "__main__":
    main()
