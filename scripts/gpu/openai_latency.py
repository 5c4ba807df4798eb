"""What the OpenAI-compatible endpoint adds over /edit: the same edit, alternately through gradio_client's /edit and
the `openai` client's images.edit, on one `python app.py` started here. Each call is timed at the client (from the
call to the edited image in hand) beside the run's own end to end (its telemetry's total_s): the difference is what
the path around the engine costs (request, queue, encoding, transfer). Reports the medians per path and the
OpenAI endpoint's overhead minus /edit's.

    python3 scripts/gpu/openai_latency.py --model tiny --device cpu --side 1024 --steps 4 --cfg 1   # the CPU figure
On the GPU machine, one device call (the engine, ui and openai wheels carried, as scripts/gpu/README.md says):
    source scripts/gpu/setup.sh && python3 scripts/gpu/openai_latency.py --model synthetic --config best --out "$OUT"
Writes DIR/openai-latency/results.json (every call, the medians, the environment) and prints the table. Both paths
warm up first (the model's load, the configuration's preparation and compile are no path's cost). One client per
path, kept for all its calls, as a script would keep it.
"""
from __future__ import annotations

import argparse
import base64
import io
import os
import shlex
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from ghostedit.bench.output import environment, markdown_table, write_results  # noqa: E402
from ghostedit.bench.pipeline import DEFAULT_IMAGE  # noqa: E402
from ghostedit.config import OptimizationConfig  # noqa: E402
from ghostedit.ui.settings import setting_parameter  # noqa: E402

PROMPT = "turn the scene into a ghostly night"
READY_TIMEOUT_S = 600


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="synthetic")
    parser.add_argument("--device", default=None)
    parser.add_argument("--config", default="best", help="a preset or settings, as `ghostedit bench --configs`")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--cfg", type=float, default=1.0)
    parser.add_argument("--side", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=10, help="timed calls per path, alternating")
    parser.add_argument("--warm-up", type=int, default=2, help="untimed calls per path first")
    parser.add_argument("--out", default=os.environ.get("OUT", "bench-results"))
    args = parser.parse_args()
    settings = {setting_parameter(name): list(value) if isinstance(value, tuple) else value
                for name, value in OptimizationConfig.parse(args.config).settings().items()}
    request = dict(steps=args.steps, cfg_scale=args.cfg, seed=0, **settings)
    with served(args) as url:
        calls = measure(url, args, request)
    rows = summary(calls)
    out = Path(args.out) / "openai-latency"
    write_results(out, {"model": args.model, "device": args.device, "config": args.config, "steps": args.steps,
                        "cfg_scale": args.cfg, "size": [args.side, args.side], "repeats": args.repeats,
                        "environment": {**environment(), "command": shlex.join([
                            "python3", "scripts/gpu/openai_latency.py", *sys.argv[1:]])},
                        "rows": rows, "calls": calls})
    print(markdown_table(rows, {"path": "path", "client_s": "client wall s (median)",
                                "engine_s": "engine total_s (median)", "around_s": "around the engine s (median)"}))
    added = rows[1]["around_s"] - rows[0]["around_s"]
    print(f"the OpenAI endpoint adds {added * 1000:+.0f} ms over /edit (medians of {args.repeats}); "
          f"wrote {out}/results.json")


class served:
    """`python app.py` on a free port for the length of the block; its log kept beside the results."""

    def __init__(self, args):
        self.args = args

    def __enter__(self) -> str:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        command = [sys.executable, str(REPO / "app.py"), "--model", self.args.model, "--port", str(port)]
        if self.args.device:
            command += ["--device", self.args.device]
        log = Path(self.args.out) / "openai-latency" / "server.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        self.process = subprocess.Popen(command, cwd=REPO, stdout=log.open("w"), stderr=subprocess.STDOUT)
        url, start = f"http://127.0.0.1:{port}/", time.monotonic()
        while self.process.poll() is None and time.monotonic() - start < READY_TIMEOUT_S:
            try:  # the OpenAI routes answer from the server's first request on
                if httpx.get(f"{url}v1/models", timeout=2).status_code == 200:
                    return url
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        raise SystemExit(f"the app did not start:\n{log.read_text()[-3000:]}")

    def __exit__(self, *exc):
        self.process.terminate()
        self.process.wait(timeout=60)


def measure(url: str, args, request: dict) -> list[dict]:
    import openai
    from gradio_client import Client, handle_file
    from PIL import Image

    size = dict(width=args.side, height=args.side)
    edit_client = Client(url, verbose=False)
    api = openai.OpenAI(base_url=f"{url}v1", api_key="unused", max_retries=0, timeout=READY_TIMEOUT_S)
    image_bytes = DEFAULT_IMAGE.read_bytes()

    def through_edit() -> tuple[float, dict]:
        start = time.perf_counter()
        outputs = edit_client.predict(image=handle_file(str(DEFAULT_IMAGE)), prompt=PROMPT, api_name="/edit",
                                      **size, **request)
        Image.open(outputs[1][1]).load()  # the edited image, in hand
        return time.perf_counter() - start, outputs[3]

    def through_openai() -> tuple[float, dict]:
        start = time.perf_counter()
        answer = api.images.edit(image=("house.png", image_bytes, "image/png"), prompt=PROMPT,
                                 size=f"{args.side}x{args.side}", extra_body=request)
        Image.open(io.BytesIO(base64.b64decode(answer.data[0].b64_json))).load()
        return time.perf_counter() - start, answer.model_extra["ghostedit"]["runs"][0]

    calls = []
    for index in range(args.warm_up + args.repeats):
        for path, call in (("/edit", through_edit), ("/v1/images/edits", through_openai)):
            wall, run = call()
            if index >= args.warm_up:
                engine = run["telemetry"]["total_s"]
                calls.append({"path": path, "client_s": wall, "engine_s": engine, "around_s": wall - engine})
    return calls


def summary(calls: list[dict]) -> list[dict]:
    return [{"path": path, **{key: statistics.median(call[key] for call in calls if call["path"] == path)
                              for key in ("client_s", "engine_s", "around_s")}}
            for path in ("/edit", "/v1/images/edits")]


if __name__ == "__main__":
    main()
