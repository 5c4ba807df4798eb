"""A test script run by Triton's interpreter: GhostEdit's Triton kernels on the CPU. Triton reads TRITON_INTERPRET
when it is imported, so the script runs in a fresh Python of its own, from the repository's root."""
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parents[1]


def run_interpreted(script: str, *args: str, timeout: int = 300) -> str:
    """`script` (Python source) with `args` as its argv, run to completion; its stdout, once it exited cleanly."""
    done = subprocess.run([sys.executable, "-c", script, *args], capture_output=True, text=True, timeout=timeout,
                          cwd=ROOT, env={**os.environ, "TRITON_INTERPRET": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout
