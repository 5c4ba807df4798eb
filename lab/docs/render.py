"""The measured-figure blocks of README.md, docs/benchmarks.md and lab/LOG.md, generated from the committed bench
results (docs/benchmarks/<part>/results.json and the experiments' results under lab/results/), each with its device,
torch, date and command; and the figures the app reads at run time (ghostedit/data/figures.json). `python -m lab.docs`
rewrites the blocks and the package data after a bench run; tests/unit/bench/test_figures.py fails when a block or the
package data differs from what the results say or when a figure appears outside a block."""
from __future__ import annotations

import bisect
import functools
import gzip
import json
import re
import subprocess
import sys
from pathlib import Path

from ghostedit import figures
from ghostedit.bench.latency import OUTSIDE_COLUMNS
from ghostedit.bench.output import markdown_table
from ghostedit.config import OptimizationConfig
from ghostedit.models import FULL_SIZE_PARAMETERS
from ghostedit.optimize import registry
from ghostedit.optimize.presets import PRESETS
from ghostedit.ui.start_timeline import page_start_words
from ghostedit.telemetry import STAGE_ORDER

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "docs" / "benchmarks"   # the current figures' results: what the product's pages and the app read
LAB = ROOT / "lab" / "results"           # the experiments' results: what lab/LOG.md reads
FILES = (ROOT / "README.md", ROOT / "docs" / "benchmarks.md", ROOT / "lab" / "LOG.md")
PACKAGE_DATA = ROOT / "ghostedit" / figures.PACKAGE_DATA  # what the app reads at run time
BLOCK = re.compile(r"(<!-- figures: (?P<name>[\w-]+) -->\n)(?P<body>.*?)(<!-- /figures -->)", re.S)
# The GPU script's phase that wrote each part (scripts/gpu/bench.sh)
PHASES = {"dit": "dit", "ready-never-compiled": "ready", "ready-package-only": "ready", "ready-restart": "ready",
          "e2e-4": "e2e", "e2e-40": "e2e", "e2e-4-stock": "e2e", "e2e-40-stock": "e2e", "card-24": "cards",
          "card-48": "cards", "card-full": "all", "lora-switch": "lora-switch", "latency-4": "latency",
          "latency-40": "latency", "latency-restart": "latency", "e2e-4-plain": "mask", "e2e-4-mask": "mask"}
READY = {"ready-never-compiled": "a process that never compiled it (empty compile cache, no package)",
         "ready-package-only": "a new machine given its package (`ghostedit compiled install`)",
         "ready-restart": "a restarted process (compile cache on disk)"}



@functools.cache
def results(part: str) -> dict:
    """The committed results.json of a bench part: a folder under docs/benchmarks/ or under lab/results/."""
    return json.loads(located(f"{part}/results.json").read_text())


def located(path: str) -> Path:
    """A file or folder of the committed results: under docs/benchmarks/ (the current figures) or lab/results/ (the
    experiments), never both."""
    found = [root / path for root in (RESULTS, LAB) if (root / path).exists()]
    if len(found) != 1:
        raise FileNotFoundError(f"{path} is in {len(found)} of docs/benchmarks/ and lab/results/")
    return found[0]

def _ran_on(environment: dict, committed: Path | None = None) -> str:
    """Where and when a result was measured, in words: the GPU, torch and the date (with `committed`, the day that
    results file was committed, for probes whose output carries no date)."""
    when = f"committed {_committed_on(committed)}" if committed else environment["date"]
    # the host CPU, where a result names it (newer ones do): imports and a first use's compile run on it
    host = f" on {environment['cpu']} ({environment['cpu_cores']} cores)" if "cpu_cores" in environment else ""
    return f"{environment['gpu']}{host}, torch {environment['torch']}, {when}"


def source(part: str) -> str:
    """Where, when and by which command a current figure's part was measured (best-fa3's runs under fa3-fp8/ are
    bench.sh's with BEST=best-fa3)."""
    environment = results(part)["environment"]
    preset = "BEST=best-fa3 " if part.startswith(f"{FA3}/") else ""
    return (f"{_ran_on(environment)}, "
            f"`{preset}scripts/gpu/bench.sh {PHASES[Path(part).name]}` (`docs/benchmarks/{part}/`)")


def name(row: dict) -> str:
    """"stock" and the presets' names ("best", ...) for the named configurations, "best + <label>" for one of them
    with more toggles, the configuration's label otherwise. A DiT forward's row (the DiT-level bench) is named by
    its DiT settings alone: the encoders' settings take no part in it."""
    dit_level = "ms_per_forward" in row

    def settings_of(text: str) -> str:
        return _dit_of(text) if dit_level else OptimizationConfig.parse(text).text
    text = settings_of(row["text"])
    named = {OptimizationConfig().text: "stock", **{settings_of(preset): preset for preset in PRESETS}}
    if text in named:
        return named[text]
    for preset in PRESETS:
        for settings, called in ((settings_of(preset), preset), (_dit_of(preset), f"{preset}'s DiT")):
            if OptimizationConfig.parse(text) == OptimizationConfig.parse(settings):
                return called
            added = _added_to(text, settings)
            if added:
                return f"{called} + {' + '.join(added)}"
            changed = _rewrites_changed(text, settings)
            if changed:
                return f"{called} {changed}"
    return row["config"]


def _named_rows(part: str) -> dict[str, dict]:
    """A part's rows by their configuration's name (name())."""
    return {name(row): row for row in results(part)["rows"]}


def _named_shape_rows(part: str) -> dict[tuple[str, str], dict]:
    """A DiT-level part's rows by (configuration's name, shape)."""
    return {(name(row), row["shape"]): row for row in results(part)["rows"]}


def _dit_of(preset: str) -> str:
    """`preset` (a name or a configuration's text) with the text encoder and VAE as released: what a DiT forward of
    it runs (and what the preset was before it set the encoders' toggles)."""
    config = OptimizationConfig.parse(preset)
    return config.replace(**{toggle.name: toggle.default for toggle in registry.singles()
                             if toggle.component != "dit"}).text


def _added_to(text: str, preset: str) -> list[str]:
    """The label parts of the toggles a configuration sets that `preset` leaves at their defaults, when it keeps
    every setting of the preset; none otherwise."""
    config, named = OptimizationConfig.parse(text), OptimizationConfig.parse(preset)
    added = []
    for toggle in registry.toggles():
        value, preset_value = config.value(toggle.name), named.value(toggle.name)
        if value == preset_value:
            continue
        if preset_value != toggle.default:
            return []
        added.append(toggle.label_part(value))
    return added


def _rewrites_changed(text: str, preset: str) -> str:
    """How a configuration without LoRAs that is otherwise the preset differs from it in its rewrites (a result
    measured before the preset changed them, or an A/B of one), in words: at most four left out and one added;
    "" otherwise."""
    if "lora=" in text:
        return ""
    config, named = OptimizationConfig.parse(text).settings(), OptimizationConfig.parse(preset).settings()
    rewrites, preset_rewrites = set(config.pop("rewrites")), set(named.pop("rewrites"))
    left_out, added = sorted(preset_rewrites - rewrites), sorted(rewrites - preset_rewrites)
    if config != named or not left_out or len(left_out) > 4 or len(added) > 1:
        return ""
    words = "without " + (f"{', '.join(left_out[:-1])} and {left_out[-1]}" if len(left_out) > 1 else left_out[0])
    return f"{words}, with {added[0]}" if added else words


def _with_and_without(rows: list[dict], rewrite: str) -> tuple[dict, dict]:
    """An A/B's two rows: the one whose configuration has `rewrite`, the one without it."""
    has = {rewrite in OptimizationConfig.parse(row["text"]).flags("rewrites"): row for row in rows}
    return has[True], has[False]


def clocks(rows: list[dict]) -> str:
    """A sentence on the GPU's clock while the rows were timed (telemetry.ClockSampler), "" for results without it:
    the power limit lowers an H100's clock, and figures of one configuration differ with it."""
    found = [row["gpu_clock"] for row in rows if row.get("gpu_clock")]
    if not found:
        return ""
    medians = sorted(clock["sm_clock_mhz"] for clock in found)
    capped = sorted(clock["power_capped_share"] * 100 for clock in found)
    thermal = max(clock["thermal_share"] for clock in found) * 100
    return (f" While timed, the GPU's SM clock (NVML, sampled every {found[0]['interval_s'] * 1000:.0f} ms while the "
            f"GPU was busy) had medians of {_span(medians)} MHz over the rows, against the card's highest "
            f"{found[0]['sm_clock_max_mhz']:.0f} MHz; the power limit held it back in {_span(capped)} percent of the "
            f"samples, heat in at most {thermal:.0f} percent.")


def _span(values: list[float]) -> str:
    """"a-b" for sorted values, one number when they are all the same."""
    return f"{values[0]:.0f}" if f"{values[0]:.0f}" == f"{values[-1]:.0f}" else f"{values[0]:.0f}-{values[-1]:.0f}"


def dit_shapes() -> str:
    found = results("dit")
    rows = []
    for shape in dict.fromkeys(row["shape"] for row in found["rows"]):
        by = {name(row): row for row in found["rows"] if row["shape"] == shape}
        rows.append({"shape": shape, "tokens": by["stock"]["sequence"], "stock": by["stock"]["ms_per_forward"],
                     "best": by["best"]["ms_per_forward"], "exact": by["exact"]["ms_per_forward"],
                     "best x": by["best"]["speedup"], "exact x": by["exact"]["speedup"],
                     "best error": by["best"]["rel_error"], "exact error": by["exact"]["rel_error"]})
    table = markdown_table(rows, {"shape": "shape", "tokens": "image + text tokens", "stock": "stock ms",
                                  "best": "best ms", "exact": "exact ms", "best x": "best speedup",
                                  "exact x": "exact speedup", "best error": "best rel. error",
                                  "exact error": "exact rel. error"})
    experiments = found["experiments"]
    outside = experiments["forward_ms"] - experiments["block_loop_ms"]
    what = "the uncompiled embeddings and output layer, and the forward's start before its first kernel"
    share = (f"{outside:.1f} ms of it outside the blocks ({what})" if outside > 0 else
             f"no longer than its blocks: what lies outside them ({what}) is within the spread of the two medians")
    loop = (f"the transformer blocks {experiments['block_loop_ms']:.1f} ms as a Python loop; the whole forward "
            f"{experiments['forward_ms']:.1f} ms, {share}")
    return (f"One DiT forward, {found['text_tokens']} text tokens, median of {found['repeats']} after warm-up, all "
            f"shapes in one process (shapes after the first reuse the compiled code with dynamic shapes). "
            f"Measured on {source('dit')}.{clocks(found['rows'])}\n\n{table}\n\nAt {experiments['shape']} on "
            f"{name(experiments)}: true CFG's two forwards {experiments['cfg_two_forwards_ms']:.1f} ms, batched into one "
            f"{experiments['cfg_batched_ms']:.1f} ms ({experiments['cfg_batching_gain']:.2f}x); {loop}.\n")


def _ready_rows(folder: str = "") -> list[dict]:
    """The ready phase's three rows (READY's order), from `lab/results/<folder>/<part>/` (the table's without a
    folder: docs/benchmarks/<part>/)."""
    return [results(f"{folder}/{part}" if folder else part)["rows"][0] for part in READY]


def ready() -> str:
    timed = _ready_rows()
    rows = [{"process": what, "prepare": row["prepare_s"], "compile": row["prepare_steps_s"]["compile"],
             "first": row["first_call_s"], "ready": row["prepare_s"] + row["first_call_s"], "ms": row["ms_per_forward"]}
            for what, row in zip(READY.values(), timed)]
    table = markdown_table(rows, {"process": "the best configuration's first use in", "prepare": "prepare s",
                                  "compile": "of it the compile step s", "first": "first forward s (compile)",
                                  "ready": "ready s", "ms": "ms / forward"})
    return f"One DiT forward at 1024x1024. Measured on {source('ready-restart')}.{clocks(timed)}\n\n{table}\n"


def _ready_runs(folder: str) -> str:
    """The ready phase's three rows in `lab/results/<folder>/`, in words."""
    return ", ".join(f"{what.split(' (')[0]} {row['prepare_s'] + row['first_call_s']:.2f} s (prepare "
                     f"{row['prepare_s']:.2f} s, first forward {row['first_call_s']:.2f} s)"
                     for what, row in zip(READY.values(), _ready_rows(folder)))


def _ready_source(folder: str) -> str:
    """Where and when the ready phase in `lab/results/<folder>/` ran, and the folder, in words."""
    return f"{_ran_on(results(f'{folder}/ready-restart')['environment'])}, `lab/results/{folder}/`"


def _copy_steps(folders: list[str]) -> str:
    """The preparation's copy step over every process of the ready phases in `lab/results/<folder>/`, as a range
    of seconds."""
    copies = [row["prepare_steps_s"]["copy"] for folder in folders for row in _ready_rows(folder)]
    return f"{min(copies):.2f}-{max(copies):.2f}"


COLD_REPEATS = "ready-cold-repeats"


def _cold_repeats() -> str:
    """Never-compiled processes of one code one after another on one machine (lab/results/ready-cold-repeats/),
    in words."""
    in_run_order = sorted((LAB / COLD_REPEATS).iterdir(), key=lambda run: int(run.name.removeprefix("cold-")))
    processes = [results(f"{COLD_REPEATS}/{run.name}") for run in in_run_order]
    ready_s = ", ".join(f"{row['prepare_s'] + row['first_call_s']:.2f} s" for row in
                        (process["rows"][0] for process in processes))
    return (f"This code's first use in {len(processes)} processes that never compiled it, one after another on a "
            f"third machine, each emptying the compile caches as the table's first row does (`ghostedit bench "
            f"--level dit --repeats 3 --configs best` each, the processes `scripts/gpu/bench.sh cold` runs, "
            f"{_ran_on(processes[0]['environment'])}, `lab/results/{COLD_REPEATS}/`): ready in {ready_s}.")


def ready_again() -> str:
    """Section 2: the ready phase again on the table's code and machine, the last stop's two runs on its code (before
    the preparation's copy module by module and the objects frozen at load) with the copy step of each, and this
    code's never-compiled first use repeated on another machine."""
    last_stop = [("earlier/ready-474149d", "its table"), ("earlier/ready-again-474149d", "the same machine's next run")]
    runs = "; ".join(f"{words} ({_ready_source(folder)}): {_ready_runs(folder)}" for folder, words in last_stop)
    return (f"The same phase again on the same machine, after the table's run ({_ready_source('ready-again')}): "
            f"{_ready_runs('ready-again')}. The last stop's code (474149d, the blocks' one torch.compile): {runs}. "
            f"The preparation's copy of the base DiT took {_copy_steps(['', 'ready-again'])} s in the six processes of "
            f"this code, {_copy_steps([folder for folder, _ in last_stop])} s in the last stop's. {_cold_repeats()}\n")


def _compile_time_s(first_call: dict, step: str) -> float:
    """One step's seconds in Dynamo's compile-time table of a first call (profile_first_call.py)."""
    line = next(line for line in first_call["dynamo_compile_times"].splitlines() if line.startswith(f"{step} "))
    return float(line.split()[-1])


def _inductor_codegen_s(first_call: dict) -> float:
    """Inductor's code generation in a first call."""
    return _compile_time_s(first_call, "GraphLowering.codegen")


RESTART_AB = "restart-ab"
# Each A/B's folder under lab/results/restart-ab/: what it compared, and its variants' folders in words
RESTART_VARIANTS = {
    "whole-forward-graph": ("before and after the whole forward's graph", {
        "old": "block loop's graph (5841561)", "new": "whole forward's graph (0fc9dcd)"}),
    "static-or-dynamic": ("all dynamic or static (0fc9dcd)", {
        "true": "every dimension dynamic", "none": "static, made dynamic when one changes"}),
    "token-dims": ("token dimensions (c2c77cb)", {
        "tokens": "token dimensions dynamic", "true": "every dimension dynamic",
        "none": "static, made dynamic when one changes"}),
    "compile-keys": ("compile keys (42d898b)", {
        "early": "keys hashed as preparation begins", "late": "keys hashed at the first compile"}),
    "gc-freeze": ("objects alive once the DiT is built left out of collections (3ccb9b3)", {
        "off": "collected as usual", "on": "gc.freeze() after building"}),
}


def _first_call_rows(folder: str, variants: dict, labels, columns) -> list[dict]:
    """One row per profile_first_call.py output of each A/B's variants under `lab/results/<folder>/` (`variants`:
    {A/B folder: (what it compared, {variant folder: words})}), for the labels `labels(calls)` picks in order, with
    `columns(call)`."""
    rows = []
    for ab, (compared, named) in variants.items():
        for variant, words in named.items():
            calls = _first_calls(f"{folder}/{ab}/{variant}")
            rows += [{"ab": compared, "variant": words, "process": label, **columns(calls[label])}
                     for label in labels(calls)]
    return rows


def _collections_s(first_call: dict) -> str:
    """The garbage collector's pauses in a first forward, where the probe recorded them (since 3ccb9b3)."""
    pauses = first_call.get("gc_pauses")
    return f"{sum(pauses['first_call']['seconds']):.3f}" if pauses else ""


def _probe_ran_on(folder: str) -> str:
    """Where and when the profile_first_call.py outputs under `lab/results/<folder>/` were measured."""
    first = next((LAB / folder).rglob("first-call-*.json"))
    return _ran_on(json.loads(first.read_text()), committed=first)


def restart_ab() -> str:
    """Section 2: the restart's first forward A/B'd (profile_first_call.py restart, the variants in processes of
    their own, alternating, each A/B on one machine after one cold process per variant)."""
    rows = _first_call_rows(RESTART_AB, RESTART_VARIANTS,
                            lambda calls: sorted(label for label in calls if label.startswith("restart")),
                            lambda call: {"first": call["first_call_s"],
                                          "trace": _compile_time_s(call, "bytecode_tracing"),
                                          "compiler": _compile_time_s(call, "OutputGraph.call_user_compiler"),
                                          "collections": _collections_s(call)})
    table = markdown_table(rows, {"ab": "A/B", "variant": "variant", "process": "process",
                                  "first": "first forward s", "trace": "of it Dynamo's trace s",
                                  "compiler": "of it the compile cache's lookups and loads s",
                                  "collections": "of it garbage collections s"})
    return (f"A restarted process's first forward of best at 1024x1024 (`lab/probes/profile_first_call.py restart`, "
            f"variants in processes of their own, alternating, each A/B on one machine, "
            f"{_probe_ran_on(f'{RESTART_AB}/compile-keys')}, `lab/results/{RESTART_AB}/`):\n\n{table}\n")


HEAD_START = "head-start"
# The compile head start's A/Bs under lab/results/head-start/ (its code: c5e6cf6, taken out in 51b6323): what
# each compared, and its variants' folders in words
HEAD_START_VARIANTS = {
    "on-off": ("head start off and on", {"off": "off", "on": "on"}),
    "switch-interval": ("Python's switch interval", {"off": "head start off", "switch-0.5ms": "on, switch 0.5 ms",
                                                     "switch-0.1ms": "on, switch 0.1 ms"}),
}


def head_start() -> str:
    """Section 2: the compile head start (c5e6cf6) A/B'd with scripts/gpu/head_start_ab.sh, and the ready phase and
    the 24 GiB card run on its code."""
    rows = _first_call_rows(HEAD_START, HEAD_START_VARIANTS,
                            lambda calls: sorted(calls, key=lambda label: (label != "cold", label)),
                            lambda call: {"prepare": call["prepare_s"],
                                          "quantize": call["prepare_stages_s"]["quantize"],
                                          "first": call["first_call_s"],
                                          "ready": call["prepare_s"] + call["first_call_s"]})
    table = markdown_table(rows, {"ab": "A/B", "variant": "variant", "process": "process", "prepare": "prepare s",
                                  "quantize": "of it quantizing s", "first": "first forward s", "ready": "ready s"})
    runs = "; ".join(f"{_ready_source(folder)}: {_ready_runs(folder)}"
                     for folder in ("earlier/ready-head-start-1", "earlier/ready-head-start-2"))
    card = results("earlier/cards-head-start/card-24")["rows"][0]
    return (f"The best configuration's first use at 1024x1024 with the compile head start (c5e6cf6) and without "
            f"(`scripts/gpu/head_start_ab.sh` of that commit, processes of their own, each A/B on one machine: a "
            f"process that never compiled per variant, the variant without first, then restarts alternating; "
            f"{_probe_ran_on(f'{HEAD_START}/on-off')}, `lab/results/{HEAD_START}/`):\n\n"
            f"{table}\n\nThe ready phase on its code (`scripts/gpu/bench.sh ready`), on two machines: {runs}. The "
            f"24 GiB card's edit on its code peaked at {card['peak_gib']:.2f} GiB "
            f"(`lab/results/earlier/cards-head-start/`).\n")


def multi_kernel() -> str:
    """Section 2: what inductor-multi-kernel costs a never-compiled first call and gains a forward, each measured
    both ways (lab/results/multi-kernel/)."""
    found = results("multi-kernel")
    with_it, without = _with_and_without(found["rows"], "inductor-multi-kernel")
    calls = _first_calls("multi-kernel")
    cold = {label: calls[f"cold-{label}"] for label in ("best", "without-multi-kernel")}
    environment = found["environment"]
    return (f"Inductor's multi-kernel (`inductor-multi-kernel`, in best until `inductor-persistent-rows` replaced it) "
            f"on {name(with_it)} at 1024x1024 on "
            f"{_ran_on(environment)}: the first forward of a "
            f"process that never compiled took {cold['best']['first_call_s']:.1f} s with it and "
            f"{cold['without-multi-kernel']['first_call_s']:.1f} s without (`lab/probes/profile_first_call.py "
            f"cold`, empty compile caches each; Inductor's code "
            f"generation {_inductor_codegen_s(cold['best']):.1f} s against "
            f"{_inductor_codegen_s(cold['without-multi-kernel']):.1f}); in one process (`{environment['command']}`, "
            f"`lab/results/multi-kernel/`) the forward took {with_it['ms_per_forward']:.1f} ms with it and "
            f"{without['ms_per_forward']:.1f} ms without "
            f"({without['ms_per_forward'] / with_it['ms_per_forward']:.3f}x).\n")


def _first_calls(folder: str) -> dict[str, dict]:
    """The profile_first_call.py outputs in `lab/results/<folder>/`, by label."""
    return {path.stem.removeprefix("first-call-"): json.loads(path.read_text())
            for path in (LAB / folder).glob("first-call-*.json")}


def _label_named(label: str) -> str:
    """A probe's configuration, which it records by its label: "best" or "exact" where it is one of them."""
    return next((preset for preset in ("best", "exact") if OptimizationConfig.parse(preset).label == label), label)


def persistent_rows() -> str:
    """Section 2: inductor-persistent-rows against inductor-multi-kernel (best before it), the first call cold and
    after a restart (profile_first_call.py) and the forward (alternate.sh); and the compile workers started before
    preparing against when torch starts them, cold and after a restart."""
    calls, pool = _first_calls("persistent-rows/first-call"), _first_calls("persistent-rows/warm-pool")
    restarts = _first_calls("early-workers")

    def restarted(when: str) -> str:
        return " s and ".join(f"{restarts[f'restart-{when}-{turn}']['first_call_s']:.2f}" for turn in (1, 2)) + " s"

    def reductions(label: str) -> str:
        kinds = calls[label]["generated_reductions"]
        return f"{kinds['persistent']} persistent and {kinds['looped']} looped"
    return (f"The first forward of a process that never compiled (`lab/probes/profile_first_call.py cold`, empty "
            f"compile caches each, the compile workers started as preparation begins; "
            f"`lab/results/persistent-rows/first-call/`): {calls['cold-best']['first_call_s']:.1f} s with "
            f"inductor-multi-kernel, {calls['cold-rows']['first_call_s']:.1f} s with inductor-persistent-rows "
            f"(reduction kernels generated: {reductions('cold-best')}, against {reductions('cold-rows')}); after a "
            f"restart {calls['restart-best-2']['first_call_s']:.1f} s and {calls['restart-rows-2']['first_call_s']:.1f}"
            f" s. Before the workers started with preparation, in a process of the same configuration that never "
            f"compiled (`lab/results/persistent-rows/warm-pool/`): {pool['cold-rows']['first_call_s']:.1f} s "
            f"with the workers started by torch, {pool['cold-rows-warm-pool']['first_call_s']:.1f} s with them "
            f"started before preparing (the probe's `--warm-pool` flag in commit 37bd46b; the engine's start replaced "
            f"it). After a restart, in turns on one machine after one process that never compiled "
            f"(`lab/results/early-workers/`, {_label_named(restarts['cold']['config'])}): the first forward took "
            f"{restarted('early')} with the workers started as preparation begins, {restarted('late')} with them "
            f"started by torch at the first compile (the probe's `--workers-at-first-compile`). "
            f"{_alternating('persistent-rows/alternating')}.\n")


def end_to_end() -> str:
    parts = []
    for part in ("e2e-4", "e2e-40"):
        found = results(part)
        rows = [{"configuration": name(row), "step": row["s_per_step"], "total": row["end_to_end_s"],
                 **{stage: row["stages_s"].get(stage) for stage in ("text encoding", "image encoding", "decoding")},
                 "speedup": row["speedup_e2e"], "psnr": row["psnr_db"], "warmup": row["warmup_s"],
                 "peak": row["peak_gib"]} for row in found["rows"]]
        table = markdown_table(rows, {"configuration": "configuration", "step": "s / step", "total": "end to end s",
                                      "text encoding": "text encoding s", "image encoding": "image encoding s",
                                      "decoding": "decoding s", "speedup": "speedup", "psnr": "PSNR dB vs stock",
                                      "warmup": "first-use compile s (apart)", "peak": "peak GiB"})
        side = found["size"][0]
        runs = (f"median of {found['repeats']} after warm-up" if found["repeats"] else
                f"one cold run each (preparation and compile warm-up apart), after {found['cold_rows_after']}, "
                "which set up the libraries")
        processes = (f" Stock's row in a process of its own (`docs/benchmarks/{found['baseline_from']}/`), the "
                     "others one after another in another process, each stage a median of the edits too; stock's "
                     "image is the PSNR column's reference." if found.get("baseline_from") else "")
        parts.append(f"{side}x{side}, {found['steps']} steps, CFG {found['cfg_scale']:g}, {runs}. Measured on "
                     f"{source(part)}.{processes}{clocks(found['rows'])}\n\n{table}\n")
    return "\n".join(parts)


# The parts `bench.sh speed` writes, whose processes' walls together must fit one device call (issue 17's done-when)
# (the ready phase's processes of the last whole-table run are kept in speed-ready/ when a ready run on later code
# replaced the table's ready rows)
SPEED_PARTS = ("dit", "speed-ready/ready-never-compiled", "speed-ready/ready-package-only",
               "speed-ready/ready-restart", "e2e-4-stock", "e2e-40-stock", "e2e-4", "e2e-40")
DEVICE_CALL_S = 600
PROCESS_WALL = re.compile(r"^== [\w-]+: process wall (\d+) s", re.M)


def process_wall(part: str) -> int:
    """The wall seconds bench.sh logged around the process that wrote `part` first (its folder keeps the log)."""
    return int(PROCESS_WALL.search(located(f"{part}/{Path(part).name}.log").read_text())[1])


def processes(parts) -> list[list[str]]:
    """`parts` grouped by the process that wrote them (runs chained with --then share one), in order."""
    groups: dict = {}
    for part in parts:
        groups.setdefault(results(part).get("process", {}).get("started", part), []).append(part)
    return list(groups.values())


def process_time() -> str:
    """Where each bench process's wall time goes, from its timeline (bench/timeline.py) and logged wall."""
    rows = []
    for parts in processes(SPEED_PARTS):
        marks = {mark["after"]: mark["s"] for mark in results(parts[0])["process_timeline"]}
        last, wall = results(parts[-1])["process_timeline"][-1]["s"], process_wall(parts[0])
        rows.append({"process": " + ".join(Path(part).name for part in parts), "imports": marks["engine imported"],
                     "checks": marks["configurations checked"] - marks["engine imported"],
                     "weights": marks["weights built"] - marks["configurations checked"],
                     "work": last - marks["weights built"], "exit": wall - last, "wall": wall})
    total = sum(row["wall"] for row in rows)
    rows.append({"process": f"all {len(rows)}", **{key: sum(row[key] for row in rows) for key in rows[0]
                                                   if key != "process"}})
    table = markdown_table(rows, {"process": "process", "imports": "start and imports s",
                                  "checks": "configurations checked s", "weights": "weights built s",
                                  "work": "configurations measured s", "exit": "results written and exit s",
                                  "wall": "process wall s"})
    dates = sorted({results(part)["environment"]["date"] for part in SPEED_PARTS})
    devices = sorted({results(part)["environment"]["gpu"] for part in SPEED_PARTS})
    return (f"The processes of `scripts/gpu/bench.sh speed`, each from its timeline and its logged wall, on "
            f"{', '.join(devices)}, {', '.join(dates)}: together {total} s against the {DEVICE_CALL_S} s of one device "
            f"call.\n\n{table}\n")


def step_cache() -> str:
    """The lossy step cache at 40 steps: its speed-up and its image against the same configuration without it."""
    found = results("e2e-40")
    cached = [row for row in found["rows"] if "cache_threshold" in row]
    rows = [{"configuration": name(row), "threshold": row["cache_threshold"],
             "computed": f"{row['forwards_computed']} of {row['step_cache']['forwards']}",
             "computed step": row["computed_step_s"], "served step": row["served_step_s"],
             "total": row["end_to_end_s"], "speedup": row["cache_speedup_e2e"], "psnr": row["cache_psnr_db"],
             "ssim": row["cache_ssim"]} for row in cached]
    table = markdown_table(rows, {"configuration": "configuration", "threshold": "threshold run",
                                  "computed": "DiT forwards computed", "computed step": "computed step s",
                                  "served step": "served step s", "total": "end to end s",
                                  "speedup": "speedup vs without", "psnr": "PSNR dB vs without",
                                  "ssim": "SSIM vs without"})
    note = cached[0]["cache_quality_note"]
    return (f"First-Block Cache (lossy) on the 40-step run above, against the same configuration without it. "
            f"Measured on {source('e2e-40')}.\n\n{table}\n\nThe threshold run is what `--step-cache-threshold` "
            f"set: {note}.\n")


def memory() -> str:
    full = results("card-full")
    rows = [{"configuration": name(row), "step": row["s_per_step"], "peak": row["peak_gib"],
             "reserved": row["peak_reserved_gib"], "dit": row["placement"]["dit"]} for row in full["rows"]]
    table = markdown_table(rows, {"configuration": "configuration (as the page offers it)", "step": "s / step",
                                  "peak": "peak GiB allocated", "reserved": "peak GiB reserved",
                                  "dit": "base DiT lives in"})
    cards = []
    for part in ("card-48", "card-24"):
        found = results(part)
        row = found["rows"][0]
        cards.append({"card": f"{found['gpu_memory_gib']:g} GiB (emulated)", "configuration": name(row),
                      "load": found["load_peak_gib"], "peak": row["peak_gib"], "step": row["s_per_step"],
                      "text encoder": found["placement"]["text_encoder"]["where"]})
    cards_table = markdown_table(cards, {"card": "card", "configuration": "configuration", "load": "load peak GiB",
                                         "peak": "edit peak GiB", "step": "s / step",
                                         "text encoder": "text encoder lives in"})
    return (f"The full-size model at 1024x1024, {full['steps']} steps, CFG {full['cfg_scale']:g}: every "
            f"configuration the page offers, one after another in one process on the whole card (memory mode "
            f"auto). Measured on {source('card-full')}.\n\n{table}\n\nOn smaller cards (configuration in the table), "
            f"emulated with `--gpu-memory` (`torch.cuda.set_per_process_memory_fraction`), 4 steps, CFG 1. Measured "
            f"on {_cards_source()}.\n\n{cards_table}\n")


def _cards_source() -> str:
    """Where, when and by which command the smaller cards were measured: one sentence where both ran in one run."""
    ran_on = {_ran_on(results(part)["environment"]) for part in ("card-48", "card-24")}
    if len(ran_on) > 1:
        return "; ".join(source(part) for part in ("card-48", "card-24"))
    return f"{ran_on.pop()}, `scripts/gpu/bench.sh cards` (`docs/benchmarks/card-48/`, `docs/benchmarks/card-24/`)"


def gpu_needs() -> str:
    """README's "what your GPU needs": GPU memory per configuration and card (the committed card runs), the host
    memory the weights placed there take and the disk the weights take (both from the model's parameter counts),
    and the CUDA build and driver the runs used."""
    weights = {name: count * 2 / 2**30 for name, count in FULL_SIZE_PARAMETERS.items()}  # bf16: 2 bytes
    full = results("card-full")

    def host(placement: dict) -> float:
        """GiB of the components a run placed in host memory (a placement's values: where, or {"where", "why"})."""
        where = {name: value["where"] if isinstance(value, dict) else value for name, value in placement.items()}
        return sum(weights[name] for name, place in where.items() if "host" in place)

    card = f"{full['environment']['gpu']} (whole card)"
    rows = [{"card": card, "configuration": name(row), "peak": row["peak_gib"], "reserved": row["peak_reserved_gib"],
             "dit": row["placement"]["dit"], "host": host(row["placement"]), "step": row["s_per_step"]}
            for row in full["rows"]]
    for found in (results("card-48"), results("card-24")):
        row = found["rows"][0]
        rows.append({"card": f"{found['gpu_memory_gib']:g} GiB (emulated)", "configuration": name(row),
                     "peak": max(row["peak_gib"], found["load_peak_gib"]), "reserved": row["peak_reserved_gib"],
                     "dit": found["placement"]["dit"]["where"], "host": host(found["placement"]),
                     "step": row["s_per_step"]})
    table = markdown_table(rows, {"card": "card", "configuration": "configuration",
                                  "peak": "GPU memory, peak GiB", "reserved": "reserved GiB",
                                  "dit": "base DiT lives in", "host": "host RAM for weights GiB",
                                  "step": "s / step"})
    environment = full["environment"]
    driver = (f"driver {environment['driver']}" if environment.get("driver")
              else "the driver's version was not recorded by these runs")
    return (f"Qwen-Image-Edit, -2509 and -2511 share one architecture; these runs measured the full-size model with "
            f"random weights (`--model synthetic`) at 1024x1024, {full['steps']} steps CFG {full['cfg_scale']:g} on "
            f"the whole card, 4 steps CFG 1 on the smaller ones, on {source('card-full')} and {source('card-24')}. "
            f"Host RAM and disk are the bf16 weights' sizes from the model's parameter counts "
            f"(`ghostedit/models/__init__.py`).\n\n{table}\n\n"
            f"Disk: {sum(weights.values()):.1f} GiB of weights (transformer {weights['dit']:.1f}, text encoder "
            f"{weights['text_encoder']:.1f}, VAE {weights['vae']:.2f}). Driver: one that runs CUDA "
            f"{environment['cuda']} (torch {environment['torch']}); {driver}.\n")


def lora_switch() -> str:
    found = results("lora-switch")
    rows = [{"switch": row["switch"], "seconds": row["switch_s"], "frames": row["new_compiled_frames"]}
            for row in found["rows"]]
    table = markdown_table(rows, {"switch": "fused LoRA switch", "seconds": "s", "frames": "recompiled frames"})
    runtime = found["runtime_scale"]
    return (f"The configuration {name(found)} at 1024x1024, LoRAs of rank {found['rank']} on {found['layers']} layers, "
            f"fused in place into the compiled FP8 DiT. Measured on {source('lora-switch')}.\n\n{table}\n\n"
            f"A runtime LoRA's scale, on {runtime['config']} (without the rewrites that refuse runtime LoRAs): set in "
            f"{runtime['set_scales_s']:.3f} s with "
            f"{runtime['new_compiled_frames']} recompiled frames.\n")


LATENCY_PARTS = ("latency-4", "latency-40", "latency-restart")


def latency() -> str:
    """Issue 44: what a person waits for through the app (bench/latency.py): each case's client wait beside the
    engine's total and where the difference goes (outside the handler in parts, where the run recorded them), and
    the first edit after start, on a machine that never compiled its configuration and on the next start on the
    same machine (python app.py again): the app's start step by step (where the run recorded it) and the start-up
    warm-up's stages."""
    summaries = [(part, line) for part in LATENCY_PARTS for line in results(part)["summary"]]
    rows = [{"run": part, "case": f"{name(line) if line['text'] is not None else line['config']}: {line['kind']}",
             **{key: line.get(key) for key in ("calls", "client_s", "engine_s", "gap_s", "handler_outside_engine_s",
                                                "outside_handler_s", *LATENCY_OUTSIDE)}}
            for part, line in summaries]
    table = markdown_table(rows, {"run": "run", "case": "case", "calls": "calls", "client_s": "client waits s",
                                  "engine_s": "engine total s", "gap_s": "difference s",
                                  "handler_outside_engine_s": "app's handler outside the engine s",
                                  "outside_handler_s": "Gradio, transport and client s"})
    parts = [row for row in rows if row["client_download_s"] is not None]
    if parts:  # the runs that split it
        table += ("\n\nOutside the handler, in parts (Gradio after the handler: its postprocessing per update; "
                  "\"client with one SSL context\" (and in earlier runs \"client with ssl_verify=False\"): "
                  "gradio_client without its TLS set-up per request, the first still checking certificates):\n\n"
                  + markdown_table(parts, {"run": "run", "case": "case", "outside_handler_s": "outside the handler s",
                                           **LATENCY_OUTSIDE}))
    first = []
    for part, words in (("latency-4", "on a machine that never compiled it"),
                        ("latency-restart", "on the next start on the same machine (`python app.py` again: the compiled "
                                            "packages, compile caches and bytecode the first start left)")):
        found = results(part)
        row = next(row for row in found["rows"] if row["kind"] == "first edit after start")
        first.append(f"- {words}: the page answered {row['page_up_s']:.1f} s after `ghostedit serve` started, the "
                     f"picture came {row['launch_to_picture_s']:.1f} s after the start; the client waited "
                     f"{row['client_s']:.2f} s for it (engine {row['engine_s']:.2f} s);"
                     + "".join(f" start-up warmed it in {warmed['seconds']:.1f} s ("
                               + ", ".join(f"{stage} {seconds:.2f}" for stage, seconds in warmed["stages_s"].items())
                               + ");" for warmed in found["startup"]["warmed"])
                     + (f" the page's start in the app's own clock: {page_start_words(row['page_start'])}"
                        if "page_start" in row else ""))
    size = results("latency-4")["size"]
    return (f"The full-size synthetic model at {size[0]}x{size[1]}, through the real app and gradio_client (medians "
            f"over the calls; browser edits where chromium was there). Measured on {source('latency-4')}.\n\n"
            f"{table}\n\nThe first {name(results('latency-4')['summary'][0])} edit after start:\n"
            + "\n".join(first) + "\n")


# the parts of "outside the handler s", without the case and their sum
LATENCY_OUTSIDE = {key: words for key, words in OUTSIDE_COLUMNS.items() if key not in ("case", "outside_handler_s")}


def masked() -> str:
    """Issue 42: the best configuration's 4-step edit and the same edit with a mask, one after the other in one
    process: their times, and what the masked edit had to prepare or compile (nothing, when it recompiles nothing)."""
    plain, mask = (results(part)["rows"][0] for part in ("e2e-4-plain", "e2e-4-mask"))
    size = results("e2e-4-plain")["size"]
    masked_with = results("e2e-4-mask")["start"]["mask"]
    return (f"{name(plain)}, {size[0]}x{size[1]}, 4 steps, CFG 1, end to end: {plain['end_to_end_s']:.3f} s plain, "
            f"{mask['end_to_end_s']:.3f} s with the mask `{masked_with}` (denoising {plain['s_per_step']:.3f} and "
            f"{mask['s_per_step']:.3f} s a step); the masked edit, after the plain one, prepared for "
            f"{mask['prepare_s']:.3f} s and compiled for {mask['warmup_s']:.3f} s. Measured on "
            f"{source('e2e-4-plain')}.\n")


def openai_latency() -> str:
    """Issue 42: what the OpenAI-compatible endpoint adds over /edit on the GPU, from the medians
    scripts/gpu/openai_latency.py printed (its per-call results.json did not come back from the device; its
    environment.json is the one latency-4 recorded in the same device call on the same machine)."""
    log = located("openai-latency/openai-latency.log").read_text()
    table = "\n".join(line for line in log.splitlines() if line.startswith("|"))
    said = next(line for line in log.splitlines() if line.startswith("the OpenAI endpoint adds"))
    return (f"The full-size synthetic model, best, 1024x1024, 4 steps, CFG 1, six alternating calls per path after two "
            f"untimed ones, measured on {_ran_on(json.loads(located('openai-latency/environment.json').read_text()))} "
            f"(in the device call of a `latency-4/` run), `python3 scripts/gpu/openai_latency.py --model synthetic --config best --repeats 6` "
            f"(`docs/benchmarks/openai-latency/`): {said.split(';')[0]}.\n\n{table}\n")


QWEN21_PARTS = ("qwen21", "qwen21-2048", "qwen21-2048-4ref", "qwen21-card-24")
QWEN21_COLUMNS = {"end_to_end_s": "end to end s", "first_step_s": "first step s", "cached_step_s": "cached step s",
                  "before_steps_s": "before the steps s", "after_steps_s": "after the steps s",
                  "speedup_cached": "cached step × DiffSynth", "speedup_end_to_end": "end to end × DiffSynth",
                  "tokens_first": "tokens, first step", "tokens_cached": "tokens, cached step",
                  "peak_gib": "peak GiB"}


def qwen21() -> str:
    """Issue 41: Qwen-Image-2.1 (the full-size synthetic model) on DiffSynth's own pipeline and on GhostEdit's, stock
    and fast, case by case: end to end, the first step (which fills the prefix cache) and a cached step, the tokens
    each computes. A case its process did not finish is named, with how the process ended."""
    rows, unfinished = [], []
    measured = [part for part in QWEN21_PARTS if (RESULTS / part / "results.json").exists()]
    unfinished += [f" `{part}` has no results yet (its process did not finish within its device call)."
                   for part in QWEN21_PARTS if part not in measured]
    for part in measured:
        found = results(part)
        card = f"{found['gpu_memory_gib']:g} GiB" if found.get("gpu_memory_gib") else "whole GPU"
        rows += [{"case": row["case"], "card": card, "config": row["config"],
                  **{key: row.get(key) for key in QWEN21_COLUMNS},
                  "error": row.get("error", "").split(":")[0]}  # "out of memory", its detail in results.json
                 for row in found["rows"]]
        done = {row["case"] for row in found["rows"]}
        left = [case for case in _cases_asked(found) if case not in done]
        if left:
            log = located(f"{part}/{part}.log").read_text()
            where = ("DiffSynth's own DiT" if "diffsynth/models/qwen_image_21_dit.py" in log else "GhostEdit's DiT")
            ended = f"ran out of GPU memory in {where}" if "OutOfMemoryError" in log else "ended"
            unfinished.append(f" In `{part}` the process {ended} at {left[0]}"
                              + (f"; {', '.join(left[1:])} never ran." if left[1:] else "."))
    columns = {key: words for key, words in QWEN21_COLUMNS.items()  # the loop's edges: in results that time them
               if key not in ("before_steps_s", "after_steps_s") or any(row[key] is not None for row in rows)}
    table = markdown_table(rows, {"case": "case", "card": "memory", "config": "pipeline and configuration",
                                  **columns, **({"error": "error"} if any(row["error"] for row in rows) else {})})
    commands = "; ".join(f"`{results(part)['environment']['command']}` (`docs/benchmarks/{part}/`)"
                         for part in measured)
    return (f"Measured on {_ran_on(results(measured[0])['environment'])}: {commands}.{''.join(unfinished)}"
            f"\n\n{table}\n")


# lab/results/profile-dit-21-h200/: each folder's run of lab/probes/profile_dit_21.py, in the order they ran (each in
# a device call of its own, on machines of one kind, the last two in one call)
PROFILES_21 = {
    "fastest": "the fastest 2.1 configuration of the committed qwen21 table before this section's changes",
    "fastest-text-to-image": "the same, text-to-image (no reference: 64 prefix tokens)",
    "persistent-rows": "the same with inductor-persistent-rows",
    "prefix-fp8-persistent-rows": "then with the prefix cache keeping the prefix's FP8 keys and its values' "
                                  "largest magnitude",
    "prefix-fp8-persistent-rows-swiglu": "and with fused-swiglu-quant",
}


def profile_21() -> str:
    """Issue 41: where the cached step of Qwen-Image-2.1's fastest configuration spends its time, kernel family by
    family, beside the GEMMs' and the attention's times at the ceilings profile_dit.py names."""
    folder = LAB / "profile-dit-21-h200"
    rows = []
    for name, words in PROFILES_21.items():
        found = json.loads((folder / name / "profile.json").read_text())
        families = found["cached_step"]["families_ms"]
        tokens = found["tokens"]
        rows.append({"run": f"`{name}`: {words}", "tokens": f"{tokens['prefix']} + {tokens['target']}",
                     "cached": found["cached_ms"], "sum": found["cached_step"]["total_kernel_ms"],
                     **{key: families.get(key, 0.0) for key in ("gemm", "attention", "inductor", "ghostedit",
                                                                 "other")},
                     "ideal": f"{found['ideal']['gemm_ms']:.1f} + {found['ideal']['attention_ms']:.1f}"})
    first = json.loads((folder / "fastest" / "profile.json").read_text())
    table = markdown_table(rows, {"run": "run", "tokens": "prefix + target tokens", "cached": "cached step ms",
                                  "sum": "kernels ms", "gemm": "FP8 GEMMs ms", "attention": "attention ms",
                                  "inductor": "Inductor's glue ms", "ghostedit": "GhostEdit's kernels ms",
                                  "other": "other ms", "ideal": "GEMMs + attention at the ceilings ms"})
    return (f"The cached step of the full-size synthetic 2.1 DiT alone at 1024x1024 (`lab/probes/profile_dit_21.py`, "
            f"CUDA events, median, then torch.profiler; {first['device']}, torch {first['torch']}, committed "
            f"{_committed_on(folder / 'fastest' / 'profile.json')}, `lab/results/profile-dit-21-h200/`):\n\n{table}\n")


def _cases_asked(found: dict) -> list[str]:
    """The --cases of the command that wrote a result, in order."""
    words = found["environment"]["command"].split()
    after = words[words.index("--cases") + 1:]
    return after[:next((index for index, word in enumerate(after) if word.startswith("--")), len(after))]


def _committed_on(path: Path) -> str:
    """The date a result without its own date was committed (the profile and attention scripts write none): its
    last commit that added or changed it, through renames (the move from docs/benchmarks/ to lab/results/ is none)."""
    return subprocess.run(["git", "log", "-1", "--follow", "--diff-filter=AM", "--format=%cs", "--", str(path)],
                          cwd=ROOT, check=True, capture_output=True, text=True).stdout.strip()


def profile() -> str:
    path = LAB / "profile" / "profile.json"
    found = json.loads(path.read_text())
    variant = next(iter(found["variants"].values()))
    families = variant["families_ms"]
    rows = [{"kernels": "FP8 GEMMs", "ms": families["gemm"], "ideal": found["ideal"]["gemm_ms"]},
            {"kernels": "attention", "ms": families["attention"], "ideal": found["ideal"]["attention_ms"]},
            {"kernels": "Inductor's fused glue (quantization, norms, modulation, RoPE, gates)",
             "ms": families["inductor"], "ideal": ""},
            {"kernels": "GhostEdit's Triton kernels (fused-gelu-quant, fused-qk-norm-rope)",
             "ms": families["ghostedit"], "ideal": ""},
            {"kernels": "other", "ms": families["other"], "ideal": ""},
            {"kernels": "sum of kernels", "ms": variant["total_kernel_ms"], "ideal": ""},
            *_idle_rows(variant),
            {"kernels": "measured forward (timed alone)", "ms": variant["ms_per_forward"], "ideal": ""},
            {"kernels": "measured forward (10 back to back)", "ms": variant["back_to_back_ms"], "ideal": ""}]
    table = markdown_table(rows, {"kernels": "kernels per forward", "ms": "ms",
                                  "ideal": "at the ceiling ms (the FP8 GEMM and bf16 attention rates of the brief)"})
    top = "\n".join(f"- {kernel['name'][:90]}: {kernel['ms']:.1f} ms" for kernel in variant["top_kernels"][:6])
    return (f"torch.profiler over three forwards of {_label_named(found['config'])} at 1024x1024 "
            f"(`lab/probes/profile_dit.py`, {_ran_on(found, committed=path)}, `lab/results/profile/`). "
            f"The CPU hands one forward to the GPU in "
            f"{variant['cpu_launch_ms']:.1f} ms, and the forward makes it wait for the GPU "
            f"{variant['synchronizing_calls']} time(s).\n\n{table}\n\nLargest kernels:\n{top}\n")


SHORT_GAPS = ("under 2 us", "under 5 us")              # profile_dit.py's buckets of a graph's launches
FROM_CPU_GAPS = ("under 100 us", "100 us or more")    # and of the GPU waiting for the CPU (20 us or more)


def _idle_ms(variant: dict, bounds=None) -> float:
    """The GPU's idle time per forward between kernels, in profile_dit.py's buckets named `bounds` (None: all)."""
    return sum(bucket["ms"] for bound, bucket in variant["idle_between_kernels"]["buckets"].items()
               if bounds is None or bound in bounds)


def _idle_rows(variant: dict) -> list[dict]:
    """The GPU's idle time between the profiled forwards' kernels, per forward: in gaps under 5 us (a graph's
    launches, one after another) and longer."""
    short, total = _idle_ms(variant, SHORT_GAPS), _idle_ms(variant)
    return [{"kernels": "GPU idle between kernels, gaps under 5 us", "ms": short, "ideal": ""},
            {"kernels": "GPU idle between kernels, longer gaps", "ms": total - short, "ideal": ""}]


def _fastest(kernels: dict, prefix: str, timing: str = "ms") -> tuple[str, dict]:
    """The fastest by `timing` of a probe's kernels whose names start with `prefix`: (name, its entry)."""
    return min(((kernel, entry) for kernel, entry in kernels.items() if kernel.startswith(prefix)),
               key=lambda item: item[1][timing])


def fused_gelu() -> str:
    """Section 6: the feed-forward layers' GELU and FP8 quantization in one kernel (ghostedit/kernels/gelu_quant.py):
    the kernel alone against Inductor's and other layouts (gelu_quant_probe.py (retired)), then the feed-forward
    layer and the DiT forward with and without it."""
    path = LAB / "gelu-quant" / "gelu-quant.json"
    found = json.loads(path.read_text())
    rows = []
    for stream, kernels in found["kernels"].items():
        picked = [("Inductor's kernel (torchao's quantization, compiled)", "",
                   kernels["inductor (best configuration)"]),
                  ("PyTorch's cast alone, the same bytes moved", "", kernels["cast alone (read bf16, write fp8)"]),
                  ("GhostEdit's kernel as the rewrite runs it", f"warps={found['engine_warps']}",
                   kernels["ghostedit (the engine's setting)"])]
        for what, prefix in (("candidate: rows read twice, fastest setting", "two passes"),
                             ("candidate: input range first, fastest setting", "bounds")):
            kernel, entry = _fastest(kernels, prefix)
            picked.append((what, kernel.removeprefix(prefix).strip(), entry))
        rows += [{"stream": stream, "kernel": what, "setting": setting, "us": entry["ms"] * 1000,
                  "bandwidth": entry["gb_per_s"], "differing": entry.get("fp8_values_differing", "")}
                 for what, setting, entry in picked]
    table = markdown_table(rows, {"stream": "stream", "kernel": "kernel", "setting": "setting", "us": "us",
                                  "bandwidth": "GB/s", "differing": "share of FP8 values unlike the reference"})
    layer = found["feed_forward"]
    fused, without = _with_and_without(results("fused-gelu")["rows"], "fused-gelu-quant")
    environment = results("fused-gelu")["environment"]
    return (f"The GELU and its quantization alone at 1024x1024, 12288 values a row (`gelu_quant_probe.py` (retired), "
            f"{_ran_on(found, committed=path)}, `lab/results/gelu-quant/`; "
            f"the reference: torchao's quantization of the GELU computed in float32):\n\n{table}\n\n"
            f"One image-stream feed-forward layer, compiled: {layer['torchao + inductor']['ms'] * 1000:.0f} us with "
            f"torchao and Inductor, {layer['fused GELU quantization']['ms'] * 1000:.0f} us with the fused kernel "
            f"(output {layer['fused GELU quantization']['rel_error_vs_torchao']:.4f} relative to torchao's). "
            f"One DiT forward at 1024x1024 in one process ({environment['gpu']}, {environment['date']}, "
            f"`{environment['command']}`, `lab/results/fused-gelu/`): {name(without)} "
            f"{without['ms_per_forward']:.1f} ms, with the rewrite {fused['ms_per_forward']:.1f} ms "
            f"({fused['speedup']:.3f}x), "
            f"one block's output {fused['block_rel_error']:.4f} relative to the run without it.\n")


def attention_io() -> str:
    """Section 6: the FP8 attention's q/k kernel alone (qk_norm_rope_probe.py (retired)), then best with and
    without its two attention rewrites in processes of their own, alternating (lab/probes/alternate.sh)."""
    path = LAB / "qk-norm-rope" / "qk-norm-rope.json"
    found = json.loads(path.read_text())
    variants = found["variants"]
    engine = f"ghostedit tokens={found['engine_tokens']} warps={found['engine_warps']}"
    picked = [("compiled code, then the copy that joins the streams (without the rewrite)", "",
               variants["compiled code and the join (without the rewrite)"]),
              ("PyTorch's cast alone, the same bytes moved", "", variants["cast alone (read bf16, write fp8)"]),
              ("GhostEdit's kernel as the rewrite runs it", engine.removeprefix("ghostedit "), variants[engine])]
    fastest, entry = _fastest(variants, "ghostedit ", "kernel_ms")
    if fastest != engine:
        picked.append(("GhostEdit's kernel, fastest setting", fastest.removeprefix("ghostedit "), entry))
    rows = [{"kernel": what, "setting": setting, "us": entry["ms"] * 1000, "kernel_us": entry["kernel_ms"] * 1000,
             "bandwidth": entry["gb_per_s"], "differing": entry.get("fp8_values_differing", "")}
            for what, setting, entry in picked]
    table = markdown_table(rows, {"kernel": "q and k of both streams", "setting": "setting",
                                  "us": "us (CUDA events)", "kernel_us": "us (kernels alone)",
                                  "bandwidth": "GB/s (kernels alone)",
                                  "differing": "share of FP8 values unlike the compiled code's"})
    before, after = (_profiled(f"earlier/profile-{when}-attention-io") for when in ("before", "after"))
    return (f"The FP8 attention's q and k prepared at 1024x1024, both streams, 24 heads of 128 "
            f"(`qk_norm_rope_probe.py` (retired), {_ran_on(found, committed=path)}, "
            f"`lab/results/qk-norm-rope/`):\n\n{table}\n\n"
            f"{_alternating('attention-io')}. The kernels of one forward (`lab/probes/profile_dit.py`) summed to "
            f"{before['total_kernel_ms']:.1f} ms before the two rewrites and {after['total_kernel_ms']:.1f} ms with "
            "them.\n")


def _alternating(folder: str) -> str:
    """An A/B of lab/probes/alternate.sh in `lab/results/<folder>/` (a results.json per process, in run order),
    in words: where and how it ran, and each process's configuration and forward."""
    processes = _alternate_processes(folder)
    runs = ", ".join(f"{name(process['rows'][0])} {process['rows'][0]['ms_per_forward']:.1f} ms"
                     for process in processes)
    environment = processes[0]["environment"]
    return (f"One DiT forward at 1024x1024, each configuration in {len(processes) // 2} processes of its own, "
            f"alternating (`lab/probes/alternate.sh`, {_ran_on(environment)}, `lab/results/{folder}/`): {runs}")


def _alternate_processes(folder: str) -> list[dict]:
    """The results.json of each process of lab/probes/alternate.sh in `lab/results/<folder>/`, in run order."""
    return [json.loads((run / "results.json").read_text()) for run in sorted((LAB / folder).iterdir())]


def _profiled(folder: str) -> dict:
    """The first variant of the profile_dit.py profile in `lab/results/<folder>/`."""
    return next(iter(json.loads((LAB / folder / "profile.json").read_text())["variants"].values()))


def e2e_order() -> str:
    """Section 3: the best configuration's 4-step edit alone in a process, after stock, and before it."""
    runs = []
    for folder, words in (("best", "alone in its process"), ("baseline-best", "after stock in one process"),
                          ("best-baseline", "before stock in one process")):
        found = results(f"e2e-order/{folder}")
        row = next(row for row in found["rows"] if name(row) != "stock")
        runs.append(f"{words} {row['end_to_end_s']:.3f} s")
    environment = found["environment"]
    return (f"The best configuration's edit at 1024x1024, 4 steps, CFG 1, median of {found['repeats']} after warm-up, "
            f"each in a process of its own ({_ran_on(environment)}, `ghostedit bench ... --configs best`, "
            "`baseline best` and `best baseline`, "
            f"`lab/results/e2e-order/`): {', '.join(runs)}.\n")


def carried_residual() -> str:
    """Section 6: best with and without carried-residual in processes of their own, alternating
    (lab/probes/alternate.sh), and the kernels of a forward before and after (lab/probes/profile_dit.py)."""
    before, after = (_profiled(f"earlier/profile-before-{change}") for change in ("carried-residual",
                                                                                  "persistent-rows"))
    return (f"{_alternating('carried-residual/alternating')}. The kernels of one forward "
            f"(`lab/probes/profile_dit.py`, before it and with it: "
            f"`lab/results/earlier/profile-before-carried-residual/` and "
            f"`lab/results/earlier/profile-before-persistent-rows/`): Inductor's kernels "
            f"{before['families_ms']['inductor']:.1f} ms before, {after['families_ms']['inductor']:.1f} ms with it; "
            f"all kernels {before['total_kernel_ms']:.1f} ms and {after['total_kernel_ms']:.1f} ms.\n")


def fused_qkv() -> str:
    """Section 6: best with and without fused-qkv in processes of their own, alternating (lab/probes/alternate.sh),
    and fused LoRA switches on best + fused-qkv (bench.sh lora-switch with it as BEST)."""
    switched = results("fused-qkv/lora-switch")
    seconds = [row["switch_s"] for row in switched["rows"]]
    recompiled = sum(row["new_compiled_frames"] for row in switched["rows"])
    return (f"{_alternating('fused-qkv/alternating')}. Fused LoRA switches on {name(switched)} "
            f"(`BEST=... scripts/gpu/bench.sh lora-switch`, {_ran_on(switched['environment'])}, "
            f"`lab/results/fused-qkv/lora-switch/`): {len(seconds)} switches of rank {switched['rank']} in "
            f"{min(seconds):.2f}-{max(seconds):.2f} s, {recompiled} frames recompiled.\n")


def cuda_graph() -> str:
    """Section 1: best with and without cuda-graph in processes of their own, alternating (lab/probes/alternate.sh),
    and in one process each of best and exact after the same configuration without it, where the outputs compare."""
    checks = []
    for preset in ("best", "exact"):
        graphed, looped = _with_and_without(results(f"cuda-graph/same-process-{preset}")["rows"], "cuda-graph")
        compared = ("equal to it bit for bit" if graphed["rel_error"] == 0 else
                    f"{graphed['rel_error']:.4f} relative to it")
        checks.append(f"{name(graphed)} {graphed['ms_per_forward']:.1f} ms after {name(looped)} "
                      f"{looped['ms_per_forward']:.1f} ms, output {compared}")
    return (f"{_alternating('cuda-graph/alternating')}. In one process each "
            f"(`lab/results/cuda-graph/same-process-*/`), the configuration without it first and so the reference: "
            f"{'; '.join(checks)}.\n")


WHOLE_FORWARD = "cuda-graph/whole-forward"
GRAPHS = {"block-loop-graph": "the block loop's graph (before)", "whole-forward-graph": "the whole forward's graph"}


def whole_forward_graph() -> str:
    """Section 1: the block loop's CUDA graph against the whole forward's, in processes of their own, alternating
    (profile_dit.py --engine-only on the code before and after), and graph_check.py's bit-for-bit comparison."""
    folder = LAB / WHOLE_FORWARD
    rows = []
    for run in sorted(path for path in folder.iterdir() if path.name[0].isdigit()):
        variant = _profiled(f"{WHOLE_FORWARD}/{run.name}")
        rows.append({"process": run.name.split("-")[0], "graph": GRAPHS[run.name.split("-", 1)[1]],
                     "alone": variant["ms_per_forward"], "back": variant["back_to_back_ms"],
                     "cpu": variant["cpu_launch_ms"], "idle": _idle_ms(variant, FROM_CPU_GAPS),
                     "kernels": variant["total_kernel_ms"]})
    table = markdown_table(rows, {"process": "process", "graph": "graph", "alone": "ms / forward (timed alone)",
                                  "back": "ms / forward (10 back to back)",
                                  "cpu": "CPU hands a forward over, ms",
                                  "idle": "GPU idle in gaps of 20 us or more, ms / forward",
                                  "kernels": "kernels, ms / forward"})
    check = json.loads((folder / "graph-check" / "graph-check.json").read_text())
    runs = "; ".join(f"{what}: {sum(run['bitwise_equal'])} of {len(run['bitwise_equal'])} outputs equal, "
                     f"{run['from_python_ms']:.1f} ms from Python against {run['graphed_ms']:.1f} ms replayed"
                     for what, run in check["runs"].items())
    first = folder / "1-block-loop-graph" / "profile.json"
    found = json.loads(first.read_text())
    return (f"One DiT forward of {_label_named(found['config'])} at 1024x1024 in four processes on one machine, "
            f"alternating the code before and after (`lab/probes/profile_dit.py --engine-only`, "
            f"{_ran_on(found, committed=first)}, "
            f"`lab/results/{WHOLE_FORWARD}/`):\n\n{table}\n\n"
            f"Replayed against run from Python, four forwards of varied inputs each (`tests/gpu/graph_check.py`, "
            f"same machine): {runs}.\n")


def stream_gemm() -> str:
    """Section 6: the text stream's GEMMs and the modulation GEMVs laid out other ways (stream_gemm_probe.py)."""
    path = LAB / "stream-gemm" / "stream-gemm.json"
    found = json.loads(path.read_text())
    rows = [{"layer": layer, "image": row["image alone"], "text": row["text alone"],
             "both": row["one after the other"], "side": row["text on a second stream"],
             "grouped": row["grouped, no bias"]} for layer, row in found["layers"].items()]
    table = markdown_table(rows, {"layer": "layer", "image": "image stream alone", "text": "text stream alone",
                                  "both": "both, one after the other (as the engine runs them)",
                                  "side": "text on a second stream", "grouped": "one grouped GEMM, no bias"})
    modulation = found["modulation"]
    return (f"A block's GEMMs at 1024x1024 (8192 image rows, 256 text rows), each 60 times over in one CUDA graph, "
            f"ms (`stream_gemm_probe.py` (retired), {_ran_on(found, committed=path)}, "
            f"`lab/results/stream-gemm/`):\n\n{table}\n\nThe 120 modulation GEMVs of a forward: "
            f"{modulation['layer by layer ms']:.2f} ms one by one ({modulation['GB/s layer by layer']:.0f} GB/s), "
            f"{modulation['joined ms']:.2f} ms as one GEMV over their weights joined "
            f"({modulation['GB/s joined']:.0f} GB/s).\n")


PDL_AB = "pdl-ab"


def pdl() -> str:
    """Section 6: Inductor's programmatic dependent launch off and on (TORCHINDUCTOR_ENABLE_PDL), best's forward in
    processes of their own, alternating (folders <round>-pdl<0|1>)."""
    runs = sorted((LAB / PDL_AB).iterdir(), key=lambda run: run.name)
    processes = [(run.name.endswith("pdl1"), results(f"{PDL_AB}/{run.name}")) for run in runs]
    forwards = ", ".join(f"{'on' if on else 'off'} {found['rows'][0]['ms_per_forward']:.1f} ms"
                         for on, found in processes)
    first = processes[0][1]
    return (f"One DiT forward of {name(first['rows'][0])} at 1024x1024, 256 text tokens, Inductor's programmatic "
            f"dependent launch off and on, each in {len(processes) // 2} processes of its own, alternating "
            f"(`TORCHINDUCTOR_ENABLE_PDL=0|1 ghostedit bench --level dit --repeats 10 --configs best`, "
            f"{_ran_on(first['environment'])}, `lab/results/{PDL_AB}/`): {forwards}.\n")


TEXT_SIDE = "text-side-stream"


def text_side_stream() -> str:
    """Section 6: the text stream's GEMMs on a second CUDA stream (the rewrite of 6bd063c, taken out again): the
    probe of one block's layers (overlap_probe.py), the forward A/B, its outputs against best's, and where its
    second stream's kernels ran in a profile of it."""
    path = LAB / TEXT_SIDE / "overlap" / "overlap.json"
    probe = json.loads(path.read_text())
    beside = "text on a second stream {}, default priority ms"
    rows = [{"part": row["part"], "rows": row["text rows"], "turns": row["one after the other ms"],
             "image": row["image alone ms"], "text": row["text alone ms"],
             "start": row[beside.format("from the block's start")],
             "after": row[beside.format("after the image up projection")]} for row in probe["rows"]]
    table = markdown_table(rows, {"part": "layers", "rows": "text rows", "turns": "one after the other",
                                  "image": "image stream alone", "text": "text stream alone",
                                  "start": "text on a second stream from the start",
                                  "after": "text on a second stream after the image's first GEMM"})
    processes = _alternate_processes(f"{TEXT_SIDE}/alternating")
    forwards = ", ".join(f"{'with' if TEXT_SIDE in found['rows'][0]['config'] else 'without'} it "
                         f"{found['rows'][0]['ms_per_forward']:.1f} ms" for found in processes)
    checked = json.loads((LAB / TEXT_SIDE / "graph-check" / "graph-check.json").read_text())["runs"]
    equal = ", ".join(f"{run}: {sum(found['equal_to_same_as'])} of {len(found['equal_to_same_as'])}"
                      for run, found in checked.items())
    without, with_it = (_profiled(f"{TEXT_SIDE}/profile-{variant}") for variant in ("best", "side"))
    streams = _second_stream(LAB / TEXT_SIDE / "profile-side" / "trace.json.gz", with_it["total_kernel_ms"])
    return (f"One block's layers at 1024x1024 (8192 image rows; the engine's kernels: rowwise FP8 GEMMs, GhostEdit's "
            f"GELU quantization, a LayerNorm with its FP8 cast), 60 times over in one CUDA graph, ms "
            f"(`overlap_probe.py` (retired), {_ran_on(probe, committed=path)}, "
            f"`lab/results/{TEXT_SIDE}/overlap/`):\n\n{table}\n\n"
            f"One DiT forward of best at 1024x1024, 256 text tokens, without and with the rewrite, each in "
            f"{len(processes) // 2} processes of its own, alternating (`lab/probes/alternate.sh`, "
            f"{_ran_on(processes[0]['environment'])}, `lab/results/{TEXT_SIDE}/alternating/`): {forwards}. "
            f"Its replayed outputs equal to best's, four inputs each (`tests/gpu/graph_check.py --same-as best`): "
            f"{equal}. The kernels of one forward (`lab/probes/profile_dit.py --trace`, same machine): without it "
            f"{without['total_kernel_ms']:.1f} ms, all on one stream; with it {with_it['total_kernel_ms']:.1f} ms, "
            f"{streams['side']:.1f} ms of them on the second stream, {streams['gemm']:.1f} ms of that beside the image "
            f"stream's GEMMs and {streams['other']:.1f} ms beside its other kernels.\n")


def _second_stream(trace: Path, kernel_ms_per_forward: float) -> dict:
    """Per forward, ms of the kernels on the second stream of a profile_dit.py trace, and how much of that ran beside
    the main stream's GEMMs and beside its other kernels. The trace holds the profile's forwards, whose count is its
    GPU time over the profile's kernel time per forward."""
    events = [event for event in json.loads(gzip.open(trace).read())["traceEvents"]
              if event.get("cat") in ("kernel", "gpu_memset", "gpu_memcpy")]
    busy = {}
    for event in events:
        busy[event["tid"]] = busy.get(event["tid"], 0) + event["dur"] / 1000
    forwards = round(sum(busy.values()) / kernel_ms_per_forward)
    main = max(busy, key=busy.get)
    beside = {"gemm": 0.0, "other": 0.0}
    main_events = sorted((event for event in events if event["tid"] == main), key=lambda event: event["ts"])
    starts = [event["ts"] for event in main_events]
    for side in (event for event in events if event["tid"] != main):
        start, end = side["ts"], side["ts"] + side["dur"]
        # one stream's kernels run one after another: those beside this one start before its end, from the one
        # running at its start on
        for event in main_events[max(bisect.bisect_right(starts, start) - 1, 0):bisect.bisect_left(starts, end)]:
            overlap = min(end, event["ts"] + event["dur"]) - max(start, event["ts"])
            if overlap > 0:
                beside["gemm" if re.search(r"nvjet|gemm", event["name"]) else "other"] += overlap / 1000
    side_ms = sum(ms for stream, ms in busy.items() if stream != main)
    return {"side": side_ms / forwards, **{kind: ms / forwards for kind, ms in beside.items()}}


def profile_edit() -> str:
    """Where a whole edit's time goes: each stage's wall time against its GPU kernels (lab/probes/profile_edit.py)."""
    found = results("profile-edit")
    rows = [{"stage": row["stage"], "wall": row["wall_s"], "gpu": row["gpu_s"], "idle": row["idle_s"],
             "top": row["top"][0]["name"][:60] if row["top"] else ""} for row in found["rows"]]
    table = markdown_table(rows, {"stage": "stage", "wall": "wall s", "gpu": "GPU kernels s",
                                  "idle": "GPU idle s", "top": "largest kernel"})
    environment = found["environment"]
    return (f"One warm edit of {name(found)} at {found['side']}x{found['side']}, {found['steps']} steps, CFG "
            f"{found['cfg']:g}, {found['total_s']:.2f} s; its kernels from a torch.profiler trace of the next edit "
            f"(`lab/probes/profile_edit.py`, {_ran_on(environment)}, `lab/results/profile-edit/`).\n\n{table}\n")


def run_toggles() -> str:
    """Section 6: the encoders' run-time toggles A/B'd on one prepared pipeline, in rotating turns
    (run_toggles_probe.py (retired)): each stage's median per variant, and its image against the base's."""
    found = results("run-toggles")
    base = next(row for row in found["rows"] if row["variant"] == "base")
    rows = []
    for row in found["rows"]:
        stages = {stage: row[stage] for stage in STAGE_ORDER if stage in row}
        rows.append({"variant": "base" if row is base else f"base + {row['variant']}", "edit": row["total_s"],
                     **stages, "psnr": row["against_base"]["psnr_db"], "max_abs": row["against_base"]["max_abs"]})
    columns = {"variant": "variant", "edit": "edit s", **{stage: f"{stage} s" for stage in stages},
               "psnr": "PSNR dB vs base", "max_abs": "max abs diff"}
    environment = found["environment"]
    check = found["vae_image_in_float32"]
    graphed_first = found["first_runs"]["text-encoder=graphed"][0]["stages_s"]["text encoding"]
    fused = found["fused_norms_in_bf16"]
    after = (f"\nAgainst the released VAE in float32 on this GPU (TF32 off), a random image: vae=image's latents "
             f"{check['latents_rel_error']:.1e} and decoded image {check['decoded_rel_error']:.1e} relative error, "
             f"vae=image-fused's {check['fused_latents_rel_error']:.1e} and {check['fused_decoded_rel_error']:.1e}. "
             f"In bf16, a random latent decoded with vae=image-fused against vae=image: {fused['differing_share']:.0%} "
             f"of the values differ, by at most {fused['max_abs_diff']:.3f}. text-encoder=graphed's first edit, which "
             f"warmed up and captured every layer: {graphed_first:.3f} s of text encoding.\n")
    return (f"The base is {name(base)}, the text encoder and VAE as released: whole edits at {found['side']}x"
            f"{found['side']}, {found['steps']} steps, CFG {found['cfg']:g}, {found['rounds']} warm edits of each variant in turns whose order rotates, medians "
            f"(`run_toggles_probe.py` (retired), {_ran_on(environment)}, `lab/results/run-toggles/`). "
            "The base's own row compares two of its warm "
            f"images.\n\n{markdown_table(rows, columns)}\n{after}")


def attention_lengths() -> str:
    """Section 6: cuDNN's FP8 attention at prompt lengths that make the joint sequence a multiple of 128 or not
    (attention_plans_probe.py (retired)), and a DiT forward at the bench's and an edit's prompt length."""
    folder = LAB / "attention-lengths"
    path = folder / "attention-plans.json"
    found = json.loads(path.read_text())
    rows = []
    for length in found["lengths"]:
        engine = next(plan for plan in length["plans"] if plan["layout"].endswith("(engine)") and plan["mode"] == "A"
                      and plan["index"] == 0)
        masked = next((plan for plan in length.get("padding_mask", []) if plan["index"] == 0
                       and plan["query_length"] == "real"), None)
        rows.append({"text": length["text_tokens"], "tokens": length["tokens"],
                     "aligned": "yes" if length["tokens"] % 128 == 0 else "no", "engine": engine["sustained_ms"],
                     "masked": f"{masked['sustained_ms']:.3f}" if masked else ""})
    table = markdown_table(rows, {"text": "text tokens", "tokens": "joint tokens", "aligned": "multiple of 128",
                                  "engine": "as the engine runs it, ms",
                                  "masked": "padded to a multiple of 128, cuDNN's padding mask, ms"})
    forwards = {tokens: results(f"attention-lengths/dit-{tokens}") for tokens in (214, 256)}
    environment = forwards[214]["environment"]
    forward = ", ".join(f"{tokens} text tokens {found_dit['rows'][0]['ms_per_forward']:.1f} ms"
                        for tokens, found_dit in forwards.items())
    return (f"cuDNN's FP8 attention alone, {found['shape']['heads']} heads of {found['shape']['head_dim']}, "
            f"{found['shape']['image_tokens']} image tokens and three prompt lengths, cuDNN's first plan (the "
            f"engine's), per call over calls back to back (`attention_plans_probe.py --text-tokens 256 "
            f"214 300` (retired), {_ran_on(found, committed=path)}, "
            f"`lab/results/attention-lengths/`):\n\n{table}\n\nOne DiT forward of "
            f"{name(forwards[214]['rows'][0])} at 1024x1024 in processes of its own: {forward} ({environment['gpu']}, "
            f"{environment['date']}, `ghostedit bench --level dit --text-tokens N`, "
            "`lab/results/attention-lengths/dit-*/`).\n")


CUDNN_AB = "cudnn-version"


def _cudnn_words(version: int) -> str:
    """torch's number for a cuDNN version (91900) as its release (9.19.0)."""
    return f"{version // 10000}.{version // 100 % 100}.{version % 100}"


def cudnn_version() -> str:
    """Section 6: cuDNN's FP8 attention and the best forward on torch's pinned cuDNN and a newer one
    (library_ab.sh (retired): the attention plans probe per version, then DiT processes alternating)."""
    folder = LAB / CUDNN_AB
    rows = []
    for variant in ("pinned", "newer"):
        path = folder / f"attention-{variant}" / "attention-plans.json"
        found = json.loads(path.read_text())
        for length in found["lengths"]:
            timed = [plan for plan in length["plans"] if "sustained_ms" in plan]
            first = next(plan for plan in timed if plan["layout"].endswith("(engine)") and plan["mode"] == "A"
                         and plan["index"] == 0)
            fastest = min(timed, key=lambda plan: plan["sustained_ms"])
            rows.append({"cudnn": _cudnn_words(found["cudnn"]), "text": length["text_tokens"],
                         "first": first["sustained_ms"], "fastest": fastest["sustained_ms"],
                         "plan": f"{fastest['name']} ({fastest['layout']}, mode {fastest['mode']})",
                         "plans": len(timed)})
    table = markdown_table(rows, {"cudnn": "cuDNN", "text": "text tokens",
                                  "first": "cuDNN's first plan (the engine's), ms", "fastest": "fastest plan, ms",
                                  "plan": "fastest plan", "plans": "plans timed"})
    in_run_order = sorted((folder / "dit").iterdir(),
                          key=lambda run: (int(run.name.split("-")[0]), "newer" in run.name))
    processes = [results(f"{CUDNN_AB}/dit/{run.name}") for run in in_run_order]
    forwards = ", ".join(f"cuDNN {_cudnn_words(process['environment']['cudnn'])} "
                         f"{process['rows'][0]['ms_per_forward']:.1f} ms" for process in processes)
    return (f"cuDNN's FP8 attention alone, 24 heads of 128, 8192 image tokens, per call over calls back to back, on "
            f"torch's pinned cuDNN and on a newer one (`library_ab.sh` (retired), "
            f"{_ran_on(found, committed=path)}, `lab/results/{CUDNN_AB}/`):\n\n{table}\n\n"
            f"One DiT forward of {name(processes[0]['rows'][0])} at 1024x1024, each cuDNN in "
            f"{len(processes) // 2} processes of its own, alternating ({_ran_on(processes[0]['environment'])}): "
            f"{forwards}.\n")


FA3 = "fa3-fp8"


def _fa3_kernel_rows(folder: str = "attention") -> tuple[list[dict], str, dict]:
    """The attention probe's FP8 rows at each prompt length (the kernels alone and as compiled blocks run them),
    where and when it ran, in words, and its first shape."""
    path = LAB / FA3 / folder / "attention.json"
    found = json.loads(path.read_text())
    rows = []
    for length in [found, *found.get("lengths", [])]:
        tokens, timed = length["shape"]["tokens"], length["backends"]
        # the probe's files name their image tokens since the FA3 runs; those ran 8192 (a 1024x1024 edit)
        rows.append({"text": tokens - length["shape"].get("image_tokens", 8192),
                     "aligned": "yes" if tokens % 128 == 0 else "no",
                     "cudnn": timed["cudnn-fp8 kernel alone"]["ms"], "fa3": timed["fa3-fp8 kernel alone"]["ms"],
                     "cudnn compiled": timed["cudnn-fp8 compiled"]["ms"],
                     "fa3 compiled": timed["fa3-fp8 compiled"]["ms"],
                     "cudnn error": timed["cudnn-fp8"]["rel_error_vs_fp32"],
                     "fa3 error": timed["fa3-fp8"]["rel_error_vs_fp32"], "bf16": timed["sdpa-cudnn"]["ms"]})
    return rows, _ran_on(found, committed=path), found["shape"]


def _e2e_alternating() -> str:
    """Whole edits of best and best-fa3 in processes of their own (lab/probes/alternate.sh with LEVEL=e2e), the
    order swapped in the second round."""
    runs = []
    for folder in sorted((LAB / FA3).glob("e2e-ab-*")):
        for process in sorted(run for run in folder.iterdir() if not run.name.endswith("-40")):
            four, forty = results(f"{FA3}/{folder.name}/{process.name}"), \
                results(f"{FA3}/{folder.name}/{process.name}-40")
            runs.append(f"{name(four['rows'][0])} {four['rows'][0]['end_to_end_s']:.2f} s and "
                        f"{forty['rows'][0]['end_to_end_s']:.2f} s")
    return (f"Whole edits at 1024x1024 (4 steps CFG 1, median of {four['repeats']}; then 40 steps CFG 4, one run), "
            f"each configuration in two processes of its own, in turns ({_ran_on(four['environment'])}, "
            f"`LEVEL=e2e lab/probes/alternate.sh`, `lab/results/{FA3}/e2e-ab-*/`): {'; '.join(runs)}.")


def fa3_fp8() -> str:
    """Section 6: FlashAttention-3's FP8 kernel against cuDNN's: alone at three prompt lengths, in the DiT forward at
    the bench's and an edit's prompt length, and in whole edits."""
    rows, probe_ran_on, shape = _fa3_kernel_rows()
    again_rows, again_ran_on, _ = _fa3_kernel_rows("attention-script-wheel")
    again = "; ".join(f"{row['text']} text tokens: cuDNN {row['cudnn']:.3f} ms, FA3 {row['fa3']:.3f} ms"
                      for row in again_rows)
    table = markdown_table(rows, {"text": "text tokens", "aligned": "multiple of 128", "cudnn": "cuDNN FP8 kernel ms",
                                  "fa3": "FA3 FP8 kernel ms", "cudnn compiled": "cuDNN path compiled ms",
                                  "fa3 compiled": "FA3 path compiled ms", "cudnn error": "cuDNN rel. error",
                                  "fa3 error": "FA3 rel. error", "bf16": "bf16 SDPA cuDNN ms"})
    error, e2e4, e2e40 = (_named_rows(f"{FA3}/{part}") for part in ("error-214", "e2e-4", "e2e-40"))
    section_1 = _named_shape_rows("dit")
    edits_ran_on = _ran_on(results(f"{FA3}/e2e-4")["environment"])
    forwards = "; ".join(f"{shape}: {section_1['best', shape]['ms_per_forward']:.1f} and {row['ms_per_forward']:.1f} ms"
                         for (config, shape), row in _named_shape_rows(f"{FA3}/dit").items() if config == "best-fa3")
    return (f"The FP8 attention alone, {shape['heads']} heads of {shape['head_dim']}, "
            f"{shape.get('image_tokens', 8192)} image tokens, median of CUDA-event timings "
            f"(`lab/probes/attention_probe.py --text-tokens 256 214 300`, {probe_ran_on}, "
            f"`lab/results/{FA3}/attention/`). The kernel alone takes FP8 inputs in the engine's "
            "layout; the compiled path quantizes bf16 q, k and v and gives bf16 out (cuDNN's output dequantized):\n\n"
            f"{table}\n\nThe kernels alone again, with the wheel `scripts/gpu/build_fa3_wheel.sh` builds (the table's "
            f"was built by hand before the script, from the same sources and flags; {again_ran_on}, "
            f"`lab/results/{FA3}/attention-script-wheel/`): {again}.\n\n"
            f"{_alternating(f'{FA3}/dit-256')}, 256 text tokens. "
            f"{_alternating(f'{FA3}/dit-214')}, 214 text tokens (an edit's prompt).\n\n"
            f"{_e2e_alternating()}\n\n"
            f"With the wheel the script builds, best-fa3 through `BEST=best-fa3 scripts/gpu/bench.sh e2e` "
            f"({edits_ran_on}, "
            f"`docs/benchmarks/{FA3}/e2e-*/`): 4 steps CFG 1 {e2e4['best-fa3']['end_to_end_s']:.3f} s "
            f"(stock {e2e4['stock']['end_to_end_s']:.3f} s, PSNR against stock {e2e4['best-fa3']['psnr_db']:.2f} dB), "
            f"40 steps CFG 4 {e2e40['best-fa3']['end_to_end_s']:.2f} s (stock {e2e40['stock']['end_to_end_s']:.2f} s, "
            f"PSNR {e2e40['best-fa3']['psnr_db']:.2f} dB). Stock's attention in this run: "
            f"{e2e4['stock']['report']['attention']}.\n\n"
            f"One DiT forward at five shapes, 256 text tokens, best (section 1's run) and best-fa3 on the same wheel "
            f"(`BEST=best-fa3 scripts/gpu/bench.sh dit`, {_ran_on(results(f'{FA3}/dit')['environment'])}, "
            f"`docs/benchmarks/{FA3}/dit/`): {forwards}.\n\n"
            f"The DiT's output against stock's at 1024x1024 and 214 text tokens, in one process "
            f"(`ghostedit bench --level dit --text-tokens 214 --configs baseline best best-fa3`, "
            f"`lab/results/{FA3}/error-214/`): best {error['best']['rel_error']:.4f} (one block "
            f"{error['best']['block_rel_error']:.4f}), best-fa3 {error['best-fa3']['rel_error']:.4f} (one block "
            f"{error['best-fa3']['block_rel_error']:.4f}).\n")


def vae_norm() -> str:
    """Section 6: the VAE's RMS norm and SiLU as released against GhostEdit's kernel (vae_norm_probe.py (retired))."""
    from ghostedit.optimize import vae_frames
    found = results("vae-norm")
    engine_setting = f"chunks, {vae_frames.ROW_VALUES} values, {vae_frames.WARPS} warps"
    by_shape: dict = {}
    for row in found["rows"]:
        by_shape.setdefault((row["channels"], row["side"]), {})[row["kernel"]] = row
    rows = []
    for (channels, side), kernels in by_shape.items():
        released = next(row for label, row in kernels.items() if label.startswith("released"))
        copy = next(row for label, row in kernels.items() if label.startswith("PyTorch's copy"))
        ours = kernels[engine_setting]
        rows.append({"shape": f"{channels} x {side}x{side}", "released": released["us"], "ours": ours["us"],
                     "gbs": ours["gb_per_s"], "copy": copy["us"], "per_million": ours["differing_share"] * 1e6,
                     "max": ours["max_abs_diff"]})
    table = markdown_table(rows, {"shape": "channels x pixels", "released": "released us", "ours": "kernel us",
                                  "gbs": "kernel GB/s", "copy": "PyTorch's copy us",
                                  "per_million": "values per million unlike the released",
                                  "max": "largest difference"})
    environment = found["environment"]
    return (f"The VAE's RMS norm and the SiLU after it on a channels-last bf16 input, as released and in "
            f"GhostEdit's kernel as the engine runs it ({engine_setting}), beside PyTorch's copy of the same bytes "
            f"(`vae_norm_probe.py` (retired), {_ran_on(environment)}, `lab/results/vae-norm/`):\n\n{table}\n")


def attention() -> str:
    path = LAB / "attention" / "attention.json"
    found = json.loads(path.read_text())
    rows = [{"backend": backend, "ms": row["ms"], "tflops": row["tflops"], "error": row["rel_error_vs_fp32"]}
            for backend, row in found["backends"].items()]
    table = markdown_table(rows, {"backend": "backend", "ms": "ms", "tflops": "TFLOP/s",
                                  "error": "rel. error vs fp32"})
    shape = found["shape"]
    return (f"Attention alone, {shape['heads']} heads x {shape['head_dim']}, {shape['tokens']} tokens "
            f"(`lab/probes/attention_probe.py`, {_ran_on(found, committed=path)}, "
            f"`lab/results/attention/`).\n\n{table}\n")


# Section 8's runs, newest first: the same script on two kinds of 2-GPU machine
PARALLEL_RUNS = ("parallel", "parallel-h200")


def parallel() -> str:
    """Section 8: one edit on one GPU against two (scripts/gpu/parallel_bench.sh), each machine's runs against its
    own single GPU, speed only: the image checks are in each part's table.md, with the caveat the section's text
    gives."""
    runs = [results(part) for part in PARALLEL_RUNS]
    rows, machines = [], []
    for part, found in zip(PARALLEL_RUNS, runs):
        environment = found["environment"]
        machine = f"{environment['gpu']} x2, {environment['date']}"
        machines.append(f"{machine} (`docs/benchmarks/{part}/`)")
        rows += [{"machine": machine, "run": row["label"], "parallel": row["parallel"], "edit": row["end_to_end_s"],
                  "step": row["s_per_step"], "speedup edit": row["speedup_e2e"],
                  "speedup step": row["speedup_step"], "peak": row["peak_gib"]} for row in found["rows"]]
    table = markdown_table(rows, {"machine": "machine", "run": "run", "parallel": "processes and split",
                                  "edit": "edit s", "step": "denoise s / step", "speedup edit": "speedup (edit)",
                                  "speedup step": "speedup (step)", "peak": "peak GiB (rank 0)"})
    newest = runs[0]
    single, link = newest["rows"][0], newest.get("link")
    measured_link = "" if link is None else (
        f" Ulysses's all-to-alls alone on the {newest['environment']['gpu']} pair's link: {link['block_ms']:.2f} ms "
        f"a block, {link['forward_ms']:.0f} ms a forward, {link['gb_per_s']:.0f} GB/s leaving each rank.")
    return (f"{single['size']}, {single['steps']} steps, CFG {single['cfg']:g}, the best configuration, one warm "
            f"edit each, torch {newest['environment']['torch']}, `scripts/gpu/parallel_bench.sh all` on "
            f"{' and on '.join(machines)}.{measured_link}\n\n{table}\n")


def headline() -> str:
    """README's summary: the best configuration against stock, each figure from its part."""
    dit = _named_shape_rows("dit")
    e2e4, e2e40 = _named_rows("e2e-4"), _named_rows("e2e-40")
    ready_new, ready_packaged, ready_restart = (results(part)["rows"][0] for part in (
        "ready-never-compiled", "ready-package-only", "ready-restart"))
    switches = [row["switch_s"] for row in results("lora-switch")["rows"]]
    fa3_e2e4, fa3_e2e40 = _named_rows(f"{FA3}/e2e-4"), _named_rows(f"{FA3}/e2e-40")
    big = "1024x1024"
    return "\n".join([
        f"Full-size synthetic model, {results('dit')['environment']['gpu']}, torch "
        f"{results('dit')['environment']['torch']}, {results('dit')['environment']['date']} "
        "([docs/benchmarks.md](docs/benchmarks.md) has the tables and commands, [lab/LOG.md](lab/LOG.md) the "
        "experiments behind them):",
        f"- one DiT forward at {big}: stock {dit['stock', big]['ms_per_forward']:.0f} ms, best "
        f"{dit['best', big]['ms_per_forward']:.0f} ms ({dit['best', big]['speedup']:.2f}x);",
        f"- a 4-step edit (CFG 1) end to end: stock {e2e4['stock']['end_to_end_s']:.2f} s, best "
        f"{e2e4['best']['end_to_end_s']:.2f} s; 40 steps with true CFG: stock {e2e40['stock']['end_to_end_s']:.1f} "
        f"s, best {e2e40['best']['end_to_end_s']:.1f} s;",
        f"- the best configuration ready in {ready_new['prepare_s'] + ready_new['first_call_s']:.1f} s on a machine "
        f"that never compiled it, {ready_packaged['prepare_s'] + ready_packaged['first_call_s']:.1f} s on one given "
        f"its compiled package, {ready_restart['prepare_s'] + ready_restart['first_call_s']:.1f} s after a restart;",
        f"- with FlashAttention-3's FP8 attention in place of cuDNN's (best-fa3, lab/LOG.md section 6): a 4-step edit "
        f"{fa3_e2e4['best-fa3']['end_to_end_s']:.2f} s, 40 steps {fa3_e2e40['best-fa3']['end_to_end_s']:.1f} s;",
        f"- switching fused LoRAs on {name(results('lora-switch'))}: {min(switches):.2f}-{max(switches):.2f} s, "
        "nothing recompiled.", ""])


def current() -> str:
    """docs/benchmarks.md's headline table: each figure of the targets, for best and best-fa3 against stock where
    stock has one, with the run that measured it (device, torch, date, command, results folder)."""
    rows = []

    def add(figure: str, part: str, configuration: str, measured: float, stock: float | None = None) -> None:
        rows.append({"figure": figure, "configuration": configuration, "measured": measured,
                     "stock": stock or "", "speedup": stock / measured if stock else "", "run": source(part)})

    big = "1024x1024"
    for folder, preset in (("", "best"), (f"{FA3}/", "best-fa3")):
        dit = _named_shape_rows(f"{folder}dit")
        add(f"one DiT forward at {big} (ms)", f"{folder}dit", preset, dit[preset, big]["ms_per_forward"],
            dit["stock", big]["ms_per_forward"])
        for part in ("e2e-4", "e2e-40"):
            found, e2e = results(f"{folder}{part}"), _named_rows(f"{folder}{part}")
            add(f"{found['steps']} steps CFG {found['cfg_scale']:g} end to end (s)", f"{folder}{part}", preset,
                e2e[preset]["end_to_end_s"], e2e["stock"]["end_to_end_s"])
    for part, words in READY.items():
        row = results(part)["rows"][0]
        add(f"ready, {words.split(' (')[0]} (s)", part, name(row), row["prepare_s"] + row["first_call_s"])
    switches = results("lora-switch")
    add("slowest fused LoRA switch (s)", "lora-switch", name(switches),
        max(row["switch_s"] for row in switches["rows"]))
    for part in ("card-48", "card-24"):
        found = results(part)
        add(f"{found['gpu_memory_gib']:g} GiB card: load and edit peak (GiB)", part, name(found["rows"][0]),
            max(found["load_peak_gib"], found["rows"][0]["peak_gib"]))
    return markdown_table(rows, {"figure": "figure", "configuration": "configuration", "measured": "measured",
                                 "stock": "stock", "speedup": "speedup", "run": "measured on"}) + "\n"

def targets() -> str:
    """Issue 16's and 17's targets against what the committed results measured."""
    dit = _named_shape_rows("dit")
    e2e4, e2e40 = _named_rows("e2e-4"), _named_rows("e2e-40")
    new, packaged, restart = (results(part)["rows"][0] for part in ("ready-never-compiled", "ready-package-only",
                                                                     "ready-restart"))
    switches = [row["switch_s"] for row in results("lora-switch")["rows"]]
    card24 = results("card-24")
    # the DiT bench's own figure (median of its repeats), not the lower of it and the ready runs' shorter medians
    checks = [("one DiT forward at 1024x1024 (ms)", 170, dit["best", "1024x1024"]["ms_per_forward"], "best"),
              ("4 steps CFG 1 end to end (s)", 0.9, e2e4["best"]["end_to_end_s"], "best"),
              ("40 steps CFG 4 end to end (s)", 14, e2e40["best"]["end_to_end_s"], "best"),
              ("ready on a machine that never compiled it (s)", 15, new["prepare_s"] + new["first_call_s"], name(new)),
              ("ready on a new machine given its compiled package (s)", 15,
               packaged["prepare_s"] + packaged["first_call_s"], name(packaged)),
              ("ready after a restart (s)", 5, restart["prepare_s"] + restart["first_call_s"], name(restart)),
              ("slowest fused LoRA switch (s)", 2, max(switches), name(results("lora-switch"))),
              ("24 GiB card: load and edit peak (GiB)", 22, max(card24["load_peak_gib"], card24["rows"][0]["peak_gib"]),
               name(card24["rows"][0]))]
    # best-fa3 where it was measured (section 6): faster than best at an edit's prompt, slower at 256 text tokens
    fa3_dit = _named_shape_rows(f"{FA3}/dit")
    fa3_e2e4, fa3_e2e40 = _named_rows(f"{FA3}/e2e-4"), _named_rows(f"{FA3}/e2e-40")
    checks[3:3] = [("one DiT forward at 1024x1024 (ms)", 170, fa3_dit["best-fa3", "1024x1024"]["ms_per_forward"],
                    "best-fa3"),
                   ("4 steps CFG 1 end to end (s)", 0.9, fa3_e2e4["best-fa3"]["end_to_end_s"], "best-fa3"),
                   ("40 steps CFG 4 end to end (s)", 14, fa3_e2e40["best-fa3"]["end_to_end_s"], "best-fa3")]
    rows = [{"target": what, "at most": limit, "measured": measured, "met": "yes" if measured <= limit else "no",
             "configuration": configuration} for what, limit, measured, configuration in checks]
    return markdown_table(rows, {"target": "target", "at most": "at most", "measured": "measured", "met": "met",
                                 "configuration": "measured on"}) + "\n"


SECTIONS = {"targets": targets, "headline": headline, "memory": memory, "gpu-needs": gpu_needs,
            "dit-shapes": dit_shapes, "ready": ready,
            "ready-again": ready_again, "restart-ab": restart_ab, "head-start": head_start,
            "multi-kernel": multi_kernel, "persistent-rows": persistent_rows, "end-to-end": end_to_end,
            "step-cache": step_cache,
            "current": current,
            "process-time": process_time, "lora-switch": lora_switch, "profile": profile, "fused-gelu": fused_gelu,
            "attention-io": attention_io, "cuda-graph": cuda_graph, "whole-forward-graph": whole_forward_graph,
            "stream-gemm": stream_gemm, "text-side-stream": text_side_stream, "pdl": pdl,
            "carried-residual": carried_residual,
            "fused-qkv": fused_qkv,
            "e2e-order": e2e_order,
            "profile-edit": profile_edit, "run-toggles": run_toggles, "attention": attention,
            "attention-lengths": attention_lengths, "cudnn-version": cudnn_version, "fa3-fp8": fa3_fp8,
            "vae-norm": vae_norm,
            "parallel": parallel, "latency": latency, "masked": masked, "qwen21": qwen21, "profile-21": profile_21,
            "openai-latency": openai_latency}


def blocks(text: str) -> list[tuple[str, str]]:
    """(name, body) of each generated block in a document."""
    return [(match["name"], match["body"]) for match in BLOCK.finditer(text)]


def rewrite(text: str) -> str:
    return BLOCK.sub(lambda match: match[1] + SECTIONS[match["name"]]() + match[4], text)


def package_data() -> str:
    """ghostedit/data/figures.json: what the app reads at run time of the committed results (figures.READS)."""
    data = {}
    for part, (keys, row_keys) in figures.READS.items():
        found = results(part)
        data[part] = {"environment": {key: value for key, value in found["environment"].items()
                                      if key in figures.ENVIRONMENT},
                      **{key: found[key] for key in keys},
                      "rows": [{key: row[key] for key in row_keys if key in row} for row in found["rows"]]}
    return json.dumps(data, indent=1, sort_keys=True) + "\n"


def main() -> None:
    for path in FILES:
        path.write_text(rewrite(path.read_text()))
        print(f"wrote the figure blocks of {path.relative_to(ROOT)}", file=sys.stderr)
    PACKAGE_DATA.write_text(package_data())
    print(f"wrote {PACKAGE_DATA.relative_to(ROOT)}", file=sys.stderr)


if __name__ == "__main__":
    main()
