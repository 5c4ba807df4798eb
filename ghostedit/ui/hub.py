"""The page's Hub controls: pick the model from the supported family (its download announced before the first run),
fetch a LoRA by repo id or URL, and apply a Lightning preset. A download's size is said before it starts and its
progress (bytes, speed, time left) streams to the page while it runs (ghostedit/downloads.py does the work)."""
from __future__ import annotations

import html
import queue
import threading

import gradio as gr

from .. import downloads
from ..config import lightning_lora
from ..engine import Engine
from ..models.family import RELEASED
from ..optimize.presets import LIGHTNING, PresetError, model_family
from .handlers import builtin_loras
from .refusals import from_page, refusal, status_words
from .settings import LORA_SLOTS, NO_LORA, LoraLibrary

NO_PRESET = "none"
TICK_SECONDS = 0.5


def model_choices(current: str) -> list[tuple[str, str]]:
    """The released models, the tiny ones, and the current source if it is neither (a local folder)."""
    choices = [(repo, repo) for repo in reversed(RELEASED)] + [("tiny (random weights, CPU)", "tiny"),
                                                              ("tiny-2.1 (random weights, CPU)", "tiny-2.1")]
    if current not in dict((value, label) for label, value in choices):
        choices.append((current, current))
    return choices


def model_words(engine) -> str:
    """What the chosen model is and, for a hub repo, what its download weighs against the free disk."""
    spec = engine.spec
    licence = f"\n\n⚖️ {spec.known_family.name} is released under the **{spec.licence}**." if spec.licence else ""
    if spec.kind == "hub" and engine.load_count == 0:
        return downloads.model_download_words(spec.source) + licence
    return f"Model: {spec.description}; {spec.recognised}." + licence


def preset_choices() -> list[tuple[str, str]]:
    return [("no preset", NO_PRESET)] + [(preset.words, preset.name) for preset in LIGHTNING.values()]


def preset_words(engine, name: str) -> str:
    """Before a preset is applied: what it sets and what it must download first (or why it cannot apply)."""
    if name in (None, NO_PRESET):
        return ""
    preset = LIGHTNING.get(name)
    if preset is None:
        return f"⚠️ unknown preset {html.escape(str(name))}"
    try:
        reference = preset.lora_reference(model_family(engine.spec.source))
    except PresetError as error:
        return f"⚠️ {html.escape(str(error))}"
    return (f"{preset.steps} steps, CFG 1, Lightning schedule and the LoRA {reference.split(':')[-1]}: "
            f"{html.escape(downloads.lora_download_words(reference))}. Press *Apply preset*.")


def stream_download(work):
    """Runs `work(on_progress)` in a thread; yields the progress words as they come (and every TICK_SECONDS), then
    returns what `work` returned. Its error is raised here."""
    events: queue.Queue = queue.Queue()
    outcome: dict = {}

    def run():
        try:
            outcome["value"] = work(events.put)
        except BaseException as error:  # noqa: BLE001 - raised again below, in the page's thread
            outcome["error"] = error
        finally:
            events.put(None)

    threading.Thread(target=run, name="ghostedit-download", daemon=True).start()
    latest = "⏳ Looking the file up on the Hub…"
    while True:
        try:
            item = events.get(timeout=TICK_SECONDS)
        except queue.Empty:
            yield latest
            continue
        if item is None:
            break
        latest = f"⬇ {item.summary}" if isinstance(item, downloads.DownloadPlan) else f"⬇ {item.words}"
        yield latest
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


class HubControls:
    """Event handlers for the model picker, the Hub LoRA fetcher and the presets, over the page's Handlers (whose
    engine a model change replaces). Each ends with the status panel's words: on the page a refusal is said there
    (refusals.py), the controls it concerns left as they were; an API client gets it as an error."""

    def __init__(self, handlers):
        self.handlers = handlers
        # what the picker offers, the folder the app was started with included; nothing else is taken from a
        # caller (the API is public: no path on the server, no repo of any size)
        self.allowed = {value for _, value in model_choices(handlers.engine.spec.source)}

    def switch_model(self, source: str, request: gr.Request | None = None):
        """A new engine for `source` (nothing loads until the first run), once its weights are known to be
        reachable; the LoRA list follows its built-ins. Refused, the picker goes back to the model in use."""
        handlers, old = self.handlers, self.handlers.engine
        try:
            if source not in self.allowed:
                raise gr.Error(html.escape(f"{source!r} is not one of the models this app offers: "
                                           f"{', '.join(sorted(self.allowed))}"), title="Cannot switch the model")
            if source != old.spec.source and not isinstance(old, Engine):
                raise gr.Error(f"this app serves a pool of {old.size} workers: start it again with --model to "
                               "change the model", title="Cannot switch the model")
            if source != old.spec.source:
                engine = Engine(source, device=old.device, dtype=old.dtype_choice)
                if engine.spec.kind == "hub":
                    downloads.check_reachable(source)
        except Exception as error:
            failure = refusal(error, "Cannot switch the model")
            if not from_page(request):
                raise failure from error
            skip = gr.skip()
            return (skip, skip, skip, *[skip] * LORA_SLOTS, gr.update(value=old.spec.source),
                    status_words(failure) + f"\n\nStill on {html.escape(old.spec.description)}.")
        if source != old.spec.source:
            old.close()
            handlers.engine = engine
            handlers.loras = LoraLibrary(handlers.loras.folder, builtin_loras(engine))
            handlers.options = engine.options()  # what the model's family runs, with the reasons for the rest
        engine = handlers.engine
        return (model_words(engine), gr.update(value=engine.spec.default_steps),
                gr.update(value=engine.family.default_cfg if engine.family else 4.0),
                *[gr.update(choices=handlers.loras.choices(), value=NO_LORA)] * LORA_SLOTS, gr.skip(),
                f"Model: {html.escape(engine.spec.description)}; {html.escape(engine.spec.recognised)}.")

    def model_notice(self):
        return model_words(self.handlers.engine)

    def preset_notice(self, name: str) -> str:
        return preset_words(self.handlers.engine, name)

    def fetch_lora(self, reference: str, request: gr.Request | None, *slots):
        """Downloads a LoRA from the Hub with progress, stores it in the LoRA folder and selects it in the first
        free slot."""
        skips = [gr.skip()] * (LORA_SLOTS + 1)
        try:
            reference = (reference or "").strip()
            if not reference:
                raise gr.Error("give a repo id (owner/name or owner/name:FILE.safetensors) or a Hub URL",
                               title="Cannot fetch this LoRA")
            path = yield from self._stream(lambda report: downloads.lora_file(reference, report), skips)
            name = self.handlers.loras.add(path, path.name)
        except Exception as error:
            yield self._said_no(error, "Cannot fetch this LoRA", "Not fetched", request, len(skips) - 1)
            return
        yield (f"Fetched `{name}` into `{self.handlers.loras.folder}`.", *self._select(name, slots), gr.skip())

    def apply_preset(self, name: str, request: gr.Request | None, *slots):
        """Fetches the preset's Lightning LoRA (with progress), selects it in a free LoRA slot (a style LoRA stays
        stacked), and sets the steps, the CFG and the schedule."""
        skips = [gr.skip()] * (LORA_SLOTS + 4)
        engine = self.handlers.engine
        try:
            preset = LIGHTNING.get(name)
            if preset is None:
                raise gr.Error("pick a preset first", title="Cannot apply a preset")
            choice = yield from self._stream(lambda report: lightning_lora(preset, engine.spec.source, report), skips)
            lora_name = self.handlers.loras.add(choice.path, choice.name + ".safetensors")
        except Exception as error:
            yield self._said_no(error, "Cannot apply this preset", "Not applied", request, len(skips) - 1)
            return
        yield (f"{preset.words}: applied (`{lora_name}`).", *self._select(lora_name, slots),
               gr.update(value=preset.steps), gr.update(value=preset.cfg_scale), gr.update(value="lightning"),
               gr.skip())

    @staticmethod
    def _said_no(error: BaseException, title: str, not_done: str, request, untouched: int) -> tuple:
        """A refused fetch or preset: raised to an API client; on the page its reason beside the control and in the
        status panel, the `untouched` outputs between them left as they are."""
        failure = refusal(error, title)
        if not from_page(request):
            raise failure from error
        return (f"⛔ {not_done}: {failure.message}", *[gr.skip()] * untouched, status_words(failure))

    def _stream(self, work, skips):
        stream = stream_download(work)
        try:
            while True:
                yield (next(stream), *skips)
        except StopIteration as done:
            return done.value

    def _select(self, name: str, slots) -> list:
        """`name` in the slot that has it already, else the first free one, else slot 1."""
        slots = list(slots) + [NO_LORA] * (LORA_SLOTS - len(slots))
        if name not in slots:
            free = next((i for i, value in enumerate(slots) if value in (None, "", NO_LORA)), 0)
            slots[free] = name
        return [gr.update(choices=self.handlers.loras.choices(), value=value) for value in slots]
