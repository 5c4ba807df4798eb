"""The runs in flight, one per session: each run's cancel switch (the Cancel button), and on the page its live view,
handed from the edit that runs it to the follower event that shows it.

Why a follower: an edit's answer holds images, and Gradio builds a component and its API schema (pydantic, about 2
ms each) for every output an update leaves as it is, so a live view streamed through the edit's own outputs cost
the server 10 ms. The edit answers once per finished image instead, and the follower streams only the status and
the run's JSON (a fraction of a millisecond an update). API clients, which have no follower, read the run's stage
and step from Gradio's progress updates.

How the two meet: the page's Run starts the edit, whose first answer (the run's start) sets the follower's trigger:
Gradio's page runs the listeners of one click one after the other, each to its end, so the follower cannot be a
second listener of Run. From then on the follower alone writes the status and the run's JSON, the answer's words
too: the page applies each event's updates in order, but not one event's against another's, so a live view sent
by one event could land after the answer sent by the other."""
from __future__ import annotations

import asyncio
import threading
import time
from contextlib import contextmanager
from typing import Callable

# an ended run waits this long for the follower called for it (which comes within a round trip of the page's; a
# page closed in between never sends it)
FOLLOWER_WAIT_S = 60.0


class Run:
    """One session's run in flight: its cancel switch, the latest view (status Markdown, run JSON) and whether a
    follower was called for it."""

    def __init__(self):
        self.cancel = threading.Event()
        self._lock = threading.Lock()
        self._view: tuple | None = None
        self._version = 0
        self.ended_at: float | None = None  # the host's clock when the run ended; None while it runs
        self._followed = False
        self._wake: Callable[[], None] = lambda: None
        self.awaited = False  # a follower was called for this run (LiveBoard.running keeps it until it comes)

    def show(self, view: tuple) -> None:
        """A new view: the follower shows it next."""
        with self._lock:
            self._view, self._version = tuple(view), self._version + 1
            self._wake()

    def end(self) -> None:
        with self._lock:
            self.ended_at = time.monotonic()
            self._wake()

    def await_follower(self) -> None:
        """The page was told to start a follower for this run: the run stays on the board for it, even if it ends
        first."""
        self.awaited = True

    def claim(self, wake: Callable[[], None]) -> bool:
        """The first follower to ask shows this run (`wake` is called at each new view and at the end); a later one
        shows none."""
        with self._lock:
            if self._followed:
                return False
            self._followed, self._wake = True, wake
            return True

    def next_view(self, seen: int) -> tuple[str, tuple | None]:
        """("view", (view, version)) with a view newer than `seen`, else ("ended", None) or ("wait", None)."""
        with self._lock:
            if self._version != seen:
                return "view", (self._view, self._version)
            return ("ended" if self.ended else "wait"), None

    @property
    def ended(self) -> bool:
        return self.ended_at is not None


class LiveBoard:
    def __init__(self):
        self._lock = threading.Lock()
        self._runs: dict[str | None, Run] = {}

    @contextmanager
    def running(self, session: str | None):
        """The run of one edit call (every image of a batch), from its checks to its last answer. It stays on the
        board after it ends only for a follower called for it and not come yet."""
        run = Run()
        with self._lock:
            now = time.monotonic()
            for stale in [key for key, other in self._runs.items()
                          if other.ended and now - other.ended_at > FOLLOWER_WAIT_S]:
                del self._runs[stale]
            self._runs[session] = run
        try:
            yield run
        finally:
            run.end()
            if not run.awaited:
                self._drop(session, run)

    def switch(self, session: str | None) -> threading.Event:
        """The cancel switch of the session's run, which the engine reads at each step (a new one when the run was
        not begun in this process: a ZeroGPU worker's copy of the board)."""
        with self._lock:
            run = self._runs.get(session)
        return run.cancel if run is not None else threading.Event()

    def cancel(self, session: str | None) -> bool:
        """Cancels the session's run at its next step; False when it has none."""
        with self._lock:
            run = self._runs.get(session)
        if run is None or run.ended:
            return False
        run.cancel.set()
        return True

    async def follow(self, session: str | None):
        """The views of the session's run, which called this follower, to its last. A follower closed before its
        run ended (the page was closed) cancels the run."""
        with self._lock:
            run = self._runs.get(session)
        loop, woken = asyncio.get_running_loop(), asyncio.Event()
        if run is None or not run.claim(lambda: loop.call_soon_threadsafe(woken.set)):
            return  # a newer run took the session's place, or another follower shows it
        try:
            seen = 0
            while True:
                kind, item = run.next_view(seen)
                if kind == "view":
                    view, seen = item
                    yield view
                elif kind == "ended":
                    return
                else:
                    await woken.wait()
                    woken.clear()
        finally:
            if not run.ended:
                run.cancel.set()
            self._drop(session, run)

    def _drop(self, session: str | None, run: Run) -> None:
        with self._lock:
            if self._runs.get(session) is run:
                del self._runs[session]
