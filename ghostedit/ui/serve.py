"""Serving the app: the command-line options of `python app.py` and `ghostedit serve`, the launch, and the start's
timeline (every second from the process's start to the page answering, step by step, printed and kept for /startup).

The page is served before what only edits need: DiffSynth (imported after the launch, in the background, while the
start-up warm-up begins) and matplotlib and the metrics' packages (ui/__init__.py)."""
from __future__ import annotations

import argparse
import os

from . import create_app, launch_options, serve_in_background
from .start_timeline import StartTimeline


def add_serve_arguments(parser: argparse.ArgumentParser) -> None:
    # the start's timeline begins here, where both launchers (app.py, the CLI) begin with serving: the options' own
    # imports (torch, the model arguments) are its first steps
    timeline = StartTimeline()
    timeline.mark("python, app.py or the command line")
    import torch  # noqa: F401 - here rather than by the next line's imports, to be timed on its own
    timeline.mark("import torch")
    from ..arguments import add_model_arguments
    timeline.mark("import ghostedit's arguments")
    parser.set_defaults(start_timeline=timeline)
    add_model_arguments(parser)
    parser.add_argument("--host", default=os.environ.get("GRADIO_SERVER_NAME", "127.0.0.1"),
                        help="address to listen on (0.0.0.0 to serve your network)")
    parser.add_argument("--port", type=int, default=int(os.environ.get("GRADIO_SERVER_PORT", 7860)),
                        help="port to listen on (default 7860, or $GRADIO_SERVER_PORT)")
    parser.add_argument("--share", action="store_true", help="also open a public gradio.live link")
    parser.add_argument("--lora-dir", default=None,
                        help="folder of LoRA .safetensors files, created if missing (default: loras/ in the working "
                             "directory)")
    parser.add_argument("--mcp", action="store_true", default=os.environ.get("GHOSTEDIT_MCP", "") == "1",
                        help="also serve the edit, options and system endpoints as MCP tools at "
                             "/gradio_api/mcp/ (needs gradio[mcp]; on a Space: GHOSTEDIT_MCP=1)")
    parser.add_argument("--compiled-from", default=os.environ.get("GHOSTEDIT_COMPILED_FROM") or None,
                        metavar="FOLDER_OR_REPO",
                        help="install compiled-code packages from this folder or Hub repo before serving (see "
                             "`ghostedit compiled`), so that the first edits load their code instead of compiling "
                             "it (on a Space: GHOSTEDIT_COMPILED_FROM); a package is code: only from a source you trust")
    parser.add_argument("--warm-up", nargs="+", default=(os.environ.get("GHOSTEDIT_WARM_UP") or "").split() or None,
                        metavar="CONFIG",
                        help="configurations made ready at start-up, in the background while the page serves: the "
                             "weights load, each is prepared (compiled ones load their compiled package, or compile "
                             "and keep one for the next start) and runs a small warm-up edit, so that the first edit "
                             "runs warm: \"stock\", a preset (\"best\") or settings such as "
                             "\"fp8=torchao,compile=regional\"; \"off\": none (default: the page's default "
                             "configuration, stock; on a Space: GHOSTEDIT_WARM_UP)")
    parser.add_argument("--api-key", default=os.environ.get("GHOSTEDIT_API_KEY") or None, metavar="KEY",
                        help="require this bearer token on the OpenAI-compatible /v1 endpoints (or "
                             "GHOSTEDIT_API_KEY; default: open, as the page; a Space keeps its own auth)")
    parser.add_argument("--workers", type=int, default=None,
                        help="edits served at once, one engine per worker: on CUDA the first N GPUs (default: every "
                             "visible GPU), on the CPU N CPU workers (default 1)")


def serve(args: argparse.Namespace) -> None:
    timeline = args.start_timeline
    timeline.mark("the command line read")
    os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")  # no calls home; the app works offline
    os.environ.setdefault("MPLBACKEND", "agg")  # a server draws no windows: Gradio's first event need not probe
    # the imports one by one, here rather than at the top (`--help` stays quick), each timed for the timeline
    import gradio  # noqa: F401
    timeline.mark("import gradio")
    from ..arguments import model_and_device
    from ..device import UnavailableOptionError
    from ..engine.startup import configurations
    from ..engine.workers import worker_devices
    from ..errors import GhostEditError
    from ..loras import default_folder
    timeline.mark("import ghostedit's engine (not DiffSynth)")
    from .openai_api import routes as images_api
    from .tools import agent_tools_only, mcp_tools
    timeline.mark("import ghostedit's API routes")

    source, device = model_and_device(args)
    try:
        worker_devices(device, args.workers)  # a --workers this machine cannot serve stops here, with the reason
    except ValueError as error:
        raise SystemExit(f"error: {error}") from None
    if args.mcp:
        check_mcp()
    try:
        warm_up = configurations(args.warm_up)
    except GhostEditError as error:
        raise SystemExit(f"error: --warm-up: {error}") from None
    timeline.mark("arguments checked")
    if args.compiled_from:
        install_compiled(args.compiled_from, device)
        timeline.mark("compiled packages installed")
    try:
        demo = create_app(source, args.lora_dir or default_folder(), device=device, dtype=args.dtype,
                          workers=args.workers, warm_up=warm_up, timeline=timeline)
    except UnavailableOptionError as error:
        raise SystemExit(f"error: --warm-up: {error}") from None
    extras = {"routes": images_api(demo, args.api_key)}
    if args.mcp:  # the agent tools only, from the server's start: Gradio enters this lifespan before it answers
        extras["lifespan"] = agent_tools_only(demo)
    # quiet: Gradio's own banner tells to edit launch() for a public link; this app's option is --share
    demo.launch(server_name=args.host, server_port=args.port, share=args.share, quiet=True,
                prevent_thread_lock=True, mcp_server=args.mcp,
                app_kwargs=extras, **launch_options())
    # launch() returns after Gradio's own calls to the page (startup-events, url_ok): it answers a little before
    timeline.mark("launch" + (" (and the share link)" if args.share else ""))
    timeline.page_up()
    print(f"GhostEdit is serving on {demo.local_url}" + (f" and {demo.share_url}" if demo.share_url else
          " (add --share for a public gradio.live link)"), flush=True)
    print(timeline.line(), flush=True)
    serve_in_background(demo)  # now, not before: this work would slow the page's own start
    if args.mcp:
        print(f"MCP tools {', '.join(mcp_tools(demo))} at (Streamable HTTP) "
              f"{demo.share_url or demo.local_url}gradio_api/mcp/", flush=True)
    demo.block_thread()


def install_compiled(source: str, device: str) -> None:
    """--compiled-from: the packages installed before the app starts, each line printed (a refused one says why)."""
    from ..optimize import packages
    try:
        lines, _ = packages.install_and_tell(source, device)
    except packages.InstallError as error:
        raise SystemExit(f"error: --compiled-from {source}: {error}") from None
    print("\n".join(lines), flush=True)


def check_mcp() -> None:
    """--mcp needs Gradio's MCP extra; without it Gradio would log an error and serve no tools, so refuse."""
    try:
        import mcp  # noqa: F401
    except ImportError as error:
        raise SystemExit(f"--mcp needs the MCP package ({error}): pip install \"gradio[mcp]==6.31.0\"") from None
