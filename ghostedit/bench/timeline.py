"""Where a bench process's own wall time goes: seconds since the process started at each named point (imports,
weights, each configuration, writing), kept in results.json and printed, so that a bench command which must fit a
time limit is trimmed where its time is, not where it is guessed to be."""
from __future__ import annotations

import time

import psutil


class ProcessTimeline:
    def __init__(self):
        process = psutil.Process()
        # the clock starts with the interpreter, imports included; the runs of one process share it (--then)
        self.process = {"pid": process.pid, "started": process.create_time()}
        self.marks: list[dict] = []

    def mark(self, after: str) -> None:
        """Kept, and printed at once: a process killed at its time limit has said how far it came."""
        self.marks.append({"after": after, "s": round(time.time() - self.process["started"], 2)})
        print(f"· {self.marks[-1]['s']:.1f} s: {after}", flush=True)

    def line(self) -> str:
        return "process timeline (s since start): " + ", ".join(f"{m['after']} {m['s']:.1f}" for m in self.marks)
