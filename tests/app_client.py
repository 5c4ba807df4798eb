"""Driving the real app's API with gradio_client: its outputs' order, sessions, and its runs' progress updates.
Shared by the API and hardening tests."""
import time

from gradio_client import Client

# /edit and /run_variants outputs, in order
STATUS, BEFORE_AFTER, SUMMARY, RUN_JSON, TABLE, IMAGES = range(6)


def client(app) -> Client:
    """A new client is a new session: its own history."""
    return Client(app.url, verbose=False)


def wait_until(condition, timeout=180):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def progress(job):
    """The job's latest progress update (Gradio's: index, length, unit, desc), or None before the first."""
    data = job.status().progress_data
    return data[0] if data else None


def reached(job, step: int = 0, stage: str = "") -> bool:
    """Whether the job's run is at `step` or later of a stage whose words start with `stage`."""
    update = progress(job)
    return update is not None and update.index >= step and update.desc.startswith(stage)


def watch(jobs, timeout: float = 300) -> list[list]:
    """Each job's progress updates as the client saw them (polled every 20 ms) until every job is done."""
    seen = [[] for _ in jobs]
    deadline = time.monotonic() + timeout
    while not all(job.done() for job in jobs):
        assert time.monotonic() < deadline, "timed out"
        for job, updates in zip(jobs, seen):
            update = progress(job)
            if update is not None and (not updates or updates[-1] != update):
                updates.append(update)
        time.sleep(0.02)
    return seen


def rows(table: dict) -> list[dict]:
    return [dict(zip(table["headers"], row)) for row in table["data"]]


def lossless(session) -> list[str]:
    """The latest /edit's (or /run_variants') outputs as the engine made them: /comparison's PNG files (the before/after
    and the run's images are JPEG views)."""
    return session.predict(api_name="/comparison")[1]
