"""The step cache (First-Block Cache, toggle `step-cache`) on the tiny model: threshold 0 gives the full run's image
bit for bit; a threshold skips steps, each CFG pass on its own, and the telemetry counts the forwards and blocks
that ran; every edit starts with an empty cache; it composes with FP8; the pipeline bench measures it against its
full run; it composes with regional compile, CFG parallel and Ulysses; the registry gives it a lossy label, a CLI
flag and an API option, and prepares nothing for it.

The tiny model's random weights change the first block's output by about 100% from one step to the next, so no
offered threshold skips there; the tests that need skipped steps raise the threshold as the bench's
--step-cache-threshold does (random weights say little about a cache's quality with real weights)."""
import json

import pytest
import torch

from dit_helpers import dit_engine, inputs_for
from gloo_runs import SIZE, free_port, parallel_request
from ghostedit import EditRequest, OptimizationConfig
from ghostedit.bench import pipeline as bench_pipeline
from ghostedit.models.seams import DitOptions
from ghostedit.optimize import registry
from ghostedit.optimize.step_cache import FirstBlockCache

STEPS = 4
SKIP_ALL_BUT_FIRST = 1e6  # every forward after a pass's first is served from the cache


def request(house, **changes):
    return EditRequest(images=[house], prompt="make it night", width=64, height=64, steps=STEPS, cfg_scale=4.0,
                       **changes)


@pytest.fixture
def skipping(engine):
    engine.step_cache_threshold = SKIP_ALL_BUT_FIRST
    yield
    engine.step_cache_threshold = None


def test_threshold_zero_gives_the_full_result_and_counts_every_block(engine, house):
    full = engine.run(request(house))
    checked = engine.run(request(house), OptimizationConfig(**{"step-cache": "fbcache-0"}))
    assert checked.image.tobytes() == full.image.tobytes()
    assert checked.telemetry.cache_hit is True  # a run-time toggle: the same prepared pipeline
    blocks = len(engine.load().dit.transformer_blocks)
    found = checked.telemetry.summary()["step_cache"]
    assert found["forwards"] == found["forwards_computed"] == 2 * STEPS and found["forwards_cached"] == 0
    assert found["blocks_run"] == found["blocks_full_run"] == 2 * STEPS * blocks
    assert full.telemetry.summary()["step_cache"] is None
    assert "random weights" in " ".join(checked.telemetry.notes)
    assert "8 of 8 DiT forwards computed" in checked.prepared_report["step-cache"]


def test_a_threshold_skips_steps_per_cfg_pass_and_the_telemetry_counts_them(engine, house, skipping):
    from ghostedit.metrics import compare_images
    full = engine.run(request(house))
    cached = engine.run(request(house), OptimizationConfig(**{"step-cache": "fbcache-0.2"}))
    found = cached.telemetry.step_cache
    blocks = len(engine.load().dit.transformer_blocks)
    later_steps = list(range(1, STEPS))
    assert found["cached_steps"] == {"positive": later_steps, "negative": later_steps}
    assert found["forwards_computed"] == 2 and found["forwards_cached"] == 2 * (STEPS - 1)
    assert found["blocks_run"] == 2 * blocks + 2 * (STEPS - 1) and found["blocks_full_run"] == 2 * STEPS * blocks
    assert len(found["relative_changes"]["positive"]) == STEPS - 1
    assert compare_images(cached.image, full.image)["max_abs"] > 0  # lossy: not the full run's image
    again = engine.run(request(house), OptimizationConfig(**{"step-cache": "fbcache-0.2"}))
    assert again.telemetry.step_cache == found  # a fresh cache per edit: step 0 computed again
    assert again.image.tobytes() == cached.image.tobytes()


def test_a_served_forward_is_the_first_block_plus_the_cached_change_each_cfg_pass_its_own():
    """Identical inputs at two steps: the second forward of each pass is served from the cache and equals the full
    forward up to rounding; with the passes' caches mixed up it would get the other prompt's change."""
    engine = dit_engine()
    prepared, _ = engine.prepare(OptimizationConfig())
    positive = inputs_for(engine)
    negative = {**positive, "prompt_emb": torch.flip(positive["prompt_emb"], dims=[1])}
    model_fn = prepared.pipe.model_fn
    with torch.no_grad():
        full = {name: model_fn(dit=prepared.dit, **inputs) for name, inputs in
                (("positive", positive), ("negative", negative))}
        cache = FirstBlockCache(threshold=0.01)
        for step in range(2):
            served = {name: model_fn(dit=prepared.dit, progress_id=step, options=DitOptions(step_cache=cache),
                                     **inputs) for name, inputs in (("positive", positive), ("negative", negative))}
    assert cache.summary()["cached_steps"] == {"positive": [1], "negative": [1]}
    assert not torch.allclose(full["positive"], full["negative"], atol=1e-3)
    for name in full:
        torch.testing.assert_close(served[name], full[name], rtol=0, atol=1e-5)
    assert isinstance(prepared.dit.transformer_blocks[0], type(engine.load().dit.transformer_blocks[0]))


def test_the_step_cache_composes_with_regional_compile():
    """The compiled blocks run behind the cache's wrappers as they are: no new compiled frame, the full result at
    threshold 0, and served forwards. The configuration and shape of test_compile.py, so that a suite run finds
    Inductor's code for them in its on-disk cache (about 30 s on this CPU; compiling cold, up to a minute)."""
    from torch._dynamo.utils import counters
    engine = dit_engine()
    prepared, _ = engine.prepare(OptimizationConfig(compile="regional", rewrites=("real-rope",)))
    inputs, model_fn = inputs_for(engine), prepared.pipe.model_fn
    options = DitOptions(real_rope=True)
    with torch.no_grad():
        full = model_fn(dit=prepared.dit, options=options, **inputs)
        frames = counters["frames"]["total"]
        exact = model_fn(dit=prepared.dit, progress_id=0, options=options.replace(step_cache=FirstBlockCache(0)),
                         **inputs)
        cache = FirstBlockCache(threshold=0.01)
        served = [model_fn(dit=prepared.dit, progress_id=step, options=options.replace(step_cache=cache), **inputs)
                  for step in range(2)][-1]
    assert torch.equal(exact, full) and counters["frames"]["total"] == frames
    assert cache.summary()["cached_steps"] == {"positive": [1]}
    torch.testing.assert_close(served, full, rtol=0, atol=1e-5)


def test_the_step_cache_composes_with_fp8(engine, house, skipping):
    fp8 = OptimizationConfig(fp8="storage")
    full = engine.run(request(house), fp8)
    exact = engine.run(request(house), fp8.replace(**{"step-cache": "fbcache-0"}))
    assert exact.image.tobytes() == full.image.tobytes() and exact.telemetry.cache_hit is True
    cached = engine.run(request(house), fp8.replace(**{"step-cache": "fbcache-0.05"}))
    assert cached.telemetry.step_cache["forwards_cached"] == 2 * (STEPS - 1)


def test_the_pipeline_bench_measures_a_cache_against_its_full_run(engine, house, skipping):
    configs = [OptimizationConfig.parse(text) for text in
               ("step-cache=fbcache-0.08", "fp8=storage,step-cache=fbcache-0.2", "fp8=storage", "baseline")]
    assert [config.text for config in bench_pipeline.with_full_runs(configs)] == \
        ["baseline", "step-cache=fbcache-0.08", "fp8=storage", "fp8=storage,step-cache=fbcache-0.2"]
    rows = bench_pipeline.run_bench(engine, request(house), configs[:1], repeats=0)
    full, cached = rows
    assert cached["full_run"] == full["config"] and cached["forwards_computed"] == 2
    assert cached["cache_threshold"] == SKIP_ALL_BUT_FIRST and cached["served_step_s"] > 0
    assert cached["computed_step_s"] > 0  # step 0: computed by both passes
    assert cached["cache_speedup_e2e"] > 0 and cached["cache_psnr_db"] < float("inf") and cached["cache_ssim"] < 1
    assert "random weights" in cached["cache_quality_note"] and "full_run" not in full
    table = bench_pipeline.table(rows)
    assert "cache PSNR dB" in table and "say little about a cache's quality with real weights" in table


def test_the_dit_level_bench_refuses_a_step_cache():
    from ghostedit.cli import build_parser
    args = build_parser().parse_args(["bench", "--model", "tiny", "--device", "cpu", "--level", "dit",
                                      "--configs", "baseline", "step-cache=fbcache-0.08"])
    with pytest.raises(SystemExit, match="one DiT forward has no steps to skip"):
        args.run(args)


def test_the_registry_declares_it_once_lossy_run_time_and_in_the_cli_and_api(engine):
    from ghostedit.cli import build_parser
    toggle = registry.get("step-cache")
    assert toggle.changes == registry.RUN and toggle.default == "off"
    assert all("lossy" in toggle.choice(value).label for value in toggle.values if toggle.is_lossy(value))
    assert not toggle.is_lossy("fbcache-0") and OptimizationConfig(**{"step-cache": "fbcache-0.12"}).lossy
    assert OptimizationConfig(**{"step-cache": "fbcache-0.12"}).cache_key == OptimizationConfig().cache_key
    assert "fbcache-0.08" in OptimizationConfig.parse("best,step-cache=fbcache-0.08").label.split(" + ")
    edit_help = build_parser()._subparsers._group_actions[0].choices["edit"].format_help()
    assert "--step-cache" in edit_help and "fbcache-0.08" in edit_help
    assert all(engine.options()["step-cache"][value].ok for value in toggle.values)


def _parallel_worker(rank: int, world_size: int, port: int, out_dir: str) -> None:
    import os
    import numpy as np
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank),
                      WORLD_SIZE=str(world_size))
    torch.set_num_threads(1)
    from ghostedit.engine import Engine
    from ghostedit.parallel import mesh as meshes
    engine = Engine("tiny", device="cpu", dtype="float32")
    engine.step_cache_threshold = SKIP_ALL_BUT_FIRST
    try:
        for mode in ("ulysses", "cfg"):
            engine.mesh = meshes.setup(mode, True, "cpu")
            result = engine.run(parallel_request(), OptimizationConfig(**{"step-cache": "fbcache-0.08"}))
            np.save(f"{out_dir}/{mode}-{rank}.npy", np.asarray(result.image, dtype=np.int16))
            with open(f"{out_dir}/{mode}-{rank}.txt", "w") as steps:
                json.dump(result.telemetry.step_cache["cached_steps"], steps)
    finally:
        meshes.teardown()


def test_ranks_of_cfg_parallel_and_ulysses_serve_the_same_steps_as_one_process(tmp_path):
    """Ulysses ranks decide together (their shards' sums added), or one rank would wait in an all-to-all the other
    skipped; a CFG-parallel rank caches its own pass. Within 1 level of 255 of one process, as test_parallel.py."""
    import numpy as np
    import torch.multiprocessing
    from ghostedit.engine import Engine
    single_engine = Engine("tiny", device="cpu", dtype="float32")
    single_engine.step_cache_threshold = SKIP_ALL_BUT_FIRST
    single = single_engine.run(parallel_request(), OptimizationConfig(**{"step-cache": "fbcache-0.08"}))
    torch.multiprocessing.spawn(_parallel_worker, args=(2, free_port(), str(tmp_path)), nprocs=2)
    later = list(range(1, SIZE["steps"]))
    expected = {"ulysses-0": {"positive": later, "negative": later}, "ulysses-1": {"positive": later, "negative": later},
                "cfg-0": {"positive": later}, "cfg-1": {"negative": later}}
    for run, steps in expected.items():
        assert json.loads((tmp_path / f"{run}.txt").read_text()) == steps
        image = np.load(tmp_path / f"{run}.npy")
        assert np.abs(image - np.asarray(single.image, dtype=np.int16)).max() <= 1


# ---- Qwen-Image-2.1: the target's tokens watched, with and without the prefix cache ----

def _request_21(house, **changes):
    return EditRequest(images=[house], prompt="make it night", width=64, height=64, steps=STEPS, cfg_scale=4.0,
                       negative_prompt="day", **changes)


@pytest.fixture(scope="module")
def engine_21():
    from ghostedit.engine import Engine
    return Engine("tiny-2.1", device="cpu", dtype="float32")


@pytest.mark.parametrize("prefix_cache", ["on", "off"])
def test_on_2_1_threshold_zero_gives_the_full_result_and_a_threshold_skips_per_cfg_branch(engine_21, house,
                                                                                          prefix_cache):
    """Threshold 0: stock's image bit for bit, every block counted. A threshold: each CFG branch's steps after
    its first served (with the prefix cache, its filling step is its first: every block stores its prefix), the
    image lossy but near, and the prefix cache still computes the target's tokens alone."""
    full = engine_21.run(_request_21(house), OptimizationConfig(**{"prefix-cache": prefix_cache}))
    checked = engine_21.run(_request_21(house), OptimizationConfig(**{"prefix-cache": prefix_cache,
                                                                       "step-cache": "fbcache-0"}))
    assert checked.image.tobytes() == full.image.tobytes()
    blocks = len(engine_21.load().dit.blocks)
    found = checked.telemetry.step_cache
    assert found["forwards_computed"] == 2 * STEPS and found["blocks_run"] == 2 * STEPS * blocks
    engine_21.step_cache_threshold = SKIP_ALL_BUT_FIRST
    try:
        cached = engine_21.run(_request_21(house), OptimizationConfig(**{"prefix-cache": prefix_cache,
                                                                          "step-cache": "fbcache-0.2"}))
    finally:
        engine_21.step_cache_threshold = None
    found = cached.telemetry.step_cache
    later_steps = list(range(1, STEPS))
    assert found["cached_steps"] == {"positive": later_steps, "negative": later_steps}
    assert found["blocks_run"] == 2 * blocks + 2 * (STEPS - 1)
    assert cached.telemetry.dit_tokens == full.telemetry.dit_tokens
    difference = abs(torch.tensor(bytearray(cached.image.tobytes()), dtype=torch.float) -
                     torch.tensor(bytearray(full.image.tobytes()), dtype=torch.float))
    assert 0 < difference.mean() < 20, difference.mean()


def test_on_2_1_a_served_step_is_the_first_block_plus_the_cached_change_of_the_target():
    """Identical inputs at two steps, each CFG branch its own: the second forward is served after the first block
    and equals the full forward up to rounding, from the prefix cache (its change measured at the filling step,
    over every token, on the target's) and without."""
    from ghostedit.models.qwen_image_21 import tiny
    from ghostedit.models.qwen_image_21.dit import QwenImage21DiT, layout, step_forward
    from ghostedit.models.seams import PrefixKVCache

    torch.manual_seed(0)
    dit = QwenImage21DiT(**tiny.TRANSFORMER).eval()
    slots = torch.zeros(1, 12, dtype=torch.bool)
    slots[0, 5:9] = True
    layout_ = layout(torch.cat([slots, torch.ones(1, 4, dtype=torch.bool)], 1), [(1, 4, 4), (1, 4, 4)], None,
                     dit.rope, "cpu")
    latents = torch.randn(1, 32, 64)
    prompts = {"positive": torch.randn(1, 12, 64), "negative": torch.randn(1, 12, 64)}
    with torch.no_grad():
        full = {name: dit(latents, prompt, torch.tensor([0.5]), layout_) for name, prompt in prompts.items()}
        for prefix_cache in (PrefixKVCache(), None):
            cache = FirstBlockCache(threshold=0.01)
            options = DitOptions(step_cache=cache, prefix_cache=prefix_cache)
            for step in range(2):
                served = {name: step_forward(dit, latents, prompt, torch.tensor([0.5]), layout_, step, options)[0]
                          for name, prompt in prompts.items()}
            assert cache.summary()["cached_steps"] == {"positive": [1], "negative": [1]}
            assert cache.summary()["blocks_run"] == 2 * len(dit.blocks) + 2
            for name in full:
                torch.testing.assert_close(served[name], full[name], rtol=0, atol=1e-5)
    assert not torch.allclose(full["positive"], full["negative"], atol=1e-3)
