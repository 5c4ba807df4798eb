"""Where the app's start goes before its page answers (issue 44: 27-34 s on the H100 machine, 9 s on a 2-core CPU):
the wall time of each step `ghostedit serve` takes (imports, the engine, the warm-up's check, the page's build, the
launch), and a cProfile of the whole, its top functions by cumulative time.

    python lab/probes/app_start.py --model synthetic --warm-up best [--top 45]
"""
from __future__ import annotations

import argparse
import cProfile
import pstats
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
START = time.perf_counter()


def mark(what: str) -> None:
    print(f"{time.perf_counter() - START:7.2f} s  {what}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--device", default=None)
    parser.add_argument("--warm-up", nargs="*", default=["best"])
    parser.add_argument("--top", type=int, default=45)
    args = parser.parse_args()
    profile = cProfile.Profile()
    profile.enable()
    import torch  # noqa: F401
    mark("torch imported")
    import gradio  # noqa: F401
    mark("gradio imported")
    from ghostedit.engine.startup import configurations
    from ghostedit.ui import create_app, launch_options
    from ghostedit.ui.openai_api import routes
    mark("ghostedit.ui imported")
    warm_up = configurations(args.warm_up)
    mark("warm-up configurations read")
    demo = create_app(args.model, "/tmp/app-start-loras", device=args.device, warm_up=warm_up)
    mark("create_app")
    demo.launch(quiet=True, prevent_thread_lock=True, app_kwargs={"routes": routes(demo, None)}, **launch_options())
    mark(f"launched: {demo.local_url}")
    profile.disable()
    demo.close()
    pstats.Stats(profile).sort_stats("cumulative").print_stats(args.top)


if __name__ == "__main__":
    main()
