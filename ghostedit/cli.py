"""Command line: `python -m ghostedit edit ...`, `python -m ghostedit bench ...`, `python -m ghostedit options`."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from .config import ATTENTION_BACKENDS, COMPILE_MODES, FP8_MODES, LORA_MODES, EditRequest, LoraChoice, OptimizationConfig


def add_model_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default="tiny",
                        help="tiny (default), synthetic, a Hugging Face repo id (modelscope:<id> for ModelScope) "
                             "or a local folder")
    parser.add_argument("--device", default=None, help="cuda or cpu (default: cuda when available)")


def add_request_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--image", action="append", required=True, help="input image (repeat for up to 3)")
    parser.add_argument("--prompt", required=True)
    parser.add_argument("--negative-prompt", default="")
    parser.add_argument("--steps", type=int, default=None, help="default: the model's (tiny 4, real 40)")
    parser.add_argument("--cfg", type=float, default=4.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--width", type=int, default=None)
    parser.add_argument("--height", type=int, default=None)


def request_from_args(args, default_steps: int) -> EditRequest:
    return EditRequest(images=args.image, prompt=args.prompt,
                       negative_prompt=args.negative_prompt, steps=args.steps or default_steps, cfg_scale=args.cfg,
                       seed=args.seed, width=args.width, height=args.height)


def config_from_args(args) -> OptimizationConfig:
    lora = LoraChoice.from_file(args.lora, args.lora_scale, args.lora_mode) if args.lora else None
    return OptimizationConfig(lora=lora, fp8=args.fp8, attention=args.attention, compile=args.compile)


def print_progress(event) -> None:
    if event.stage == "denoising" and event.step_seconds is not None:
        print(f"  step {event.step}/{event.total_steps}  {event.step_seconds:.3f} s/step  "
              f"elapsed {event.elapsed:.1f} s  ETA {event.eta:.1f} s  "
              f"{event.memory.label} {event.memory.allocated_gib:.2f} GiB (peak {event.peak.allocated_gib:.2f})",
              flush=True)
    elif event.stage not in ("denoising", "done"):
        print(f"  [{event.stage}] {event.message}", flush=True)


def format_telemetry(result) -> str:
    summary = result.telemetry.summary()
    lines = [f"configuration: {result.config.label}   ({result.width}x{result.height}, {result.request.steps} steps, "
             f"CFG {result.request.cfg_scale:g}, attention ran: {result.attention_backend})",
             f"prepared pipeline: {'cache hit' if summary['cache_hit'] else 'built (cache miss)'}"]
    lines += [f"  {name}: {words}" for name, words in result.prepared_report.items()]
    lines.append("stages:")
    lines += [f"  {name:<16}{seconds:8.3f} s" for name, seconds in summary["stages_s"].items()]
    lines += [f"    prepare: {name:<12}{seconds:8.3f} s" for name, seconds in summary["prepare_steps_s"].items()]
    lines.append(f"  {'total':<16}{summary['total_s']:8.3f} s")
    if summary["denoise_s_per_step"] is not None:
        lines.append(f"denoising: {summary['denoise_s_per_step']:.3f} s/step (median), steps: "
                     + " ".join(f"{s:.3f}" for s in summary["step_s"]))
    lines.append(f"peak {summary['memory_kind']}: {summary['peak_allocated_gib']:.2f} GiB"
                 + (f", reserved {summary['peak_reserved_gib']:.2f} GiB" if summary["peak_reserved_gib"] else "")
                 + (f", device used (NVML) {summary['peak_device_used_gib']:.2f} GiB" if summary["peak_device_used_gib"] else "")
                 + f", host RSS {summary['peak_host_rss_gib']:.2f} GiB")
    lines += [f"WARNING: {note}" for note in summary["notes"]]
    return "\n".join(lines)


def cmd_edit(args) -> int:
    from .engine import Engine

    engine = Engine(args.model, device=args.device)
    result = engine.run(request_from_args(args, engine.spec.default_steps), config_from_args(args),
                        on_progress=print_progress)
    result.image.save(args.out)
    print(format_telemetry(result))
    print(f"saved {args.out}")
    if args.json:
        Path(args.json).write_text(json.dumps(result.telemetry.summary(), indent=2))
    return 0


def cmd_options(args) -> int:
    from .engine import Engine

    engine = Engine(args.model, device=args.device)
    for toggle, choices in engine.options().items():
        print(f"{toggle}:")
        for choice, available in choices.items():
            print(f"  {choice:<16}{'available' if available.ok else 'unavailable: ' + available.reason}")
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ghostedit", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)

    edit = commands.add_parser("edit", help="edit an image and print the telemetry")
    add_model_argument(edit)
    add_request_arguments(edit)
    edit.add_argument("--lora", default=None, help="LoRA .safetensors file")
    edit.add_argument("--lora-scale", type=float, default=1.0)
    edit.add_argument("--lora-mode", choices=LORA_MODES, default="fused")
    edit.add_argument("--fp8", choices=FP8_MODES, default="off")
    edit.add_argument("--attention", choices=ATTENTION_BACKENDS, default="diffsynth")
    edit.add_argument("--compile", choices=COMPILE_MODES, default="off")
    edit.add_argument("--out", required=True)
    edit.add_argument("--json", default=None, help="also write the telemetry as JSON here")
    edit.set_defaults(run=cmd_edit)

    options = commands.add_parser("options", help="which toggles can run on this machine, and why not")
    add_model_argument(options)
    options.set_defaults(run=cmd_options)

    from .bench import add_bench_command
    add_bench_command(commands)

    args = parser.parse_args(argv)
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
