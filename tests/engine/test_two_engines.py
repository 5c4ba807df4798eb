"""Two engines of different configurations in one process, their edits interleaved in threads, each give the image
it gives alone: a run's choices travel in its options, never in module state (the attention backend, the rewrites'
paths, the step cache, compiled blocks and their Inductor options, the encoders' choices). Stock against the fastest
configuration that runs on a CPU (every lossless rewrite, regional compile with its Inductor options, the attention
computed by SDPA's math kernel, FP8 weights, the step cache's bookkeeping, the encoders' fast paths)."""
import threading

import pytest

from ghostedit import EditRequest, OptimizationConfig
from ghostedit.engine import Engine

STOCK = "baseline"
BEST_ON_A_CPU = ("fp8=storage,compile=regional,attention=sdpa-math,step-cache=fbcache-0,vae=image,"
                 "text-encoder=joined-windows,rewrites=real-rope+joint-layout+fused-qkv+carried-residual"
                 "+inductor-persistent-rows")
RUNS_EACH = 3


def _request(house, seed: int) -> EditRequest:
    return EditRequest(images=[house], prompt="a haunted house at night", width=80, height=64, steps=3,
                       cfg_scale=4.0, seed=seed)


@pytest.fixture(scope="module")
def engines():
    return {text: (Engine("tiny", device="cpu"), OptimizationConfig.parse(text)) for text in (STOCK, BEST_ON_A_CPU)}


def test_interleaved_in_threads_each_engine_gives_the_image_it_gives_alone(engines, house):
    alone = {text: [engine.run(_request(house, seed), config).image.tobytes() for seed in range(RUNS_EACH)]
             for text, (engine, config) in engines.items()}
    assert alone[STOCK] != alone[BEST_ON_A_CPU]  # lossy FP8 weights: the two differ, so a mix-up would show
    together = {text: [None] * RUNS_EACH for text in engines}
    errors = []
    start = threading.Barrier(len(engines))

    def edits(text):
        engine, config = engines[text]
        try:
            start.wait()
            for seed in range(RUNS_EACH):
                together[text][seed] = engine.run(_request(house, seed), config).image.tobytes()
        except Exception as error:  # reported below, with the configuration
            errors.append((text, error))
    threads = [threading.Thread(target=edits, args=(text,)) for text in engines]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors
    for text in engines:
        assert together[text] == alone[text], text
