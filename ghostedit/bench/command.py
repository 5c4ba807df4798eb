"""`ghostedit bench`: its arguments (toggle options made from the registry apply to every configuration that does
not set them itself) and its run, at the pipeline or the DiT level."""
from __future__ import annotations

import argparse
import contextlib
import copy
import json
import os
import sys
from pathlib import Path

from ..arguments import add_model_arguments, add_request_arguments, add_toggle_arguments, loras_from_args, \
    model_and_device, request_from_args, settings_from_args
from ..config import OptimizationConfig
from ..device import UnavailableOptionError
from ..models.family import QWEN_IMAGE_21_DIT
from .output import environment, markdown_table, write_bar_charts, write_results
from .timeline import ProcessTimeline


# What the runs of one process share (--then): the engine and its weights
SHARED_BY_RUNS = ("model", "device", "dtype", "gpu_memory", "level")


def add_bench_command(commands) -> None:
    bench = commands.add_parser("bench", help="benchmark configurations on the same inputs",
                                description="Configurations one after another in one process, on the same inputs; "
                                            "the first is the baseline. Toggle options given here apply to every "
                                            "configuration that does not set them itself.")
    add_model_arguments(bench)
    add_request_arguments(bench, image_required=False)
    add_toggle_arguments(bench, defaults_to_none=True)
    bench.add_argument("--configs", nargs="+", default=["baseline"],
                       help='the configurations: "baseline", a preset ("best", "exact") or settings such as '
                            '"fp8=torchao,compile=regional,attention=auto"; pipeline level: one with a step cache '
                            '("best,step-cache=fbcache-0.08") also runs without it unless listed, for the cache\'s '
                            'own speed-up and PSNR/SSIM')
    bench.add_argument("--repeats", type=int, default=2,
                       help="pipeline: warm runs per configuration after the cold one (0: report the cold run); "
                            "dit: timed forwards")
    bench.add_argument("--level", choices=("pipeline", "dit", "lora-switch", "2.1", "latency"), default="pipeline",
                       help="pipeline: whole edits; dit: one DiT forward at the edit's shape (CUDA events); "
                            "lora-switch: fused LoRA switches on the first configuration, and a runtime LoRA's scale; "
                            "2.1: a Qwen-Image-2.1 model (--model synthetic-2.1) under each configuration against "
                            "stock DiffSynth's QwenImage21Pipeline with its KV cache, case by case (--cases); "
                            "latency: what a person waits for: the real app started in a process of its own and "
                            "/edit called through gradio_client, the client's wall time beside the engine's total "
                            "(bench/latency.py)")
    bench.add_argument("--cases", nargs="+", default=None, metavar="CASE",
                       help="2.1 level: any of 1024-1ref (40 steps), turbo-1024-1ref (8 steps), 2048-1ref and "
                            "2048-4ref (20 steps), t2i-1024 (40 steps) (default: all); --width runs every case at "
                            "that side instead (a rehearsal on a CPU)")
    bench.add_argument("--warm-up", nargs="+", default=None, metavar="CONFIG",
                       help="latency level: the app's --warm-up (default: the first configuration)")
    bench.add_argument("--lora-switch", type=int, default=0, metavar="CALLS",
                       help="latency level: also this many calls switching two random fused LoRAs on the first "
                            "configuration")
    bench.add_argument("--browser-calls", type=int, default=0, metavar="N",
                       help="latency level: also N edits through the page in chromium (playwright), with the page's "
                            "own settings")
    bench.add_argument("--lora-rank", type=int, default=32, help="lora-switch level: rank of the random LoRAs")
    bench.add_argument("--text-tokens", type=int, default=256, help="dit level: prompt tokens")
    bench.add_argument("--shapes", nargs="+", default=None, metavar="SIDE[:IMAGES]",
                       help="dit level: square output sides, each with a number of input images (default 1), e.g. "
                            "512 1024 1024:3 (default: --width, or 1024)")
    bench.add_argument("--experiments", action="store_true",
                       help="dit level: also time CFG batching and a CUDA graph of the fastest configuration")
    bench.add_argument("--experiment-shape", default=None, metavar="SIDE[:IMAGES]",
                       help="dit level: the shape (one of --shapes) whose fastest configuration the experiments "
                            "run on (default: the first shape)")
    bench.add_argument("--one-at-a-time", action="store_true",
                       help="pipeline level: free prepared pipelines before each configuration, so each "
                            "configuration's memory peak is its own")
    bench.add_argument("--baseline-from", default=None, metavar="DIR",
                       help="pipeline level: the first row, every row's reference (speed-up, image), is the first "
                            "row of an earlier run with the same request, read from DIR (its results.json and "
                            "output-0.png): measured in a process of its own, since configurations measured one "
                            "after another in one process measured slower the later they came")
    bench.add_argument("--gpu-memory", type=float, default=None, metavar="GiB",
                       help="use at most this much of the GPU (torch.cuda.set_per_process_memory_fraction): a "
                            "smaller card, emulated; placement plans with it")
    bench.add_argument("--step-cache-threshold", type=float, default=None, metavar="T",
                       help="pipeline level: every step-cache choice but fbcache-0 runs at this threshold. Random "
                            "weights change the first block's output by ~90%% per step, so no offered threshold "
                            "skips a step there: e.g. 0.95 measures served steps' speed on them (their quality "
                            "means nothing)")
    bench.add_argument("--out-dir", default="bench-results", help="folder for the results (default bench-results)")
    bench.add_argument("--title", default=None, help="the title of the report and charts (default: names the model and device)")
    bench.add_argument("--then", nargs=argparse.REMAINDER, default=None, metavar="OPTION",
                       help="then another bench run in this process, on the weights already built (each process "
                            "pays for Python, the imports and the weights): the options after --then replace this "
                            "run's where given, give it its own --out-dir, and may end with --then again; the "
                            f"{', '.join(SHARED_BY_RUNS)} stay")
    bench.add_argument("--skip-teardown", action="store_true",
                       help="leave the process as soon as its results are written and its output flushed, without "
                            "Python's, torch's and CUDA's teardown (freeing pinned memory, the compile workers): time "
                            "that no figure counts, which a scripted series of bench processes pays each time")
    bench.set_defaults(run=cmd_bench, bench_parser=bench)


def configurations(args) -> list[OptimizationConfig]:
    """--configs, each with the command line's toggle options and LoRAs under its own settings."""
    given, loras = settings_from_args(args), loras_from_args(args)
    configs = []
    for text in args.configs:
        config = OptimizationConfig.parse(text)
        explicit = {name: value for name, value in config.settings().items()
                    if value != OptimizationConfig().settings()[name]}
        configs.append(OptimizationConfig(loras=config.loras or loras, **{**given, **explicit}))
    return configs


def _shape(text: str) -> tuple[int, int]:
    side, _, images = text.partition(":")
    return int(side), int(images or 1)


def cap_gpu_memory(gib: float | None, device: str) -> None:
    if gib is None:
        return
    import torch
    if not device.startswith("cuda"):
        raise SystemExit("--gpu-memory emulates a smaller GPU: it needs a CUDA device")
    index = torch.device(device).index or 0
    total = torch.cuda.get_device_properties(index).total_memory
    torch.cuda.set_per_process_memory_fraction(min(1.0, gib * 1024**3 / total), index)


def runs_of(args) -> list[argparse.Namespace]:
    """This run and those chained after it with --then, each inheriting the options it does not give."""
    runs = [args]
    while runs[-1].then:
        chained = copy.copy(runs[-1])
        following, chained.then = chained.then, None
        chained = args.bench_parser.parse_args(following, namespace=chained)  # given options replace inherited ones
        changed = [name for name in SHARED_BY_RUNS if getattr(chained, name) != getattr(args, name)]
        if changed:
            raise SystemExit(f"--then: the runs of one process share the engine; they cannot change "
                             f"{', '.join('--' + name.replace('_', '-') for name in changed)}")
        runs.append(chained)
    out_dirs = [Path(run.out_dir).resolve() for run in runs]
    if len(set(out_dirs)) < len(out_dirs):
        raise SystemExit("--then: give each run its own --out-dir")
    if any(run.level != "pipeline" and start_of(run) for run in runs):
        raise SystemExit("--mask, --strength, --padding-mask-crop and --paste-back are for --level pipeline: one DiT "
                         "forward of a masked edit has a plain edit's inputs")
    return runs


def start_of(args) -> dict:
    """The masked or partial edit the pipeline level runs, for results.json (empty for a plain edit)."""
    given = {"mask": args.mask and Path(args.mask).name, "strength": args.strength if args.strength != 1.0 else None,
             "padding_mask_crop": args.padding_mask_crop, "paste_back": args.paste_back or None}
    return {name: value for name, value in given.items() if value is not None}


def cmd_bench(args) -> int:
    timeline = ProcessTimeline()
    timeline.mark("python and the CLI")
    if args.level == "latency":  # the engine runs in the app's process, not in this one
        return _latency(args, timeline)
    from ..engine import Engine, import_run_code

    import_run_code()  # DiffSynth: the engine's import, as this timeline names it (the app imports it later)
    timeline.mark("engine imported")
    runs = runs_of(args)
    source, device = model_and_device(args)
    cap_gpu_memory(args.gpu_memory, device)
    engine = Engine(source, device=device, dtype=args.dtype,
                    dit_only=args.level == "dit")
    configs = [configurations(run) for run in runs]
    for config in [config for run_configs in configs for config in run_configs]:
        try:  # refuse up front, with the reason, rather than after an hour of benchmarking
            engine.check(config)
        except UnavailableOptionError as error:
            raise SystemExit(f"{config.label}: {error}")
    timeline.mark("configurations checked")
    where = environment()
    for run_args, run_configs in zip(runs, configs):
        context = {"model": engine.spec.source, "device": engine.device, "gpu_memory_gib": args.gpu_memory,
                   "configs": [config.text for config in run_configs], "environment": where,
                   "process": timeline.process, "process_timeline": timeline.marks}
        run = {"dit": _dit, "lora-switch": _lora_switch, "pipeline": _pipeline, "2.1": _qwen_image_21}[run_args.level]
        # results.json holds the marks made before its writing
        run(run_args, engine, run_configs, Path(run_args.out_dir), context, timeline)
        timeline.mark("results written")
    print(timeline.line(), flush=True)
    if args.skip_teardown:
        sys.stderr.flush()
        os._exit(0)  # everything is written: the OS reclaims the memory (compile workers leave with their parent)
    return 0


# dit.py and pipeline.py import the engine (DiffSynth): imported by the runs, not by `ghostedit --help`

def _dit(args, engine, configs, out_dir: Path, context: dict, timeline: ProcessTimeline) -> None:
    from . import dit, pipeline
    cached = [config.label for config in configs if config != pipeline.full_run(config)]
    if cached:
        raise SystemExit(f"{', '.join(cached)}: a step cache skips the blocks of whole denoising steps; one DiT "
                         "forward has no steps to skip: bench it with --level pipeline")
    shapes = [_shape(text) for text in args.shapes] if args.shapes else [(args.width or 1024, 1)]
    width = height = shapes[0][0]
    engine.load(configs[0])  # the run's own load finds these weights: timed apart from the first configuration
    timeline.mark("weights built")

    def on_row(row, results):
        timeline.mark(f"{row['config']} at {row['shape']}")
        write_results(out_dir, {**context, **results})  # kept even if a later configuration fails
        print(f"{row['config']} at {row['shape']}: {row['ms_per_forward']:.1f} ms/forward, first call {row['first_call_s']:.1f} s, "
              f"rel. error {row['rel_error']:.4f}, block {row['block_rel_error']:.4f}", flush=True)
    experiment_shape = _shape(args.experiment_shape) if args.experiment_shape else None
    if experiment_shape is not None and experiment_shape not in shapes:
        raise SystemExit(f"--experiment-shape {args.experiment_shape} is not one of --shapes")
    results = dit.run_dit_bench(engine, configs, shapes, args.text_tokens, args.seed, args.repeats, args.experiments,
                                on_row, experiment_shape)
    if results["experiments"]:
        timeline.mark("experiments")
        print(json.dumps(results["experiments"], indent=2), flush=True)
    write_results(out_dir, {**context, **results})
    rows = results["rows"]
    (out_dir / "table.md").write_text(markdown_table(rows, dit.COLUMNS) + "\n")
    write_bar_charts(out_dir / "chart.png",
                     args.title or f"GhostEdit DiT forward, {width}x{height} edit: {engine.spec.source} on {engine.device}",
                     [f"{row['config']} ({row['shape']})" for row in rows], [row["ms_per_forward"] for row in rows],
                     "ms per DiT forward (lower is better)", [row["dit_alone_gib"] or 0 for row in rows],
                     "DiT alone: weights + activation peak, GiB")
    print(markdown_table(rows, dit.COLUMNS))


def _lora_switch(args, engine, configs, out_dir: Path, context: dict, timeline: ProcessTimeline) -> None:
    from . import pipeline
    from .lora_switch import run_lora_switch_bench
    args.image = args.image or [str(pipeline.DEFAULT_IMAGE)]
    request = request_from_args(args, 2)  # the fewest steps the model's schedule runs (models/exact.py)
    results = run_lora_switch_bench(engine, request, configs[0], args.lora_rank, out_dir / "loras")
    timeline.mark("LoRA switches")
    write_results(out_dir, {**context, **results})
    (out_dir / "table.md").write_text(markdown_table(results["rows"], {
        "switch": "switch", "switch_s": "LoRA switch s", "compile_warmup_s": "compile warm-up s",
        "new_compiled_frames": "recompiled frames", "edit_s": "edit s"}) + "\n")
    print(json.dumps({key: value for key, value in results.items() if key != "rows"}, indent=1))


def _latency(args, timeline: ProcessTimeline) -> int:
    from .latency import run_latency_bench
    runs = runs_of(args)
    source, device = model_and_device(args)
    context = {"model": source, "device": device, "process": timeline.process, "process_timeline": timeline.marks}
    run_latency_bench(runs, [configurations(run) for run in runs], source, device, context, timeline)
    print(timeline.line(), flush=True)
    if args.skip_teardown:
        sys.stderr.flush()
        os._exit(0)
    return 0


def _qwen_image_21(args, engine, configs, out_dir: Path, context: dict, timeline: ProcessTimeline) -> None:
    from . import qwen_image_21
    if engine.family is None or engine.family.dit != QWEN_IMAGE_21_DIT:
        raise SystemExit("--level 2.1 benches a Qwen-Image-2.1 model: --model synthetic-2.1 (or tiny-2.1, a 2.1 "
                         "folder or repo)")
    cases = args.cases or list(qwen_image_21.CASES)
    unknown = [name for name in cases if name not in qwen_image_21.CASES]
    if unknown:
        raise SystemExit(f"--cases: unknown {', '.join(unknown)}; the cases are {', '.join(qwen_image_21.CASES)}")
    rows = []

    def on_row(row):
        rows.append(row)
        timeline.mark(f"{row['config']} at {row['case']}")
        write_results(out_dir, {**context, "rows": rows})  # kept even if a later case fails
        if "error" in row:
            print(f"{row['case']} ({row['words']}), {row['config']}: {row['error']}", flush=True)
            return row
        cached = f"{row['cached_step_s']:.3f}" if row["cached_step_s"] is not None else "-"
        print(f"{row['case']} ({row['words']}), {row['config']}: {row['end_to_end_s']:.2f} s end to end, first step "
              f"{row['first_step_s']:.3f} s, cached step {cached} s, tokens {row['tokens_first']} then "
              f"{row['tokens_cached']}", flush=True)
        return row
    results = qwen_image_21.run_bench(engine, configs, cases, args.seed, on_row, timeline.mark,
                                       side=args.width)
    write_results(out_dir, {**context, **results})
    ran = [row for row in results["rows"] if "error" not in row]
    columns = {**qwen_image_21.COLUMNS, **({"error": "error"} if len(ran) < len(results["rows"]) else {})}
    (out_dir / "table.md").write_text(markdown_table(results["rows"], columns) + "\n")
    write_bar_charts(out_dir / "chart.png", args.title or f"GhostEdit {engine.spec.source} on {engine.device}",
                     [f"{row['case']}: {row['config']}" for row in ran],
                     [row["end_to_end_s"] for row in ran], "seconds end to end (lower is better)",
                     [row["peak_gib"] or 0 for row in ran], "peak GiB")
    print(markdown_table(results["rows"], columns))


@contextlib.contextmanager
def peak_memory(device: str):
    """The GPU memory peak (torch's allocated and reserved) of what runs inside, in GiB; empty on a CPU."""
    import torch
    found: dict = {}
    if device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
    yield found
    if device.startswith("cuda"):
        found.update(allocated_gib=torch.cuda.max_memory_allocated() / 1024**3,
                     reserved_gib=torch.cuda.max_memory_reserved() / 1024**3)


def _pipeline(args, engine, configs, out_dir: Path, context: dict, timeline: ProcessTimeline) -> None:
    from . import pipeline
    args.image = args.image or [str(pipeline.DEFAULT_IMAGE)]
    request = request_from_args(args, engine.spec.default_steps)
    loads = engine.load_count
    with peak_memory(engine.device) as load_peak:
        engine.load(configs[0])  # before the first cold run: loading is no configuration's cost, in time or memory
    chained = engine.load_count == loads  # chained with --then: an earlier run of this process built the weights
    if chained:                             # and edited with them (the runs share the level)
        load_peak = {}
    context.update(load_peak_gib=load_peak.get("allocated_gib"), load_peak_reserved_gib=load_peak.get("reserved_gib"),
                   placement=engine.placement(configs[0]).describe())
    timeline.mark("weights built")

    def on_row(row):
        timeline.mark(row["config"])
        print(f"{row['config']}: {row['s_per_step']:.3f} s/step, {row['end_to_end_s']:.2f} s end to end", flush=True)
    cold_rows_after = None
    if args.repeats == 0:  # the cold rows' figures: the libraries set up before them
        cold_rows_after = ("the edits of the process's earlier run" if chained
                           else pipeline.set_up_libraries(engine, request, configs[0]))
    context.update(step_cache_threshold_override=args.step_cache_threshold, cold_rows_after=cold_rows_after)
    baseline = None
    if args.baseline_from:
        baseline = pipeline.earlier_baseline(Path(args.baseline_from), request, args.repeats, start_of(args))
        context.update(baseline_from=Path(args.baseline_from).name)
    engine.step_cache_threshold = args.step_cache_threshold
    rows = pipeline.run_bench(engine, request, configs, args.repeats, args.one_at_a_time, on_row, baseline)
    context.update(steps=request.steps, cfg_scale=request.cfg_scale, size=list(rows[0]["image"].size),
                   repeats=args.repeats, start=start_of(args))
    pipeline.write_outputs(rows, out_dir, args.title or f"GhostEdit bench: {engine.spec.source} on {engine.device}",
                           context)
    print(pipeline.table(rows))
    print(f"wrote {out_dir}/table.md, results.json, chart.png")
