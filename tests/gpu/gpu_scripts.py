"""What the GPU tier's tests share: each runs its script beside it (graph_check.py, parallel_smoke.py, seed_check.py,
qwen21_fp8_attention.py, qwen21_graphs.py, text_encoder_graph_check.py) in a process of its own, as on the GPU
machine, where they run from the repository root after `source scripts/gpu/setup.sh`:  python -m pytest -m gpu tests/gpu
One script at a time, whatever pytest-xdist does: each builds the full-size synthetic model on the one GPU."""
import fcntl
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
SCRIPT_LIMIT_S = 480   # a device call is at most ten minutes
LOCK = Path(tempfile.gettempdir()) / "ghostedit-gpu-tests.lock"


def run_script(script: str, *args: str) -> str:
    """Runs tests/gpu/<script> with its arguments (its main) from the repository root; returns what it printed, or
    fails with the end of its output."""
    with open(LOCK, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        ran = subprocess.run([sys.executable, str(HERE / script), *args], cwd=HERE.parents[1], capture_output=True,
                             text=True, timeout=SCRIPT_LIMIT_S)
    output = ran.stdout + ran.stderr
    assert ran.returncode == 0, f"{script} {' '.join(args)} exited {ran.returncode}:\n{output[-4000:]}"
    return ran.stdout


def output_folder(description: str, name: str) -> Path:
    """A GPU script's folder for its report: `name` under --out (default $OUT, else bench-results), created."""
    import argparse
    import os
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--out", default=os.environ.get("OUT", "bench-results"))
    folder = Path(parser.parse_args().out) / name
    folder.mkdir(parents=True, exist_ok=True)
    return folder
