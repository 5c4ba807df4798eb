"""The `ghostedit` command: `edit` one image and print the telemetry, `bench` configurations, list the `options`
this machine can run, or `serve` the app (the same as `python app.py`)."""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from .arguments import add_model_arguments, add_request_arguments, add_toggle_arguments, config_from_args, \
    model_and_device, request_from_args
from .parallel.mesh import MODE_HELP, MODES


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
             f"prepared pipeline: {'cache hit' if summary['cache_hit'] else 'built (cache miss)'}",
             "dtypes: " + ", ".join(f"{name} {dtype}" for name, dtype in summary["dtypes"].items()),
             "placement: " + ", ".join(f"{name} in {where}" for name, where in summary["placement"].items()),
             f"parallel: {summary['parallel']}"]
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


def _engine(args):
    from .engine import Engine
    source, device = model_and_device(args)
    return Engine(source, device=device, dtype=args.dtype)


def cmd_edit(args) -> int:
    from . import parallel
    if parallel.world_size_from_environment() > 1:  # started by torchrun: one edit on every process
        return _parallel_edit(args)
    engine = _engine(args)
    result = engine.run(request_from_args(args, engine.spec.default_steps), config_from_args(args),
                        on_progress=print_progress)
    _report_edit(args, result)
    return 0


def _parallel_edit(args) -> int:
    """Every rank runs the edit on its share of the mesh; rank 0 prints the telemetry and writes the image."""
    from . import parallel
    from .device import default_device
    mesh = parallel.setup(args.parallel, args.cfg != 1.0, args.device or default_device())
    try:
        engine = _engine(args)
        result = engine.run(request_from_args(args, engine.spec.default_steps), config_from_args(args),
                            on_progress=print_progress if mesh.is_writer else None)
        if mesh.is_writer:
            _report_edit(args, result)
    finally:
        parallel.teardown()
    return 0


def _report_edit(args, result) -> None:
    result.image.save(args.out)
    print(format_telemetry(result))
    print(f"saved {args.out}")
    if args.json:
        Path(args.json).write_text(json.dumps(result.telemetry.summary(), indent=2))


def options_text(engine) -> str:
    """Every setting's choices, each marked available or not with the reason, and where each component lives."""
    options = engine.options()
    width = max(len(choice) for choices in options.values() for choice in choices) + 2
    lines = []
    for setting, choices in options.items():
        lines.append(f"{setting}:")
        lines += [f"  {choice:<{width}}{'available' if available.ok else 'unavailable: ' + available.reason}"
                  for choice, available in choices.items()]
    lines.append("placement (memory=auto):")
    lines += [f"  {component:<{width}}{where['where']}: {where['why']}"
              for component, where in engine.placement().describe().items()]
    return "\n".join(lines)


def cmd_options(args) -> int:
    print(options_text(_engine(args)))
    return 0


def cmd_serve(args) -> int:
    from .ui.serve import serve
    serve(args)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ghostedit", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)

    edit = commands.add_parser("edit", help="edit an image and print the telemetry",
                               description="Edit 1 to 3 images with an instruction; print the stage and step times.")
    add_model_arguments(edit)
    add_request_arguments(edit)
    add_toggle_arguments(edit)
    edit.add_argument("--out", required=True, help="where to write the edited image (PNG, JPEG, WebP...)")
    edit.add_argument("--json", default=None, help="also write the telemetry as JSON here")
    edit.add_argument("--parallel", choices=MODES, default=os.environ.get("GHOSTEDIT_PARALLEL", "auto"),
                      help=MODE_HELP + "; the environment's GHOSTEDIT_PARALLEL sets the default")
    edit.set_defaults(run=cmd_edit)

    options = commands.add_parser("options", help="which toggles can run on this machine, and why not")
    add_model_arguments(options)
    options.set_defaults(run=cmd_options)

    from .bench.command import add_bench_command
    add_bench_command(commands)

    from .ui.serve import add_serve_arguments
    serve = commands.add_parser("serve", help="serve the app in a browser (the same as python app.py)")
    add_serve_arguments(serve)
    serve.set_defaults(run=cmd_serve)
    return parser


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
