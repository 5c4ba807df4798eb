"""The worker pool (engine/workers.py) on two CPU workers of the tiny model: two edits run at once, each gets its own
result (the same image a single engine makes), a worker killed during an edit fails that edit with a clear error
while the other finishes, and the app started with `--workers 2` serves two edits at once and names the worker."""
import argparse
import os
import signal
import threading
import time

import numpy as np
import psutil
import pytest

from app_client import RUN_JSON, watch
from ghostedit import EditRequest, OptimizationConfig
from ghostedit.device import UnavailableOptionError
from ghostedit.engine.workers import WorkerPool, WorkerStoppedError, worker_devices
from ghostedit.telemetry import RunCancelled

SIZE = dict(width=128, height=128)
EDITS = {"night": dict(prompt="make it night", seed=11), "snow": dict(prompt="cover it in snow", seed=22)}


CONSTRUCTED = {}  # how the pool looked right after it was made (the fixture's own start, checked by a test)


@pytest.fixture(scope="module")
def pool():
    start = time.perf_counter()
    workers = WorkerPool("tiny", worker_devices("cpu", 2))
    CONSTRUCTED.update(seconds=time.perf_counter() - start, workers=workers.describe_workers())
    yield workers
    workers.close()


def edit_request(image, name, steps=6):
    return EditRequest(images=[image], steps=steps, **SIZE, **EDITS[name])


def pixels(result):
    return np.asarray(result.image, dtype=np.int16)


def run_together(pool, requests, **options):
    """Runs every (name, request) at once, each in its thread; returns {name: result or the error raised}."""
    outcomes, start = {}, threading.Barrier(len(requests))

    def run(name, request):
        start.wait()
        try:
            outcomes[name] = pool.run(request, **options.get(name, {}))
        except Exception as error:  # noqa: BLE001 - the test looks at it
            outcomes[name] = error

    threads = [threading.Thread(target=run, args=item) for item in requests.items()]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=600)
    return outcomes


def test_worker_devices():
    assert worker_devices("cpu") == ["cpu"]
    assert worker_devices("cpu", 3) == ["cpu"] * 3
    with pytest.raises(ValueError, match="at least 1"):
        worker_devices("cpu", 0)


def test_serve_refuses_workers_it_cannot_run():
    from ghostedit.ui.serve import add_serve_arguments, serve
    parser = argparse.ArgumentParser()
    add_serve_arguments(parser)
    with pytest.raises(SystemExit, match="--workers must be at least 1"):
        serve(parser.parse_args(["--device", "cpu", "--workers", "0"]))


def test_the_pool_is_there_before_its_workers_and_warms_them_all_at_once(pool, house):
    """The app serves its page while the workers start (each imports torch and DiffSynth in its process); the
    start-up warm-up runs one edit on every worker at once, each loading its weights. A worker takes its edit as
    soon as it has started: the edits overlap once both have (a worker that started a second later on a loaded
    machine took its edit after the other's had ended, as it should)."""
    assert CONSTRUCTED["seconds"] < 3, CONSTRUCTED
    assert not any(worker["started"] for worker in CONSTRUCTED["workers"]), CONSTRUCTED
    assert pool.wait_until_ready(timeout=120)
    warmed = pool.run_on_every_worker(edit_request(house, "night", steps=2), OptimizationConfig())
    assert [result.telemetry.worker["index"] for result in warmed] == [0, 1]
    assert all("load" in result.telemetry.stages for result in warmed)
    intervals = [(result.telemetry.worker["started_at"], result.telemetry.worker["finished_at"]) for result in warmed]
    assert min(end for _, end in intervals) > max(start for start, _ in intervals), intervals  # at the same time
    assert all(worker["started"] and worker["runs"] == 0 for worker in pool.describe_workers())  # no edit served
    assert pool.load_count == 1


def test_two_edits_run_at_once_on_two_workers_with_their_own_results(pool, engine, house):
    run_together(pool, {name: edit_request(house, name, steps=2) for name in EDITS})  # both workers warm first
    results = run_together(pool, {name: edit_request(house, name) for name in EDITS})
    night, snow = results["night"], results["snow"]
    assert {night.telemetry.worker["index"], snow.telemetry.worker["index"]} == {0, 1}
    intervals = [(r.telemetry.worker["started_at"], r.telemetry.worker["finished_at"]) for r in (night, snow)]
    overlap = min(end for _, end in intervals) - max(start for start, _ in intervals)
    assert overlap > 0.5 * min(end - start for start, end in intervals), intervals
    for name, result in results.items():  # not crossed: each is the image one engine makes for its own request
        alone = engine.run(edit_request(house, name))
        assert result.request.prompt == EDITS[name]["prompt"] and result.request.seed == EDITS[name]["seed"]
        assert np.abs(pixels(result) - pixels(alone)).max() <= 1
    assert np.abs(pixels(night) - pixels(snow)).mean() > 1.0
    summary = night.telemetry.summary()["worker"]
    assert summary["device"] == "cpu" and summary["pid"] != os.getpid()
    assert {entry["worker"] for entry in pool.cached()} == {"worker 0 (cpu)", "worker 1 (cpu)"}


def test_a_killed_worker_fails_its_edit_and_the_other_finishes(pool, engine, house):
    denoising = threading.Event()
    first = {}

    def run_first():
        try:
            first["result"] = pool.run(edit_request(house, "night", steps=40),
                                       on_progress=lambda event: event.stage == "denoising" and denoising.set())
        except Exception as error:  # noqa: BLE001
            first["error"] = error

    thread = threading.Thread(target=run_first)
    thread.start()
    assert denoising.wait(120)
    victim = next(worker for worker in pool.describe_workers() if worker["busy_s"] is not None)
    other = {}
    other_thread = threading.Thread(target=lambda: other.update(result=pool.run(edit_request(house, "snow"))))
    other_thread.start()
    while sum(worker["busy_s"] is not None for worker in pool.describe_workers()) < 2:
        time.sleep(0.05)
    os.kill(victim["pid"], signal.SIGKILL)
    thread.join(120)
    other_thread.join(300)
    assert isinstance(first.get("error"), WorkerStoppedError), first
    assert f"worker {victim['worker']} (cpu) stopped (exit code -9)" in str(first["error"])
    assert other["result"].telemetry.worker["index"] != victim["worker"]
    assert np.abs(pixels(other["result"]) - pixels(engine.run(edit_request(house, "snow")))).max() <= 1
    # the pool serves on: the dead worker is started again and takes edits
    results = run_together(pool, {name: edit_request(house, name, steps=2) for name in EDITS})
    assert all(not isinstance(result, Exception) for result in results.values()), results
    restarted = next(worker for worker in pool.describe_workers() if worker["worker"] == victim["worker"])
    assert restarted["alive"] and restarted["pid"] != victim["pid"]


def test_errors_and_cancel_come_back_from_the_worker(pool, house):
    with pytest.raises(UnavailableOptionError, match="fa3"):
        pool.run(edit_request(house, "night"), OptimizationConfig(attention="fa3"))
    cancel = threading.Event()
    with pytest.raises(RunCancelled):
        pool.run(edit_request(house, "night", steps=40), cancel=cancel,
                 on_progress=lambda event: event.stage == "denoising" and cancel.set())


def test_app_with_two_workers_serves_two_edits_at_once(tmp_path):
    from gradio_client import Client, handle_file

    from app_server import REPO, running_app
    launcher = tmp_path / "app_two_workers.py"
    launcher.write_text(f"import sys\nsys.path.insert(0, {str(REPO)!r})\nimport app\n"
                        "if __name__ == '__main__':\n    app.main(sys.argv[1:] + ['--workers', '2'])\n")
    with running_app(tmp_path, launcher) as running:
        while Client(running.url, verbose=False).predict(api_name="/startup")["state"] == "warming":
            time.sleep(0.2)  # both workers warmed at start: two people then find two workers free
        house = str(REPO / "assets/examples/house.png")
        jobs = [Client(running.url, verbose=False).submit(  # two clients: two people at once; long
            # enough that several progress updates (four a second at most) come while they run
            image=handle_file(house), steps=40, width=128, height=128, api_name="/edit", **EDITS[name])
            for name in EDITS]
        seen = watch(jobs, timeout=600)
        outputs = [job.result(timeout=600) for job in jobs]
    workers = [output[RUN_JSON]["telemetry"]["worker"] for output in outputs]
    deadline = time.time() + 30  # the app was stopped (SIGTERM): its workers end with it
    while any(_running(worker["pid"]) for worker in workers) and time.time() < deadline:
        time.sleep(0.2)
    assert not any(_running(worker["pid"]) for worker in workers)
    assert {worker["index"] for worker in workers} == {0, 1}
    assert min(w["finished_at"] for w in workers) > max(w["started_at"] for w in workers)  # ran at the same time
    for updates, worker in zip(seen, workers):  # while running: the progress says which worker runs it
        assert updates and all(update.desc.endswith(f"on worker {worker['index']} (cpu)") for update in updates)
    for (status, _, summary, *_), worker in zip(outputs, workers):
        assert f"ran on worker {worker['index']}: cpu (CPU)" in status
        assert f"ran on worker {worker['index']}" in summary



def _running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
