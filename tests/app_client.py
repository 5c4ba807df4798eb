"""Driving the real app's API with gradio_client: its outputs' order, sessions, and waiting on streamed updates.
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


def reached(job, key, value) -> bool:
    """Whether the job has streamed a live update with update[key] >= value (or == for strings)."""
    for out in job.outputs():
        update = out[RUN_JSON]
        if isinstance(update, dict) and key in update:
            if update[key] == value or (not isinstance(value, str) and update[key] >= value):
                return True
    return False


def rows(table: dict) -> list[dict]:
    return [dict(zip(table["headers"], row)) for row in table["data"]]


def lossless(session) -> list[str]:
    """The latest /edit's (or /run_variants') outputs as the engine made them: /comparison's PNG files (the before/after
    and the run's images are JPEG views)."""
    return session.predict(api_name="/comparison")[1]
