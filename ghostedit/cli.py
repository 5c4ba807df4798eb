"""The `ghostedit` command: `edit` one image and print the telemetry, `bench` configurations, list the `options`
this machine can run, `download` a model or LoRA ahead of time, list, export or install `compiled` code packages,
or `serve` the app (the same as `python app.py`).

A command's options are built only for the command asked for, and its modules imported only when it runs: `ghostedit
--help` imports neither torch nor DiffSynth. Every refusal (an option this machine cannot run, an image that is not
one, a LoRA that is not a LoRA, a folder that is not a model) is one `error:` line and exit status 2, said before
the model loads."""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

DOWNLOAD_LINE_SECONDS = 1.0
_last_download_line = [float("-inf")]


def print_progress(event) -> None:
    if event.stage == "download":  # the plan, then a line every few seconds, and the end
        now = time.monotonic()
        finished = event.download is None or event.download["finished"]
        if finished or now - _last_download_line[0] >= DOWNLOAD_LINE_SECONDS:
            _last_download_line[0] = now
            print(f"  [download] {event.message}", flush=True)
    elif event.stage == "denoising" and event.step_seconds is not None:
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


def _engine(args, mesh=None):
    from .engine import Engine
    from .arguments import model_and_device
    source, device = model_and_device(args)
    return Engine(source, device=device, dtype=args.dtype, mesh=mesh)


def _checked_edit(args, mesh=None):
    """The engine (on the process mesh `mesh` of a parallel edit), configuration and request of `edit`, every part
    checked before the model loads: the model folder, the preset, the LoRAs (by content), the images, the size and
    steps, then (the engine imported) whether this machine runs every chosen option."""
    from .arguments import apply_preset, config_from_args, model_and_device, request_from_args
    from .models import resolve
    from .lora_files import check_lora_file
    spec = resolve(model_and_device(args)[0])
    config, steps, cfg = apply_preset(args, spec.source, config_from_args(args), spec.default_steps)
    for lora in config.loras:
        check_lora_file(lora.path)
    family = spec.known_family
    if family is not None and not args.preset:
        cfg = family.default_cfg
    request = request_from_args(args, steps, cfg, keep_alpha=bool(family and family.rgba))
    if family is not None:
        family.check_request(request)
    engine = _engine(args, mesh)
    engine.check(config)
    return engine, config, request


def cmd_edit(args) -> int:
    from . import parallel
    if parallel.world_size_from_environment() > 1:  # started by torchrun: one edit on every process
        return _parallel_edit(args)
    engine, config, request = _checked_edit(args)
    print(f"model: {engine.spec.description}; {engine.spec.recognised}", flush=True)
    print_licence(engine)
    result = engine.run(request, config, on_progress=print_progress)
    if engine.spec.family is None:  # a repo id: recognised from its files once downloaded
        from .models.family import family_words
        print(f"model: recognised as {family_words(result.family)}")
    _report_edit(args, result)
    return 0


def print_licence(engine) -> None:
    """The model's licence, where it is not Apache 2.0 (Qwen-Image-2.1's is for research, not commercial use)."""
    if engine.spec.licence:
        print(f"licence: {engine.spec.known_family.name} is released under the {engine.spec.licence}")


def _parallel_edit(args) -> int:
    """Every rank runs the edit on its share of the mesh; rank 0 prints the telemetry and writes the image."""
    from . import parallel
    from .arguments import DEFAULT_CFG, preset_cfg
    from .device import default_device
    cfg = args.cfg if args.cfg is not None else preset_cfg(args, DEFAULT_CFG)
    mesh = parallel.setup(args.parallel, cfg != 1.0, args.device or default_device())
    engine = None
    try:
        engine, config, request = _checked_edit(args, mesh)
        result = engine.run(request, config, on_progress=print_progress if mesh.is_writer else None)
        if mesh.is_writer:
            _report_edit(args, result)
    finally:
        parallel.teardown(engine)
    return 0


def _report_edit(args, result) -> None:
    image = result.image
    if image.mode == "RGBA" and Path(args.out).suffix.lower() in (".jpg", ".jpeg", ".bmp"):
        print(f"WARNING: {Path(args.out).suffix} has no alpha channel: the image is composited over white (save it "
              "as .png, .webp or .tiff to keep its transparency)")
        image = _over_white(image)
    image.save(args.out)
    print(format_telemetry(result))
    print(f"saved {args.out}")
    if args.json:
        Path(args.json).write_text(json.dumps(result.telemetry.summary(), indent=2))


def _over_white(image):
    from PIL import Image
    background = Image.new("RGB", image.size, (255, 255, 255))
    background.paste(image, mask=image.getchannel("A"))
    return background


def options_text(device: str) -> str:
    """Every setting's choices on `device`, each marked available or not with the reason (no model is loaded)."""
    from .optimize import registry
    options = registry.options(device)
    width = max(len(choice) for choices in options.values() for choice in choices) + 2
    lines = []
    for setting, choices in options.items():
        lines.append(f"{setting}:")
        lines += [f"  {choice:<{width}}{registry.words(setting, choice)}: "
                  f"{'available' if available.ok else 'unavailable, ' + available.reason}"
                  for choice, available in choices.items()]
    return "\n".join(lines)


def cmd_options(args) -> int:
    from .device import default_device
    print(options_text(args.device or default_device()))
    print("(where the weights live on this card: the memory setting; `ghostedit edit` and the app's System tab say "
          "where each component went and why)")
    return 0


def cmd_download(args) -> int:
    """Fetches a model repo (or, with --lora, a LoRA file) into the cache ahead of time, with progress."""
    from .downloads import DownloadError, lora_file, model_folder, printer
    show = printer()
    try:
        where = lora_file(args.reference, show) if args.lora else model_folder(args.reference, show, show)
    except DownloadError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(f"ready: {where}")
    return 0


def cmd_compiled(args) -> int:
    """Lists, exports or installs compiled-code packages (optimize/packages.py)."""
    from .optimize import packages
    if args.action == "list":
        found = packages.listed()
        print("\n".join(package.words() for package in found) or f"no compiled packages in {packages.folder()}")
        return 0
    if args.action == "export":
        if args.where is None:
            raise SystemExit("ghostedit compiled export needs a folder to write to")
        for package in packages.export(Path(args.where)):
            print(f"exported {package.words()}")
        return 0
    if args.where is None:
        raise SystemExit("ghostedit compiled install needs a folder or a Hub repo (owner/name)")
    from .device import default_device
    try:
        lines, installed = packages.install_and_tell(args.where, args.device or default_device())
    except packages.InstallError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print("\n".join(lines))
    return 0 if installed else 2


def cmd_serve(args) -> int:
    from .ui.serve import serve
    serve(args)
    return 0


def _add_edit(edit: argparse.ArgumentParser) -> None:
    from .arguments import add_model_arguments, add_preset_argument, add_request_arguments, add_toggle_arguments
    from .parallel.mesh import MODE_HELP, MODES
    add_model_arguments(edit)
    add_request_arguments(edit, image_required=False, prompt_required=True)
    add_toggle_arguments(edit)
    add_preset_argument(edit)
    edit.add_argument("--out", required=True, help="where to write the edited image (PNG, JPEG, WebP...; PNG keeps "
                                                   "Qwen-Image-2.1's alpha channel)")
    edit.add_argument("--json", default=None, help="also write the telemetry as JSON here")
    edit.add_argument("--parallel", choices=MODES, default=os.environ.get("GHOSTEDIT_PARALLEL", "auto"),
                      help=MODE_HELP + "; the environment's GHOSTEDIT_PARALLEL sets the default")
    edit.set_defaults(run=cmd_edit)


def _add_options(options: argparse.ArgumentParser) -> None:
    options.add_argument("--device", default=None, help="cuda or cpu (default: cuda when available)")
    options.set_defaults(run=cmd_options)


def _add_download(download: argparse.ArgumentParser) -> None:
    download.add_argument("reference", help="owner/name or modelscope:owner/name; with --lora also "
                                            "owner/name:FILE.safetensors or a Hub URL")
    download.add_argument("--lora", action="store_true", help="the reference is a LoRA (one .safetensors file)")
    download.set_defaults(run=cmd_download)


def _add_compiled(compiled: argparse.ArgumentParser) -> None:
    compiled.add_argument("action", choices=("list", "export", "install"))
    compiled.add_argument("where", nargs="?", default=None,
                          help="export: the folder to write; install: a folder or a Hub repo id (owner/name)")
    compiled.add_argument("--device", default=None, help="install: the device the packages must be made for "
                                                         "(default: cuda if there is a GPU, else cpu)")
    compiled.set_defaults(run=cmd_compiled)


def _add_serve(serve: argparse.ArgumentParser) -> None:
    from .ui.serve import add_serve_arguments
    add_serve_arguments(serve)
    serve.set_defaults(run=cmd_serve)


# name: (one line for `ghostedit --help`, the command's own description, what adds its options)
COMMANDS = {
    "edit": ("edit images (or, with Qwen-Image-2.1, generate one) and print the telemetry",
             "Edit images with an instruction (Qwen-Image-Edit: 1 to 3; Qwen-Image-2.1: 1 to 10, or none to "
             "generate from the prompt); print the stage and step times. Each toggle's choices and whether this "
             "machine runs them: `ghostedit options`.", _add_edit),
    "options": ("which toggles can run on this machine, and why not (loads no model)", None, _add_options),
    "download": ("fetch a model or LoRA from the Hub ahead of time, with progress",
                 "Fetch a model repo (only the files GhostEdit reads) or a LoRA file into the Hugging Face cache: "
                 "size and free disk space checked first, progress shown, an interrupted download resumed.",
                 _add_download),
    "compiled": ("list, export or install compiled-code packages (a new machine skips compiling)",
                 "A configuration's compiled code is kept as a package per torch build and device in "
                 "$GHOSTEDIT_HOME/compiled. Export them to a folder (to copy or upload to a Hub repo), install them "
                 "on another machine from that folder or repo: its first edit of the configuration then loads the "
                 "code instead of compiling it. A package made for another torch or GPU is refused. A package is "
                 "code: install packages only from a source you trust.", _add_compiled),
    "bench": ("benchmark configurations on the same inputs", None, None),  # bench/command.py adds its own
    "serve": ("serve the app in a browser (the same as python app.py)", None, _add_serve),
}


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """Every command's parser; with `only`, the options of that command alone (the others keep their one line;
    "": none)."""
    parser = argparse.ArgumentParser(prog="ghostedit", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (summary, description, add) in COMMANDS.items():
        wanted = only is None or only == name
        if add is None and wanted:
            from .bench.command import add_bench_command
            add_bench_command(commands)
            continue
        command = commands.add_parser(name, help=summary, description=description or summary)
        if wanted:
            add(command)
    return parser


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    chosen = next((word for word in argv if not word.startswith("-")), None)
    args = build_parser(chosen or "").parse_args(argv)  # no command: the list of commands, nothing imported
    from .errors import GhostEditError
    try:
        return args.run(args)
    except GhostEditError as error:  # a refusal, written for the person: one line, no traceback
        print(f"error: {' '.join(str(error).split())}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
