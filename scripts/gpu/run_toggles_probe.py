"""Run-time toggles (those that prepare nothing: `text-encoder`, `vae`, ...) A/B'd on one prepared pipeline: warm
whole edits of the base configuration and of each variant, taken in turns whose order rotates each round (one
process: an order kept fixed would favour one position), each stage's median per variant, each variant's last warm
image against the base's (the base's row: two of its own warm images); vae=image and vae=image-fused against the
released VAE in float32, and vae=image-fused against vae=image in the engine's bf16.

On the GPU machine (after `source scripts/gpu/setup.sh`):
    python3 scripts/gpu/run_toggles_probe.py [--config best,vae=video,text-encoder=eager] [--variants vae=image ...]
        [--rounds 8] [--side 1024] [--steps 4] [--cfg 1] [--out DIR]
Full-size synthetic model (`--model tiny --device cpu` rehearses on a CPU). Writes DIR/run-toggles/results.json and
table.md.
"""
from __future__ import annotations

import argparse
import copy
import json
import statistics
from pathlib import Path

import torch

from ghostedit import OptimizationConfig
from ghostedit.bench.output import environment, markdown_table
from ghostedit.bench.pipeline import add_edit_probe_arguments, edit_probe, stage_medians
from ghostedit.metrics import compare_images
from ghostedit.optimize import vae_frames
from ghostedit.telemetry import EDIT_STAGES



def rotated(names: list[str], round_index: int) -> list[str]:
    shift = round_index % len(names)
    return names[shift:] + names[:shift]


def vae_image_in_float32(engine, side: int) -> dict:
    """vae=image and vae=image-fused against the VAE as released on this device in float32, where only another
    function (not bf16's rounding of other kernels) would differ: the relative error of a random image's latents and
    of their decoding."""
    vae = copy.deepcopy(engine.load().vae).float()
    image = torch.rand(1, 3, side, side, generator=torch.Generator().manual_seed(0)).to(engine.device) * 2 - 1
    with torch.no_grad(), torch.backends.cudnn.flags(allow_tf32=False):  # float32 convolutions, not TF32
        latents = vae.encode(image)
        decoded = vae.decode(latents)
        with vae_frames.image_convolutions(vae):
            image_latents = vae.encode(image)
            image_decoded = vae.decode(latents)
            with vae_frames.fused_norms(vae):
                fused_latents = vae.encode(image)
                fused_decoded = vae.decode(latents)
    return {"latents_rel_error": _relative(image_latents, latents),
            "decoded_rel_error": _relative(image_decoded, decoded),
            "fused_latents_rel_error": _relative(fused_latents, latents),
            "fused_decoded_rel_error": _relative(fused_decoded, decoded)}


def fused_norms_in_bf16(engine, side: int) -> dict:
    """vae=image-fused against vae=image with the VAE as the engine runs it (bf16): the share of a decoded random
    latent's values whose bits differ, and the largest difference (the kernel rounds where PyTorch's kernels round;
    a sum of squares summed in another order may round otherwise)."""
    vae = engine.load().vae
    generator = torch.Generator().manual_seed(0)
    latents = torch.randn(1, 16, side // 8, side // 8, generator=generator).to(engine.device,
                                                                               next(vae.parameters()).dtype)
    with torch.no_grad(), vae_frames.image_convolutions(vae):
        expected = vae.decode(latents)
        with vae_frames.fused_norms(vae):
            fused = vae.decode(latents)
    return {"differing_share": float((fused != expected).float().mean()),
            "max_abs_diff": float((fused.float() - expected.float()).abs().max())}


def _relative(value, reference) -> float:
    return float((value - reference).norm() / reference.norm())


def timed_rounds(engine, request, configs: dict, rounds: int) -> tuple[dict, dict]:
    """Each variant's run summaries and images over `rounds` rounds, the order rotating each round."""
    runs, images = {name: [] for name in configs}, {name: [] for name in configs}
    for round_index in range(rounds):
        for name in rotated(list(configs), round_index):
            result = engine.run(request, configs[name])
            runs[name].append(result.telemetry.summary())
            images[name].append(result.image)
    return runs, images


def row(name: str, config, summaries: list[dict], images: dict) -> dict:
    """A variant's medians, its spread, and its last warm image against the base's (the base's own row: its first
    warm image against its last, what runs alone vary)."""
    totals = [summary["total_s"] for summary in summaries]
    stages = stage_medians(summaries, EDIT_STAGES)
    return {"variant": name, "config": config.label, "text": config.text, "total_s": statistics.median(totals),
            **stages, "total_spread_s": [min(totals), max(totals)],
            "against_base": compare_images(images[name][-1], images["base"][0 if name == "base" else -1])}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_edit_probe_arguments(parser, config="best,vae=video,text-encoder=eager")
    parser.add_argument("--variants", nargs="+", default=["vae=image", "vae=image-fused", "text-encoder=graphed",
                                                          "vae=image-fused,text-encoder=graphed"])
    parser.add_argument("--rounds", type=int, default=8)
    args = parser.parse_args()
    engine, request = edit_probe(args)
    configs = {"base": OptimizationConfig.parse(args.config)}
    configs.update({variant: OptimizationConfig.parse(f"{args.config},{variant}") for variant in args.variants})
    # two untimed runs each: preparing and compiling, then capturing graphs
    first_runs = {name: [engine.run(request, config).telemetry.summary() for _ in range(2)]
                  for name, config in configs.items()}
    runs, images = timed_rounds(engine, request, configs, args.rounds)
    rows = [row(name, configs[name], summaries, images) for name, summaries in runs.items()]
    found = {"config": args.config, "side": args.side, "steps": args.steps, "cfg": args.cfg, "rounds": args.rounds,
             "rows": rows, "runs": runs, "first_runs": first_runs, "environment": environment(),
             "vae_image_in_float32": vae_image_in_float32(engine, args.side),
             "fused_norms_in_bf16": fused_norms_in_bf16(engine, args.side)}
    out = Path(args.out) / "run-toggles"
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(found, indent=2, default=str))
    table = markdown_table(rows, {"variant": "variant", "total_s": "edit s (median)",
                                  **{stage: f"{stage} s" for stage in EDIT_STAGES}})
    (out / "table.md").write_text(table + "\n")
    print(table)
    for found_row in rows:
        print(found_row["variant"], "spread", found_row["total_spread_s"], "against base", found_row["against_base"])
    print("vae=image in float32:", found["vae_image_in_float32"])
    print("vae=image-fused in bf16:", found["fused_norms_in_bf16"])


if __name__ == "__main__":
    main()
