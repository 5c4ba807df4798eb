"""Serving the app: the command-line options of `python app.py` and `ghostedit serve`, and the launch."""
from __future__ import annotations

import argparse
import os


def add_serve_arguments(parser: argparse.ArgumentParser) -> None:
    from ..arguments import add_model_arguments
    add_model_arguments(parser)
    parser.add_argument("--host", default=os.environ.get("GRADIO_SERVER_NAME", "127.0.0.1"),
                        help="address to listen on (0.0.0.0 to serve your network)")
    parser.add_argument("--port", type=int, default=int(os.environ.get("GRADIO_SERVER_PORT", 7860)),
                        help="port to listen on (default 7860, or $GRADIO_SERVER_PORT)")
    parser.add_argument("--share", action="store_true", help="also open a public gradio.live link")
    parser.add_argument("--lora-dir", default=None,
                        help="folder of LoRA .safetensors files, created if missing (default: loras/ in the working "
                             "directory)")


def serve(args: argparse.Namespace) -> None:
    from ..arguments import model_and_device
    from ..loras import default_folder
    from . import create_app, launch_options

    source, device = model_and_device(args)
    demo = create_app(source, args.lora_dir or default_folder(), device=device, dtype=args.dtype)
    # quiet: Gradio's own banner tells to edit launch() for a public link; this app's option is --share
    demo.launch(server_name=args.host, server_port=args.port, share=args.share, quiet=True,
                prevent_thread_lock=True, **launch_options())
    print(f"GhostEdit is serving on {demo.local_url}" + (f" and {demo.share_url}" if demo.share_url else
          " (add --share for a public gradio.live link)"), flush=True)
    demo.block_thread()
