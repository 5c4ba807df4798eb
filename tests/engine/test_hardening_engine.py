"""Hardening at engine level: hostile images, out-of-range parameters, unsafe or broken LoRA files, running out of
memory, cancelling, a failing torch.compile and concurrent callers. Tiny model, 128 px, 1-3 steps.

Hostile files come from hostile_inputs.py; each is sent under a misleading name."""
import io
import threading
import traceback
import weakref

import numpy as np
import pytest
import torch
from PIL import Image

from ghostedit import EditRequest, LoraChoice, OptimizationConfig
from ghostedit.engine import Engine
from ghostedit.engine.recovery import OUT_OF_MEMORY_RETRY_NOTE
from ghostedit.engine.runner import _Instrumented
from ghostedit.errors import GhostEditError, GpuOutOfMemoryError, InputImageError, InvalidRequestError
from ghostedit.images import image_notes, load_image
from ghostedit.loras import list_loras, resolve_lora, save_uploaded_lora
from ghostedit.models.tiny import ensure_foreign_lora, ensure_tiny_lora
from ghostedit.lora_files import LoraError, check_lora_file, read_lora_file
from ghostedit.optimize.lora import match_lora
from ghostedit.telemetry import RunCancelled
from hostile_inputs import (GIF_NOTE, REFUSED_IMAGES, REFUSED_REQUEST_VALUES, animated_gif, cmyk_jpeg, encoded,
                            gradient_16bit_png,
                            half_transparent_png, multipage_tiff, noise, refused_by_content, refused_by_the_model,
                            rotated_jpeg, transparent_palette_png)

SMALL = dict(width=128, height=128, steps=2)


def request(image, **overrides):
    return EditRequest(images=[image], prompt="make it a haunted house", **{**SMALL, **overrides})


def pixels(result):
    return np.asarray(result.image, dtype=np.int16)


# ---- hostile images ----

def near(color, expected, tolerance=4):
    return all(abs(a - b) <= tolerance for a, b in zip(color, expected))


CONVERTED = {
    "16-bit PNG": (gradient_16bit_png, lambda im: np.asarray(im)[0, 0, 0] == 0 and np.asarray(im)[0, -1, 0] == 255
                   and 120 < np.asarray(im)[0, 32, 0] < 140),  # scaled to 8 bits, not clipped to white
    "CMYK JPEG": (cmyk_jpeg, lambda im: near(im.getpixel((32, 32)), (0, 255, 255))),
    "RGBA PNG": (half_transparent_png, lambda im: im.getpixel((0, 0)) == (255, 255, 255)
                 and im.getpixel((63, 0)) == (0, 0, 255)),
    "palette PNG with transparency": (transparent_palette_png, lambda im: im.getpixel((0, 0)) == (255, 255, 255)),
    "1-bit PNG": (lambda: encoded(Image.new("1", (32, 32), 1)), lambda im: im.getpixel((0, 0)) == (255, 255, 255)),
    "animated GIF": (animated_gif, lambda im: near(im.getpixel((0, 0)), (255, 0, 0))
                     and image_notes(im) == [GIF_NOTE]),
    "multi-page TIFF": (multipage_tiff, lambda im: im.getpixel((0, 0)) == (255, 255, 0)
                        and image_notes(im) == ["the TIFF has 2 frames (animation or pages): only the first is used"]),
    "EXIF-rotated JPEG": (rotated_jpeg, lambda im: im.size == (32, 64)),
    "16x16, the smallest": (lambda: encoded(noise(16, 16)), lambda im: im.size == (16, 16)),
    "8:1, the most elongated": (lambda: encoded(noise(256, 32)), lambda im: im.size == (256, 32)),
}


@pytest.mark.parametrize("name", CONVERTED)
def test_unusual_images_are_converted_to_rgb(name, tmp_path):
    make, correct = CONVERTED[name]
    path = tmp_path / "upload.jpg"  # the name says nothing: content decides
    path.write_bytes(make())
    image = load_image(path)
    assert image.mode == "RGB"
    assert correct(image)
    assert load_image(image).tobytes() == image.tobytes()  # loading again changes nothing


@pytest.mark.parametrize("name", REFUSED_IMAGES)
def test_hostile_images_are_refused_with_a_clear_message(name, tmp_path):
    make, message = REFUSED_IMAGES[name]
    data = make()
    path = tmp_path / "photo.png"
    path.write_bytes(data)
    limit = Image.MAX_IMAGE_PIXELS
    for source in (path, str(path), data, io.BytesIO(data)):
        with pytest.raises(InputImageError, match=message):
            load_image(source)
    with pytest.raises(InputImageError, match=message):
        EditRequest(images=[path], prompt="make it night")
    assert Image.MAX_IMAGE_PIXELS == limit  # Pillow's process-wide limit is left alone


def test_refused_image_among_several_is_named():
    with pytest.raises(InputImageError, match=r"^input image 2: the image is 1x1 pixels"):
        EditRequest(images=[noise(32, 32), encoded(Image.new("RGB", (1, 1)))], prompt="make it night")


def test_converted_images_edit_at_multiples_of_16_within_the_area(engine):
    """No size given: the last image's aspect ratio (8:1 here; the reference, QwenImageEditPlusPipeline, takes the
    last) at the model's default area."""
    result = engine.run(EditRequest(images=[animated_gif(), gradient_16bit_png(), encoded(noise(256, 32))],
                                    prompt="make it night", steps=2))
    width, height = result.image.size
    assert width % 16 == 0 and height % 16 == 0 and width / height == pytest.approx(8, rel=0.15)
    assert width * height <= engine.spec.default_area * 1.1
    for image in result.inputs:
        assert image.size[0] % 16 == 0 and image.size[1] % 16 == 0
        assert image.size[0] * image.size[1] <= width * height * 1.1
    assert result.telemetry.notes == [f"input image 1: {GIF_NOTE}"]


# ---- parameters: refused, never clamped ----

@pytest.mark.parametrize("overrides, message", REFUSED_REQUEST_VALUES + [
    (dict(prompt=None), r"the prompt must be text"),
    (dict(steps=True), r"steps must be a whole number"),
    (dict(cfg_scale=float("nan")), r"CFG scale must be a number"),
    (dict(cfg_scale=float("inf")), r"CFG scale must be a number"),
    (dict(width=32, height=32), r"width must be between 64 and 2048"),
    (dict(width=128, height=None), r"give both width and height, or neither"),
    (dict(images=[Image.new("RGB", (32, 32))] * 11), r"a run takes at most 10 input images; got 11"),
])
def test_out_of_range_parameters_are_refused(overrides, message):
    fields = dict(images=[Image.new("RGB", (32, 32))], prompt="make it night", **SMALL)
    with pytest.raises(InvalidRequestError, match=message) as refused:
        EditRequest(**{**fields, **overrides})
    assert isinstance(refused.value, GhostEditError) and isinstance(refused.value, ValueError)


def test_boundary_parameters_are_accepted_as_given():
    image = Image.new("RGB", (32, 32))
    low = EditRequest(images=image, prompt="x", steps=1, cfg_scale=1, seed=0, width=64, height=64)
    high = EditRequest(images=[image], prompt="x" * 2000, steps=100.0, cfg_scale=20.0, seed=2**32 - 1,
                       width=2048, height=2048.0)
    assert (low.steps, low.cfg_scale, low.seed, low.width) == (1, 1.0, 0, 64)
    assert (high.steps, high.seed, high.height) == (100, 2**32 - 1, 2048)
    assert type(high.steps) is int and type(high.height) is int and type(low.cfg_scale) is float


# ---- LoRA files ----

@pytest.fixture(scope="module")
def bad_loras(tmp_path_factory):
    """{case: (file, what the error says)}; every file is named .safetensors, whatever it holds."""
    folder = tmp_path_factory.mktemp("bad-loras")
    marker = folder / "pickle-was-loaded"
    yield {**refused_by_content(folder, marker), **refused_by_the_model(folder)}
    assert not marker.exists(), "a pickle was loaded"


@pytest.mark.parametrize("case", ["PyTorch zip checkpoint carrying code", "pickle carrying code", "truncated",
                                  "cut inside the header", "text", "empty", "safetensors without LoRA layers",
                                  "wrong shapes", "NaN weights", "NaN alpha", "another model (0 layers match)"])
def test_bad_lora_files_give_a_clear_error(engine, bad_loras, case):
    path, message = bad_loras[case]
    with pytest.raises(LoraError, match=message):
        match_lora(engine.load().dit, read_lora_file(path))


def test_bad_loras_leave_cached_pipelines_and_base_weights_untouched(engine, house, bad_loras):
    before = engine.run(request(house))
    cached = [entry["config"] for entry in engine.cached()]
    base = {name: p.detach().clone() for name, p in engine.load().dit.named_parameters()}
    for case, (path, message) in bad_loras.items():
        for mode in ("fused", "runtime"):
            config = OptimizationConfig(loras=(LoraChoice.from_file(path, mode=mode),), fp8="storage")
            with pytest.raises(LoraError, match=message):
                engine.run(request(house), config)
    assert [entry["config"] for entry in engine.cached()] == cached
    for name, p in engine.load().dit.named_parameters():
        assert torch.equal(p, base[name]), name
    after = engine.run(request(house))
    assert after.telemetry.cache_hit and np.array_equal(pixels(after), pixels(before))


def test_lora_folder_refuses_names_that_leave_it(tmp_path):
    folder, outside = tmp_path / "loras", tmp_path / "secret.safetensors"
    folder.mkdir()
    outside.write_bytes(ensure_tiny_lora("peft").read_bytes())
    (folder / "ghost.safetensors").write_bytes(ensure_tiny_lora("kohya").read_bytes())
    (folder / "escape.safetensors").symlink_to(outside)
    (folder / "alias.safetensors").symlink_to(folder / "ghost.safetensors")
    (folder / ".partial.safetensors").write_bytes(b"")
    (folder / "notes.txt").write_text("not a LoRA")
    (folder / "sub").mkdir()
    assert list_loras(folder) == ["alias.safetensors", "ghost.safetensors"]
    assert list_loras(tmp_path / "missing") == []
    assert resolve_lora(folder, "ghost.safetensors") == (folder / "ghost.safetensors").resolve()
    assert resolve_lora(folder, "alias.safetensors") == (folder / "ghost.safetensors").resolve()
    refused = {
        "../secret.safetensors": "not a LoRA name", str(outside): "not a LoRA name",
        "sub/ghost.safetensors": "not a LoRA name", "..\\secret.safetensors": "not a LoRA name",
        "ghost\0.safetensors": "not a LoRA name", "..": "not a LoRA name", "": "not a LoRA name",
        ".partial.safetensors": "not a LoRA name", "notes.txt": "end in .safetensors",
        "escape.safetensors": "outside the LoRA folder", "missing.safetensors": "no LoRA named",
    }
    for name, message in refused.items():
        with pytest.raises(LoraError, match=message):
            resolve_lora(folder, name)


def test_uploaded_lora_is_checked_by_content_and_stored_under_a_safe_name(engine, house, tmp_path, bad_loras):
    folder = tmp_path / "loras"
    upload = tmp_path / "upload-7f3a"
    upload.write_bytes(ensure_tiny_lora("peft").read_bytes())
    name = save_uploaded_lora(folder, upload, "C:\\Users\\me\\..\\..\\My Ghost (v2)!.safetensors")
    assert name == "My_Ghost_v2.safetensors"
    assert save_uploaded_lora(folder, upload, "My Ghost (v2)!.safetensors") == name  # same file: same name
    other = tmp_path / "other"
    other.write_bytes(ensure_tiny_lora("kohya").read_bytes())
    second = save_uploaded_lora(folder, other, "My Ghost (v2)!.ckpt")  # safetensors inside, whatever the name says
    assert second.startswith("My_Ghost_v2-") and second.endswith(".safetensors") and second != name
    assert (folder / name).read_bytes() == upload.read_bytes()  # never overwritten
    for case in ("PyTorch zip checkpoint carrying code", "pickle carrying code", "truncated"):
        with pytest.raises(LoraError, match=r"^evil\.safetensors "):
            save_uploaded_lora(folder, bad_loras[case][0], "../../evil.safetensors")
    assert list_loras(folder) == sorted([name, second], key=str.lower)
    result = engine.run(request(house), OptimizationConfig(loras=(LoraChoice.from_file(resolve_lora(folder, name)),)))
    assert "layers matched" in result.prepared_report["LoRA My_Ghost_v2 (fused)"]


def test_check_lora_file_counts_layers():
    assert check_lora_file(ensure_tiny_lora("peft")) == check_lora_file(ensure_tiny_lora("kohya")) > 0


# ---- out of memory ----

def _spy_on_dit_calls(monkeypatch, before_call=None):
    """Weak references to every tensor the DiT is called with, through the engine's own hook; `before_call(n)` runs
    before the n-th call and may raise."""
    tensors, calls = [], []
    original = _Instrumented._model_fn

    def spy(self, **inputs):
        calls.append(len(tensors))
        tensors.extend(weakref.ref(value) for value in inputs.values() if isinstance(value, torch.Tensor))
        if before_call is not None:
            before_call(len(calls))
        return original(self, **inputs)

    monkeypatch.setattr(_Instrumented, "_model_fn", spy)
    return tensors, calls


def _out_of_memory():
    return torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of "
                                  "79.19 GiB of which 1.06 GiB is free.")


def test_out_of_memory_while_running_evicts_the_cache_and_retries_once(engine, house, monkeypatch):
    reference = engine.run(request(house, seed=5, steps=2))
    engine.prepare(OptimizationConfig(fp8="storage"))
    loads = engine.load_count
    first_attempt_alive = []

    def fail_first_call(n):
        if n == 1:
            raise _out_of_memory()
        if n == 2:  # the retry's first call: the failed attempt's tensors must be gone by now
            first_attempt_alive.extend(ref for ref in tensors[:calls[1]] if ref() is not None)

    tensors, calls = _spy_on_dit_calls(monkeypatch, fail_first_call)
    result = engine.run(request(house, seed=5, steps=2))
    assert OUT_OF_MEMORY_RETRY_NOTE in result.telemetry.notes
    assert not first_attempt_alive
    assert [entry["config"] for entry in engine.cached()] == [OptimizationConfig().label]  # others evicted
    assert result.telemetry.cache_hit is False and engine.load_count == loads  # the base weights stayed
    assert np.array_equal(pixels(result), pixels(reference))


def test_out_of_memory_while_preparing_retries(engine, house, monkeypatch):
    engine.free()
    build, builds, failures = Engine._build, [], [_out_of_memory()]

    def build_failing_first(self, *args):
        builds.append(args[0].label)
        if failures:
            raise failures.pop()
        return build(self, *args)

    monkeypatch.setattr(Engine, "_build", build_failing_first)
    result = engine.run(request(house, steps=2), OptimizationConfig(fp8="storage"))
    assert builds == ["fp8-storage"] * 2 and OUT_OF_MEMORY_RETRY_NOTE in result.telemetry.notes
    failures.append(_out_of_memory())
    prepared, hit = engine.prepare(OptimizationConfig(rewrites=("real-rope",)))  # preparing alone recovers too
    assert not hit and builds[2:] == ["real-rope"] * 2
    assert [entry["config"] for entry in engine.cached()] == ["real-rope"]


def test_out_of_memory_twice_is_a_clear_error_and_the_next_edit_succeeds(engine, house, monkeypatch):
    reference = engine.run(request(house, seed=9, steps=2))
    def always(n):
        raise _out_of_memory()

    tensors, _ = _spy_on_dit_calls(monkeypatch, always)
    with pytest.raises(GpuOutOfMemoryError, match=r"out of (GPU )?memory while running a 128x128 edit with stock "
                                                  r"\(it needed another 2.00 GiB\): GhostEdit freed every cached "
                                                  r"pipeline and tried once more.*smaller output size") as failed:
        engine.run(request(house, seed=9, steps=2))
    assert failed.value.__context__ is None and failed.value.__cause__ is None
    assert all(ref() is None for ref in tensors)  # both attempts' tensors freed, though the error is still held
    assert engine.cached() == []
    monkeypatch.undo()
    after = engine.run(request(house, seed=9, steps=2))
    assert np.array_equal(pixels(after), pixels(reference)) and not after.telemetry.notes


# ---- cancelling ----

def _cancel_after_step(step, cancel):
    def on_progress(event):
        if event.stage == "denoising" and event.step == step and event.step_seconds is not None:
            cancel.set()
    return on_progress


def _lock_is_free(engine) -> bool:
    """Whether another thread can take the engine's lock (the lock is reentrant: this thread could anyway)."""
    taken = []

    def take():
        if engine._lock.acquire(timeout=10):
            taken.append(True)
            engine._lock.release()
    thread = threading.Thread(target=take)
    thread.start()
    thread.join()
    return bool(taken)


def _allocated(device: str) -> int | None:
    return torch.cuda.memory_allocated(torch.device(device)) if device.startswith("cuda") else None


def test_cancelled_run_stops_early_frees_its_memory_and_the_next_run_succeeds(engine, house, monkeypatch):
    reference = engine.run(request(house, steps=3, seed=3))
    allocated = _allocated(engine.device)
    for _ in range(2):  # a second cancel finds nothing left behind by the first
        tensors, calls = _spy_on_dit_calls(monkeypatch)
        cancel = threading.Event()
        with pytest.raises(RunCancelled, match=r"cancelled after 1 of 3 steps") as cancelled:
            engine.run(request(house, steps=3, seed=3), on_progress=_cancel_after_step(1, cancel), cancel=cancel)
        assert 0 < len(calls) <= 2  # one step's DiT calls (two with CFG) of three steps
        assert tensors and all(ref() is None for ref in tensors), "the cancelled run's tensors are still alive"
        assert not [frame for frame in traceback.extract_tb(cancelled.value.__traceback__)
                    if "diffsynth" in frame.filename]  # the error no longer holds the pipeline's frames
        assert _lock_is_free(engine)
        assert _allocated(engine.device) == allocated
        monkeypatch.undo()
    after = engine.run(request(house, steps=3, seed=3))
    assert np.array_equal(pixels(after), pixels(reference))


def test_cancel_before_start_runs_nothing(engine, house):
    cancel = threading.Event()
    cancel.set()
    events = []
    with pytest.raises(RunCancelled):
        engine.run(request(house), on_progress=events.append, cancel=cancel)
    assert not [event for event in events if event.stage == "denoising"]
    assert _lock_is_free(engine)


# ---- compile failure ----

def test_compile_failure_falls_back_to_eager_with_a_visible_warning(engine, house):
    """A broken C++ compiler makes Inductor fail at the first call, as a missing toolchain or a Triton error would
    on a Space: the real failure, through the engine's real compile path."""
    eager = engine.run(request(house))
    config = OptimizationConfig(compile="regional")
    # compile's availability is checked once per process: here, with the working compiler, not the broken one
    assert engine.options()["compile"]["regional"].ok
    engine.free()           # a compiled pipeline warmed by an earlier test would not compile again
    torch._dynamo.reset()   # nor would code Dynamo compiled earlier in this process
    try:
        with torch._inductor.config.patch({"cpp.cxx": ("false",), "force_disable_caches": True}):
            failed = engine.run(request(house), config)
        later = engine.run(request(house), config)
    finally:
        engine.free()
        torch._dynamo.reset()
    for result in (failed, later):
        assert [note for note in result.telemetry.notes if note.startswith("torch.compile failed (InductorError")]
        assert "runs in eager mode" in result.telemetry.notes[0]
        assert result.prepared_report["compile"] == "failed: eager"
        assert np.array_equal(pixels(result), pixels(eager))
    assert later.telemetry.cache_hit is True


# ---- concurrent callers ----

def test_concurrent_callers_each_get_their_own_result_and_telemetry(engine, house):
    """Eight callers at once: one cancels, one sends a LoRA for another model, one an animated GIF. Every call
    returns or raises its own outcome, with its own request, image, steps, progress events and notes."""
    gif = load_image(animated_gif())
    steps = (2, 3, 2, 3, 2, 3, 4, 2)
    cancelled_job, foreign_job, gif_job = 6, 7, 5
    requests = [request(gif if index == gif_job else house, seed=200 + index, steps=count)
                for index, count in enumerate(steps)]
    foreign = OptimizationConfig(loras=(LoraChoice.from_file(ensure_foreign_lora()),))
    cancel = threading.Event()
    events = [[] for _ in requests]
    outcomes = {}

    def edit(index):
        def on_progress(event):
            events[index].append(event)
            if index == cancelled_job:
                _cancel_after_step(1, cancel)(event)
        try:
            outcomes[index] = engine.run(requests[index], foreign if index == foreign_job else OptimizationConfig(),
                                         on_progress=on_progress, cancel=cancel if index == cancelled_job else None)
        except Exception as error:  # noqa: BLE001 - every outcome is checked below
            outcomes[index] = error

    threads = [threading.Thread(target=edit, args=(index,)) for index in range(len(requests))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=300)
    assert sorted(outcomes) == list(range(len(requests)))  # every request completed or was reported
    assert isinstance(outcomes.pop(cancelled_job), RunCancelled)
    assert isinstance(outcomes.pop(foreign_job), LoraError)
    for index, result in outcomes.items():
        assert result.request is requests[index]
        assert len(result.telemetry.step_seconds) == steps[index]
        step_events = [event for event in events[index]
                       if event.stage == "denoising" and event.step_seconds is not None]
        assert [event.step for event in step_events] == list(range(1, steps[index] + 1))
        assert {event.total_steps for event in step_events} == {steps[index]}
        assert result.telemetry.notes == ([f"input image 1: {GIF_NOTE}"] if index == gif_job else [])
    for index in (0, 2, gif_job):  # the image is the one this request makes on its own
        assert np.array_equal(pixels(outcomes[index]), pixels(engine.run(requests[index])))
