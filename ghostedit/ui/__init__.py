"""GhostEdit's Gradio app: a thin layer over the engine (see layout.py for the page, handlers.py for the events)."""
from __future__ import annotations

import threading
from pathlib import Path


def create_app(model: str, lora_dir: str | Path, device: str | None = None, dtype: str | None = None,
               workers: int | None = None, warm_up: list | None = None):
    """The Blocks app on an engine for `model`, with its queue: one edit at a time per GPU. With several GPUs (or
    `workers` CPU workers) a pool of engines, one per device, serves that many edits at once (engine/workers.py),
    its workers starting in the background. `warm_up`: the configurations (OptimizationConfig) made ready in the
    background (engine/startup.py; None: the page's default one; []: none) once `demo.ghostedit_startup.start()` is
    called (serve.py: when the server answers): the weights load and each is prepared and warmed while the page
    serves. One that cannot run here is refused at once (UnavailableOptionError)."""
    from ..device import default_device
    from ..engine import Engine
    from ..config import OptimizationConfig
    from ..engine.startup import StartUp
    from ..engine.workers import WorkerPool, worker_devices
    from .layout import build_app
    from .space import prepare_space, zero_gpu

    devices = worker_devices(device or default_device(), workers)
    engine = (WorkerPool(model, devices, dtype=dtype) if len(devices) > 1
              else Engine(model, device=device, dtype=dtype))
    for done in prepare_space(engine):  # on a ZeroGPU Space: weights and AoT compile before serving
        print(done, flush=True)
    # on ZeroGPU the GPU exists only inside an edit's call: prepare_space did what start-up can do there
    startup = StartUp(engine, [] if zero_gpu() else [OptimizationConfig()] if warm_up is None else warm_up).check()
    demo = build_app(engine, Path(lora_dir), concurrency=len(devices), startup=startup)
    demo.ghostedit_startup = startup  # serve() starts it once the server answers
    demo.queue(default_concurrency_limit=1, max_size=64)
    threading.Thread(target=_first_event_imports, name="ghostedit-imports", daemon=True).start()
    return demo


def _first_event_imports() -> None:
    """What the first events would import, done here in the background before a page or a client asks: Gradio
    settles matplotlib's backend around the first event it serves (gradio.utils.MatplotlibBackendMananger: matplotlib
    and pyplot imported, most of a second on two cores, on the server's event loop, which answers nothing
    meanwhile); the first comparison imports scikit-image and SciPy (metrics.py)."""
    import matplotlib
    matplotlib.get_backend()
    from .. import metrics  # noqa: F401


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
