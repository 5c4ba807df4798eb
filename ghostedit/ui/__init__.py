"""GhostEdit's Gradio app: a thin layer over the engine (see layout.py for the page, handlers.py for the events)."""
from __future__ import annotations

import threading
import time
from pathlib import Path


def create_app(model: str, lora_dir: str | Path, device: str | None = None, dtype: str | None = None,
               workers: int | None = None, warm_up: list | None = None, timeline=None):
    """The Blocks app on an engine for `model`, with its queue: one edit at a time per GPU. With several GPUs (or
    `workers` CPU workers) a pool of engines, one per device, serves that many edits at once (engine/workers.py),
    its workers starting in the background. `warm_up`: the configurations (OptimizationConfig) made ready in the
    background (engine/startup.py; None: the page's default one; []: none) once serve_in_background(demo) is called
    (serve.py: when the server answers): the weights load and each is prepared and warmed while the page serves.
    One that cannot run here is refused at once (UnavailableOptionError). `timeline`: start_timeline.py's StartTimeline, given
    a step for each part of this (the engine, every choice's availability check, the warm-up's check, the page);
    /startup returns it. The engine's DiffSynth is imported by serve_in_background, not here."""
    from ..device import default_device
    from ..engine import Engine
    from ..config import OptimizationConfig
    from ..engine.startup import StartUp
    from ..engine.workers import WorkerPool, worker_devices
    from .layout import build_app
    from .start_timeline import StartTimeline
    from .space import prepare_space, zero_gpu

    timeline = timeline or StartTimeline()
    timeline.mark("import ghostedit's page (layout, handlers)")
    devices = worker_devices(device or default_device(), workers)
    engine = (WorkerPool(model, devices, dtype=dtype) if len(devices) > 1
              else Engine(model, device=device, dtype=dtype, import_now=False))
    timeline.mark("engine made" + (f" ({len(devices)} workers starting)" if len(devices) > 1 else ""))
    for done in prepare_space(engine):  # on a ZeroGPU Space: weights and AoT compile before serving
        print(done, flush=True)
        timeline.mark(f"Space: {done}")
    timeline.mark("every choice's availability checked", detail=_checked_choices(engine.device))
    # on ZeroGPU the GPU exists only inside an edit's call: prepare_space did what start-up can do there
    configs = [] if zero_gpu() else [OptimizationConfig()] if warm_up is None else warm_up
    startup = StartUp(engine, configs, page_start=timeline.record).check()
    timeline.mark("warm-up configurations checked")
    demo = build_app(engine, Path(lora_dir), concurrency=len(devices), startup=startup)
    demo.ghostedit_startup = startup  # serve_in_background starts it once the server answers
    demo.ghostedit_timeline = timeline
    demo.queue(default_concurrency_limit=1, max_size=64)
    timeline.mark("page built")
    return demo


def _checked_choices(device: str) -> list[dict]:
    """Every choice's availability on this device, each checked once and timed (the checks keep what they found:
    the page's build asks again at no cost): on a GPU an attention backend's check imports its package and runs
    it, FP8's imports torchao. The choices that took 10 ms or more, slowest first."""
    from ..optimize import registry

    timed = []
    for toggle in registry.toggles():
        for value in toggle.values if toggle.group is None else (registry.ON,):
            began = time.perf_counter()
            registry.availability(toggle, value, device)
            timed.append({"step": f"{toggle.name}={value}", "s": round(time.perf_counter() - began, 3)})
    return sorted((item for item in timed if item["s"] >= 0.01), key=lambda item: -item["s"])


def serve_in_background(demo) -> None:
    """What the page did not wait for, once it answers: the start-up warm-up, and the imports edits need
    (DiffSynth; what the first events import) in a thread of their own, each timed in the start's timeline."""
    demo.ghostedit_startup.start()
    threading.Thread(target=imports_after_launch, args=(demo.ghostedit_timeline,), name="ghostedit-imports",
                     daemon=True).start()


def imports_after_launch(timeline) -> None:
    """DiffSynth, which loading and running import (a run that asks first waits for it, as for the warm-up); then
    what the first events would import, before a page or a client asks: Gradio settles matplotlib's backend around
    the first event it serves (gradio.utils.MatplotlibBackendMananger: matplotlib and pyplot imported, most of a
    second on two cores, on the server's event loop, which answers nothing meanwhile); the first comparison imports
    scikit-image and SciPy (metrics.py)."""
    from ..engine import import_run_code

    began = time.perf_counter()
    import_run_code()
    timeline.after("import DiffSynth (loading and runs need it)", time.perf_counter() - began)
    began = time.perf_counter()
    import matplotlib
    matplotlib.get_backend()
    from .. import metrics  # noqa: F401
    timeline.after("import matplotlib and scikit-image (the first events')", time.perf_counter() - began)


def launch_options() -> dict:
    """What Gradio 6 takes at launch rather than in Blocks: theme, CSS and the page's script. System fonts: nothing is fetched from
    the internet, so the page renders the same offline."""
    import gradio as gr

    from .browser import CSS, PAGE_SCRIPT
    from .layout import ASSETS
    theme = gr.themes.Soft(primary_hue="indigo", secondary_hue="slate",
                           font=["ui-sans-serif", "system-ui", "sans-serif"],
                           font_mono=["ui-monospace", "SFMono-Regular", "monospace"])
    # show_error: a value Gradio itself refuses before GhostEdit sees it (text where a number belongs) reaches the
    # API client with its reason, not "the app has raised an exception"; GhostEdit's own errors are shown anyway
    return {"theme": theme, "css": CSS, "js": PAGE_SCRIPT, "allowed_paths": [str(ASSETS)], "show_error": True}
