"""What the page's events do, as methods over one engine: each turns control values into engine calls and engine
results into what the components show. Layout lives in layout.py."""
from __future__ import annotations

import html
import random
import secrets
import tempfile
import time
from collections import OrderedDict
from pathlib import Path

import gradio as gr
from gradio.utils import get_upload_folder
from PIL import Image

from ..config import SEED_RANGE
from ..device import UnavailableOptionError
from ..errors import InvalidRequestError
from ..engine.startup import StartUp
from ..images import fit
from ..telemetry import GIB, RunCancelled
from . import live, media
from .history import COMPARISON_RULE, History
from .live_board import LiveBoard
from .mask_inputs import start_values
from .refusals import from_page, refusal, status_words
from .startup import WAITING_FOR_STARTUP, startup_words
from .settings import (NO_LORA, LoraLibrary, edit_request, image_count, image_parameters, lora_summary,
                       panel_config, preset_size, reused_values, seeded_requests, toggle_choices, toggle_parameters,
                       uploaded_images, variant_configs, variants)
from .tables import column_widths, comparison_html, readable
from .system import cache_table, hardware_markdown, options_json, options_table, system_report


# At most one live view of a running edit this often: four a second show every stage a person can read (and each
# view is one more message to the page and one more Markdown to draw)
STREAM_INTERVAL_S = 0.25
TIMER_INTERVAL_S = 1.0  # a view with only the timer moved (no new stage or step)
MAX_BROWSERS = 16  # browsers whose history the server keeps for a page reload (each holds up to MAX_RUNS images)
BEFORE_VIEWS = 16  # the inputs' views kept (the same input edited again shows the same file)
REUSED_REQUEST = ["prompt", "negative_prompt", "steps", "cfg_scale", "seed", "width", "height"]


def builtin_loras(engine) -> dict:
    """The tiny model's own LoRA, so LoRA fusion can be tried on it (real LoRAs are made for the real model). It is
    generated when first picked: importing the tiny model's code would slow the app's start."""
    if engine.spec.kind != "tiny":
        return {}

    def tiny_lora():
        from ..models.tiny import ensure_tiny_lora
        return ensure_tiny_lora("peft")
    return {"tiny_lora_peft.safetensors": ("tiny", tiny_lora)}


class Handlers:
    def __init__(self, engine, lora_dir: Path, startup: StartUp | None = None):
        """`startup`: the engine's background warm-up (engine/startup.py), shown on the page; none by default."""
        self.engine = engine
        self.startup = startup or StartUp(engine, []).start()
        self.loras = LoraLibrary(lora_dir, builtin_loras(engine), hash_after=self.startup.wait)
        self.options = engine.options()
        self.upload_folder = Path(get_upload_folder())
        self.board = LiveBoard()
        self._exports = Path(tempfile.mkdtemp(prefix="ghostedit-exports-"))
        self._browser_histories: OrderedDict[str, History] = OrderedDict()
        # the images sent to the page, in Gradio's file cache (served from there, never copied again)
        self._views = self.upload_folder / "ghostedit-views"
        self._before_views: OrderedDict[str, str] = OrderedDict()  # edit key -> the input's view at the output size

    # ---- choices shown on the page ----

    def choices(self, toggle: str) -> list[tuple[str, str]]:
        return toggle_choices(toggle, self.options[toggle])

    def lora_dropdown(self, value: str = NO_LORA) -> dict:
        return gr.update(choices=self.loras.choices(), value=value)

    # ---- one edit ----

    # Values arrive as sent, unprocessed by Gradio (layout._wire_edit), as {API parameter: value}: the engine's
    # objects check every one. layout.py gives these methods their API signature (api.py) and serves what they
    # yield with answer() (the API) or answer_page() (the page): an answer per finished image, a refusal or a cancel
    # as the last answer, and live.View items for the live view.
    def edit(self, values: dict, history: History, request: gr.Request, progress):
        """`count` images of one edit, with seeds seed, seed+1, ...: each joins the history; a batch's show in the
        run's gallery (one image shows as the before/after pair's second only) and it ends with its total."""
        started = time.perf_counter()
        cancel = self.board.switch(request.session_hash)
        try:
            with media.Stopwatch() as configuration:
                config = panel_config(self.loras, values)
            self.engine.check(config)
            edits = seeded_requests(self._edit_request(values), image_count(values.get("count")))
            self.engine.check_request(edits[0])
        except Exception as error:
            yield from _say_no(refusal(error), request)
            return
        history.begin_call()
        images, results, batch_started = [], [], started
        for index, edit in enumerate(edits, 1):
            heading = f"**Image {index} of {len(edits)}** (seed {edit.seed})\n\n" if len(edits) > 1 else ""
            result = yield from self._run(edit, config, cancel, request, progress, heading, done=len(results))
            if result is None:
                return
            record, before_after, serving = self._shown(result, history, started,
                                                        configuration.seconds if index == 1 else 0.0)
            results.append(result)
            images.append((record.view, f"seed {edit.seed} · {record.label}"))
            status = live.done_status(result, heading)
            if index == len(edits) > 1:
                status = live.batch_status(results, time.perf_counter() - batch_started) + "\n\n" + status
            # one image is the pair's second already: every file in the answer is one more request for a client
            yield (status, before_after, live.run_summary(result), live.result_json(result, record.number, serving),
                   history.table(), images if len(edits) > 1 else [], history)
            started = time.perf_counter()  # the next image's own time

    def run_variants(self, values: dict, history: History, request: gr.Request, progress):
        started = time.perf_counter()  # the first variant's time includes the checks, as an edit's does
        words = variants()
        cancel = self.board.switch(request.session_hash)
        try:
            if image_count(values.get("count")) != 1:
                raise InvalidRequestError("Run variants makes one image per variant, with the seed given: set "
                                          "“Images per run” (count) to 1")
            with media.Stopwatch() as configuration:
                panel = panel_config(self.loras, values)
            runs, notes = variant_configs(values.get("variants"), panel)
            for name, config in runs:  # refuse before the first run, not after an hour of them
                try:
                    self.engine.check(config)
                except UnavailableOptionError as error:
                    raise UnavailableOptionError(f"“{words[name]}”: {error}") from error
            edit = self._edit_request(values)
            self.engine.check_request(edit)
        except Exception as error:
            yield from _say_no(refusal(error), request)
            return
        history.begin_call()
        finished, images = [], []
        for index, (name, config) in enumerate(runs, 1):
            heading = f"**Variant {index} of {len(runs)}: {words[name]}** ({config.label})\n\n"
            result = yield from self._run(edit, config, cancel, request, progress, heading, done=len(finished))
            if result is None:
                return
            record, before_after, serving = self._shown(result, history, started,
                                                        configuration.seconds if index == 1 else 0.0)
            if name == "baseline":
                history.set_baseline(record.number)
            finished.append(live.result_json(result, record.number, serving))
            images.append((record.view, record.label))
            status = live.done_status(result, heading)
            if index == len(runs):
                status = f"### ✅ Ran {len(runs)} variants: see the comparison below\n" + "\n".join(
                    f"- {note}" for note in notes)
            yield (status, before_after, live.run_summary(result),
                   {"state": "done" if index == len(runs) else "running", "runs": finished, "notes": notes},
                   history.table(), images, history)
            started = time.perf_counter()

    def answer(self, answers, request: gr.Request) -> tuple:
        """For the API: a call's answers to the end, its last one returned (the live views reach an API client
        as Gradio's progress updates). Its run can be cancelled (/cancel) while it goes."""
        with self.board.running(request.session_hash):
            last = None
            for item in answers:
                if not isinstance(item, live.View):
                    last = item
            return last

    def answer_page(self, answers, request: gr.Request):
        """For the page: each answer as it comes, with one more output, the follower's trigger (layout.py). The
        run's first live view goes out with it and starts the follower, which then shows the other views and the
        answers' status and JSON (live_board.py says why)."""
        skip = gr.skip()
        with self.board.running(request.session_hash) as run:
            for item in answers:
                if isinstance(item, live.View) and not run.awaited:
                    run.await_follower()
                    yield item.status, skip, skip, item.run_json, skip, skip, skip, secrets.token_hex(8)
                elif isinstance(item, live.View):
                    run.show(item)
                elif run.awaited:
                    status, before_after, summary, run_json, table, images, history = item
                    run.show(live.View(status, run_json))
                    yield skip, before_after, summary, skip, table, images, history, skip
                else:  # refused before the run began: no follower
                    yield (*item, skip)

    async def follow(self, request: gr.Request):
        """The page's live view of this session's run (the status and the run's JSON), from its start to its
        answer; a page closed during the run cancels it. (An async generator: Gradio streams it without holding
        a thread while it waits.)"""
        async for view in self.board.follow(request.session_hash):
            yield view

    def _edit_request(self, values: dict):
        images = uploaded_images([values.get(name) for name in image_parameters()], self.upload_folder)
        family = self.engine.family
        return edit_request(images, values.get("prompt"), values.get("negative_prompt"), values.get("steps"),
                            values.get("cfg_scale"), values.get("seed"), values.get("width"), values.get("height"),
                            keep_alpha=bool(family and family.rgba), **start_values(values, self.upload_folder))

    def _run(self, edit, config, cancel, request: gr.Request, progress, heading: str, done: int = 0):
        """Runs one image, yielding its live views (and giving Gradio's progress) as it goes; returns the result.
        A cancelled or failed run yields its answer and returns None. `done`: the images of this batch finished
        before this one."""
        notice = self.prepare_notice(config)  # before the run starts: it reads what the run will change
        # the engine starts now, not after this first view; a tick every STREAM_INTERVAL_S shows a stage or step
        # the throttle held back (the load's, say) that soon, not only when the next event comes
        stream = live.stream_run(self.engine, edit, config, cancel, tick_seconds=STREAM_INTERVAL_S)
        skip = gr.skip()  # the previous result stays up until this run's replaces it, and after a cancel
        try:
            yield live.View(heading + "### ⏳ Starting…\n" + live.progress_bar(None) + notice, {"state": "starting"})
            shown, shown_event = time.perf_counter(), None  # the "Starting" view
            for item in stream:
                if not isinstance(item, live.Live):
                    return item
                if item.event is not None and item.event.stage == "done":
                    continue  # the result follows at once
                interval = TIMER_INTERVAL_S if item.event is shown_event else STREAM_INTERVAL_S
                if time.perf_counter() - shown < interval:
                    continue  # a later view shows it: a quicker one would only delay the picture
                shown, shown_event = time.perf_counter(), item.event
                if item.event is not None and item.event.total_steps:
                    progress((item.event.step, item.event.total_steps), desc=live.progress_words(item),
                             unit="steps")
                waiting = WAITING_FOR_STARTUP if self.startup.busy else None
                yield live.View(live.live_status(item, heading, waiting), live.progress_json(item))
        except RunCancelled as cancelled:
            yield (heading + live.cancelled_status(cancelled, done), skip, skip,
                   {"state": "cancelled", "message": str(cancelled)}, skip, skip, skip)
            return None
        except Exception as error:
            # the live status must not stay at its last stage ("Loading the model", a frozen timer)
            yield from _say_no(refusal(error), request, heading, during_run=True)
            return None
        finally:
            stream.close()  # a run left behind (the call closed early) is cancelled at its next step

    def _shown(self, result, history: History, started: float, configuration_s: float):
        """A finished run joins the history, and its images are made ready to show (JPEG views: ui/media.py);
        returns the run's record, the before/after pair and where the handler's time went beside the engine's
        (`configuration_s`: the panel's values read into the run's configuration, each LoRA file's content hash
        with them: a file the library had not hashed yet is read whole there)."""
        record = history.add(result)
        with media.Stopwatch() as encoding:
            record.view = media.view_file(result.image, self._views)
            before_after = (self._before_view(result, record.edit_key), record.view)
        handler_s = time.perf_counter() - started
        engine_s = result.telemetry.total_seconds
        return record, before_after, {
            "handler_s": handler_s, "engine_s": engine_s, "configuration_s": configuration_s,
            "output_encoding_s": encoding.seconds,
            "other_s": handler_s - engine_s - configuration_s - encoding.seconds,
            "outside": "Gradio's queue before the handler starts, and the answer's way to the client after it, are "
                       "not in handler_s; the image metrics come after the answer (/comparison)"}

    def _before_view(self, result, edit_key: str) -> str:
        """The first input at the output's size (resized once from the upload) as shown, and for text-to-image
        (no input) an empty, transparent image of the output's size; the same edit again (another configuration,
        steps or CFG) shows the same file."""
        if edit_key not in self._before_views:
            before = (fit(result.request.images[0], result.image.size) if result.request.images
                      else Image.new("RGBA", result.image.size))
            self._before_views[edit_key] = media.view_file(before, self._views)
            while len(self._before_views) > BEFORE_VIEWS:
                self._before_views.popitem(last=False)
        self._before_views.move_to_end(edit_key)
        return self._before_views[edit_key]

    def cancel(self, request: gr.Request) -> None:
        if not self.board.cancel(request.session_hash):
            gr.Info("Nothing of yours is running.")
            return
        gr.Info("Cancelling: the run stops at the next step.")

    # ---- start-up ----

    def startup_view(self):
        """The start-up notice, and its timer: polling while start-up goes on."""
        return (startup_words(self.startup.status(), dict(self.startup.events)),
                gr.Timer(active=self.startup.busy))

    def startup_status(self) -> dict:
        """What the start-up warm-up is doing or did: `state` (warming, ready, failed or off), the configuration
        being warmed, seconds since start, each worker's stage now, and each configuration warmed with its stage
        times."""
        return self.startup.status()

    # ---- before a run ----

    def prepare_notice(self, config) -> str:
        """What the next run with `config` will spend before denoising, from earlier runs on this machine."""
        try:
            self.engine.check(config)
        except UnavailableOptionError as error:
            return f"⚠️ {error}"
        expected = self.engine.expected_prepare_seconds(config)
        notice = []
        if self.engine.load_count == 0:
            notice.append("The model loads on the first run.")
        compiles = config.value("compile") != "off"
        if expected == 0:
            notice.append(f"**{config.label}** is prepared and warm: the run goes straight to encoding and denoising.")
        elif expected is None:
            notice.append(f"First use of **{config.label}**: it is prepared before the run "
                          "(not measured yet on this machine).")
            if compiles:
                notice.append(f"⚠️ **This run compiles the DiT** (torch.compile {config.value('compile')}) before "
                              "its first step at each output size: expect about a minute on a GPU and several on a "
                              "CPU, shown as “compiling” in the time chart; later runs at that size reuse it.")
        else:
            notice.append(f"First use of **{config.label}**: preparing took {expected:.1f} s last time on this "
                          "machine.")
            if compiles:
                notice.append(f"⚠️ **This run compiles the DiT** (torch.compile {config.value('compile')}): "
                              f"that is counted in the {expected:.1f} s.")
        return " ".join(notice)

    def panel_views(self, *values):
        """For the panel's toggles (in the order of toggle_parameters()): the prepare notice, and the one-line
        summaries of the LoRA and speed sections."""
        values = dict(zip(toggle_parameters(), values))
        loras = gr.Accordion(label=lora_summary(values))
        try:
            config = panel_config(self.loras, values)
        except Exception as error:
            invalid = gr.Accordion(label="Speed · ⚠️ not valid")
            return f"⚠️ {html.escape(str(error), quote=False)}", loras, invalid
        speed = config.replace(loras=()).label
        try:
            self.engine.check(config)
        except UnavailableOptionError:
            speed += " · ⚠️ cannot run here"
        return self.prepare_notice(config), loras, gr.Accordion(label=f"Speed · {speed}")

    @staticmethod
    def random_seed() -> int:
        return random.randint(*SEED_RANGE)

    def upload_lora(self, file, request: gr.Request):
        """Saves an uploaded .safetensors LoRA into the LoRA folder under a safe name and selects it. On the page a
        refused file is said beside the button (and then in the status panel: said_in_status)."""
        try:
            if file is None:
                raise InvalidRequestError("no file received")
            name = self.loras.add(file, Path(file).name)
        except Exception as error:
            failure = refusal(error, "Cannot use this LoRA")
            if not from_page(request):
                raise failure from error
            return gr.skip(), f"⛔ Not saved: {failure.message}"
        return self.lora_dropdown(name), f"Saved as `{name}` in `{self.loras.folder}`."

    @staticmethod
    def said_in_status(message: str):
        """A refusal said beside a control (a message that starts with ⛔), said in the status panel too."""
        if not (message or "").startswith("⛔"):
            return gr.skip()
        return f"### {message.replace(': ', chr(10), 1)}"

    # ---- the history of a browser, kept across page reloads ----

    def restore_history(self, browser_key: str | None):
        """On page load: the history of this browser (its key is kept in the browser's storage, gr.BrowserState),
        and the key, a new one for a browser seen for the first time. Histories live in this server's memory (each
        holds its runs' images), for the MAX_BROWSERS browsers seen last."""
        if not browser_key or browser_key not in self._browser_histories:
            browser_key = browser_key or secrets.token_urlsafe(24)
            self._browser_histories[browser_key] = History()
        self._browser_histories.move_to_end(browser_key)
        while len(self._browser_histories) > MAX_BROWSERS:
            self._browser_histories.popitem(last=False)
        history = self._browser_histories[browser_key]
        return browser_key, history, readable(history.table())

    def remember_history(self, browser_key: str | None, history: History) -> None:
        if browser_key:
            self._browser_histories[browser_key] = history

    def reuse_settings(self, number, history: History):
        """An earlier run's input images and panel values, in the order of layout's reuse outputs (the image slots,
        the request values, then the toggles, then the note)."""
        run = history.run(number)
        slots = len(image_parameters())
        if run is None:
            return [gr.skip()] * (slots + len(REUSED_REQUEST) + len(toggle_parameters())) + [
                "Pick a run of the history first."]
        values = reused_values(self.loras, run.params, run.toggles)
        missing = [lora["name"] for lora in run.toggles["loras"]
                   if lora["name"] not in {Path(value).stem for _, value in self.loras.choices()}]
        note = f"The images and settings of run {run.label} are back in the panel." + (
            f" Not found in the LoRA folder any more: {', '.join(missing)}." if missing else "")
        images = list(run.inputs) + [None] * (slots - len(run.inputs))
        return images + [values[name] for name in REUSED_REQUEST + list(toggle_parameters())] + [note]

    def aspect_size(self, preset: str):
        return preset_size(preset, self.engine.spec.default_area)

    # ---- the comparison ----

    def compare_views(self, history: History):
        """Gallery, charts, baseline picker, the table's column widths, the runs to reuse and the comparison, for
        the session's history: what shows at once after a run (the image metrics follow in `comparison`)."""
        return (history.gallery(), history.stage_chart(), history.memory_chart(),
                gr.update(choices=[(run.label, run.number) for run in history.runs], value=history.baseline_number),
                _comparison_caption(history),
                gr.update(column_widths=column_widths(history.table())),  # here: the API's table stays plain data
                gr.update(choices=[(run.label, run.number) for run in reversed(history.runs)],
                          value=history.runs[-1].number if history.runs else None),
                comparison_html(history.compact_rows(), history.memory_kind()))

    @staticmethod
    def chart_order(history: History):
        """The charts' bars in run order (the plot sorts them by name otherwise). Sent after the data, in an event
        of its own: the plot redraws from its data of the moment when its order changes, and in the same update
        that data would be the previous one."""
        order = list(history.names().values()) or None
        return gr.BarPlot(sort=order), gr.BarPlot(sort=order)

    def comparison(self, history: History):
        """The session's comparison table with every image difference against the baseline (PSNR, SSIM) computed,
        and the outputs of its latest /edit or /run_variants as lossless PNG files. An edit answers before these
        are made (its table says "pending"): the page asks for them right after each run, an API client when it
        wants them."""
        history.compute_metrics()
        latest = [run for run in history.runs if run.number in history.latest_call]
        for run in latest:
            if run.png is None:
                run.png = media.png_file(run.image, self._views, f"ghostedit-run-{run.number}")
        # the table's column widths were set for it by compare_views, its pending cells as wide as computed ones
        return history.table(), [run.png for run in latest] or None

    @staticmethod
    def comparison_view(history: History) -> str:
        """The page's comparison (configuration, s/step, speed-ups, PSNR/SSIM, memory), once `comparison` has
        computed the image metrics."""
        return comparison_html(history.compact_rows(), history.memory_kind())

    def exports(self, history: History, request: gr.Request):
        """The history as CSV and JSON files for the export buttons (after `comparison`: the metrics are in)."""
        folder = self._exports / (request.session_hash or "api")
        csv_path, json_path = history.write_exports(folder) if history.runs else (None, None)
        return (gr.update(value=csv_path, interactive=csv_path is not None),
                gr.update(value=json_path, interactive=json_path is not None))

    @staticmethod
    def set_baseline(number, history: History):
        history.set_baseline(None if number is None else int(number))
        return readable(history.table()), history

    @staticmethod
    def clear_question(history: History):
        """Before the history is cleared: how many runs would go (the page asks to confirm)."""
        runs = len(history.runs)
        if not runs:
            return gr.Row(visible=True), "There are no runs to clear."
        return (gr.Row(visible=True),
                f"Clear all {runs} run{'s' if runs > 1 else ''} of this browser? This cannot be undone.")

    @staticmethod
    def clear_history(history: History):
        history.clear()
        return readable(history.table()), history, gr.Row(visible=False)

    # ---- the system ----

    def system(self) -> dict:
        """GPU, driver, CUDA, library versions, every option's availability with the reason, the memory in use now
        and the cached pipelines."""
        return system_report(self.engine)

    def system_views(self):
        report = system_report(self.engine)
        return (hardware_markdown(report), readable(options_table(report)),
                readable(cache_table(report["cached_pipelines"])))

    def free_cache(self) -> dict:
        """Drops every prepared pipeline (the base weights stay loaded) and says how much memory that freed."""
        freed = self.engine.free()
        return {"freed_gib": freed / GIB, "cached_pipelines": self.engine.cached()}

    def free_cache_views(self):
        freed = self.free_cache()
        return (f"Freed {freed['freed_gib']:.3f} GiB of prepared pipelines (the base weights stay loaded).",
                readable(cache_table(freed["cached_pipelines"])))

    def api_options(self) -> dict:
        """Every toggle's choices with availability and reason, the LoRA choices, and the model's defaults."""
        return {
            "options": options_json(self.options),
            "loras": [value for _, value in self.loras.choices()],
            "variants": variants(),
            "model": {"source": self.engine.spec.source, "default_steps": self.engine.spec.default_steps},
        }


def _say_no(failure: gr.Error, request: gr.Request, heading: str = "", during_run: bool = False):
    """A refused edit, or one that failed while it ran: the reason in the status panel, the other outputs left as
    they are; an API client gets the error itself (refusals.py)."""
    skip = gr.skip()
    yield (status_words(failure, heading, during_run), skip, skip,
           {"state": "failed" if during_run else "refused", "message": failure.message}, skip, skip, skip)
    if not from_page(request):
        raise failure


def _comparison_caption(history: History) -> str:
    if not history.runs:
        return ""  # the comparison itself says there are no runs yet
    baseline = history.baseline()
    return (f"Baseline: **{baseline.label}**. Memory is {history.memory_kind()}. {COMPARISON_RULE}")
