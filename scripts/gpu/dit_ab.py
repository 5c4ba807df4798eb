"""An A/B of two versions of GhostEdit's code on the DiT forward (issue 40's "must not regress"): in this process, with
whichever `ghostedit` is first on the path, the full-size synthetic DiT's forward for each configuration (stock,
exact, best) at each shape (512, 1024, 1328, 1024 with three images), timed (CUDA events, median of --repeats after
two warm-up calls and the first call, which compiles and captures), and each output kept on the same inputs (seeded),
so that two versions' outputs can be compared bit for bit. Uses only what both versions have (Engine, the DiT
bench's inputs and run-time contexts).

    python3 scripts/gpu/dit_ab.py --name new-1 --out DIR      # one process of one version
    python3 scripts/gpu/dit_ab.py --compare DIR                # the table of every process in DIR

scripts/gpu/dit_check.sh runs the versions in alternating processes (configurations prepared later in a process
measured slower, docs/benchmarks.md section 6), then the comparison. Writes DIR/dit-ab-NAME.json and
DIR/dit-ab-NAME.pt (the outputs); --compare writes DIR/dit-ab.json and prints the table.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

# stock, the presets, and best without fused-gelu-quant: its kernel computes the model's GELU since this change (it
# computed DiffSynth's sigmoid approximation before), so best and exact differ from main's by that, and this one not
BEST_WITHOUT_GELU_KERNEL = ("best,rewrites=real-rope+joint-layout+fused-qkv+inductor-persistent-rows+carried-residual"
                            "+cuda-graph+fused-qk-norm-rope+fp8-attention-out")
CONFIGS = ("baseline", "exact", "best", BEST_WITHOUT_GELU_KERNEL)
SHAPES = ("512", "1024", "1328", "1024:3")


def shape_of(text: str) -> tuple[int, int]:
    side, _, images = text.partition(":")
    return int(side), int(images or 1)


def measure(args) -> None:
    import ghostedit
    from ghostedit import OptimizationConfig
    from ghostedit.bench.dit import dit_inputs, running
    from ghostedit.device import device_name, synchronize
    from ghostedit.engine import Engine
    from ghostedit.telemetry import RunRecorder, median_ms
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    device = args.device
    engine = Engine(args.model, device=device, dit_only=True)
    base = engine.load(OptimizationConfig())
    inputs = {text: dit_inputs(base.dit, shape_of(text)[0], shape_of(text)[0], args.text_tokens, device,
                               engine.torch_dtype, seed=0, edit_images=shape_of(text)[1]) for text in args.shapes}
    report = {"name": args.name, "code": str(Path(ghostedit.__file__).parent), "gpu": device_name(device),
              "model": args.model, "torch": torch.__version__, "text_tokens": args.text_tokens,
              "repeats": args.repeats, "rows": []}
    outputs = {}
    for text in args.configs:
        engine.free()
        config = OptimizationConfig.parse(text)
        for shape in args.shapes:
            prepared, _ = engine.prepare(config)
            with running(prepared, config, inputs[shape], device, RunRecorder(device)) as (call, ran):
                synchronize(device)
                start = time.perf_counter()
                first = call()
                synchronize(device)
                first_s = time.perf_counter() - start
                ms = median_ms(call, device, args.repeats, warmup=2)
                outputs[f"{text} @ {shape}"] = call().clone().cpu()
            report["rows"].append({"config": text, "shape": shape, "ms": ms, "first_call_s": first_s,
                                   "first_equals_later": bool(torch.equal(first.cpu(), outputs[f"{text} @ {shape}"])),
                                   "words": {k: v for k, v in ran.get("words", {}).items()}})
            print(f"{args.name}: {text} @ {shape}: {ms:.1f} ms (first call {first_s:.1f} s)", flush=True)
            (out / f"dit-ab-{args.name}.json").write_text(json.dumps(report, indent=1))
    torch.save(outputs, out / f"dit-ab-{args.name}.pt")


def compare(folder: Path) -> None:
    """Per configuration and shape: each version's median ms over its processes, new / old, and whether the
    versions' outputs are bit-equal (and each version's outputs between its own processes)."""
    runs = {path.stem.removeprefix("dit-ab-"): json.loads(path.read_text())
            for path in sorted(folder.glob("dit-ab-*.json")) if path.stem != "dit-ab"}
    versions = {name.split("-")[0] for name in runs}
    tensors = {name: torch.load(folder / f"dit-ab-{name}.pt") for name in runs if (folder / f"dit-ab-{name}.pt").exists()}
    rows = []
    for key in {(row["config"], row["shape"]) for run in runs.values() for row in run["rows"]}:
        row = {"config": key[0], "shape": key[1]}
        for version in sorted(versions):
            times = [r["ms"] for name, run in runs.items() if name.startswith(version + "-") for r in run["rows"]
                     if (r["config"], r["shape"]) == key]
            row[f"{version}_ms"] = statistics.median(times) if times else None
            row[f"{version}_processes"] = len(times)
            kept = [t[f"{key[0]} @ {key[1]}"] for name, t in tensors.items()
                    if name.startswith(version + "-") and f"{key[0]} @ {key[1]}" in t]
            row[f"{version}_same_between_processes"] = all(torch.equal(kept[0], k) for k in kept[1:]) if kept else None
        if {"old", "new"} <= versions:
            old = [t for name, t in tensors.items() if name.startswith("old-") and f"{key[0]} @ {key[1]}" in t]
            new = [t for name, t in tensors.items() if name.startswith("new-") and f"{key[0]} @ {key[1]}" in t]
            if old and new:
                a, b = old[0][f"{key[0]} @ {key[1]}"], new[0][f"{key[0]} @ {key[1]}"]
                row["new_equals_old"] = bool(torch.equal(a, b))
                row["max_abs_difference"] = float((a.float() - b.float()).abs().max())
            if row.get("old_ms") and row.get("new_ms"):
                row["new_over_old"] = row["new_ms"] / row["old_ms"]
        rows.append(row)
    order = {config: index for index, config in enumerate(CONFIGS)}
    rows.sort(key=lambda r: (order.get(r["config"], 99), shape_of(r["shape"])))
    summary = {"processes": sorted(runs), "gpu": next(iter(runs.values()))["gpu"] if runs else None, "rows": rows}
    (folder / "dit-ab.json").write_text(json.dumps(summary, indent=1))
    print("| config | shape | old ms | new ms | new / old | new == old (bits) | max abs diff |")
    print("|---|---|---|---|---|---|---|")
    for row in rows:
        print(f"| {row['config']} | {row['shape']} | {row.get('old_ms') or 0:.1f} | {row.get('new_ms') or 0:.1f} | "
              f"{row.get('new_over_old', float('nan')):.3f} | {row.get('new_equals_old')} | "
              f"{row.get('max_abs_difference')} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--name", help="VERSION-ROUND, e.g. old-1 or new-2 (the version is what --compare pairs)")
    parser.add_argument("--out", default="bench-results/dit-check")
    parser.add_argument("--configs", nargs="+", default=list(CONFIGS))
    parser.add_argument("--shapes", nargs="+", default=list(SHAPES), metavar="SIDE[:IMAGES]")
    parser.add_argument("--text-tokens", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--model", default="synthetic", help="tiny with --device cpu rehearses the script")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--compare", metavar="DIR")
    args = parser.parse_args()
    if args.compare:
        compare(Path(args.compare))
    else:
        measure(args)


if __name__ == "__main__":
    main()
