"""The app's start timeline: every second from the process's creation to the page answering, step by step, what ran
after the launch, and the bytecode Python compiled; kept as a JSON-ready record (/startup returns it, the latency
bench carries it into its results) and said in words by one function for the log, the bench and the docs."""
from __future__ import annotations

import os
import sys
import time

import psutil


class StartTimeline:
    """Where the app's start goes: wall seconds from the process's creation (the interpreter, app.py or the CLI) to
    the page answering, one entry per step, each from the end of the one before (so that they add up to the whole);
    a step may list its parts (`detail`: every choice's availability check). Then what runs after the launch, in
    the background (`after`), and how much of the imported Python this process compiled from source (with no
    bytecode cached, every start pays that again). `record` is JSON-ready: the app's /startup returns it."""

    def __init__(self):
        self.started = psutil.Process().create_time()
        self.record = {"steps": [], "page_up_s": None, "after": [], "bytecode": None}
        self._last = self.started

    def mark(self, step: str, detail: list[dict] | None = None) -> None:
        now = time.time()
        self.record["steps"].append({"step": step, "s": round(now - self._last, 3),
                                     **({"detail": detail} if detail else {})})
        self._last = now

    def page_up(self) -> None:
        """The page answers: the whole before it, and what Python compiled on the way."""
        self.record["page_up_s"] = round(self._last - self.started, 3)
        self.record["bytecode"] = compiled_from_source(self.started)

    def after(self, step: str, seconds: float) -> None:
        self.record["after"].append({"step": step, "s": round(seconds, 3)})

    def line(self) -> str:
        return f"page start: {page_start_words(self.record)}"


def compiled_from_source(since: float) -> dict:
    """How many of the modules imported from .py files had no bytecode cached before this process (compiled from
    source here: their .pyc is missing or newer than `since`, the process's start). On a machine whose packages
    were installed without bytecode (pip --no-compile) and that writes none (PYTHONDONTWRITEBYTECODE), every start
    compiles them all again."""
    compiled = modules = 0
    for module in list(sys.modules.values()):
        spec = getattr(module, "__spec__", None)
        if spec is None or not spec.cached or not str(spec.origin or "").endswith(".py"):
            continue
        modules += 1
        try:
            compiled += os.stat(spec.cached).st_mtime >= since
        except OSError:
            compiled += 1
    return {"compiled": compiled, "modules": modules, "not_written": sys.dont_write_bytecode}


def page_start_words(page_start: dict) -> str:
    """A start's record in words: each step before the page answered, the slowest availability checks, what ran after
    the launch, and the bytecode Python compiled."""
    steps = ", ".join(f"{step['step']} {step['s']:.2f}" for step in page_start["steps"])
    checks = ", ".join(f"{item['step']} {item['s']:.2f}" for step in page_start["steps"]
                       for item in step.get("detail", [])[:5])
    after = ", ".join(f"{step['step']} {step['s']:.2f}" for step in page_start["after"])
    bytecode = page_start["bytecode"]
    return (f"the page answered {page_start['page_up_s']:.1f} s after the process started ({steps})"
            + (f"; the slowest availability checks: {checks}" if checks else "")
            + (f"; after the launch, in the background: {after}" if after else "")
            + (f"; Python compiled {bytecode['compiled']} of the {bytecode['modules']} modules imported by then from "
               f"source" + (" (and keeps no bytecode: PYTHONDONTWRITEBYTECODE)" if bytecode["not_written"] else "")
               if bytecode else ""))
