"""GhostEdit's Gradio app: a thin layer over the engine (see layout.py for the page, handlers.py for the events)."""
from __future__ import annotations

from pathlib import Path


def create_app(model: str, lora_dir: str | Path, device: str | None = None, dtype: str | None = None,
               workers: int | None = None):
    """The Blocks app on an engine for `model` (loaded on the first run), with its queue: one edit at a time per
    GPU. With several GPUs (or `workers` CPU workers) a pool of engines, one per device, serves that many edits at
    once (engine/workers.py)."""
    from ..device import default_device
    from ..engine import Engine
    from ..engine.workers import WorkerPool, worker_devices
    from .layout import build_app
    from .space import prepare_space

    devices = worker_devices(device or default_device(), workers)
    engine = (WorkerPool(model, devices, dtype=dtype) if len(devices) > 1
              else Engine(model, device=device, dtype=dtype))
    for done in prepare_space(engine):  # on a ZeroGPU Space: weights and AoT compile before serving
        print(done, flush=True)
    demo = build_app(engine, Path(lora_dir), concurrency=len(devices))
    demo.queue(default_concurrency_limit=1, max_size=64)
    return demo


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
