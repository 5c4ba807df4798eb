"""GhostEdit web app.

    python app.py                                   # tiny model without a GPU, Qwen/Qwen-Image-Edit-2509 with one
    python app.py --model Qwen/Qwen-Image-Edit-2509 --host 0.0.0.0 --port 7860 --share

On a Hugging Face Space (README front matter: sdk gradio, app_file app.py) the same file runs as is.
"""
from __future__ import annotations

import argparse
import os

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")  # no calls home; the app works offline

try:  # ZeroGPU needs `spaces` imported before torch touches CUDA; outside a Space it changes nothing
    import spaces  # noqa: F401
except ImportError:
    pass  # not on a Space: nothing to prepare


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="GhostEdit: instruction-based image editing with every speed "
                                                 "toggle measured live")
    parser.add_argument("--model", default=None,
                        help="tiny (the default without a GPU), synthetic, a Hugging Face repo id (the default with "
                             "a GPU: Qwen/Qwen-Image-Edit-2509), modelscope:<repo id>, or a local folder")
    parser.add_argument("--device", default=None, help="cuda or cpu (default: cuda when available)")
    parser.add_argument("--host", default=os.environ.get("GRADIO_SERVER_NAME", "127.0.0.1"),
                        help="address to listen on (0.0.0.0 to serve your network)")
    parser.add_argument("--port", type=int, default=int(os.environ.get("GRADIO_SERVER_PORT", 7860)))
    parser.add_argument("--share", action="store_true", help="also open a public gradio.live link")
    parser.add_argument("--lora-dir", default=None,
                        help="folder of LoRA .safetensors files, created if missing (default: loras/ in the working "
                             "directory)")
    return parser.parse_args(argv)


def default_model() -> str:
    import torch

    from ghostedit.models import DEFAULT_REPO
    return DEFAULT_REPO if torch.cuda.is_available() else "tiny"


def main(argv=None) -> None:
    args = parse_args(argv)
    from ghostedit.loras import default_folder
    from ghostedit.ui import create_app, launch_options

    demo = create_app(args.model or default_model(), args.lora_dir or default_folder(), device=args.device)
    demo.launch(server_name=args.host, server_port=args.port, share=args.share, **launch_options())


if __name__ == "__main__":
    main()
