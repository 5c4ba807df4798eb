"""The page (Edit & compare, System) and the named API endpoints, wired to Handlers."""
from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import gradio as gr

from ..config import CFG_RANGE, MAX_INPUT_IMAGES, SEED_RANGE, SIZE_RANGE, STEPS_RANGE
from .gpu import on_gpu
from .. import figures
from .handlers import Handlers
from .hub import NO_PRESET, HubControls, model_choices, preset_choices
from .history import COLUMNS, OTHER_STAGE, History
from .tables import column_widths
from .live import stage_words
from ..telemetry import STAGE_ORDER
from ..optimize import registry
from . import api, openai_api, tools
from .mask_inputs import add_mask_inputs
from .settings import (ASPECT_PRESETS, DEFAULT_VARIANTS, FROM_INPUT, LORA_SLOTS, MAX_IMAGES_PER_RUN, NO_LORA,
                       lora_parameter, lora_parameters, setting_parameter, toggle_parameters, variants)

ASSETS = Path(__file__).resolve().parents[2] / "assets"
EXAMPLES = [
    ("house.png", "turn it into a haunted house at night, with a full moon"),
    ("portrait.png", "give the person a wizard hat and a glowing cape"),
    ("mountains.png", "cover the mountains in snow under a pink sunset"),
]
# one colour per stage, every stage in the legend (compiling too, before any run compiled), in the order they run
STAGE_COLORS = dict(zip([stage_words(stage) for stage in STAGE_ORDER] + [OTHER_STAGE],
                        ["#64748b", "#0ea5e9", "#a855f7", "#f472b6", "#ef4444", "#fb923c", "#f59e0b", "#eab308",
                         "#6366f1", "#10b981", "#cbd5e1"], strict=True))
GPU_QUEUE = dict(concurrency_id="gpu")  # edits and variant batches: one job at a time per GPU (worker)
LIGHT = dict(concurrency_limit=None)                          # quick events never wait behind a GPU job
# the prepare notice: one at a time, in the order asked for (side by side, an older one finishing last would show
# the notice of settings no longer chosen); each takes milliseconds
NOTICE_QUEUE = dict(concurrency_id="notice", concurrency_limit=1)
PRIVATE = dict(api_visibility="private")

CSS = """
#status {min-height: 8em}
#prepare_notice {font-size: 0.92em}
.ghost-note {font-size: 0.9em; opacity: 0.85}
.ghost-progress {width: 100%; height: 0.9em; accent-color: var(--color-accent)}
.ghost-legend {display: flex; flex-wrap: wrap; gap: 0.3em 1em; font-size: 0.85em}
.ghost-legend-item {white-space: nowrap}
.ghost-swatch {display: inline-block; width: 0.8em; height: 0.8em; margin-right: 0.3em; border-radius: 2px}
#result img, #run_images img {background: repeating-conic-gradient(#c8c8c8 0% 25%, #ffffff 0% 50%) 50% / 16px 16px
  !important}
"""

# In-page behaviour Gradio has no component for. Run on Enter in the instruction (Shift+Enter: a new line) or
# Ctrl/Cmd+Enter anywhere; the theme chosen with the page's switch is kept in this browser.
PAGE_SCRIPT = """
() => {
  if (localStorage.getItem('ghostedit-theme') === 'dark') document.body.classList.add('dark');
  document.addEventListener('keydown', (event) => {
    if (event.key !== 'Enter' || event.isComposing) return;
    const inPrompt = event.target.closest && event.target.closest('#prompt');
    if (event.ctrlKey || event.metaKey || (inPrompt && !event.shiftKey)) {
      event.preventDefault();
      document.querySelector('#run').click();
    }
  }, true);
}
"""
TOGGLE_THEME = """
() => {
  const dark = document.body.classList.toggle('dark');
  localStorage.setItem('ghostedit-theme', dark ? 'dark' : 'light');
}
"""
CLOSE_TOASTS = "() => document.querySelectorAll('[data-testid=toast-close]').forEach((button) => button.click())"


def build_app(engine, lora_dir: Path, concurrency: int = 1, startup=None) -> gr.Blocks:
    """`concurrency`: edits served at once, one per worker of a pool (engine/workers.py); 1 for a plain Engine.
    `startup`: the engine's background warm-up (engine/startup.py), whose progress the page shows."""
    handlers = Handlers(engine, lora_dir, startup)
    with gr.Blocks(title="GhostEdit", analytics_enabled=False) as demo:
        gr.Markdown(_intro(engine, concurrency))
        _startup_notice(demo, handlers)
        history = gr.State(History())
        # this browser's key to its history on the server: the history survives a page reload
        browser_key = gr.BrowserState(None, storage_key="ghostedit-history")
        with gr.Row():
            gr.Button("🌓 Dark / light", size="sm", scale=0, min_width=140, elem_id="theme_toggle").click(
                None, js=TOGGLE_THEME, **PRIVATE)
        with gr.Tab("Edit & compare"):
            edit = _edit_section(handlers, engine)
            compare = _compare_section()
        with gr.Tab("System") as system_tab:
            system = _system_section()
        _wire_edit(demo, handlers, edit, compare, history, browser_key, concurrency)
        _wire_hub(demo, HubControls(handlers), handlers, edit, concurrency)
        _wire_system(demo, handlers, system, system_tab)
        tools.add_tools(handlers, on_gpu, dict(concurrency_limit=concurrency, **GPU_QUEUE))
        openai_api.add_queue_endpoint(demo, handlers, dict(concurrency_limit=concurrency, **GPU_QUEUE))
        gr.api(handlers.free_cache, api_name="free_cache", **LIGHT)
    return demo


def _startup_notice(demo: gr.Blocks, handlers: Handlers) -> None:
    """What the start-up warm-up is doing (loading, its download, compiling), polled each second until it ends."""
    notice = gr.Markdown(elem_id="startup", elem_classes="ghost-note")
    timer = gr.Timer(1.0, active=handlers.startup.busy)
    for trigger in (demo.load, timer.tick):
        trigger(handlers.startup_view, None, [notice, timer], show_progress="hidden", **PRIVATE, **LIGHT)
    gr.api(handlers.startup_status, api_name="startup", **LIGHT)


def _intro(engine, concurrency: int) -> str:
    memory = "GPU memory" if engine.device.startswith("cuda") else "host memory (RSS: there is no GPU)"
    device = (f"{concurrency} workers, one edit at a time on each (the status names the one that ran an edit)"
              if concurrency > 1 else engine.device)
    text = f"""# 👻 GhostEdit
Edit an image with an instruction (Qwen-Image-Edit), switch the speed options on and off (LoRA fusion, FP8,
attention backend, torch.compile, steps) and see what each one costs: every run is timed stage by stage and
step by step while it happens, and joins the comparison below.

**1.** Upload an image or pick an example and say what to change. **2.** Choose the toggles (a choice this
machine cannot run says why). **3.** Run and watch stage, step, seconds per step, ETA and memory live.
**4.** Change a toggle and run again, or use *Run variants*: the table shows the speedup and the image
difference (PSNR, SSIM) against the baseline run.

<span class="ghost-note">Model: {engine.spec.description} · device: {device} · memory figures:
{memory}.</span>"""
    if engine.spec.kind == "tiny":
        text += ("\n\n<span class=\"ghost-note\">The tiny model has random weights: it runs the real "
                 "Qwen-Image-Edit pipeline end to end in seconds on a CPU, but its outputs are not meaningful "
                 "pictures. For real edits start the app on a GPU with `--model Qwen/Qwen-Image-Edit-2509`.</span>")
    return text


def _edit_section(handlers: Handlers, engine) -> SimpleNamespace:
    ui = SimpleNamespace()
    with gr.Row(equal_height=False):
        with gr.Column(scale=1):
            _inputs(ui)
        with gr.Column(scale=1):
            _settings(ui, handlers, engine)
    with gr.Row(equal_height=False):
        with gr.Column(scale=1):
            ui.status = gr.Markdown("Ready: the live status of a run shows here.", elem_id="status")
            # the views are JPEG files (ui/media.py); the download is the lossless PNG, made after the picture shows
            ui.result = gr.ImageSlider(label="Before / after (drag the handle)", type="filepath", interactive=False,
                                       elem_id="result", max_height=560, buttons=["fullscreen"])
            ui.download_png = gr.File(label="The outputs as PNG (full quality), once shown", interactive=False,
                                      file_count="multiple", height=90, elem_id="download_png")
            ui.images = gr.Gallery(label="This run's images (one per seed)", columns=4, height=220,
                                   object_fit="contain", buttons=["fullscreen"], elem_id="run_images")
        with gr.Column(scale=1):
            ui.summary = gr.Markdown("The stage breakdown of the finished run shows here.", elem_id="run_summary")
            with gr.Accordion("Run telemetry (JSON)", open=False):
                ui.run_json = gr.JSON(elem_id="run_json")
    ui.toggles = [ui.controls[name] for name in lora_parameters()] + [ui.controls[setting_parameter(setting)]
                                                                      for setting in registry.settings()]
    ui.request = [ui.image, *ui.more_images, ui.prompt, ui.negative_prompt, ui.steps, ui.cfg_scale, ui.seed,
                  ui.width, ui.height, ui.count]
    ui.panel = ui.request + ui.toggles + ui.start  # the order of api.edit_parameters()
    return ui


def _inputs(ui: SimpleNamespace) -> None:
    ui.image = gr.Image(label="Image to edit (none: Qwen-Image-2.1 generates from the instruction)",
                        type="filepath", elem_id="input_image", height=300, sources=["upload", "clipboard"])
    with gr.Accordion("More input images (optional: up to 3 in all with Qwen-Image-Edit-2509/2511, 10 with "
                      "Qwen-Image-2.1)", open=False):
        ui.more_images = []
        for first in range(2, MAX_INPUT_IMAGES + 1, 3):
            with gr.Row():
                ui.more_images += [gr.Image(label=f"Image {number}", type="filepath", height=180,
                                            elem_id=f"input_image_{number}")
                                   for number in range(first, min(first + 3, MAX_INPUT_IMAGES + 1))]
    ui.prompt = gr.Textbox(label="Instruction", lines=2, elem_id="prompt",
                           info="Enter or Ctrl+Enter runs; Shift+Enter starts a new line",
                           placeholder="What should change? e.g. make it night and add snow")
    ui.negative_prompt = gr.Textbox(label="Negative prompt (optional)", elem_id="negative_prompt")
    gr.Examples([[str(ASSETS / "examples" / name), prompt] for name, prompt in EXAMPLES],
                inputs=[ui.image, ui.prompt], label="Examples (images made by the project)")
    add_mask_inputs(ui)


def _settings(ui: SimpleNamespace, handlers: Handlers, engine) -> None:
    with gr.Accordion("Model and presets", open=True):
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
    with gr.Accordion("Generation", open=True):
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
            ui.width = gr.Slider(0, SIZE_RANGE[1], value=0, step=16, label="Output width",
                                 info="0: from the input's aspect ratio", elem_id="width")
            ui.height = gr.Slider(0, SIZE_RANGE[1], value=0, step=16, label="Output height",
                                  info="0: from the input's aspect ratio", elem_id="height")
        ui.count = gr.Slider(1, MAX_IMAGES_PER_RUN, value=1, step=1, label="Images per run",
                             info="seeds seed, seed+1, …; each image joins the comparison", elem_id="count")
    ui.controls = {}
    with gr.Accordion("LoRAs", open=True):
        _lora_slots(ui, handlers)
    with gr.Accordion("Speed toggles", open=True):
        for setting in registry.settings():
            ui.controls[setting_parameter(setting)] = _toggle_control(setting, handlers)
    ui.prepare_notice = gr.Markdown(elem_id="prepare_notice")
    with gr.Row():
        ui.run = gr.Button("Run (Ctrl+Enter)", variant="primary", elem_id="run", scale=3)
        ui.cancel = gr.Button("Cancel", variant="stop", elem_id="cancel", scale=1)


def _lora_slots(ui: SimpleNamespace, handlers: Handlers) -> None:
    """LORA_SLOTS stacked LoRAs, each with its mode and scale; the first also takes uploads."""
    for slot in range(1, LORA_SLOTS + 1):
        with gr.Group(visible=True):
            with gr.Row(equal_height=True):
                ui.controls[lora_parameter(slot)] = gr.Dropdown(
                    handlers.loras.choices(), value=NO_LORA, label="LoRA" if slot == 1 else f"LoRA {slot} (stacked)",
                    scale=3, elem_id=lora_parameter(slot), allow_custom_value=True,  # checked by LoraLibrary.path
                    info=f"*.safetensors files in {handlers.loras.folder}" if slot == 1 else None)
                if slot == 1:
                    ui.lora_upload = gr.UploadButton("⬆ Upload a LoRA", file_types=[".safetensors"], scale=1,
                                                     size="sm", elem_id="lora_upload")
            with gr.Row():
                ui.controls[lora_parameter(slot, "mode")] = gr.Radio(
                    [("fused into the weights", "fused"), ("runtime (PEFT layers)", "runtime")], value="fused",
                    label="mode", elem_id=lora_parameter(slot, "mode"))
                ui.controls[lora_parameter(slot, "scale")] = gr.Slider(
                    -2.0, 2.0, value=1.0, step=0.05, label="scale", elem_id=lora_parameter(slot, "scale"))
    ui.lora = ui.controls[lora_parameter(1)]
    with gr.Row(equal_height=True):
        ui.hub_lora = gr.Textbox(label="LoRA from the Hugging Face Hub", elem_id="hub_lora", scale=3,
                                 placeholder="owner/name, owner/name:FILE.safetensors or a Hub URL (safetensors only)")
        ui.fetch_lora = gr.Button("⬇ Fetch", scale=1, size="sm", elem_id="fetch_lora")
    ui.lora_message = gr.Markdown(elem_classes="ghost-note")


def _toggle_control(setting: str, handlers: Handlers):
    """A dropdown for a toggle, a checkbox group for a group of flags; each choice this machine cannot run says
    why (the handler refuses it)."""
    if setting in registry.groups():
        return gr.CheckboxGroup(handlers.choices(setting), value=[], elem_id=setting_parameter(setting),
                                label="Lossless DiT rewrites", info="the same function with fewer kernels")
    toggle = registry.get(setting)
    return gr.Dropdown(handlers.choices(setting), value=toggle.default, label=toggle.label,
                       elem_id=setting_parameter(setting), info=figures.toggle_info(setting) or toggle.help)


def _compare_section() -> SimpleNamespace:
    ui = SimpleNamespace()
    gr.Markdown("## Compare runs")
    with gr.Row():
        ui.variants = gr.CheckboxGroup([(words, name) for name, words in variants().items()], value=DEFAULT_VARIANTS,
                                       label="Run variants: the current inputs under each chosen configuration",
                                       info="Each “+” variant is the stock baseline plus that one setting of the "
                                            "toggles above; “all” is every setting above.",
                                       elem_id="variants", scale=5)
        ui.run_variants = gr.Button("Run variants", variant="primary", elem_id="run_variants", scale=1,
                                    min_width=160)
    ui.table = gr.Dataframe(History().table(), headers=list(COLUMNS), interactive=False, wrap=True,
                            column_widths=column_widths(History().table()),
                            elem_id="history", label="Runs of this browser (kept across page reloads)",
                            max_height=420, elem_classes="ghost-table", pinned_columns=1)
    ui.caption = gr.Markdown("No runs yet: every run joins this comparison.", elem_classes="ghost-note")
    with gr.Row(equal_height=True):
        ui.reuse_run = gr.Dropdown([], label="Run of the history", elem_id="reuse_run", scale=3)
        ui.reuse = gr.Button("Reuse these settings", elem_id="reuse", scale=1)
    ui.reuse_message = gr.Markdown(elem_classes="ghost-note", elem_id="reuse_message")
    with gr.Row(equal_height=True):
        ui.baseline = gr.Dropdown([], label="Baseline run", elem_id="baseline", scale=3)
        ui.download_csv = gr.DownloadButton("Export CSV", interactive=False, elem_id="export_csv", scale=1)
        ui.download_json = gr.DownloadButton("Export JSON", interactive=False, elem_id="export_json", scale=1)
        ui.clear = gr.Button("Clear history", elem_id="clear_history", scale=1)
    with gr.Row():
        # x: the run numbers, short enough never to be cut; the configuration is in the tooltip and the table
        # Gradio's legend is one line that a narrow screen cuts: this one wraps (and names every stage)
        ui.time_plot = gr.BarPlot(x="run", y="seconds", color="stage", y_lim=[0, None], color_map=STAGE_COLORS,
                                  colors_in_legend=[],
                                  tooltip=["run", "configuration", "stage", "seconds"], x_title="run (see the table)",
                                  title="Seconds per run, by stage", height=340,
                                  elem_id="time_plot", min_width=300)
        ui.memory_plot = gr.BarPlot(x="run", y="peak GiB", y_lim=[0, None], tooltip=["run", "configuration", "peak GiB"],
                                    x_title="run (see the table)", title="Peak memory per run (GiB)", height=340,
                                    elem_id="memory_plot", min_width=300)
    gr.HTML(_stage_legend(), elem_id="stage_legend")
    ui.gallery = gr.Gallery(label="Outputs side by side", columns=6, fit_columns=False, height=260,
                            object_fit="contain", buttons=["fullscreen"], elem_id="outputs_gallery")
    return ui


def _stage_legend() -> str:
    items = "".join(f'<span class="ghost-legend-item"><span class="ghost-swatch" style="background:{color}"></span>'
                    f'{stage}</span>' for stage, color in STAGE_COLORS.items())
    return f'<div class="ghost-legend" aria-label="stages of the time chart">Stages: {items}</div>'


def _system_section() -> SimpleNamespace:
    ui = SimpleNamespace()
    with gr.Row():
        ui.refresh = gr.Button("Refresh", scale=0)
    ui.hardware = gr.Markdown(elem_id="hardware")
    ui.options = gr.Dataframe(label="Every option on this machine", interactive=False, wrap=True,
                              elem_id="backends", elem_classes="ghost-table", max_height=600)
    gr.Markdown("### Prepared pipelines in the cache\nEach configuration used is prepared once (LoRA fused, FP8 "
                "quantized, compiled…) and kept for the next run, within a memory budget.")
    ui.cache = gr.Dataframe(label="Cached pipelines", interactive=False, wrap=True, elem_id="cache",
                            elem_classes="ghost-table")
    with gr.Row():
        ui.free = gr.Button("Free cached pipelines", variant="stop", scale=0, elem_id="free_cache")
        ui.free_message = gr.Markdown()
    return ui


def panel_notice(handlers: Handlers, edit) -> dict:
    """The arguments of an event that refreshes the prepare notice from the panel's toggles."""
    return dict(fn=handlers.panel_notice, inputs=edit.toggles, outputs=edit.prepare_notice, show_progress="hidden",
                **PRIVATE, **NOTICE_QUEUE)


def _wire_edit(demo: gr.Blocks, handlers: Handlers, edit, compare, history, browser_key, concurrency: int) -> None:
    outputs = [edit.status, edit.result, edit.summary, edit.run_json, compare.table, edit.images, history]
    compare_outputs = [compare.gallery, compare.time_plot, compare.memory_plot, compare.baseline, compare.caption,
                       compare.table, compare.reuse_run]
    comparison_outputs = [compare.table, edit.download_png]
    names = api.edit_parameters()

    def after_history_changed(event, comparison_api: dict = PRIVATE):
        """The views of the history; then, off the edit's way, its image metrics, exports and PNG; and the history
        kept for this browser."""
        return (event.then(handlers.compare_views, history, compare_outputs, **PRIVATE, **LIGHT)
                .then(handlers.comparison, history, comparison_outputs, **comparison_api, **LIGHT)
                .then(handlers.exports, history, [compare.download_csv, compare.download_json], **PRIVATE, **LIGHT)
                .then(handlers.remember_history, [browser_key, history], None, **PRIVATE, **LIGHT))

    edit_fn = on_gpu(api.endpoint(handlers.edit, "Edits 1 to 3 images with an instruction under the chosen toggles, "
                                  "`count` times with seeds seed, seed+1, .... "
                                  "Streams the live status and progress (stage, step, s/step, elapsed, ETA, memory) "
                                  "at every step, then returns the before/after pair, the run summary, the run's "
                                  "telemetry (JSON), the session's comparison table and the run's images.", names),
                     handlers.engine.spec, runs_for=lambda arguments: arguments.get("count") or 1)
    variants_fn = on_gpu(api.endpoint(handlers.run_variants, "Runs the same edit under several configurations in one "
                                      "go: the stock baseline, the baseline plus one panel setting each, or the "
                                      "whole panel. Streams like /edit; each finished variant joins the comparison "
                                      "table.", names + ["variants"], {"variants": api.variants_description()}),
                         handlers.engine.spec, runs_for=lambda arguments: len(arguments.get("variants") or [1]))
    for button, fn, inputs, name in ((edit.run, edit_fn, edit.panel + [history], "edit"),
                                     (compare.run_variants, variants_fn, edit.panel + [compare.variants, history],
                                      "run_variants")):
        button.click(None, js=CLOSE_TOASTS, **PRIVATE)  # an earlier run's error is not this run's
        # preprocess=False: the values reach the handler as sent, and the engine's checks are the only ones (with
        # messages that name the parameter). Gradio's gr.Image would open an upload with Pillow before GhostEdit's
        # safe reader sees it, and would open any file on the server named by a payload without FileData's "meta".
        after_history_changed(button.click(fn, inputs, outputs, api_name=name, show_progress_on=[edit.result],
                                           preprocess=False, concurrency_limit=concurrency, **GPU_QUEUE),
                              dict(api_name="comparison") if name == "edit" else PRIVATE).then(
            **panel_notice(handlers, edit))
    edit.cancel.click(handlers.cancel, None, None, api_name="cancel", queue=False)
    edit.seed_button.click(handlers.random_seed, None, edit.seed, queue=False, **PRIVATE)
    edit.aspect.input(handlers.aspect_size, edit.aspect, [edit.width, edit.height], queue=False, **PRIVATE)
    edit.lora_upload.upload(handlers.upload_lora, edit.lora_upload, [edit.lora, edit.lora_message],
                            api_name="upload_lora", **LIGHT)
    for toggle in edit.toggles:
        toggle.change(**panel_notice(handlers, edit))
    after_history_changed(
        demo.load(handlers.lora_dropdown, None, edit.lora, **PRIVATE, **LIGHT)
        .then(handlers.restore_history, browser_key, [browser_key, history, compare.table], **PRIVATE, **LIGHT)
    ).then(**panel_notice(handlers, edit))
    after_history_changed(compare.baseline.input(handlers.set_baseline, [compare.baseline, history],
                                                 [compare.table, history], **PRIVATE, **LIGHT))
    after_history_changed(compare.clear.click(handlers.clear_history, history, [compare.table, history],
                                              **PRIVATE, **LIGHT))
    reused = [edit.prompt, edit.negative_prompt, edit.steps, edit.cfg_scale, edit.seed, edit.width, edit.height]
    compare.reuse.click(handlers.reuse_settings, [compare.reuse_run, history],
                        reused + [edit.controls[name] for name in toggle_parameters()] + [compare.reuse_message],
                        **PRIVATE, **LIGHT)


def _wire_hub(demo: gr.Blocks, hub: HubControls, handlers: Handlers, edit, concurrency: int) -> None:
    """The model picker (on the GPU queue: an engine is not swapped under a run), presets and Hub LoRAs."""
    slots = [edit.controls[lora_parameter(slot)] for slot in range(1, LORA_SLOTS + 1)]
    scheduler = edit.controls[setting_parameter("scheduler")]

    def then_panel_notice(event):
        event.then(**panel_notice(handlers, edit))
    then_panel_notice(edit.model.input(hub.switch_model, edit.model,
                                       [edit.model_notice, edit.steps, edit.cfg_scale, *slots],
                                       api_name="switch_model", concurrency_limit=concurrency, **GPU_QUEUE))
    demo.load(hub.model_notice, None, edit.model_notice, **PRIVATE, **LIGHT)
    edit.preset.change(hub.preset_notice, edit.preset, edit.preset_notice, **PRIVATE, **LIGHT)
    then_panel_notice(edit.apply_preset.click(
        hub.apply_preset, [edit.preset, *slots], [edit.preset_notice, *slots, edit.steps, edit.cfg_scale, scheduler],
        api_name="apply_preset", **LIGHT))
    then_panel_notice(edit.fetch_lora.click(hub.fetch_lora, [edit.hub_lora, *slots], [edit.lora_message, *slots],
                                            api_name="fetch_lora", **LIGHT))


def _wire_system(demo: gr.Blocks, handlers: Handlers, system, system_tab) -> None:
    for trigger in (system.refresh.click, system_tab.select):
        trigger(handlers.system_views, None, [system.hardware, system.options, system.cache], **PRIVATE, **LIGHT)
    system.free.click(handlers.free_cache_views, None, [system.free_message, system.cache], **PRIVATE, **LIGHT)
