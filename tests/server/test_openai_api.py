"""OpenAI's images API on the real app (`python app.py`, tiny model, GHOSTEDIT_API_KEY set), driven with the official
`openai` client: an edit of one and of three images is the image /edit (gradio_client) makes with the same settings,
n=2 makes consecutive seeds, a masked edit keeps the image outside the mask as /edit does, url answers serve the same
image, and a bad image, a bad size, a missing or wrong key, an unknown setting and a generation with an edit model
each get their error in OpenAI's shape. In-process, on the app's own queue: a full queue answers 429 and a client
that goes away leaves it."""
from __future__ import annotations

import base64
import io
import threading
import urllib.request

import httpx
import numpy as np
import openai
import pytest
from gradio_client import handle_file
from PIL import Image

from app_client import RUN_JSON, client, lossless
from app_server import free_port, running_app
from conftest import ASSETS
from ghostedit.errors import InvalidRequestError

KEY = "ghostedit-test-key"
HOUSE, PORTRAIT, MOUNTAINS = (ASSETS / f"{name}.png" for name in ("house", "portrait", "mountains"))
MASK = ASSETS / "house-mask.png"
PROMPT = "make it a haunted house at night"
SETTINGS = dict(steps=2, seed=5)  # GhostEdit's settings, the same in both APIs
SIZE = (128, 96)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with running_app(tmp_path_factory.mktemp("openai"), env={"GHOSTEDIT_API_KEY": KEY}) as running:
        yield running


@pytest.fixture(scope="module")
def api(server):
    return openai.OpenAI(base_url=f"{server.url}v1", api_key=KEY, max_retries=0, timeout=300)


def _decoded(item) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(base64.b64decode(item.b64_json))).convert("RGB"))


def _pixels(path) -> np.ndarray:
    return np.asarray(Image.open(path).convert("RGB"))


def _edit(server, **inputs):
    """/edit through gradio_client, with the settings the API calls send: its outputs, and its images as the engine
    made them (the outputs' are JPEG views)."""
    session = client(server)
    outputs = session.predict(prompt=PROMPT, width=SIZE[0], height=SIZE[1], api_name="/edit", **SETTINGS, **inputs)
    return outputs, lossless(session)


@pytest.mark.parametrize("images", [[HOUSE], [HOUSE, PORTRAIT, MOUNTAINS]], ids=["one-image", "three-images"])
def test_an_edit_is_the_image_edit_makes(server, api, images):
    files = [open(path, "rb") for path in images]
    try:
        answer = api.images.edit(image=files if len(files) > 1 else files[0], prompt=PROMPT,
                                 size=f"{SIZE[0]}x{SIZE[1]}", extra_body=SETTINGS)
    finally:
        for file in files:
            file.close()
    extra = {name: handle_file(str(path)) for name, path in zip(("image_2", "image_3"), images[1:])}
    reference, (made,) = _edit(server, image=handle_file(str(images[0])), **extra)
    assert answer.size == f"{SIZE[0]}x{SIZE[1]}" and len(answer.data) == 1
    assert np.array_equal(_decoded(answer.data[0]), _pixels(made))
    run = answer.model_extra["ghostedit"]["runs"][0]
    assert run["seed"] == 5 and run["steps"] == 2 and run["configuration"] == reference[RUN_JSON]["configuration"]
    assert run["telemetry"]["stages_s"]["denoising"] > 0 and len(run["telemetry"]["step_s"]) == 2


def test_n_images_have_consecutive_seeds(server, api):
    with open(HOUSE, "rb") as image:
        answer = api.images.edit(image=image, prompt=PROMPT, n=2, size=f"{SIZE[0]}x{SIZE[1]}", extra_body=SETTINGS)
    assert [run["seed"] for run in answer.model_extra["ghostedit"]["runs"]] == [5, 6]
    _, pngs = _edit(server, image=handle_file(str(HOUSE)), count=2)
    made = [_pixels(path) for path in pngs]
    assert [np.array_equal(_decoded(item), pixels) for item, pixels in zip(answer.data, made)] == [True, True]
    assert not np.array_equal(made[0], made[1])


def test_a_list_setting_in_extra_body_arrives_as_the_openai_client_sends_it(server, api):
    """The openai client sends a list of extra_body as NAME[] fields (rewrites[]=real-rope&rewrites[]=...): a group
    of flags takes them, and the run says it ran them."""
    with open(HOUSE, "rb") as image:
        answer = api.images.edit(image=image, prompt=PROMPT, size=f"{SIZE[0]}x{SIZE[1]}",
                                 extra_body={**SETTINGS, "rewrites": ["real-rope", "joint-layout"]})
    configuration = answer.model_extra["ghostedit"]["runs"][0]["configuration"]
    assert "real-rope" in configuration and "joint-layout" in configuration, configuration


def test_a_masked_edit_keeps_the_image_outside_the_mask(server, api):
    with open(HOUSE, "rb") as image, open(MASK, "rb") as mask:
        answer = api.images.edit(image=image, mask=mask, prompt=PROMPT, size=f"{SIZE[0]}x{SIZE[1]}",
                                 response_format="url", extra_body={**SETTINGS, "strength": 0.9, "paste_back": True})
    with urllib.request.urlopen(answer.data[0].url) as response:  # served by the same server, without the key
        assert response.headers["content-type"] == "image/png"
        edited = np.asarray(Image.open(io.BytesIO(response.read())).convert("RGB"))
    _, (made,) = _edit(server, image=handle_file(str(HOUSE)), mask=handle_file(str(MASK)), strength=0.9,
                       paste_back=True)
    assert np.array_equal(edited, _pixels(made))
    outside = np.asarray(Image.open(MASK).resize(SIZE, Image.LANCZOS)) == 0
    original = np.asarray(Image.open(HOUSE).convert("RGB").resize(SIZE, Image.LANCZOS))
    assert np.array_equal(edited[outside], original[outside])
    assert answer.model_extra["ghostedit"]["runs"][0]["start"]["paste_back"] is True


def _error(error: openai.APIStatusError) -> dict:
    body = error.response.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}, body
    return body["error"]


def test_requests_it_cannot_run_get_openais_error_shape(server, api):
    with pytest.raises(openai.BadRequestError) as bad_image:
        api.images.edit(image=("notes.png", b"these are not pixels", "image/png"), prompt=PROMPT)
    assert bad_image.value.status_code == 400
    assert _error(bad_image.value) == {"message": "the file is not an image GhostEdit can read (it takes PNG, JPEG, "
                                                  "WebP, GIF, BMP, TIFF or AVIF)", "type": "invalid_request_error",
                                       "param": "image", "code": "invalid_image"}
    for size, words in (("huge", "size must be auto or WIDTHxHEIGHT"), ("100x100", "width must be a multiple of 16")):
        with open(HOUSE, "rb") as image, pytest.raises(openai.BadRequestError) as bad_size:
            api.images.edit(image=image, prompt=PROMPT, size=size)
        assert words in _error(bad_size.value)["message"]
    assert _error(bad_size.value)["type"] == "invalid_request_error"
    with open(HOUSE, "rb") as image, pytest.raises(openai.BadRequestError) as unknown:
        api.images.edit(image=image, prompt=PROMPT, extra_body={"cfg": 3})
    assert _error(unknown.value)["param"] == "cfg"
    with open(HOUSE, "rb") as image, pytest.raises(openai.BadRequestError) as unavailable:
        api.images.edit(image=image, prompt=PROMPT, extra_body={"attention": "fa3"})
    assert "fa3" in _error(unavailable.value)["message"]
    with pytest.raises(openai.BadRequestError) as generation:
        api.images.generate(prompt="a ghost in a library")
    assert "cannot generate one without an input image" in _error(generation.value)["message"]
    assert _error(generation.value)["param"] == "model"
    stray = httpx.post(f"{server.url}v1/images/edits", headers={"Authorization": f"Bearer {KEY}"},
                       files={"image": HOUSE.read_bytes(), "picture": HOUSE.read_bytes()}, data={"prompt": PROMPT})
    assert stray.status_code == 400 and stray.json()["error"]["param"] == "picture"
    with open(HOUSE, "rb") as image, pytest.raises(openai.NotFoundError) as model:
        api.images.edit(image=image, prompt=PROMPT, model="gpt-image-1")
    assert _error(model.value)["code"] == "model_not_found"


def test_the_key_is_required_where_it_is_set(server, api):
    for key, code in ((None, "missing_api_key"), ("wrong", "invalid_api_key")):
        headers = {} if key is None else {"Authorization": f"Bearer {key}"}
        answer = httpx.get(f"{server.url}v1/models", headers=headers)
        assert answer.status_code == 401 and answer.json()["error"]["code"] == code
    with pytest.raises(openai.AuthenticationError) as refused, open(HOUSE, "rb") as image:
        openai.OpenAI(base_url=f"{server.url}v1", api_key="wrong", max_retries=0).images.edit(image=image,
                                                                                              prompt=PROMPT)
    assert _error(refused.value)["code"] == "invalid_api_key"
    models = api.models.list().data
    assert [model.id for model in models] == ["tiny"] and models[0].model_extra["generations"] is False


# ---- in-process: the app's own queue ----

@pytest.fixture
def local_app(tmp_path, monkeypatch):
    """The app served in this process, its engine's runs held until released (a slow edit stands in)."""
    from ghostedit.ui import create_app, openai_api

    demo = create_app("tiny", tmp_path / "loras", device="cpu")
    release, started = threading.Event(), threading.Semaphore(0)

    def held_run(*args, **kwargs):
        started.release()
        release.wait(60)
        raise InvalidRequestError("released")
    monkeypatch.setattr(demo.ghostedit_images_api.handlers.engine, "run", held_run)
    port = free_port()
    demo.launch(server_port=port, prevent_thread_lock=True, quiet=True,
                app_kwargs={"routes": openai_api.routes(demo, None)})
    try:
        yield demo, f"http://127.0.0.1:{port}/v1", release, started
    finally:
        release.set()
        demo.close()


def _post_edit(url: str, timeout: float = 60):
    with open(HOUSE, "rb") as image:
        return httpx.post(f"{url}/images/edits", files={"image": image.read()}, data={"prompt": PROMPT},
                          timeout=timeout)


def test_a_full_queue_answers_429_and_a_client_gone_leaves_it(local_app):
    demo, url, release, started = local_app
    queue = demo._queue
    queue.max_size = 1
    answers = []
    running = threading.Thread(target=lambda: answers.append(_post_edit(url)))
    running.start()
    assert started.acquire(timeout=60)  # the first edit runs (held): the queue is empty again
    with pytest.raises(httpx.ReadTimeout):
        _post_edit(url, timeout=3)         # waits in the queue, and its client goes away...
    _until(lambda: len(queue) == 0)         # ...which takes it out of the queue
    waiting = threading.Thread(target=lambda: answers.append(_post_edit(url)))
    waiting.start()
    _until(lambda: len(queue) == 1)
    full = _post_edit(url)
    assert full.status_code == 429
    assert full.json()["error"] == {"message": "The queue is full (1 waiting): retry later",
                                    "type": "requests", "param": None, "code": "rate_limit_exceeded"}
    release.set()
    running.join(60)
    waiting.join(60)
    assert [answer.json()["error"]["message"] for answer in answers] == ["released", "released"]


def _until(condition, timeout: float = 30) -> None:
    waited = threading.Event()
    for _ in range(int(timeout * 10)):
        if condition():
            return
        waited.wait(0.1)
    raise AssertionError("timed out")
