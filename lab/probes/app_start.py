"""Where the app's start goes before its page answers (issue 44): the steps `ghostedit serve` takes, in its own
timeline (ui/start_timeline.py's StartTimeline: the imports, the engine, each choice's availability check, the warm-up's
check, the page's build, the launch; what runs after the launch; the bytecode Python compiled), and a cProfile of
the whole, its top functions by cumulative time. `ghostedit serve` prints the same timeline ("page start: ...") and
the latency bench keeps it in results.json (page_start); this probe adds the profile.

    python lab/probes/app_start.py --model synthetic --warm-up best [--top 45] [--no-profile]
"""
from __future__ import annotations

import argparse
import cProfile
import pstats
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def main() -> None:
    from ghostedit.ui.start_timeline import StartTimeline  # light: psutil; the timeline starts with the process anyway

    timeline = StartTimeline()
    timeline.mark("python and the probe's arguments")
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--device", default=None)
    parser.add_argument("--warm-up", nargs="*", default=["best"])
    parser.add_argument("--top", type=int, default=45)
    parser.add_argument("--no-profile", action="store_true", help="the timeline alone, without cProfile's cost")
    args = parser.parse_args()
    profile = cProfile.Profile()
    if not args.no_profile:
        profile.enable()
    import torch  # noqa: F401
    timeline.mark("import torch")
    import gradio  # noqa: F401
    timeline.mark("import gradio")
    from ghostedit.engine.startup import configurations
    timeline.mark("import ghostedit's engine (not DiffSynth)")
    from ghostedit.ui import create_app, imports_after_launch, launch_options
    from ghostedit.ui.openai_api import routes
    timeline.mark("import ghostedit's API routes")
    warm_up = configurations(args.warm_up)
    demo = create_app(args.model, "/tmp/app-start-loras", device=args.device, warm_up=warm_up, timeline=timeline)
    demo.launch(quiet=True, prevent_thread_lock=True, app_kwargs={"routes": routes(demo, None)}, **launch_options())
    timeline.mark("launch")
    timeline.page_up()
    profile.disable()
    print(timeline.line(), flush=True)
    for step in timeline.record["steps"]:
        for item in step.get("detail", []):
            print(f"  {step['step']}: {item['step']} {item['s']:.3f} s")
    imports_after_launch(timeline)  # what serve_in_background imports, without the warm-up beside it
    print("after the launch: " + ", ".join(f"{step['step']} {step['s']:.2f}" for step in timeline.record["after"]),
          flush=True)
    demo.close()
    if not args.no_profile:
        pstats.Stats(profile).sort_stats("cumulative").print_stats(args.top)


if __name__ == "__main__":
    main()
