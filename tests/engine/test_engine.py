"""The engine on the tiny model: edits, the prepared-pipeline cache, LoRA, FP8, compile, telemetry."""
import statistics
import threading
import time
import weakref

import numpy as np
import pytest
import torch

from ghostedit import EditRequest, LoraChoice, OptimizationConfig
from ghostedit.device import UnavailableOptionError
from ghostedit.engine import Engine
from ghostedit.metrics import compare_images
from ghostedit.models.tiny import ensure_foreign_lora, ensure_tiny_lora
from ghostedit import telemetry
from ghostedit.lora_files import LoraError
from ghostedit.tensors import linear_weight_bytes

SMALL = dict(width=128, height=128, steps=3)


def request(image, **overrides):
    return EditRequest(images=[image], prompt="make it a haunted house", **{**SMALL, **overrides})


def pixels(result):
    return np.asarray(result.image, dtype=np.int16)


def mean_abs(a, b):
    return float(np.abs(pixels(a) - pixels(b)).mean())


def lora(style="peft", mode="fused", scale=1.0):
    return LoraChoice.from_file(ensure_tiny_lora(style), scale, mode)


def test_default_edit_returns_requested_size(engine, house):
    result = engine.run(EditRequest(images=[house], prompt="make it night", width=256, height=192, steps=4))
    assert result.image.size == (256, 192)
    assert result.telemetry.total_seconds > 0


def test_size_defaults_to_input_aspect_within_model_area(engine):
    from PIL import Image
    wide = Image.new("RGB", (800, 400), (200, 30, 30))
    result = engine.run(EditRequest(images=[wide], prompt="make it blue", steps=2))
    width, height = result.image.size
    assert width % 16 == 0 and height % 16 == 0
    assert width / height == pytest.approx(2, rel=0.1)
    assert width * height <= engine.spec.default_area * 1.1


def test_same_seed_same_image_other_seed_differs(engine, house):
    first = engine.run(request(house, seed=7))
    again = engine.run(request(house, seed=7))
    other = engine.run(request(house, seed=8))
    assert np.array_equal(pixels(first), pixels(again))
    assert mean_abs(first, other) > 1.0


def test_same_config_is_a_cache_hit_without_second_load(house):
    engine = Engine("tiny", device="cpu")
    config = OptimizationConfig(attention="sdpa-math")
    first = engine.run(request(house), config)
    loads = engine.load_count
    second = engine.run(request(house), config)
    other_attention = engine.run(request(house), OptimizationConfig(attention="sdpa-flash"))
    other_weights = engine.run(request(house), OptimizationConfig(fp8="storage"))
    assert first.telemetry.cache_hit is False
    assert second.telemetry.cache_hit is True
    # an exact attention backend is chosen around the run: switching it prepares nothing
    assert other_attention.telemetry.cache_hit is True and other_attention.attention_backend == "sdpa-flash"
    assert other_weights.telemetry.cache_hit is False
    assert engine.load_count == loads == 1
    assert "load" not in second.telemetry.stages and "prepare" not in second.telemetry.stages


def test_fused_and_runtime_lora_agree_and_differ_from_no_lora(engine, house):
    plain = engine.run(request(house))
    fused = engine.run(request(house), OptimizationConfig(loras=(lora("peft", "fused"),)))
    runtime = engine.run(request(house), OptimizationConfig(loras=(lora("kohya", "runtime"),)))
    assert mean_abs(fused, plain) > 2.0 and mean_abs(runtime, plain) > 2.0
    assert compare_images(fused.image, runtime.image)["psnr_db"] > 30
    assert "24 layers matched" in fused.prepared_report["LoRA tiny_lora_peft (fused)"]


def test_runtime_lora_scale_changes_without_reprepare(engine, house):
    half = engine.run(request(house), OptimizationConfig(loras=(lora(mode="runtime", scale=0.5),)))
    zero = engine.run(request(house), OptimizationConfig(loras=(lora(mode="runtime", scale=0.0),)))
    plain = engine.run(request(house))
    assert zero.telemetry.cache_hit is True
    assert np.abs(pixels(zero) - pixels(plain)).max() <= 2
    assert mean_abs(half, plain) > 1.0


def test_lora_matching_zero_layers_is_an_error(engine, house):
    config = OptimizationConfig(loras=(LoraChoice.from_file(ensure_foreign_lora()),))
    with pytest.raises(LoraError, match="matched 0 layers"):
        engine.run(request(house), config)


def test_failed_prepare_leaves_cache_and_base_intact(engine, house):
    engine.run(request(house))
    cached = [entry["config"] for entry in engine.cached()]
    base = {name: p.detach().clone() for name, p in engine.load().dit.named_parameters()}
    with pytest.raises(LoraError):
        engine.run(request(house), OptimizationConfig(loras=(LoraChoice.from_file(ensure_foreign_lora()),), fp8="storage"))
    assert [entry["config"] for entry in engine.cached()] == cached
    for name, p in engine.load().dit.named_parameters():
        assert torch.equal(p, base[name]), name


def test_fused_lora_does_not_touch_base_weights(engine, house):
    before = {name: p.detach().clone() for name, p in engine.load().dit.named_parameters()}
    engine.run(request(house), OptimizationConfig(loras=(lora(scale=0.7),)))
    for name, p in engine.load().dit.named_parameters():
        assert torch.equal(p, before[name]), name


def test_fp8_storage_halves_weight_bytes_and_stays_close(engine, house):
    bf16 = engine.run(request(house))
    fp8 = engine.run(request(house), OptimizationConfig(fp8="storage"))
    prepared, _ = engine.prepare(OptimizationConfig(fp8="storage"))
    base_bytes = linear_weight_bytes(engine.load().dit)
    fp8_bytes = linear_weight_bytes(prepared.dit)
    assert fp8_bytes < 0.56 * base_bytes  # half, plus per-row scales
    assert compare_images(fp8.image, bf16.image)["psnr_db"] > 25
    assert "in FP8 (storage)" in fp8.prepared_report["fp8"]


def test_regional_compile_matches_eager(engine, house):
    eager = engine.run(request(house))
    compiled = engine.run(request(house), OptimizationConfig(compile="regional"))
    assert compiled.telemetry.stages["compile warm-up"] > 0
    assert not compiled.telemetry.notes
    assert compare_images(compiled.image, eager.image)["psnr_db"] > 30
    again = engine.run(request(house), OptimizationConfig(compile="regional"))
    assert "compile warm-up" not in again.telemetry.stages


def test_compiled_runs_in_a_new_thread_keep_the_raised_recompile_limit(engine, house):
    """Dynamo's limits set from Python hold per thread, and the app runs each edit in a thread of its own: below the
    raised limit, configurations past the eighth would quietly run eager."""
    from ghostedit.optimize.compile import RECOMPILE_LIMIT
    engine.run(request(house), OptimizationConfig(compile="regional"))  # compiled and warm: this thread set the limit
    limits_seen = []
    run = threading.Thread(target=lambda: engine.run(
        request(house), OptimizationConfig(compile="regional"),
        on_progress=lambda event: limits_seen.append(torch._dynamo.config.recompile_limit)))
    run.start()
    run.join()
    assert limits_seen and min(limits_seen) >= RECOMPILE_LIMIT


@pytest.mark.parametrize("config, reason", [
    (OptimizationConfig(fp8="torchao"), "needs a CUDA GPU"),
    (OptimizationConfig(attention="fa3"), "needs a CUDA GPU"),
    (OptimizationConfig(attention="sdpa-cudnn"), "needs a CUDA GPU"),
    (OptimizationConfig(fp8="te"), "needs a CUDA GPU"),
])
def test_unavailable_option_raises_with_reason(engine, house, config, reason):
    assert not all(choice.ok for choice in engine.options()["fp8"].values())
    with pytest.raises(UnavailableOptionError, match=reason):
        engine.run(request(house), config)


def test_progress_fires_once_per_step_in_order(engine, house):
    events = []
    engine.run(request(house, steps=5), on_progress=events.append)
    steps = [e.step for e in events if e.stage == "denoising" and e.step_seconds is not None]
    assert steps == [1, 2, 3, 4, 5]
    final = [e for e in events if e.stage == "denoising" and e.step_seconds is not None][-1]
    assert final.total_steps == 5 and final.eta == 0
    assert final.memory.kind == "host" and final.memory.label == "host memory (process RSS)"


def test_telemetry_has_every_stage(house):
    fresh = Engine("tiny", device="cpu")
    result = fresh.run(request(house), OptimizationConfig(compile="regional"))
    summary = result.telemetry.summary()
    assert list(summary["stages_s"]) == ["load", "prepare", "compile warm-up", "set-up", "image encoding",
                                         "text encoding", "denoising", "decoding"]
    assert set(summary["prepare_steps_s"]) == {"copy", "to device", "compile"}
    assert all(seconds > 0 for seconds in summary["stages_s"].values())
    assert len(summary["step_s"]) == SMALL["steps"]
    # every second named: the stages add up to the run's total within 2% (issue 44)
    assert summary["total_s"] * 0.98 <= sum(summary["stages_s"].values()) <= summary["total_s"]
    warm = fresh.run(request(house), OptimizationConfig(compile="regional")).telemetry.summary()
    assert list(warm["stages_s"])[0] == "set-up"
    assert warm["total_s"] * 0.98 <= sum(warm["stages_s"].values()) <= warm["total_s"]
    assert summary["peak_host_rss_gib"] > 0


def test_every_stage_is_a_range_in_a_profiler_trace(engine, house):
    """lab/probes/profile_edit.py files each kernel under the stage whose range it falls in; set-up is the host's
    time between the ranges before the loop (what runs there falls in none)."""
    from torch.profiler import ProfilerActivity, profile

    from ghostedit.telemetry import STAGE_RANGE
    engine.run(request(house))
    with profile(activities=[ProfilerActivity.CPU]) as trace:
        result = engine.run(request(house))
    ranges = {event.name.removeprefix(STAGE_RANGE) for event in trace.events() if event.name.startswith(STAGE_RANGE)}
    assert ranges == set(result.telemetry.summary()["stages_s"]) - {"set-up"} == {"image encoding", "text encoding",
                                                                                 "denoising", "decoding"}


def test_lru_budget_evicts_and_frees(house):
    small = Engine("tiny", device="cpu", cache_budget_gib=1e-6)  # room for one prepared variant only
    small.run(request(house), OptimizationConfig(fp8="storage"))
    prepared, _ = small.prepare(OptimizationConfig(fp8="storage"))
    evicted_dit = weakref.ref(prepared.dit)
    del prepared
    small.run(request(house), OptimizationConfig(rewrites=("real-rope",)))
    assert [entry["config"] for entry in small.cached()] == [OptimizationConfig(rewrites=("real-rope",)).label]
    assert evicted_dit() is None  # really freed, not just forgotten
    assert small.run(request(house), OptimizationConfig(fp8="storage")).telemetry.cache_hit is False


def test_loaded_weights_leave_the_collectors_walks_until_the_engine_closes(house):
    """Loading freezes what lives (the base modules out of full collections, which the first compile sets off);
    closing the engine (a model switch) unfreezes them, so that weights held in a reference cycle are freed: a frozen
    cycle never is."""
    import gc
    engine = Engine("tiny", device="cpu")
    engine.run(request(house), OptimizationConfig(fp8="storage"))
    dit = engine.load().dit
    assert not any(found is dit for found in gc.get_objects())  # frozen: the collector's generations skip it
    dit.same_module_again = dit  # a cycle made after the freeze: only a collection of unfrozen objects frees it
    base_dit = weakref.ref(dit)
    del dit
    gc.collect()
    assert base_dit() is not None
    engine.close()
    assert base_dit() is None
    engine.run(request(house))
    assert engine.load_count == 2  # a later run loads the weights again


def test_concurrent_callers_are_serialized(engine, house):
    results, errors = {}, []

    def edit(seed):
        try:
            results[seed] = engine.run(request(house, seed=seed, steps=2))
        except Exception as error:  # noqa: BLE001 - reported below
            errors.append(error)

    threads = [threading.Thread(target=edit, args=(seed,)) for seed in (1, 2, 3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors
    for seed, result in results.items():
        assert np.array_equal(pixels(result), pixels(engine.run(request(house, seed=seed, steps=2))))


def test_multi_image_edit(engine, house):
    from PIL import Image
    from conftest import ASSETS
    portrait = Image.open(ASSETS / "portrait.png")
    result = engine.run(EditRequest(images=[house, portrait, house], prompt="put the person in front of the house",
                                    **SMALL))
    assert result.image.size == (128, 128) and len(result.inputs) == 3


def test_one_step_on_the_models_schedule_is_refused_not_a_black_image(engine, house):
    from ghostedit.errors import InvalidRequestError
    with pytest.raises(InvalidRequestError, match="Use 2 steps or more, or the Lightning schedule"):
        engine.run(EditRequest(images=[house], prompt="make it blue", steps=1, width=64, height=64))
    lightning = engine.run(EditRequest(images=[house], prompt="make it blue", steps=1, width=64, height=64),
                           OptimizationConfig(scheduler="lightning"))
    assert 10 < np.asarray(lightning.image).std()  # one step is fine where the schedule has no terminal stretch


class _MaskOnTheGpu(torch.Tensor):
    """A prompt mask that says it lives on the GPU and counts its copies to the host."""
    copies = 0

    @property
    def device(self):
        return torch.device("cuda", 0)

    def cpu(self):
        type(self).copies += 1
        return self.as_subclass(torch.Tensor).clone()


def test_the_dit_forward_reads_the_prompt_mask_from_a_host_copy_made_once_per_mask():
    """DiffSynth's model_fn reads the prompt's length with `.tolist()`, which on a GPU mask makes the CPU wait for
    the GPU at every forward: the engine's forward hands it a host copy, made once while the mask is unchanged, and
    an entity prompt's mask as it is."""
    from ghostedit.engine.runner import forward
    mask = torch.ones(1, 8, dtype=torch.long).as_subclass(_MaskOnTheGpu)
    seen = []

    def model_fn(**inputs):
        seen.append(inputs["prompt_emb_mask"])
    for _ in range(2):
        forward(model_fn, {"prompt_emb_mask": mask})
    assert _MaskOnTheGpu.copies == 1 and seen[0] is seen[1] and type(seen[0]) is torch.Tensor
    assert torch.equal(seen[0], torch.ones(1, 8, dtype=torch.long))
    mask.as_subclass(torch.Tensor).fill_(0)  # changed in place: copied again
    forward(model_fn, {"prompt_emb_mask": mask})
    assert _MaskOnTheGpu.copies == 2 and not seen[2].any()
    forward(model_fn, {"prompt_emb_mask": mask, "entity_prompt_emb": [torch.zeros(1)]})
    assert seen[3] is mask


def test_steps_on_a_gpu_are_timed_a_step_behind_the_cpu(monkeypatch):
    """With CUDA events a step is timed once the CPU has handed over the next one (nothing waits for the GPU between
    steps), each step less its own one-time stages, and the last step once the CPU has handed over the decoding
    too, which is timed from that step's end; a compile warm-up's step is left out of the median step time, a graph
    capture's is not."""
    monkeypatch.setattr(telemetry, "StepClock", EventClock)
    events = []
    recorder = telemetry.RunRecorder("cpu", on_progress=events.append)
    for index, _ in enumerate(recorder.timed_steps([0, 1, 2])):
        assert len(recorder.telemetry.step_seconds) == max(index - 1, 0)
        if index == 1:
            with recorder.stage("compile warm-up", warm_up=True):
                time.sleep(0.25)
        if index == 2:
            with recorder.stage("CUDA graph capture", out_of_step=True):
                time.sleep(0.1)
    assert len(recorder.telemetry.step_seconds) == 2
    recorder.decoding_done()
    warm_up, capture = (recorder.telemetry.stages[name] for name in ("compile warm-up", "CUDA graph capture"))
    assert warm_up >= 0.25 and capture >= 0.1
    steps = [1.0, 1.0 - warm_up, 1.0 - capture]
    assert recorder.telemetry.step_seconds == steps
    assert recorder.telemetry.stages["decoding"] == 1.0  # the mark after the last step's end
    assert recorder.telemetry.warm_up_steps == [1]  # a capture's step times its replays as any later step
    assert recorder.telemetry.denoise_seconds_per_step == statistics.median([steps[0], steps[2]])
    assert [event.step_seconds for event in events if event.step_seconds is not None] == steps


def test_an_edits_encoding_stages_on_a_gpu_are_timed_by_events_read_at_the_end(monkeypatch):
    """Image and text encoding do not make the CPU wait for the GPU (it goes on into the next stage meanwhile): their
    marks are read when the run finishes. Other stages (loading, preparing) wait and take the host's clock."""
    monkeypatch.setattr(telemetry, "StepClock", EventClock)
    recorder = telemetry.RunRecorder("cpu")
    with recorder.stage("load"):
        time.sleep(0.05)
    with recorder.stage("image encoding"):
        pass
    with recorder.stage("text encoding"):
        pass
    # the host's time between the stages is the run's set-up
    assert set(recorder.telemetry.stages) == {"load", "set-up"} and recorder.telemetry.stages["load"] >= 0.05
    recorder.finish()
    assert recorder.telemetry.stages["image encoding"] == recorder.telemetry.stages["text encoding"] == 1.0


class EventClock:
    """Stands in for CUDA events: each mark one second after the one before."""
    on_gpu = True
    steps_ahead = 1

    def __init__(self, device):
        self.marks = 0

    def mark(self):
        self.marks += 1
        return self.marks

    def seconds(self, start, end):
        return float(end - start)
