"""One edit on one GPU and on several (ghostedit/parallel), timed the same way; run by scripts/gpu/parallel_bench.sh.

  torchrun --standalone --nproc-per-node N scripts/gpu/parallel_bench.py run --label L --parallel MODE ...
      every rank runs `--warmup-edits` short warm-up edits (load, prepare, compile at the edit's shapes, capture
      CUDA graphs), then `--repeats` timed edits; rank 0 writes L.json (the medians, from the engine's own telemetry)
      and L.png (the last image)
  torchrun --standalone --nproc-per-node N scripts/gpu/parallel_bench.py link --out-dir DIR
      what Ulysses's all-to-alls cost on this machine's link at the edit's shape (link.json)
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
from ghostedit.bench.lora_switch import compiled_frames  # noqa: E402
from ghostedit.bench.output import environment, markdown_table  # noqa: E402
from ghostedit.metrics import compare_images  # noqa: E402
from ghostedit.bench.pipeline import DEFAULT_IMAGE, edit_seconds  # noqa: E402

SINGLE = "1gpu"  # the label of the single-process run the others are compared with
COLUMNS = {"label": "run", "ranks": "processes", "parallel": "parallel", "end_to_end_s": "edit s",
           "s_per_step": "denoise s/step", "speedup_e2e": "speedup (edit)", "speedup_step": "speedup (step)",
           "peak_gib": "peak GiB (rank 0)", "recompiled_frames": "recompiled frames (timed)",
           "repeat_max_abs": "max abs diff between repeats", "ranks_same_image": "every rank same image",
           "same_weights_as_single": "weights as 1 GPU", "max_abs": "max abs diff vs 1 GPU", "psnr_db": "PSNR dB vs 1 GPU"}


def run(args) -> None:
    from PIL import Image

    from ghostedit.engine import Engine
    device = args.device
    mesh = None
    if parallel.world_size_from_environment() > 1:
        mesh = parallel.setup(args.parallel, args.cfg != 1.0, device)
    engine = Engine(args.model, device=device, dtype=args.dtype, mesh=mesh)
    try:
        config = OptimizationConfig.parse(args.config)
        image = Image.open(args.image).convert("RGB")

        def request(steps):
            return EditRequest(images=[image], prompt=args.prompt, negative_prompt=args.negative_prompt,
                               width=args.side, height=args.side, steps=steps, cfg_scale=args.cfg, seed=args.seed)
        cold = engine.run(request(args.warmup_steps), config)
        for _ in range(args.warmup_edits - 1):  # a graphed 2.1 edit captures its cache-filling forward's graph here
            engine.run(request(args.warmup_steps), config)
        frames = compiled_frames()
        timed = [engine.run(request(args.steps), config) for _ in range(args.repeats)]
        ranks = agreement(weights_fingerprint(engine.load(config)), timed[-1].image, mesh)
        if mesh is None or mesh.is_writer:
            write_run(args, cold, timed, compiled_frames() - frames, ranks)
    finally:
        if mesh is not None:
            parallel.teardown(engine)


def weights_fingerprint(pipe) -> dict[str, float]:
    """A sum over every 25th tensor of each component: equal in two processes when their weights are equal."""
    return {name: float(sum(tensor.detach().double().sum().item()
                            for tensor in list(getattr(pipe, name).state_dict().values())[::25]))
            for name in ("dit", "text_encoder", "vae") if getattr(pipe, name, None) is not None}


def agreement(fingerprint: dict, image, mesh) -> dict:
    """Whether every rank holds the same weights and ends with the same image (each rank computes the whole edit's
    latent; a difference would be a bug of the parallel code, or weights that differ between processes)."""
    import hashlib

    import torch.distributed as dist
    own = (fingerprint, hashlib.sha256(image.tobytes()).hexdigest())
    every = [own] if mesh is None else [None] * dist.get_world_size()
    if mesh is not None:
        dist.all_gather_object(every, own)
    return {"weights": fingerprint, "ranks_same_weights": all(item[0] == fingerprint for item in every),
            "ranks_same_image": all(item[1] == own[1] for item in every)}


def write_run(args, cold, timed, recompiled_frames: int, ranks: dict) -> None:
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
        **ranks,
        "recompiled_frames": recompiled_frames,  # during the timed edits: 0 unless a guard failed
        # the same edit repeated in one process: 0 unless the configuration is not deterministic
        "repeat_max_abs": max(compare_images(result.image, timed[0].image)["max_abs"] for result in timed),
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

    out_dir = Path(args.out_dir)
    rows = [found for path in sorted(out_dir.glob("*.json")) if "label" in (found := json.loads(path.read_text()))]
    single = next((row for row in rows if row["label"] == SINGLE), None)
    if single is None:
        raise SystemExit(f"no single-process run ({SINGLE}.json) in {out_dir}: run that phase first")
    rows.sort(key=lambda row: (row["ranks"], row["label"] != SINGLE, row["label"]))
    reference = Image.open(out_dir / f"{SINGLE}.png")
    for row in rows:
        row["speedup_e2e"] = single["end_to_end_s"] / row["end_to_end_s"]
        row["speedup_step"] = single["s_per_step"] / row["s_per_step"]
        row.update(compare_images(Image.open(out_dir / f"{row['label']}.png"), reference))
        row["same_weights_as_single"] = row["weights"] == single["weights"]
    env = single["environment"]
    heading = (f"{single['size']}, {single['steps']} steps, CFG {single['cfg']:g}, configuration {single['config']}; "
               f"{env.get('gpu', env['cpu'])}, torch {env['torch']}, {env['date']}. Edit s: one warm edit "
               f"(median of the timed ones), text and image encoding, denoising and decoding; every rank runs "
               f"the encoders and the VAE.")
    measured = json.loads((out_dir / "link.json").read_text()) if (out_dir / "link.json").exists() else None
    if measured is not None:
        heading += (f" Ulysses's all-to-alls on this machine's link alone (`link` phase): {measured['block_ms']:.2f} "
                    f"ms a block, {measured['forward_ms']:.0f} ms a forward, {measured['gb_per_s']:.0f} GB/s "
                    f"leaving each rank.")
    text = heading + "\n\n" + markdown_table(rows, COLUMNS) + "\n"
    (out_dir / "table.md").write_text(text)
    # what docs/benchmarks.md section 8 is generated from (lab/docs/render.py)
    (out_dir / "results.json").write_text(json.dumps({"environment": env, "rows": rows, "link": measured},
                                                     indent=2, default=str))
    print(text)


def link(args) -> None:
    """What Ulysses's all-to-alls cost on this machine's link: one block's two all-to-alls (q, k and v of this rank's
    image tokens out, the attention output back) at the edit's shape, timed with CUDA events, times the blocks;
    rank 0 writes link.json. Each rank sends (N-1)/N of every buffer to the others."""
    import torch
    import torch.distributed as dist

    from ghostedit.models.synthetic import DIT_LAYERS, DIT_WIDTH
    mesh = parallel.setup("ulysses", False, args.device)
    try:
        ranks = mesh.world_size
        image_tokens = 2 * (args.side // 16) ** 2  # the output latent and one condition image at the same area
        own = image_tokens // ranks
        qkv = torch.randn(ranks, own // ranks * 3 * DIT_WIDTH, device="cuda", dtype=torch.bfloat16)
        out = torch.randn(ranks, own // ranks * DIT_WIDTH, device="cuda", dtype=torch.bfloat16)
        group = mesh.group("ulysses")

        def block():
            for buffer in (qkv, out):
                received = torch.empty_like(buffer)
                dist.all_to_all_single(received, buffer, group=group)
        times = []
        for index in range(25):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            block()
            end.record()
            torch.cuda.synchronize()
            if index >= 5:  # after warm-up
                times.append(start.elapsed_time(end))
        block_ms = statistics.median(times)
        crossing = (qkv.numel() + out.numel()) * 2 * (ranks - 1) / ranks  # bytes that leave each rank
        row = {"ranks": ranks, "side": args.side, "image_tokens": image_tokens, "block_ms": block_ms,
               "forward_ms": block_ms * DIT_LAYERS, "bytes_per_block": crossing,
               "gb_per_s": crossing / block_ms / 1e6, "environment": environment()}
        if mesh.is_writer:
            out_dir = Path(args.out_dir)
            out_dir.mkdir(parents=True, exist_ok=True)
            (out_dir / "link.json").write_text(json.dumps(row, indent=2, default=str))
            print(json.dumps({key: row[key] for key in ("block_ms", "forward_ms", "gb_per_s")}), flush=True)
    finally:
        parallel.teardown()


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
    timed.add_argument("--warmup-edits", type=int, default=1,
                       help="untimed edits before the timed ones (a graphed Qwen-Image-2.1 edit captures its "
                            "cache-filling forward's graph in its second)")
    timed.add_argument("--repeats", type=int, default=1)
    timed.add_argument("--cfg", type=float, default=4.0)
    timed.add_argument("--seed", type=int, default=0)
    timed.add_argument("--prompt", default="turn the scene into a ghostly night")
    timed.add_argument("--negative-prompt", default="", help="with --cfg above 1 (Qwen-Image-2.1 guides only with one)")
    timed.add_argument("--image", default=str(DEFAULT_IMAGE))
    timed.add_argument("--out-dir", required=True)
    timed.set_defaults(run=run)
    linked = commands.add_parser("link", help="the all-to-all cost of Ulysses on this machine (under torchrun)")
    linked.add_argument("--device", default="cuda")
    linked.add_argument("--side", type=int, default=1024)
    linked.add_argument("--out-dir", required=True)
    linked.set_defaults(run=link)
    tabled = commands.add_parser("table", help="table.md from the runs in --out-dir")
    tabled.add_argument("--out-dir", required=True)
    tabled.set_defaults(run=table)
    args = parser.parse_args()
    args.run(args)


if __name__ == "__main__":
    main()
