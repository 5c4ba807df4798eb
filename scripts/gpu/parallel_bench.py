"""One edit on one GPU and on several (ghostedit/parallel), timed the same way; run by scripts/gpu/parallel_bench.sh.

  torchrun --standalone --nproc-per-node N scripts/gpu/parallel_bench.py run --label L --parallel MODE ...
      every rank runs a short warm-up edit (load, prepare, compile at the edit's shape), then `--repeats` timed
      edits; rank 0 writes L.json (the medians, from the engine's own telemetry) and L.png (the last image)
  python scripts/gpu/parallel_bench.py table --out-dir DIR
      table.md from every L.json there: each run against the single-process one (label "1gpu"): its speedup end to
      end and per denoising step, and how far its image is from the single-process image
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from ghostedit import EditRequest, OptimizationConfig, parallel  # noqa: E402
from ghostedit.bench.output import environment, markdown_table  # noqa: E402
from ghostedit.bench.pipeline import DEFAULT_IMAGE, edit_seconds  # noqa: E402

SINGLE = "1gpu"  # the label of the single-process run the others are compared with
COLUMNS = {"label": "run", "ranks": "processes", "parallel": "parallel", "end_to_end_s": "edit s",
           "s_per_step": "denoise s/step", "speedup_e2e": "speedup (edit)", "speedup_step": "speedup (step)",
           "peak_gib": "peak GiB (rank 0)", "max_abs": "max abs diff vs 1 GPU", "psnr_db": "PSNR dB vs 1 GPU"}


def run(args) -> None:
    from PIL import Image

    from ghostedit.engine import Engine
    device = args.device
    mesh = None
    if parallel.world_size_from_environment() > 1:
        mesh = parallel.setup(args.parallel, args.cfg != 1.0, device)
    try:
        engine = Engine(args.model, device=device, dtype=args.dtype)
        config = OptimizationConfig.parse(args.config)
        image = Image.open(args.image).convert("RGB")

        def request(steps):
            return EditRequest(images=[image], prompt=args.prompt, width=args.side, height=args.side, steps=steps,
                               cfg_scale=args.cfg, seed=args.seed)
        cold = engine.run(request(args.warmup_steps), config)
        timed = [engine.run(request(args.steps), config) for _ in range(args.repeats)]
        if mesh is None or mesh.is_writer:
            write_run(args, cold, timed)
    finally:
        if mesh is not None:
            parallel.teardown()


def write_run(args, cold, timed) -> None:
    summaries = [result.telemetry.summary() for result in timed]
    cold_summary = cold.telemetry.summary()
    row = {
        "label": args.label,
        "ranks": parallel.world_size_from_environment(),
        "parallel": summaries[0]["parallel"],
        "config": timed[0].config.label,
        "size": f"{args.side}x{args.side}", "steps": args.steps, "cfg": args.cfg,
        "end_to_end_s": statistics.median(edit_seconds(s) for s in summaries),
        "s_per_step": statistics.median(s["denoise_s_per_step"] for s in summaries),
        "denoise_s": statistics.median(s["stages_s"]["denoising"] for s in summaries),
        "warmup_edit_s": cold_summary["total_s"],
        "compile_warmup_s": cold_summary["stages_s"].get("compile warm-up", 0.0),
        "peak_gib": max(s["peak_allocated_gib"] for s in [cold_summary, *summaries]),
        "attention_ran": timed[-1].attention_backend,
        "notes": summaries[-1]["notes"],
        "environment": environment(),
    }
    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    timed[-1].image.save(out_dir / f"{args.label}.png")
    (out_dir / f"{args.label}.json").write_text(json.dumps(row, indent=2, default=str))
    print(json.dumps({key: row[key] for key in ("label", "parallel", "end_to_end_s", "s_per_step")}), flush=True)


def table(args) -> None:
    from PIL import Image

    from ghostedit.metrics import compare_images
    out_dir = Path(args.out_dir)
    rows = [json.loads(path.read_text()) for path in sorted(out_dir.glob("*.json"))]
    single = next((row for row in rows if row["label"] == SINGLE), None)
    if single is None:
        raise SystemExit(f"no single-process run ({SINGLE}.json) in {out_dir}: run that phase first")
    rows.sort(key=lambda row: (row["ranks"], row["label"] != SINGLE, row["label"]))
    reference = Image.open(out_dir / f"{SINGLE}.png")
    for row in rows:
        row["speedup_e2e"] = single["end_to_end_s"] / row["end_to_end_s"]
        row["speedup_step"] = single["s_per_step"] / row["s_per_step"]
        row.update(compare_images(Image.open(out_dir / f"{row['label']}.png"), reference))
    env = single["environment"]
    heading = (f"{single['size']}, {single['steps']} steps, CFG {single['cfg']:g}, configuration {single['config']}; "
               f"{env.get('gpu', env['cpu'])}, torch {env['torch']}, {env['date']}. Edit s: one warm edit "
               f"(median of the timed ones), text and image encoding, denoising and decoding; every rank runs "
               f"the encoders and the VAE.")
    text = heading + "\n\n" + markdown_table(rows, COLUMNS) + "\n"
    (out_dir / "table.md").write_text(text)
    print(text)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    timed = commands.add_parser("run", help="one timed edit configuration (under torchrun for several ranks)")
    timed.add_argument("--label", required=True)
    timed.add_argument("--parallel", choices=parallel.MODES, default="auto", help=parallel.MODE_HELP)
    timed.add_argument("--model", default="synthetic")
    timed.add_argument("--device", default="cuda")
    timed.add_argument("--dtype", default=None)
    timed.add_argument("--config", default="best", help='"best", "baseline" or settings, as `ghostedit bench`')
    timed.add_argument("--side", type=int, default=1024)
    timed.add_argument("--steps", type=int, default=40)
    timed.add_argument("--warmup-steps", type=int, default=2, help="the untimed first edit (compiles the shape)")
    timed.add_argument("--repeats", type=int, default=1)
    timed.add_argument("--cfg", type=float, default=4.0)
    timed.add_argument("--seed", type=int, default=0)
    timed.add_argument("--prompt", default="turn the scene into a ghostly night")
    timed.add_argument("--image", default=str(DEFAULT_IMAGE))
    timed.add_argument("--out-dir", required=True)
    timed.set_defaults(run=run)
    tabled = commands.add_parser("table", help="table.md from the runs in --out-dir")
    tabled.add_argument("--out-dir", required=True)
    tabled.set_defaults(run=table)
    args = parser.parse_args()
    args.run(args)


if __name__ == "__main__":
    main()
