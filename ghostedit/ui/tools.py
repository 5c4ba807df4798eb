"""The endpoints an agent calls, which are also the MCP tools of `python app.py --mcp` (Gradio's own MCP server):
`edit_image` (one edit; returns the edited image and the run's telemetry), `options` and `system`. Their
descriptions, and what each argument means and which values it takes, come from api.py (the toggle registry).

The page's own endpoints (/edit, /run_variants, ...) stay in the API but are not MCP tools: they answer with a UI's
outputs (status text, a before/after pair, a comparison table, a session state), which Gradio's MCP bridge cannot
hand to an agent (Gradio 6.31 answers such a call with "pop index out of range")."""
from __future__ import annotations

import contextlib
from typing import Callable

import gradio as gr
from gradio.data_classes import FileData

from . import media
from .api import edit_parameters, typed_tool
from .history import History

MCP_ENDPOINTS = ("/edit_image", "/options", "/system")


def add_tools(handlers, on_gpu: Callable, concurrency: dict) -> None:
    """The agent endpoints, inside the Blocks context. `on_gpu` wraps the edit for ZeroGPU; `concurrency` is the
    edit events' queue settings (one edit per GPU worker at a time)."""
    edit = typed_tool(lambda values, request: _edit_image(handlers, values, request), "edit_image",
                      "Edits images with an instruction under the chosen speed toggles (Qwen-Image-Edit: 1 to 3; "
                      "Qwen-Image-2.1: 1 to 10, or none to generate from the prompt), and waits for the result. An "
                      "option this machine cannot run is refused with the reason (the options tool lists them).",
                      edit_parameters(), handlers.engine.spec.default_steps,
                      ("the edited image (PNG, with an alpha channel for Qwen-Image-2.1)", FileData),
                      default_cfg=_default_cfg(handlers.engine))

    def options() -> dict:
        """Every speed toggle with its choices, whether each can run on this machine and why not; the LoRA names
        the lora arguments take; the run-variant names; the model and its default steps.

        Returns:
            {"options": {toggle: {choice: {"available", "reason"}}}, "loras", "variants", "model"}
        """
        return handlers.api_options()

    def system() -> dict:
        """This machine and the engine: GPU(s), driver, CUDA, library versions, every option's availability with
        the reason, where the weights live, the memory in use now, the cached prepared pipelines and the GPU
        workers.

        Returns:
            {"model", "hardware", "libraries", "options", "placement", "memory", "cached_pipelines", "workers"}
        """
        return handlers.system()

    gr.api(on_gpu(edit, handlers.engine.spec), api_name="edit_image", **concurrency)
    gr.api(options, api_name="options", concurrency_limit=None)
    gr.api(system, api_name="system", concurrency_limit=None)


def _default_cfg(engine) -> float:
    family = engine.family
    return family.default_cfg if family else 4.0


def agent_tools_only(demo: gr.Blocks):
    """A lifespan for launch(app_kwargs=...): Gradio enters it after making its MCP server and before the server
    answers, so no client ever lists the page's endpoints as tools (Gradio lists every public endpoint)."""
    @contextlib.asynccontextmanager
    async def lifespan(_app):
        server = demo.mcp_server_obj
        if server is not None:  # None: Gradio could not start it; mcp_tools says why once launch returns
            server.tool_to_endpoint = {tool: endpoint for tool, endpoint in server.tool_to_endpoint.items()
                                       if endpoint in MCP_ENDPOINTS}
        yield
    return lifespan


def mcp_tools(demo: gr.Blocks) -> list[str]:
    """After launch(mcp_server=True): the tools served; a --mcp that serves none is refused (Gradio would log why
    and serve on without tools)."""
    server = demo.mcp_server_obj
    if server is None:
        raise SystemExit(f"the MCP server did not start: {demo.mcp_error}")
    return list(server.tool_to_endpoint)


def _edit_image(handlers, values: dict, request: gr.Request) -> dict:
    """Runs handlers.edit (its checks, its errors) to the end and returns the edited image as a file. The image
    alone: Gradio 6.31's MCP bridge passes a tool's several outputs only to clients that ask for progress (without,
    it sends their tuple as one text); the run's telemetry stays with /edit."""
    history = History()
    handlers.answer(handlers.edit(values, history, request, lambda *args, **kwargs: None), request)
    path = media.png_file(history.runs[-1].image, handlers.upload_folder / "edited")  # lossless, not the JPEG view
    return FileData(path=path, orig_name="edited.png", mime_type="image/png").model_dump()
