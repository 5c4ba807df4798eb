"""The parallel code paths on one GPU through a fake 2-rank process group (parallel_smoke.py): CFG parallel and
Ulysses each run twice with the best configuration's toggles, the all-to-alls traced and compiled inside the compiled
blocks and the FP8 attention taking the redistributed heads. Nothing is compared: a fake group moves no data."""
from gpu_scripts import run_script


def test_cfg_parallel_and_ulysses_run_with_the_best_configuration():
    output = run_script("parallel_smoke.py", "--model", "synthetic", "--device", "cuda", "--config", "best",
                        "--side", "1024", "--steps", "3")
    for mode in ("ulysses", "cfg"):
        for run in ("first", "again"):
            assert f"{mode} ({run}):" in output, output
