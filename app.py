"""GhostEdit web app (the same as `ghostedit serve`).

    python app.py                                   # tiny model without a GPU, Qwen/Qwen-Image-Edit-2509 with one
    python app.py --model Qwen/Qwen-Image-Edit-2509 --host 0.0.0.0 --port 7860 --share

On a Hugging Face Space (README front matter: sdk gradio, app_file app.py) the same file runs as is.
"""
from __future__ import annotations

import argparse

try:  # ZeroGPU needs `spaces` imported before torch touches CUDA; outside a Space it changes nothing
    import spaces  # noqa: F401
except ImportError:
    pass  # not on a Space: nothing to prepare


def main(argv=None) -> None:
    from ghostedit.ui.serve import add_serve_arguments, serve
    parser = argparse.ArgumentParser(description="GhostEdit: instruction-based image editing with every speed "
                                                 "toggle measured live")
    add_serve_arguments(parser)
    serve(parser.parse_args(argv))


if __name__ == "__main__":
    main()
