"""The page (Edit & compare, System) and the named API endpoints, wired to Handlers. The first screen is the edit:
the image(s), the instruction and Run, with the live status and the result beside them (under them on a phone);
the settings wait in closed sections, each titled with a one-line summary of what is set."""
from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import gradio as gr

from ..config import CFG_RANGE, MAX_INPUT_IMAGES, SEED_RANGE, SIZE_RANGE, STEPS_RANGE
from .gpu import on_gpu
from .. import figures
from .browser import QUEUED, TOGGLE_THEME, mark_unavailable
from .handlers import Handlers
from .hub import NO_PRESET, HubControls, model_choices, preset_choices
from .history import CHART_STAGES, COLUMNS, History
from .tables import column_widths, comparison_html
from ..optimize import registry
from . import api, openai_api, tools
from .mask_inputs import add_mask_inputs
from .settings import (ASPECT_PRESETS, DEFAULT_VARIANTS, FROM_INPUT, LORA_SLOTS, MAX_IMAGES_PER_RUN, NO_LORA,
                       generation_summary, lora_parameter, lora_parameters, lora_summary, setting_parameter,
                       slots_shown, toggle_parameters, unavailable_reasons, variants)

ASSETS = Path(__file__).resolve().parents[2] / "assets"
EXAMPLES = [
    ("house.png", "turn it into a haunted house at night, with a full moon"),
    ("portrait.png", "give the person a wizard hat and a glowing cape"),
    ("mountains.png", "cover the mountains in snow under a pink sunset"),
]
# one colour per stage of the time chart, in the order the stages run (history.CHART_STAGES)
STAGE_COLORS = dict(zip(CHART_STAGES, ["#64748b", "#0ea5e9", "#a855f7", "#f472b6", "#ef4444", "#fb923c", "#94a3b8",
                                       "#f59e0b", "#eab308", "#6366f1", "#10b981", "#cbd5e1"], strict=True))
READY = "### Ready\nUpload an image, say what to change and press **Run**: the live status of the run shows here."
GPU_QUEUE = dict(concurrency_id="gpu")  # edits and variant batches: one job at a time per GPU (worker)
LIGHT = dict(concurrency_limit=None)                          # quick events never wait behind a GPU job
# the prepare notice: one at a time, in the order asked for (side by side, an older one finishing last would show
# the notice of settings no longer chosen); each takes milliseconds
NOTICE_QUEUE = dict(concurrency_id="notice", concurrency_limit=1)
PRIVATE = dict(api_visibility="private")
INSTANT = dict(queue=False, show_progress="hidden", **PRIVATE)  # quick answers that need no queue
# a section's summary: one at a time, in the order asked for (unqueued, two quick changes raced: the width's answer,
# read before the height's value arrived, could come last and say "size from the input" after both were set)
SUMMARY_QUEUE = dict(concurrency_id="summary", concurrency_limit=1, trigger_mode="always_last",
                     show_progress="hidden", **PRIVATE)


def build_app(engine, lora_dir: Path, concurrency: int = 1, startup=None) -> gr.Blocks:
    """`concurrency`: edits served at once, one per worker of a pool (engine/workers.py); 1 for a plain Engine.
    `startup`: the engine's background warm-up (engine/startup.py), whose progress the page shows."""
    handlers = Handlers(engine, lora_dir, startup)
    with gr.Blocks(title="GhostEdit", analytics_enabled=False) as demo:
        with gr.Row(elem_id="intro_row", equal_height=True):
            gr.Markdown(_intro(engine, concurrency), elem_id="intro")
            # beside the title, not above the result or between Run and the status: the warm-up's progress
            startup = gr.Markdown(elem_id="startup", elem_classes="ghost-note")
            gr.Button("🌓", size="sm", scale=0, min_width=44, elem_id="theme_toggle").click(
                None, js=TOGGLE_THEME, **PRIVATE)
        history = gr.State(History())
        # this browser's key to its history on the server: the history survives a page reload
        browser_key = gr.BrowserState(None, storage_key="ghostedit-history")
        with gr.Tab("Edit & compare"):
            edit = _edit_section(handlers, engine)
            compare = _compare_section(engine)
        with gr.Tab("System") as system_tab:
            system = _system_section()
        _wire_startup(demo, handlers, startup)
        _wire_edit(demo, handlers, edit, compare, history, browser_key, concurrency)
        _wire_sections(handlers, edit)
        _wire_hub(demo, HubControls(handlers), handlers, edit, concurrency)
        _wire_system(demo, handlers, system, system_tab)
        demo.load(None, js=mark_unavailable(unavailable_reasons(handlers.options)), **PRIVATE)
        tools.add_tools(handlers, on_gpu, dict(concurrency_limit=concurrency, **GPU_QUEUE))
        openai_api.add_queue_endpoint(demo, handlers, dict(concurrency_limit=concurrency, **GPU_QUEUE))
        gr.api(handlers.free_cache, api_name="free_cache", **LIGHT)
    return demo


def _wire_startup(demo: gr.Blocks, handlers: Handlers, notice: gr.Markdown) -> None:
    """What the start-up warm-up is doing (loading, its download, compiling), polled each second until it ends."""
    timer = gr.Timer(1.0, active=handlers.startup.busy)
    for trigger in (demo.load, timer.tick):
        trigger(handlers.startup_view, None, [notice, timer], show_progress="hidden", **PRIVATE, **LIGHT)
    gr.api(handlers.startup_status, api_name="startup", **LIGHT)


def _intro(engine, concurrency: int) -> str:
    device = f"{concurrency} workers" if concurrency > 1 else engine.device
    return (f"# 👻 GhostEdit\nEdit an image with an instruction and see what each speed option costs, live. "
            f"<span class=\"ghost-note\">{engine.spec.source} · {device}</span>")


def _ready(engine) -> str:
    """The status panel before the first run: what to do, and what the model is."""
    text = READY + f"\n\n<span class=\"ghost-note\">Model: {engine.spec.description}; {engine.spec.recognised}.</span>"
    if engine.spec.kind == "tiny":
        text += ("\n\n<span class=\"ghost-note\">The tiny model has random weights: it runs the real pipeline in "
                 "seconds on a CPU, but its pictures are noise. For real edits start the app on a GPU with "
                 "`--model Qwen/Qwen-Image-Edit-2509`.</span>")
    return text


def _edit_section(handlers: Handlers, engine) -> SimpleNamespace:
    ui = SimpleNamespace()
    with gr.Row(equal_height=False, elem_id="edit_row"):
        with gr.Column(elem_id="inputs_col", min_width=320):
            _inputs(ui)
        with gr.Column(elem_id="output_col", min_width=320):
            _outputs(ui, engine)
        with gr.Column(elem_id="settings_col", min_width=320):
            _settings(ui, handlers, engine)
    ui.loras = [ui.controls[lora_parameter(slot)] for slot in range(1, LORA_SLOTS + 1)]
    ui.lora = ui.loras[0]
    ui.toggles = [ui.controls[name] for name in lora_parameters()] + [ui.controls[setting_parameter(setting)]
                                                                      for setting in registry.settings()]
    ui.generation = [ui.steps, ui.cfg_scale, ui.seed, ui.width, ui.height, ui.count]
    ui.request = [ui.image, *ui.more_images, ui.prompt, ui.negative_prompt, *ui.generation]
    ui.panel = ui.request + ui.toggles + ui.start  # the order of api.edit_parameters()
    return ui


def _inputs(ui: SimpleNamespace) -> None:
    """The image to edit; more images one "add" at a time (as many as a model takes); the instruction; Run."""
    ui.image = gr.Image(label="Image to edit", type="filepath", elem_id="input_image", height=260,
                        sources=["upload", "clipboard"])
    with gr.Row(elem_id="more_images"):
        ui.more_images = [gr.Image(label=f"Image {number}", type="filepath", elem_id=f"input_image_{number}",
                                   height=150, min_width=140, visible=False, sources=["upload", "clipboard"])
                          for number in range(2, MAX_INPUT_IMAGES + 1)]
    ui.images_shown = gr.State(0)  # extra image slots shown
    ui.add_image = gr.Button(f"➕ Add an image (up to {MAX_INPUT_IMAGES}, edited together)", size="sm",
                             elem_id="add_image")
    ui.prompt = gr.Textbox(label="Instruction", lines=2, elem_id="prompt",
                           info="Enter or Ctrl+Enter runs; Shift+Enter starts a new line",
                           placeholder="What should change? e.g. make it night and add snow")
    with gr.Row():
        ui.run = gr.Button("Run", variant="primary", elem_id="run", scale=3)
        ui.cancel = gr.Button("Cancel", variant="stop", elem_id="cancel", scale=1, min_width=100)



def _outputs(ui: SimpleNamespace, engine) -> None:
    """The live status (every refusal says its reason here too), the time waited, the result and the run's
    details."""
    ui.status = gr.Markdown(_ready(engine), elem_id="status")
    ui.waited = gr.HTML('You waited <span id="waited">–</span> s from the click on Run to the picture (this '
                        'browser\'s clock; the engine\'s time is above).', elem_id="waited_box", padding=False)
    # the views are JPEG files (ui/media.py); the download is the lossless PNG, made after the picture shows
    ui.result = gr.ImageSlider(label="Before / after (drag the handle)", type="filepath", interactive=False,
                               elem_id="result", height=380, buttons=["fullscreen"])
    ui.download_png = gr.File(label="The outputs as PNG (full quality), once shown", interactive=False,
                              file_count="multiple", height=90, elem_id="download_png")
    # shown while it holds a batch's or the variants' images (ui/browser.py's style; one image is the slider's)
    ui.images = gr.Gallery(label="This run's images (one per seed or variant)", columns=4, height=160,
                           object_fit="contain", buttons=["fullscreen"], elem_id="run_images")
    with gr.Accordion("Run details: stages, memory, what each toggle did", open=True):
        ui.summary = gr.Markdown("The stage breakdown of the finished run shows here.", elem_id="run_summary")
        with gr.Accordion("Run telemetry (JSON)", open=False):
            ui.run_json = gr.JSON(elem_id="run_json")
            # set by a run's first answer on the page: starts the follower of its live view (live_board.py)
            ui.follow_run = gr.Textbox(visible=False)


def _settings(ui: SimpleNamespace, handlers: Handlers, engine) -> None:
    with gr.Accordion(_model_summary(engine, NO_PRESET), open=False, elem_id="model_section") as ui.model_section:
        ui.model = gr.Dropdown(model_choices(engine.spec.source), value=engine.spec.source, label="Model",
                               elem_id="model",
                               info="the Qwen-Image-Edit family and Qwen-Image-2.1 (downloaded on the first run, "
                                    "with progress), the tiny models, or the folder the app was started with "
                                    "(--model PATH)")
        ui.model_notice = gr.Markdown(elem_id="model_notice", elem_classes="ghost-note")
        with gr.Row(equal_height=True):
            ui.preset = gr.Dropdown(preset_choices(), value=NO_PRESET, label="Preset", elem_id="preset", scale=3,
                                    info="Lightning: the lightx2v LoRA made for this model, stacked with yours")
            ui.apply_preset = gr.Button("Apply preset", scale=1, size="sm", elem_id="apply_preset")
        ui.preset_notice = gr.Markdown(elem_id="preset_notice", elem_classes="ghost-note")
    with gr.Accordion(generation_summary(engine.spec.default_steps, 4.0, 0, 0, 0, 1), open=False,
                      elem_id="generation_section") as ui.generation_section:
        ui.negative_prompt = gr.Textbox(label="Negative prompt (optional, used when CFG > 1)",
                                        elem_id="negative_prompt")
        with gr.Row():
            ui.steps = gr.Slider(*STEPS_RANGE, value=engine.spec.default_steps, step=1, label="Steps",
                                 elem_id="steps")
            ui.cfg_scale = gr.Slider(*CFG_RANGE, value=engine.family.default_cfg if engine.family else 4.0, step=0.5,
                                     label="CFG scale", elem_id="cfg")
        with gr.Row(equal_height=True):
            ui.seed = gr.Number(value=0, precision=0, minimum=SEED_RANGE[0], maximum=SEED_RANGE[1], label="Seed",
                                elem_id="seed", scale=3)
            ui.seed_button = gr.Button("🎲 Random seed", scale=1, size="sm")
        ui.aspect = gr.Radio(list(ASPECT_PRESETS), value=FROM_INPUT, label="Aspect ratio",
                             info="sets the size below at the model's usual area", elem_id="aspect")
        with gr.Row():
            size_from = "0: from the input (Qwen-Image-Edit: the first image; 2509 and 2511: the last)"
            ui.width = gr.Slider(0, SIZE_RANGE[1], value=0, step=16, label="Output width", info=size_from,
                                 elem_id="width")
            ui.height = gr.Slider(0, SIZE_RANGE[1], value=0, step=16, label="Output height", info=size_from,
                                  elem_id="height")
        ui.count = gr.Slider(1, MAX_IMAGES_PER_RUN, value=1, step=1, label="Images per run",
                             info="seeds seed, seed+1, …; each image joins the comparison", elem_id="count")
    add_mask_inputs(ui)
    ui.controls = {}
    with gr.Accordion(lora_summary({}), open=False, elem_id="lora_section") as ui.lora_section:
        _lora_slots(ui, handlers)
    with gr.Accordion("Speed · stock", open=False, elem_id="speed_section") as ui.speed_section:
        for setting in registry.settings():
            ui.controls[setting_parameter(setting)] = _toggle_control(setting, handlers)
    ui.prepare_notice = gr.Markdown(elem_id="prepare_notice")
    gr.Examples([[str(ASSETS / "examples" / name), prompt] for name, prompt in EXAMPLES],
                inputs=[ui.image, ui.prompt], label="Examples (images made by the project)")


def _model_summary(engine, preset: str) -> str:
    chosen = preset not in (None, NO_PRESET) and preset in {value for _, value in preset_choices()}
    return f"Model · {engine.spec.source}" + (f" · preset {preset}" if chosen else "")


def _lora_slots(ui: SimpleNamespace, handlers: Handlers) -> None:
    """One LoRA slot, and "add another" for up to LORA_SLOTS stacked, each with its mode and scale; uploads and
    Hub fetches land in the first free slot."""
    ui.lora_groups = []
    for slot in range(1, LORA_SLOTS + 1):
        with gr.Group(visible=slot == 1) as group:
            ui.controls[lora_parameter(slot)] = gr.Dropdown(
                handlers.loras.choices(), value=NO_LORA, label="LoRA" if slot == 1 else f"LoRA {slot} (stacked)",
                elem_id=lora_parameter(slot), allow_custom_value=True,  # checked by LoraLibrary.path
                info=f"*.safetensors files in {handlers.loras.folder}" if slot == 1 else None)
            with gr.Row():
                ui.controls[lora_parameter(slot, "mode")] = gr.Radio(
                    [("fused into the weights", "fused"), ("runtime (PEFT layers)", "runtime")], value="fused",
                    label="mode", elem_id=lora_parameter(slot, "mode"))
                ui.controls[lora_parameter(slot, "scale")] = gr.Slider(
                    -2.0, 2.0, value=1.0, step=0.05, label="scale", elem_id=lora_parameter(slot, "scale"))
        ui.lora_groups.append(group)
    ui.loras_shown = gr.State(0)  # extra LoRA slots shown
    with gr.Row(equal_height=True):
        ui.add_lora = gr.Button("➕ Add another LoRA", size="sm", elem_id="add_lora", scale=1)
        ui.lora_upload = gr.UploadButton("⬆ Upload a LoRA", file_types=[".safetensors"], scale=1, size="sm",
                                         elem_id="lora_upload")
    with gr.Row(equal_height=True):
        ui.hub_lora = gr.Textbox(label="LoRA from the Hugging Face Hub", elem_id="hub_lora", scale=3,
                                 placeholder="owner/name, owner/name:FILE.safetensors or a Hub URL (safetensors only)")
        ui.fetch_lora = gr.Button("⬇ Fetch", scale=1, size="sm", elem_id="fetch_lora")
    ui.lora_message = gr.Markdown(elem_classes="ghost-note", elem_id="lora_message")


def _toggle_control(setting: str, handlers: Handlers):
    """A dropdown for a toggle, a checkbox group for a group of flags; a choice this machine cannot run is greyed
    with its reason on hover (the handler refuses it)."""
    if setting in registry.groups():
        return gr.CheckboxGroup(handlers.choices(setting), value=[], elem_id=setting_parameter(setting),
                                label="Lossless DiT rewrites", info="the same function with fewer kernels")
    toggle = registry.get(setting)
    return gr.Dropdown(handlers.choices(setting), value=toggle.default, label=toggle.label,
                       elem_id=setting_parameter(setting), info=figures.toggle_info(setting) or toggle.help)


def _compare_section(engine) -> SimpleNamespace:
    ui = SimpleNamespace()
    gr.Markdown("## Compare runs")
    with gr.Row():
        ui.variants = gr.CheckboxGroup([(words, name) for name, words in variants().items()], value=DEFAULT_VARIANTS,
                                       label="Run variants: the current inputs under each chosen configuration",
                                       info="Each “+” variant is the stock baseline plus that one setting of the "
                                            "speed section; “all” is every setting there.",
                                       elem_id="variants", scale=5)
        ui.run_variants = gr.Button("Run variants", variant="primary", elem_id="run_variants", scale=1,
                                    min_width=160)
    ui.comparison = gr.HTML(comparison_html([], ""), elem_id="comparison")
    ui.caption = gr.Markdown("", elem_classes="ghost-note")
    memory = ("Peak GPU memory per run (GiB)" if engine.device.startswith("cuda")
              else "Peak host memory per run (GiB, process RSS: no GPU)")
    with gr.Row():
        # None until the first run: Gradio's plot fixes its axes' types and its series when it first draws (an
        # empty frame would make the seconds a category); every run has every stage (history.CHART_STAGES)
        ui.time_plot = gr.BarPlot(None, x="configuration", y="seconds", color="stage", y_lim=[0, None],
                                  color_map=STAGE_COLORS, colors_in_legend=[], sort=None,
                                  tooltip=["configuration", "stage", "seconds", "run"], x_title="configuration",
                                  y_title="seconds", title="Seconds per run, by stage", height=340,
                                  elem_id="time_plot", min_width=300)
        ui.memory_plot = gr.BarPlot(None, x="configuration", y="peak GiB", y_lim=[0, None], sort=None,
                                    tooltip=["configuration", "peak GiB", "run"], x_title="configuration",
                                    title=memory, height=340, elem_id="memory_plot", min_width=300)
    gr.HTML(_stage_legend(), elem_id="stage_legend")
    ui.gallery = gr.Gallery(label="Outputs side by side", columns=5, fit_columns=False, height=300,
                            object_fit="contain", buttons=["fullscreen"], elem_id="outputs_gallery")
    with gr.Accordion("Every column (prompt, seed, size, stage times, cache), for export", open=False):
        ui.table = gr.Dataframe(History().table(), headers=list(COLUMNS), interactive=False, wrap=True,
                                column_widths=column_widths(History().table()),
                                elem_id="history", label="Runs of this browser (kept across page reloads)",
                                max_height=420, elem_classes="ghost-table", pinned_columns=1)
    with gr.Row(equal_height=True):
        ui.reuse_run = gr.Dropdown([], label="Run of the history", elem_id="reuse_run", scale=3)
        ui.reuse = gr.Button("Reuse these settings", elem_id="reuse", scale=1)
    ui.reuse_message = gr.Markdown(elem_classes="ghost-note", elem_id="reuse_message")
    with gr.Row(equal_height=True):
        ui.baseline = gr.Dropdown([], label="Baseline run", elem_id="baseline", scale=3)
        ui.download_csv = gr.DownloadButton("Export CSV", interactive=False, elem_id="export_csv", scale=1)
        ui.download_json = gr.DownloadButton("Export JSON", interactive=False, elem_id="export_json", scale=1)
        ui.clear = gr.Button("Clear history", elem_id="clear_history", scale=1)
    with gr.Row(visible=False, equal_height=True, elem_id="clear_confirm") as ui.clear_confirm:
        ui.clear_question = gr.Markdown(elem_id="clear_question")
        ui.clear_yes = gr.Button("Yes, clear them", variant="stop", elem_id="clear_yes", scale=0, min_width=150)
        ui.clear_no = gr.Button("Keep them", elem_id="clear_no", scale=0, min_width=120)
    return ui


def _stage_legend() -> str:
    items = "".join(f'<span class="ghost-legend-item"><span class="ghost-swatch" style="background:{color}"></span>'
                    f'{stage}</span>' for stage, color in STAGE_COLORS.items())
    return (f'<div class="ghost-legend" aria-label="stages of the time chart">Stages, bottom to top of a bar: '
            f'{items}</div>')


def _system_section() -> SimpleNamespace:
    ui = SimpleNamespace()
    with gr.Row():
        ui.refresh = gr.Button("Refresh", scale=0)
    ui.hardware = gr.Markdown(elem_id="hardware")
    ui.options = gr.Dataframe(label="Every option on this machine, and why one cannot run here", interactive=False,
                              wrap=True, elem_id="backends", elem_classes="ghost-table", max_height=600)
    gr.Markdown("### Prepared pipelines in the cache\nEach configuration used is prepared once (LoRA fused, FP8 "
                "quantized, compiled…) and kept for the next run, within a memory budget.")
    ui.cache = gr.Dataframe(label="Cached pipelines", interactive=False, wrap=True, elem_id="cache",
                            elem_classes="ghost-table")
    with gr.Row():
        ui.free = gr.Button("Free cached pipelines", variant="stop", scale=0, elem_id="free_cache")
        ui.free_message = gr.Markdown()
    return ui


def panel_notice(handlers: Handlers, edit) -> dict:
    """The arguments of an event that refreshes the prepare notice, and the LoRA and speed sections' summaries,
    from the panel's toggles."""
    return dict(fn=handlers.panel_views, inputs=edit.toggles,
                outputs=[edit.prepare_notice, edit.lora_section, edit.speed_section], show_progress="hidden",
                **PRIVATE, **NOTICE_QUEUE)


def _wire_edit(demo: gr.Blocks, handlers: Handlers, edit, compare, history, browser_key, concurrency: int) -> None:
    outputs = [edit.status, edit.result, edit.summary, edit.run_json, compare.table, edit.images, history]
    compare_outputs = [compare.gallery, compare.time_plot, compare.memory_plot, compare.baseline, compare.caption,
                       compare.table, compare.reuse_run, compare.comparison]
    comparison_outputs = [compare.table, edit.download_png]
    names = api.edit_parameters()

    def after_history_changed(event, comparison_api: dict = PRIVATE):
        """The views of the history; then, off the edit's way, its image metrics, exports and PNG; and the history
        kept for this browser."""
        return (event.then(handlers.compare_views, history, compare_outputs, **PRIVATE, **LIGHT)
                .then(handlers.chart_order, history, [compare.time_plot, compare.memory_plot], **INSTANT)
                .then(handlers.comparison, history, comparison_outputs, **comparison_api, **LIGHT)
                .then(handlers.comparison_view, history, compare.comparison, **PRIVATE, **LIGHT)
                .then(handlers.exports, history, [compare.download_csv, compare.download_json], **PRIVATE, **LIGHT)
                .then(handlers.remember_history, [browser_key, history], None, **PRIVATE, **LIGHT))

    # each endpoint's description, its parameters and the extra parameters' descriptions (api.endpoint)
    edit_api = ("Edits 1 to 3 images with an instruction under the chosen toggles, `count` times with seeds seed, "
                "seed+1, .... Answers when the run ends, with the before/after pair, the run summary, the run's "
                "telemetry (JSON), the session's comparison table and, when count > 1, the run's images (one "
                "image is the pair's second). While it runs, Gradio's progress updates give the stage, step, "
                "s/step, elapsed, ETA and memory (gradio_client: job.status().progress_data).", names, None)
    variants_api = ("Runs the same edit under several configurations in one go: the stock baseline, the baseline "
                    "plus one panel setting each, or the whole panel. Answers like /edit when the last variant "
                    "ends, every variant in the run's JSON and the comparison table.", names + ["variants"],
                    {"variants": api.variants_description()})
    for button, method, described, inputs, name, runs_for in (
            (edit.run, handlers.edit, edit_api, edit.panel + [history], "edit",
             lambda arguments: arguments.get("count") or 1),
            (compare.run_variants, handlers.run_variants, variants_api, edit.panel + [compare.variants, history],
             "run_variants", lambda arguments: len(arguments.get("variants") or [1]))):
        answers = on_gpu(api.endpoint(method, *described), handlers.engine.spec, runs_for=runs_for)
        gpu = dict(preprocess=False, concurrency_limit=concurrency, **GPU_QUEUE)
        # preprocess=False: the values reach the handler as sent, and the engine's checks are the only ones (with
        # messages that name the parameter). Gradio's gr.Image would open an upload with Pillow before GhostEdit's
        # safe reader sees it, and would open any file on the server named by a payload without FileData's "meta".
        # The API's endpoint answers once (gradio_client fetches the files of a streamed answer twice).
        gr.on([], api.served(answers, handlers.answer, stream=False), inputs, outputs, api_name=name, **gpu)
        # the page: an answer per finished image, the first of which starts the live view's follower
        button.click(None, None, edit.status, js=QUEUED, **PRIVATE)
        page = button.click(api.served(answers, handlers.answer_page, stream=True), inputs,
                            outputs + [edit.follow_run], show_progress_on=[edit.result], **PRIVATE, **gpu)
        after_history_changed(page, dict(api_name="comparison") if name == "edit" else PRIVATE).then(
            **panel_notice(handlers, edit))
    # its own tracker on the JSON (closed away): over the status, Gradio's "processing" would cover the words
    edit.follow_run.change(handlers.follow, None, [edit.status, edit.run_json], show_progress_on=[edit.run_json],
                           **PRIVATE, **LIGHT)
    edit.cancel.click(handlers.cancel, None, None, api_name="cancel", queue=False)
    edit.seed_button.click(handlers.random_seed, None, edit.seed, queue=False, **PRIVATE)
    edit.aspect.input(handlers.aspect_size, edit.aspect, [edit.width, edit.height], queue=False, **PRIVATE)
    edit.lora_upload.upload(handlers.upload_lora, edit.lora_upload, [edit.lora, edit.lora_message],
                            api_name="upload_lora", show_progress="hidden", **LIGHT).then(
        handlers.said_in_status, edit.lora_message, edit.status, **INSTANT)
    for toggle in edit.toggles:
        toggle.change(**panel_notice(handlers, edit))
    after_history_changed(
        demo.load(handlers.lora_dropdown, None, edit.lora, **PRIVATE, **LIGHT)
        .then(handlers.restore_history, browser_key, [browser_key, history, compare.table], **PRIVATE, **LIGHT)
    ).then(**panel_notice(handlers, edit))
    after_history_changed(compare.baseline.input(handlers.set_baseline, [compare.baseline, history],
                                                 [compare.table, history], **PRIVATE, **LIGHT))
    compare.clear.click(handlers.clear_question, history, [compare.clear_confirm, compare.clear_question], **INSTANT)
    compare.clear_no.click(lambda: gr.Row(visible=False), None, compare.clear_confirm, **INSTANT)
    after_history_changed(compare.clear_yes.click(handlers.clear_history, history,
                                                  [compare.table, history, compare.clear_confirm], **PRIVATE, **LIGHT))
    reused = [edit.prompt, edit.negative_prompt, edit.steps, edit.cfg_scale, edit.seed, edit.width, edit.height]
    compare.reuse.click(handlers.reuse_settings, [compare.reuse_run, history],
                        [edit.image, *edit.more_images] + reused
                        + [edit.controls[name] for name in toggle_parameters()] + [compare.reuse_message],
                        **PRIVATE, **LIGHT)


def _wire_sections(handlers: Handlers, edit) -> None:
    """Each settings section's one-line summary follows what is set; an extra image or LoRA slot shows when
    added, or when it gets a value (reused settings, a fetched LoRA)."""
    for control in edit.generation:
        control.change(lambda *values: gr.Accordion(label=generation_summary(*values)), edit.generation,
                       edit.generation_section, **SUMMARY_QUEUE)
    edit.preset.change(lambda preset: gr.Accordion(label=_model_summary(handlers.engine, preset)), edit.preset,
                       edit.model_section, **SUMMARY_QUEUE)

    for counter, slots, add_button, values in ((edit.images_shown, edit.more_images, edit.add_image, edit.more_images),
                                               (edit.loras_shown, edit.lora_groups[1:], edit.add_lora, edit.loras[1:])):
        def show(shown, *filled, slots=slots, add=False):
            shown = slots_shown(shown, filled, add)
            return (shown, *[gr.update(visible=index < shown) for index in range(len(slots))],
                    gr.update(visible=shown < len(slots)))
        inputs, outputs = [counter, *values], [counter, *slots, add_button]
        add_button.click(lambda *state, show=show: show(*state, add=True), inputs, outputs, preprocess=False,
                         **INSTANT)
        for value in values:
            value.change(show, inputs, outputs, preprocess=False, **INSTANT)


def _wire_hub(demo: gr.Blocks, hub: HubControls, handlers: Handlers, edit, concurrency: int) -> None:
    """The model picker (on the GPU queue: an engine is not swapped under a run), presets and Hub LoRAs. Each says
    a refusal in the status panel, the controls it concerns left as they were (refusals.py)."""
    scheduler = edit.controls[setting_parameter("scheduler")]

    def then_panel_notice(event):
        event.then(**panel_notice(handlers, edit))
    then_panel_notice(edit.model.input(hub.switch_model, edit.model,
                                       [edit.model_notice, edit.steps, edit.cfg_scale, *edit.loras, edit.model,
                                        edit.status],
                                       api_name="switch_model", show_progress="hidden",
                                       concurrency_limit=concurrency, **GPU_QUEUE)
                      .then(lambda preset: gr.Accordion(label=_model_summary(handlers.engine, preset)), edit.preset,
                            edit.model_section, **INSTANT))
    demo.load(hub.model_notice, None, edit.model_notice, **PRIVATE, **LIGHT)
    edit.preset.change(hub.preset_notice, edit.preset, edit.preset_notice, **PRIVATE, **LIGHT)
    then_panel_notice(edit.apply_preset.click(
        hub.apply_preset, [edit.preset, *edit.loras],
        [edit.preset_notice, *edit.loras, edit.steps, edit.cfg_scale, scheduler, edit.status],
        api_name="apply_preset", show_progress="hidden", **LIGHT))
    then_panel_notice(edit.fetch_lora.click(hub.fetch_lora, [edit.hub_lora, *edit.loras],
                                            [edit.lora_message, *edit.loras, edit.status], api_name="fetch_lora",
                                            show_progress="hidden", **LIGHT))


def _wire_system(demo: gr.Blocks, handlers: Handlers, system, system_tab) -> None:
    for trigger in (system.refresh.click, system_tab.select):
        trigger(handlers.system_views, None, [system.hardware, system.options, system.cache], **PRIVATE, **LIGHT)
    system.free.click(handlers.free_cache_views, None, [system.free_message, system.cache], **PRIVATE, **LIGHT)
