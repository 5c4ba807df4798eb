"""Runs the app (the same arguments as app.py) with faults injected into the server process, for the server-level
hardening tests: running out of GPU memory while preparing or running, and a C++ compiler that fails. The product
code has no test hooks: this script patches the engine from outside before the app starts.

GHOSTEDIT_FAULTS (JSON) picks the faults. Out-of-memory faults hit only edits with a given seed, so one server serves
every case and any other edit runs as usual:
    {"oom_running_once": seed, "oom_running_always": seed, "oom_preparing_once": seed, "broken_compiler": true}
"once" fails the first attempt of each such edit (the engine's retry then succeeds); "always" fails every attempt.
"""
from __future__ import annotations

import json
import os
import sys
import tempfile
import threading
from pathlib import Path

FAULTS_VARIABLE = "GHOSTEDIT_FAULTS"
FAULTS = json.loads(os.environ.get(FAULTS_VARIABLE) or "{}")


def break_the_compiler() -> None:
    """Inductor's C++ compiler fails on every kernel, though it answers `--version` like g++: the app offers
    compile (its check finds a working compiler) and the failure comes while compiling. Through the environment,
    before torch is imported: Inductor's config set from Python holds only in the thread that sets it (torch 2.14),
    and the app compiles in its run threads. Inductor's caches are off, so nothing compiled earlier is reused."""
    compiler = Path(tempfile.mkdtemp(prefix="ghostedit-broken-cxx-")) / "c++"
    compiler.write_text('#!/bin/sh\n[ "$1" = --version ] && exec g++ --version\necho "injected failure" >&2\nexit 1\n')
    compiler.chmod(0o755)
    os.environ["CXX"] = str(compiler)
    os.environ["TORCHINDUCTOR_FORCE_DISABLE_CACHES"] = "1"


if FAULTS.get("broken_compiler"):
    break_the_compiler()

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import app  # noqa: E402 - before torch, as app.py imports `spaces` first on a Space


def out_of_memory():
    import torch
    return torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of "
                                  "79.19 GiB of which 1.06 GiB is free. (injected by tests/app_with_faults.py)")


def inject_out_of_memory(faults: dict) -> None:
    from ghostedit.engine import Engine
    from ghostedit.engine.runner import _Instrumented

    current = threading.local()  # the request of the attempt running in this thread (the engine runs one at a time)

    def fails(where: str) -> bool:
        request = getattr(current, "request", None)
        if request is None:
            return False
        if request.seed == faults.get(f"oom_{where}_always"):
            return True
        flag = f"_ghostedit_failed_{where}"  # set on the request: the retry gets the same request object
        if request.seed == faults.get(f"oom_{where}_once") and not getattr(request, flag, False):
            object.__setattr__(request, flag, True)  # EditRequest is frozen
            return True
        return False

    run, build, model_fn = Engine._run, Engine._build, _Instrumented._model_fn

    def run_noting_the_request(self, request, *args):
        current.request = request
        try:
            return run(self, request, *args)
        finally:
            current.request = None

    def build_or_fail(self, *args):
        if fails("preparing"):
            raise out_of_memory()
        return build(self, *args)

    def model_fn_or_fail(self, **inputs):
        if fails("running"):
            raise out_of_memory()
        return model_fn(self, **inputs)

    Engine._run, Engine._build, _Instrumented._model_fn = run_noting_the_request, build_or_fail, model_fn_or_fail


def main() -> None:
    if any(name.startswith("oom_") for name in FAULTS):
        inject_out_of_memory(FAULTS)
    app.main()


if __name__ == "__main__":
    main()
