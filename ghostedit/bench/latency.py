"""The latency level of `ghostedit bench`: what a person waits for. It starts the real app (`ghostedit serve`, the
same as `python app.py`) in a process of its own, calls its public `/edit` through gradio_client as an API client
does, and reports for every call the client's wall time beside the engine's `telemetry.total_s`, and where the
difference went: the app's handler outside the engine (the run JSON's `serving`: waiting for the engine, encoding
the views), and outside the handler, in parts: the client's upload of the input and its downloads of the outputs
(timed in gradio_client's own steps), Gradio's queue wait, its preprocessing, its postprocessing of the answer
(after the handler; from Gradio's own record of each request, its profiling traces, which also give what each
update of the page's live view costs it while the engine works), and the rest (the transport and the client
library). gradio_client 2.7 sets up TLS for each of its HTTP requests (each file download one), even to an
http:// app: it hands its `ssl_verify` to a new httpx client per request, which loads the CA bundle each time. The
first configuration's warm calls are made again by a second client given one SSL context to share
(`ssl_verify=one_ssl_context()`: certificates still checked, the bundle loaded once; docs/api.md), labelled so,
beside the default client's (the headline: what a gradio_client script waits). The engine's stages are checked against its
total (`unnamed_s`: what no stage names).

The app's own start is in results.json too: its timeline before the page answered, step by step (`page_start`,
from /startup: ui/serve.py), beside the page's answer as this process saw it (`page_up_s`), and the start-up
warm-up's stages (`startup`).

Rows, for each configuration of each run (--configs at the run's steps, CFG and size):
- "first edit after start" (the first run's first configuration): submitted the moment the page answers, while
  the app's start-up warms --warm-up (by default that configuration): the page's start, the client's wait, and
  the time from the app's launch to the picture;
- "first call": a configuration's first edit in this app (it prepares it, unless start-up did);
- "warm": --repeats more calls; for the first configuration also "warm, client with one SSL context" (as many);
- "LoRA switch" (--lora-switch N): N calls on the first configuration switching between two fused LoRAs, random
  and shaped like real ones (every linear of every block at --lora-rank);
- "browser" (--browser-calls N): edits through the page in Debian's chromium (playwright), from the click on Run
  to the picture on screen, with the page's own settings.
The runs chained with --then share the app (one start)."""
from __future__ import annotations

import json
import os
import re
import socket
import ssl
import statistics
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import certifi

from ..config import OptimizationConfig
from ..ui.start_timeline import page_start_words
from .output import environment, markdown_table, write_results

APP_START_TIMEOUT_S = 600   # the full-size model's imports on a loaded machine; start-up warms in the background
CALL_TIMEOUT_S = 900        # a cold first call compiles
CHROMIUM = os.environ.get("GHOSTEDIT_CHROMIUM", "/usr/bin/chromium")
EDIT_IMAGE = Path(__file__).resolve().parents[2] / "assets" / "examples" / "house.png"
ONE_SSL_CONTEXT = "warm, client with one SSL context"
COLUMNS = {"case": "case", "calls": "calls", "client_s": "client waits s", "engine_s": "engine total s",
           "gap_s": "difference s", "handler_outside_engine_s": "handler outside the engine s",
           "outside_handler_s": "outside the handler s", "postprocess_per_update_ms": "Gradio ms per update",
           "live_view_ms_per_update": "page's live view: Gradio ms per update",
           "unnamed_s": "engine time no stage names s"}
# the parts of "outside the handler s"
OUTSIDE_COLUMNS = {"case": "case", "outside_handler_s": "outside the handler s",
                   "client_upload_s": "client's upload s", "gradio_queue_wait_s": "Gradio queue s",
                   "gradio_preprocess_s": "Gradio before the handler s",
                   "gradio_after_handler_s": "Gradio after the handler s",
                   "client_download_s": "client's downloads s", "outside_rest_s": "transport and client, the rest s"}


@dataclass
class App:
    url: str
    process: subprocess.Popen
    launched: float        # time.perf_counter() at the launch
    page_up_s: float       # launch to the page answering
    edits: int = 0         # /edit calls answered


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.status == 200
    except OSError:
        return False


def start_app(source: str, device: str, dtype: str | None, warm_up: list[str], lora_dir: Path, log: Path) -> App:
    """`ghostedit serve` on a free port, with Gradio's per-request profiling on; returns once the page answers."""
    port = free_port()
    command = [sys.executable, "-m", "ghostedit", "serve", "--model", source, "--device", device, "--port", str(port),
               "--lora-dir", str(lora_dir), "--warm-up", *warm_up] + (["--dtype", dtype] if dtype else [])
    url = f"http://127.0.0.1:{port}/"
    launched = time.perf_counter()
    with open(log, "w") as log_file:
        process = subprocess.Popen(command, stdout=log_file, stderr=subprocess.STDOUT,
                                   env={**os.environ, "GRADIO_PROFILING": "1"})
    while not answers(url):
        if process.poll() is not None or time.perf_counter() - launched > APP_START_TIMEOUT_S:
            process.kill()
            raise SystemExit(f"the app did not start (exit code {process.poll()}):\n{log.read_text()[-3000:]}")
        time.sleep(0.1)
    return App(url, process, launched, time.perf_counter() - launched)


def stop_app(app: App) -> None:
    app.process.terminate()
    try:
        app.process.wait(timeout=60)
    except subprocess.TimeoutExpired:
        app.process.kill()


def edit_parameters(config: OptimizationConfig, lora: str | None = None) -> dict:
    """/edit's toggle parameters for a configuration (without LoRAs), and one fused LoRA by its name in the app's
    LoRA folder."""
    from ..ui.settings import lora_parameter, setting_parameter
    if config.loras:
        raise SystemExit(f"{config.label}: the latency level calls the app with LoRAs from its own folder "
                         "(--lora-switch), not the configuration's")
    values = {setting_parameter(setting): list(value) if isinstance(value, tuple) else value
              for setting, value in config.settings().items()}
    if lora is not None:
        values.update({lora_parameter(1): lora, lora_parameter(1, "mode"): "fused", lora_parameter(1, "scale"): 1.0})
    return values


def one_ssl_context() -> ssl.SSLContext:
    """What gradio_client's `ssl_verify` may be instead of True: an SSL context that checks certificates against the
    same CA bundle as httpx's default (certifi's), made once and shared by every request of the client (httpx takes
    a context as given; True makes it build one, the bundle loaded, per request)."""
    return ssl.create_default_context(cafile=certifi.where())


class Caller:
    """One client session of the app, calling /edit with one request's values. `ssl_verify`: gradio_client's own
    option (the default, True, sets up TLS for every HTTP request, even to http://)."""

    def __init__(self, app: App, args, ssl_verify: bool | ssl.SSLContext = True):
        from gradio_client import Client
        self.app = app
        self.client = Client(app.url, verbose=False, ssl_verify=ssl_verify)
        given = {"prompt": args.prompt, "negative_prompt": args.negative_prompt, "seed": args.seed,
                 "steps": args.steps, "cfg_scale": args.cfg, "width": args.width, "height": args.height}
        self.request = {name: value for name, value in given.items() if value is not None}  # else the app's default
        self.image = (args.image or [str(EDIT_IMAGE)])[0]
        self.client_steps = timed_client_steps(self.client)

    def edit(self, kind: str, config: OptimizationConfig, parameters: dict) -> dict:
        from gradio_client import handle_file
        self.client_steps.clear()
        start = time.perf_counter()
        outputs = self.client.submit(image=handle_file(self.image), **self.request, **parameters,
                                     api_name="/edit").result(timeout=CALL_TIMEOUT_S)
        client_s = time.perf_counter() - start
        self.app.edits += 1
        return {**call_row(kind, config.label, client_s, outputs[3]), "text": config.text,
                "client_upload_s": self.client_steps.get("upload", 0.0),
                "client_download_s": self.client_steps.get("download", 0.0)}

    def comparison_s(self) -> float:
        """The follow-up that computes the image metrics and the PNG (off every edit's way)."""
        start = time.perf_counter()
        self.client.predict(api_name="/comparison")
        return time.perf_counter() - start


def timed_client_steps(client) -> dict:
    """The seconds this client's endpoints spend in their own steps of a call, by name, summed since the dict was
    last cleared: "upload" (gradio_client's process_input_files: the input files sent to the app, one request each)
    and "download" (process_predictions: the output files fetched, one request each), each timed around the
    client's own method of that endpoint object."""
    seconds: dict[str, float] = {}

    def timed(step: str, method):
        def call(*args, **kwargs):
            began = time.perf_counter()
            try:
                return method(*args, **kwargs)
            finally:
                seconds[step] = seconds.get(step, 0.0) + time.perf_counter() - began
        return call

    for endpoint in client.endpoints.values():
        endpoint.process_input_files = timed("upload", endpoint.process_input_files)
        endpoint.process_predictions = timed("download", endpoint.process_predictions)
    return seconds


def call_row(kind: str, case: str, client_s: float, run: dict) -> dict:
    telemetry, serving = run["telemetry"], run["serving"]
    stages = telemetry["stages_s"]
    return {"kind": kind, "case": case, "config": run["configuration"], "steps": run["steps"],
            "cfg": run["cfg_scale"], "size": f"{run['width']}x{run['height']}", "client_s": client_s,
            "engine_s": telemetry["total_s"], "gap_s": client_s - telemetry["total_s"],
            "handler_s": serving["handler_s"], "configuration_s": serving["configuration_s"],
            "output_encoding_s": serving["output_encoding_s"],
            "handler_outside_engine_s": serving["handler_s"] - telemetry["total_s"],
            "outside_handler_s": client_s - serving["handler_s"],
            "stages_s": stages, "unnamed_s": telemetry["total_s"] - sum(stages.values()),
            "cache_hit": telemetry["cache_hit"], "worker": telemetry["worker"],
            "compile": run["prepared_report"].get("compile")}  # says whether a compiled package was loaded


def gradio_traces(app: App, fn_name: str = "edit", count: int | None = None) -> list[dict]:
    """Gradio's own record of every call of `fn_name` answered so far (by default every /edit), in order
    (GRADIO_PROFILING); Gradio files a request's record just after its answer, so this waits for `count` of them
    (default: the /edit calls made)."""
    count = app.edits if count is None else count
    deadline = time.perf_counter() + 30
    while True:
        with urllib.request.urlopen(app.url + "gradio_api/profiling/traces", timeout=30) as response:
            traces = [trace for trace in json.load(response) if trace["fn_name"] == fn_name]
        if len(traces) >= count or time.perf_counter() > deadline:
            return traces
        time.sleep(0.1)


def with_gradio(rows: list[dict], traces: list[dict]) -> None:
    """Each call's row gets Gradio's record of it (calls and records in the same order): its wait in Gradio's
    queue, and what Gradio's post-processing of its answer (/edit answers once, after the handler) cost."""
    for row, trace in zip(rows, traces):
        per_update = trace["postprocess_ms"] / max(1, trace["n_iterations"]) / 1000
        row.update(gradio_queue_wait_s=trace["queue_wait_ms"] / 1000, updates=trace["n_iterations"],
                   gradio_postprocess_s=trace["postprocess_ms"] / 1000, postprocess_per_update_ms=per_update * 1000,
                   gradio_preprocess_s=trace["preprocess_ms"] / 1000,
                   # the last update's postprocessing comes after the handler; Gradio records their sum only
                   gradio_after_handler_s=per_update)
        named = ("client_upload_s", "gradio_queue_wait_s", "gradio_preprocess_s", "gradio_after_handler_s",
                 "client_download_s")
        row["outside_rest_s"] = row["outside_handler_s"] - sum(row[key] for key in named)


def random_loras(source: str, rank: int, folder: Path) -> list[str]:
    """Two random fused-LoRA files for the model's DiT (built on the meta device for its shapes) in the app's LoRA
    folder; their names."""
    import torch

    from .lora_switch import synthetic_lora
    with torch.device("meta"):
        if source == "tiny":
            from ..models.tiny import TinyQwenImageDiT
            dit = TinyQwenImageDiT()
        elif source == "synthetic":
            from diffsynth.models.qwen_image_dit import QwenImageDiT

            from ..models.synthetic import DIT_LAYERS
            dit = QwenImageDiT(num_layers=DIT_LAYERS)
        else:
            raise SystemExit("--lora-switch writes random LoRAs shaped for the tiny or the synthetic model")
    return [synthetic_lora(dit, rank, seed, folder / f"latency-{name}-r{rank}.safetensors").name
            for name, seed in (("a", 1), ("b", 2))]


def browser_edit(app: App, image: str, prompt: str) -> dict:
    """One edit through the page in chromium, with the page's own settings: the seconds from the click on Run to the
    result shown (the status says done and both sides of the before/after have loaded), read in the page; the
    page's own "time waited" (#waited) where it shows one; the engine's total from the status."""
    from playwright.sync_api import sync_playwright
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True,
                                             args=["--no-sandbox", "--disable-gpu", "--no-first-run"])
        try:
            page = browser.new_page(viewport={"width": 1440, "height": 900})
            page.goto(app.url, wait_until="load")
            page.locator("#input_image input[type=file]").set_input_files(image)
            page.locator("#prompt textarea").fill(prompt)
            page.wait_for_function("() => document.querySelector('#input_image img') !== null")
            page.evaluate("""() => document.querySelector('#run').addEventListener(
                'click', () => { window.__ghostClick = performance.now(); }, {capture: true, once: true})""")
            page.locator("#run").click()
            page.wait_for_function(
                """() => {
                  const status = document.querySelector('#status');
                  const shown = [...document.querySelectorAll('#result img')];
                  if (status && /❌|⏹/.test(status.innerText)) return true;  // refused or cancelled: said below
                  if (!status || !status.innerText.includes('Done in') || shown.length < 2) return false;
                  if (!shown.every((img) => img.complete && img.naturalWidth > 0)) return false;
                  window.__ghostShown = window.__ghostShown || performance.now();
                  return true;
                }""", timeout=CALL_TIMEOUT_S * 1000)
            status = page.locator("#status").inner_text()
            if "Done in" not in status:
                raise SystemExit(f"the browser's edit did not finish: {status}")
            seconds = page.evaluate("() => (window.__ghostShown - window.__ghostClick) / 1000")
            waited = page.locator("#waited")
            waited_text = waited.inner_text() if waited.count() else None
        finally:
            browser.close()
    engine = re.search(r"Done in ([0-9.]+) s", status)
    engine_s = float(engine[1]) if engine else None
    return {"kind": "browser", "case": "the page's settings", "client_s": seconds, "engine_s": engine_s,
            "gap_s": None if engine_s is None else seconds - engine_s, "page_waited": waited_text,
            "note": "click on Run to the picture loaded, read in the page (requestAnimationFrame polling)"}


def with_live_views(rows: list[dict], app: App) -> None:
    """Each browser edit's row gets what its live view cost Gradio: the page's follower event (ui/live_board.py)
    streams the status and the run's JSON while the engine works; its updates and Gradio's post-processing of each,
    from Gradio's record of it."""
    if not rows:
        return
    traces = gradio_traces(app, "follow", len(rows))[-len(rows):]
    for row, trace in zip(rows, traces):
        row.update(live_views=trace["n_iterations"],
                   live_view_ms_per_update=trace["postprocess_ms"] / max(1, trace["n_iterations"]))


def browser_missing() -> str | None:
    """Why no browser edit can run here, or None."""
    if not Path(CHROMIUM).exists():
        return f"no chromium at {CHROMIUM} (GHOSTEDIT_CHROMIUM)"
    try:
        import playwright  # noqa: F401
    except ImportError:
        return "the playwright package is not installed"
    return None


def summarize(rows: list[dict]) -> list[dict]:
    """Medians per case and kind, in the order the calls ran."""
    groups: dict[tuple, list[dict]] = {}
    for row in rows:
        groups.setdefault((row["case"], row["kind"]), []).append(row)
    summary = []
    for (case, kind), members in groups.items():
        line = {"case": f"{case}: {kind}", "kind": kind, "config": case, "text": members[0].get("text"),
                "calls": len(members)}
        for key in dict.fromkeys([*COLUMNS, *OUTSIDE_COLUMNS]):
            if key in ("case", "calls"):
                continue
            values = [row[key] for row in members if row.get(key) is not None]
            line[key] = statistics.median(values) if values else None
        summary.append(line)
    return summary


def run_latency_bench(runs: list, configs: list[list[OptimizationConfig]], source: str, device: str, context: dict,
                      timeline) -> None:
    """Every run's calls on one app; each run's results.json and table.md in its --out-dir."""
    first = runs[0]
    out_dirs = [Path(run.out_dir) for run in runs]
    for folder in out_dirs:
        folder.mkdir(parents=True, exist_ok=True)
    lora_dir = out_dirs[0] / "loras"
    lora_dir.mkdir(exist_ok=True)
    switching = any(run.lora_switch for run in runs)
    loras = random_loras(source, first.lora_rank, lora_dir) if switching else []
    timeline.mark("LoRA files written" if loras else "ready to start the app")
    warm_up = first.warm_up or [configs[0][0].text or "stock"]
    app = start_app(source, device, first.dtype, warm_up, lora_dir, out_dirs[0] / "app.log")
    timeline.mark("the page answers")
    try:
        for index, (run, run_configs, out_dir) in enumerate(zip(runs, configs, out_dirs)):
            rows, notes = [], []
            if index == 0:
                caller = Caller(app, run)
                row = caller.edit("first edit after start", run_configs[0], edit_parameters(run_configs[0]))
                row.update(page_up_s=app.page_up_s, launch_to_picture_s=time.perf_counter() - app.launched)
                rows.append(row)
                timeline.mark("first edit after start")
            for number, config in enumerate(run_configs):
                caller = Caller(app, run)
                parameters = edit_parameters(config)
                kinds = ["first call"] if not rows or rows[-1]["case"] != config.label else []
                for kind in kinds + ["warm"] * run.repeats:
                    rows.append(caller.edit(kind, config, parameters))
                rows[-1]["comparison_s"] = caller.comparison_s()
                if number == 0 and run.repeats:  # the same calls without gradio_client's TLS set-up per request
                    shared = Caller(app, run, ssl_verify=one_ssl_context())
                    rows += [shared.edit(ONE_SSL_CONTEXT, config, parameters) for _ in range(run.repeats)]
                timeline.mark(config.label)
            if run.lora_switch:
                caller = Caller(app, run)
                for call in range(run.lora_switch + 1):  # the first call reads and fuses the first LoRA
                    rows.append(caller.edit("LoRA switch", run_configs[0],
                                            edit_parameters(run_configs[0], loras[call % 2])))
                    rows[-1]["switch_s"] = rows[-1]["stages_s"].get("LoRA switch", 0.0)
                timeline.mark("LoRA switches")
            with_gradio(rows, gradio_traces(app)[-len(rows):])
            for _ in range(run.browser_calls):
                missing = browser_missing()
                if missing:
                    notes.append(f"browser edit not measured: {missing}")
                    break
                rows.append(browser_edit(app, caller.image, run.prompt))
            with_live_views([row for row in rows if row["kind"] == "browser"], app)
            startup = Caller(app, run).client.predict(api_name="/startup")
            if index == 0:  # the app's own start, step by step, beside the page's answer as seen from here
                rows[0]["page_start"] = startup["page_start"]
            write_run(out_dir, run, {**context, "startup": startup, "notes": notes,
                                     "warm_up": warm_up if index == 0 else None}, rows)
            timeline.mark(f"results of {out_dir.name}")
    finally:
        stop_app(app)


def start_words(page_start: dict, startup: dict) -> str:
    """The app's start in words (ui/start_timeline.py), and the start-up warm-up's stages."""
    warmed = "; ".join(f"{item['configuration']} in {item['seconds']:.1f} s ("
                       + ", ".join(f"{stage} {seconds:.2f}" for stage, seconds in item["stages_s"].items()) + ")"
                       for item in startup["warmed"])
    return (f"The app's start (its own clock): {page_start_words(page_start)}."
            + (f" Start-up warmed {warmed}." if warmed else ""))


def write_run(out_dir: Path, run, context: dict, rows: list[dict]) -> None:
    summary = summarize(rows)
    write_results(out_dir, {**context, "environment": environment(), "steps": run.steps, "cfg_scale": run.cfg,
                            "size": [run.width, run.height], "repeats": run.repeats, "summary": summary,
                            "rows": rows})
    table = (markdown_table(summary, COLUMNS) + "\n\nOutside the handler, in parts (medians; Gradio after the handler: "
             "its postprocessing per update):\n\n"
             + markdown_table([line for line in summary if line["kind"] != "browser"], OUTSIDE_COLUMNS))
    first = next((row for row in rows if row["kind"] == "first edit after start"), None)
    if first is not None:
        table += (f"\n\nFirst edit after start: the page answered {first['page_up_s']:.1f} s after the launch, the "
                  f"picture came {first['launch_to_picture_s']:.1f} s after it; the edit waited {first['client_s']:.2f} s"
                  f" for an engine total of {first['engine_s']:.2f} s (stages: "
                  + ", ".join(f"{stage} {seconds:.2f}" for stage, seconds in first["stages_s"].items()) + ").\n\n"
                  + start_words(first["page_start"], context["startup"]))
    (out_dir / "table.md").write_text(table + "\n")
    print(table, flush=True)
