"""Starts the real app (`python app.py --model tiny`) as a subprocess on a free port and waits until it serves.
A test may start it through another launcher script (the same command-line arguments), with extra environment."""
from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import psutil

from ghostedit.bench.latency import answers, free_port  # how the latency bench starts the app too

REPO = Path(__file__).resolve().parent.parent
READY_TIMEOUT_S = 180  # generous: a loaded CI machine; the startup time itself is checked in a test


@dataclass
class RunningApp:
    url: str
    lora_dir: Path
    log: Path
    startup_wall_s: float
    startup_cpu_s: float   # CPU time of the server process until it served: what a start costs without contention
    pid: int


@contextlib.contextmanager
def running_app(folder: Path, launcher: str | Path = "app.py", env: dict[str, str] | None = None, cwd: Path = REPO,
                model: str = "tiny"):
    """The app served from `launcher` (a script taking app.py's arguments) on `model`, with `env` added to the
    environment, started in `cwd`."""
    port, lora_dir, log = free_port(), folder / "loras", folder / "server.log"
    url = f"http://127.0.0.1:{port}/"
    start = time.perf_counter()
    with open(log, "w") as log_file:
        process = subprocess.Popen([sys.executable, str(launcher), "--model", model, "--port", str(port),
                                    "--lora-dir", str(lora_dir)], cwd=cwd, stdout=log_file,
                                   stderr=subprocess.STDOUT, env={**os.environ, **(env or {})})
    try:
        while not answers(url):
            if process.poll() is not None or time.perf_counter() - start > READY_TIMEOUT_S:
                raise RuntimeError(f"the app did not start (exit code {process.poll()}):\n{log.read_text()[-3000:]}")
            time.sleep(0.25)
        cpu = psutil.Process(process.pid).cpu_times()
        yield RunningApp(url, lora_dir, log, time.perf_counter() - start, cpu.user + cpu.system, process.pid)
    finally:
        process.terminate()
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
