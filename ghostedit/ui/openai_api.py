"""OpenAI's images API on the app's own server, for the tools and UIs built for OpenAI's client:
POST /v1/images/edits, POST /v1/images/generations, GET /v1/models, and GET /v1/images/files/{name} where
response_format=url images are served (docs/api-openai.md says what each takes and gives back). The routes are
handed to the FastAPI app Gradio builds at launch (`launch(app_kwargs={"routes": routes(...)})`): one server, one
process, the routes there from its first request on.

Same queue, workers and prepared pipelines as the page. An API call is an event of Gradio's own queue: the route
checks the request and reads its files, then pushes one event for a private endpoint of the Blocks (`openai_images`,
registered with the page's edit events' concurrency id and limit: one edit per GPU worker at a time, ZeroGPU's
`spaces.GPU` around it as around the page's) onto `Blocks._queue` with `Queue.push`, what Gradio's
/gradio_api/queue/join route does for a browser, and waits for the event's completion message. So an API edit waits
its turn behind the page's edits and theirs behind it, a full queue (`queue(max_size=)`) refuses it (429), and it
runs through Engine.run on the engine or worker pool whose prepared pipelines the page's runs use. The alternatives
were worse: calling the engine from the route would run beside the queue (two edits at once on one GPU, queue
positions that ignore API calls); Gradio's client over loopback HTTP would upload the images a second time and
parse an event stream for nothing. `Queue.push`, `pending_messages_per_session` and the message classes are Gradio
6.31's internals (requirements.txt pins it; tests/server/test_openai_api.py drives them through a real server). Every
API event belongs to one queue session of this process, named by a random token (no browser can read its messages, and
Gradio keeps one session state for all of them); one task hands each completion to the call that waits for it. A call
whose client disconnects is taken out of the queue, or cancelled at its next step if it runs.

Errors come in OpenAI's shape, {"error": {"message", "type", "param", "code"}}: 400 for a request GhostEdit refuses
(with the engine's reason), 401 for a missing or wrong key where --api-key (or GHOSTEDIT_API_KEY) is set, 404 for a
model this server does not serve, 429 when the queue is full, 500 for a failure of the server.
"""
from __future__ import annotations

import asyncio
import base64
import io
import json
import secrets
import tempfile
import threading
import time
import traceback
import types
import typing
import uuid
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path

import gradio as gr
from fastapi import Request
from fastapi.responses import FileResponse, JSONResponse
from fastapi.routing import APIRoute
from gradio import route_utils
from gradio.data_classes import PredictBodyInternal
from gradio.route_utils import API_PREFIX
from gradio.server_messages import ProcessCompletedMessage
from starlette.concurrency import run_in_threadpool

from ..config import InvalidRequestError, OptimizationConfig
from ..device import UnavailableOptionError
from ..errors import GhostEditError, InputImageError
from ..optimize.presets import LIGHTNING
from ..telemetry import RunCancelled
from . import live
from .api import edit_parameters, parameter_types
from .gpu import on_gpu
from .settings import MAX_IMAGES_PER_RUN, edit_request, panel_config, seeded_requests, setting_parameter

QUEUE_ENDPOINT = "openai_images"
# OpenAI's fields GhostEdit answers as OpenAI does; those it takes and leaves (their words are GhostEdit's own)
OPENAI_FIELDS = ("prompt", "n", "size", "response_format", "model", "output_format", "output_compression",
                 "background", "stream", "partial_images")
IGNORED_FIELDS = ("user", "quality", "input_fidelity", "safety_identifier", "moderation", "style")
# /edit's parameters that OpenAI's fields stand for (image, prompt, size, n) and the mask file
REPLACED_BY_OPENAI = ("image", "image_2", "image_3", "prompt", "width", "height", "count", "mask")
OUTPUT_FORMATS = {"png": ("PNG", "image/png"), "jpeg": ("JPEG", "image/jpeg"), "webp": ("WEBP", "image/webp")}
PNG_COMPRESS_LEVEL = 1   # the fastest zlib level: the client waits for the encoding, and base64 grows it anyway
URL_IMAGES_KEPT = 256    # response_format=url: the newest images kept, for URL_LIFETIME_S at most
URL_LIFETIME_S = 3600
DISCONNECT_POLL_S = 1.0


class OpenAIError(Exception):
    """An answer in OpenAI's error shape."""

    def __init__(self, status: int, message: str, kind: str = "invalid_request_error", param: str | None = None,
                 code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.kind, self.param, self.code = status, message, kind, param, code

    def response(self) -> JSONResponse:
        return JSONResponse({"error": {"message": self.message, "type": self.kind, "param": self.param,
                                       "code": self.code}}, status_code=self.status)


@dataclass
class Outcome:
    """What the queue's function hands back to the waiting call (pickled back under ZeroGPU): the edits' results,
    or the error that stopped them."""
    results: list = field(default_factory=list)
    error: BaseException | None = None


def add_queue_endpoint(demo: gr.Blocks, handlers, queue_settings: dict) -> None:
    """Inside the Blocks: the private endpoint API calls are queued for, with the page's edit queue settings
    (`queue_settings`: its concurrency id and limit). The routes come with routes()."""
    images = ImagesAPI(handlers)

    def openai_images(edits: list, config: typing.Any, values: dict, job: str, request: gr.Request) -> typing.Any:
        return images.run(edits, config, job)  # `values`: /edit's, for ZeroGPU's duration (gpu.gpu_seconds)

    gr.api(on_gpu(openai_images, handlers.engine.spec, runs_for=lambda arguments: len(arguments["edits"]),
                  arguments_of=lambda arguments: arguments["values"]),
           api_name=QUEUE_ENDPOINT, api_visibility="private", **queue_settings)
    demo.ghostedit_images_api = images


def routes(demo: gr.Blocks, api_key: str | None) -> list[APIRoute]:
    """The /v1 routes, for launch(app_kwargs={"routes": ...}): on the app's own FastAPI server from its first
    request on. `api_key`: the bearer token they require (None: open, as the page is)."""
    return demo.ghostedit_images_api.routes(demo, api_key)


class ImagesAPI:
    def __init__(self, handlers):
        self.handlers = handlers
        self.files = ImageFiles()
        self.session = f"openai-{secrets.token_hex(16)}"
        self._cancels: dict[str, threading.Event] = {}
        self._waiting: dict[str, asyncio.Future] = {}
        self._dispatcher: asyncio.Task | None = None

    # ---- the queue's side: runs in a queue worker thread ----

    def run(self, edits: list, config: OptimizationConfig, job: str) -> Outcome:
        outcome, cancel = Outcome(), self._cancels.get(job)
        try:
            for edit in edits:
                outcome.results.append(self.handlers.engine.run(edit, config, cancel=cancel))
        except BaseException as error:  # noqa: BLE001 - handed to the waiting call, which answers with it
            if not isinstance(error, (GhostEditError, RunCancelled)):
                traceback.print_exception(error)
            outcome.error = error
        return outcome

    # ---- the routes ----

    def routes(self, demo: gr.Blocks, api_key: str | None) -> list[APIRoute]:
        self.demo, self.api_key = demo, api_key
        self.fn_index = next(fn._id for fn in demo.fns.values() if fn.api_name == QUEUE_ENDPOINT)
        return [APIRoute("/v1/images/edits", self._answering(self.edits), methods=["POST"]),
                APIRoute("/v1/images/generations", self._answering(self.generations), methods=["POST"]),
                APIRoute("/v1/models", self._answering(self.models), methods=["GET"]),
                APIRoute("/v1/images/files/{name}", self.file, methods=["GET"])]

    def _answering(self, route):
        """The route behind the key check, its OpenAIError answered in OpenAI's shape."""
        async def answer(request: Request):
            try:
                self._check_key(request)
                return await route(request)
            except OpenAIError as error:
                return error.response()
        return answer

    def _check_key(self, request: Request) -> None:
        if self.api_key is None:
            return
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not token:
            raise OpenAIError(401, "You didn't provide an API key: this server requires one, in an Authorization "
                                   "header (Authorization: Bearer YOUR_KEY).", code="missing_api_key")
        if not secrets.compare_digest(token.strip().encode(), self.api_key.encode()):
            raise OpenAIError(401, "Incorrect API key provided.", code="invalid_api_key")

    async def models(self, request: Request) -> JSONResponse:
        spec = self.handlers.engine.spec
        return JSONResponse({"object": "list", "data": [{
            "id": spec.source, "object": "model", "created": 0, "owned_by": "ghostedit",
            "family": spec.family.name, "edits": True, "generations": generates(spec.family),
            "max_images": spec.family.max_images, "default_steps": spec.default_steps}]})

    async def edits(self, request: Request) -> JSONResponse:
        if not request.headers.get("content-type", "").startswith("multipart/form-data"):
            raise OpenAIError(400, "send the edit as multipart/form-data (the image files, the prompt, ...), as "
                                   "OpenAI's client does")
        form = await request.form()
        files = {name: [await item.read() for item in form.getlist(name) if hasattr(item, "read")]
                 for name in ("image", "image[]", "mask")}
        stray = sorted({name for name, value in form.multi_items() if hasattr(value, "read")} - set(files))
        if stray:
            raise OpenAIError(400, f"a file in {stray[0]!r}: the files are `image` (or `image[]`) and `mask`",
                              param=stray[0])
        fields = {name: [value for value in form.getlist(name) if isinstance(value, str)]
                  for name in form.keys() if name not in files}
        images = files["image"] + files["image[]"]
        if not images:
            raise OpenAIError(400, "no image: send one or more image files as `image` (or `image[]`)",
                              param="image")
        if len(files["mask"]) > 1:
            raise OpenAIError(400, "one mask at most: it applies to the first image", param="mask")
        return await self._answer(request, fields, images, files["mask"][0] if files["mask"] else None)

    async def generations(self, request: Request) -> JSONResponse:
        try:
            body = await request.json()
        except ValueError:
            raise OpenAIError(400, "send the generation as JSON, as OpenAI's client does") from None
        if not isinstance(body, dict):
            raise OpenAIError(400, "the body must be a JSON object")
        family = self.handlers.engine.spec.family
        if not generates(family):
            raise OpenAIError(400, f"{self.handlers.engine.spec.source} ({family.name}) edits images: it cannot "
                                   "generate one without an input image. Send the image to /v1/images/edits, or "
                                   "start the server with a model that generates", param="model",
                              code="unsupported_model")
        fields = {name: value if isinstance(value, list) else [value] for name, value in body.items()}
        return await self._answer(request, {name: [_text(value) for value in values]
                                            for name, values in fields.items()}, [], None)

    async def file(self, name: str):
        path = self.files.get(name)
        if path is None:
            return OpenAIError(404, "no such image here (images are kept for an hour, the newest "
                                    f"{URL_IMAGES_KEPT})", code="not_found").response()
        return FileResponse(path, media_type=OUTPUT_FORMATS[path.suffix[1:]][1])

    # ---- one call ----

    async def _answer(self, request: Request, fields: dict, images: list[bytes], mask: bytes | None) -> JSONResponse:
        call = await run_in_threadpool(self._call, fields, images, mask)
        outcome = await self._queued(request, call)
        if outcome.error is not None:
            raise _answer_for(outcome.error)
        root = route_utils.get_root_url(request=request, route_path=request.url.path,
                                        root_path=self.demo.app.root_path)
        return JSONResponse(await run_in_threadpool(self._response, call, outcome.results, root))

    def _call(self, fields: dict, images: list[bytes], mask: bytes | None) -> "Call":
        """The request checked and its images read (the engine's own checks), before it waits in the queue."""
        # a list in the openai client's extra_body arrives as NAME[] (rewrites[]=real-rope&rewrites[]=...)
        named = {name.removesuffix("[]") for name in fields}
        unknown = sorted(named - set(OPENAI_FIELDS) - set(IGNORED_FIELDS) - set(extra_fields()) - {"config"})
        if unknown:
            raise OpenAIError(400, f"Unrecognized request argument supplied: {', '.join(unknown)} (GhostEdit's "
                                   f"settings: {', '.join(extra_fields())}, config)", param=unknown[0])
        one = {name: values[-1] for name, values in fields.items() if values}
        self._check_model(one.get("model"))
        self._refuse_unsupported(one)
        values = self._values(fields, one)
        response_format = one.get("response_format") or "b64_json"
        if response_format not in ("b64_json", "url"):
            raise OpenAIError(400, f"response_format must be b64_json or url; got {response_format!r}",
                              param="response_format")
        output_format = one.get("output_format") or "png"
        if output_format not in OUTPUT_FORMATS:
            raise OpenAIError(400, f"output_format must be one of {', '.join(OUTPUT_FORMATS)}; got "
                                   f"{output_format!r}", param="output_format")
        compression = _number("output_compression", one.get("output_compression"), int, 0, 100)
        try:
            config = panel_config(self.handlers.loras, values)
            self.handlers.engine.check(config)
            family = self.handlers.engine.family
            edit = edit_request(images, values.get("prompt"), values.get("negative_prompt"), values["steps"],
                                values["cfg_scale"], values["seed"], values.get("width"), values.get("height"),
                                keep_alpha=bool(family and family.rgba), mask=mask, strength=values["strength"],
                                padding_mask_crop=values.get("padding_mask_crop"), paste_back=values["paste_back"])
            self.handlers.engine.check_request(edit)
            edits = seeded_requests(edit, values["count"])
        except GhostEditError as error:
            raise _answer_for(error) from error
        return Call(edits, config, values, response_format, output_format, compression)

    def _check_model(self, model: str | None) -> None:
        spec = self.handlers.engine.spec
        if model not in (None, "", spec.source, spec.family.name):
            raise OpenAIError(404, f"The model {model!r} does not exist here: this server serves {spec.source!r} "
                                   "(GET /v1/models)", param="model", code="model_not_found")

    @staticmethod
    def _refuse_unsupported(one: dict) -> None:
        if _flag(one.get("stream")) or _number("partial_images", one.get("partial_images"), int, 0, 3):
            raise OpenAIError(400, "streaming partial images is not supported here: GhostEdit's Gradio API (/edit) "
                                   "gives each step's progress instead (Gradio's progress updates)", param="stream")
        if one.get("background") == "transparent":
            raise OpenAIError(400, "a transparent background is not supported: the model makes RGB images",
                              param="background")

    def _values(self, fields: dict, one: dict) -> dict:
        """/edit's {parameter: value} from OpenAI's fields and GhostEdit's, with /edit's defaults."""
        spec = self.handlers.engine.spec
        family = self.handlers.engine.family
        values = {"steps": spec.default_steps, "cfg_scale": family.default_cfg if family else 4.0, "seed": 0,
                  "strength": 1.0, "paste_back": False}
        if one.get("config"):
            values.update(_preset_values(one["config"]))
        types_ = parameter_types(spec.default_steps)
        for name in extra_fields():
            texts = fields.get(name, []) + fields.get(f"{name}[]", [])
            if texts:
                values[name] = _converted(name, texts, types_[name][0])
        values["prompt"] = one.get("prompt")
        if not values["prompt"]:
            raise OpenAIError(400, "no prompt: say what the edit should do", param="prompt")
        values["count"] = _number("n", one.get("n"), int, 1, MAX_IMAGES_PER_RUN) or 1
        size = one.get("size") or "auto"
        if size != "auto":
            width, _, height = size.partition("x")
            if not (width.isdigit() and height.isdigit()):
                raise OpenAIError(400, f"size must be auto or WIDTHxHEIGHT (such as 1024x1024); got {size!r}",
                                  param="size")
            values["width"], values["height"] = int(width), int(height)
        return values

    async def _queued(self, request: Request, call: "Call") -> Outcome:
        """`call` as an event of Gradio's queue; its Outcome when the event completes."""
        queue = self.demo._queue
        if queue.server_app is None:
            queue.set_server_app(self.demo.app)
        if queue.stopped:
            raise OpenAIError(503, "the server is stopping", "server_error")
        job = uuid.uuid4().hex
        self._cancels[job] = threading.Event()
        joined = _as_queue_join(request)
        body = PredictBodyInternal(data=[call.edits, call.config, call.values, job], fn_index=self.fn_index,
                                   session_hash=self.session, request=joined)
        try:
            success, event_id, state = await queue.push(body=body, request=joined, username=None)
            if not success:
                if state == "queue_full":
                    raise OpenAIError(429, f"The queue is full ({queue.max_size} waiting): retry later",
                                      "requests", code="rate_limit_exceeded")
                raise OpenAIError(500, f"the queue refused the edit: {event_id}", "server_error")
            message = await self._completion(queue, event_id, request, self._cancels[job])
        finally:
            self._cancels.pop(job, None)
        if not message.success:
            raise OpenAIError(500, f"the edit failed: {message.output.get('error')}", "server_error")
        return message.output["data"][0]

    async def _completion(self, queue, event_id: str, request: Request, cancel: threading.Event):
        """The event's completion message; a client gone meanwhile takes the event out of the queue, or cancels
        it at its next step."""
        self._start_dispatcher(queue)
        done = self._waiting.setdefault(event_id, asyncio.get_running_loop().create_future())
        try:
            while True:
                try:
                    return await asyncio.wait_for(asyncio.shield(done), DISCONNECT_POLL_S)
                except asyncio.TimeoutError:
                    if await request.is_disconnected():
                        cancel.set()
                        await queue.remove_from_queue(event_id)
                        raise OpenAIError(499, "the client went away", code="client_closed") from None
        finally:
            self._waiting.pop(event_id, None)
            queue.pending_event_ids_session.get(self.session, set()).discard(event_id)

    def _start_dispatcher(self, queue) -> None:
        if self._dispatcher is None or self._dispatcher.done():
            self._dispatcher = asyncio.get_running_loop().create_task(self._dispatch(queue))

    async def _dispatch(self, queue) -> None:
        """Hands each completion message of this API's queue session to the call waiting for it."""
        messages = queue.pending_messages_per_session[self.session]
        while True:
            message = await messages.get()
            if isinstance(message, ProcessCompletedMessage):
                done = self._waiting.get(message.event_id)
                if done is not None and not done.done():
                    done.set_result(message)

    def _response(self, call: "Call", results: list, root: str) -> dict:
        """OpenAI's ImagesResponse, with GhostEdit's account of each run (/edit's run JSON) as `ghostedit`."""
        data = []
        for result in results:
            encoded = _encoded(result.image, call.output_format, call.compression)
            if call.response_format == "url":
                data.append({"url": f"{root}/v1/images/files/{self.files.add(encoded, call.output_format)}",
                             "revised_prompt": None})
            else:
                data.append({"b64_json": base64.b64encode(encoded).decode(), "revised_prompt": None})
        first = results[0]
        return {"created": int(time.time()), "data": data, "output_format": call.output_format,
                "size": f"{first.width}x{first.height}",
                "ghostedit": {"model": self.handlers.engine.spec.source, "configuration": call.config.label,
                              "runs": [live.result_json(result, None) for result in results]}}


@dataclass
class Call:
    edits: list
    config: OptimizationConfig
    values: dict
    response_format: str
    output_format: str
    compression: int | None


class ImageFiles:
    """The images of response_format=url answers, in a folder of this process: the newest URL_IMAGES_KEPT, each
    for URL_LIFETIME_S. Their names are random (128 bits): a URL is its own permission, as OpenAI's are."""

    def __init__(self):
        self.folder = Path(tempfile.mkdtemp(prefix="ghostedit-openai-images-"))
        self._kept: OrderedDict[str, float] = OrderedDict()
        self._lock = threading.Lock()

    def add(self, data: bytes, output_format: str) -> str:
        name = f"{uuid.uuid4().hex}.{output_format}"
        (self.folder / name).write_bytes(data)
        with self._lock:
            self._kept[name] = time.monotonic()
            self._forget(lambda kept, added: len(kept) > URL_IMAGES_KEPT)
        return name

    def get(self, name: str) -> Path | None:
        with self._lock:
            self._forget(lambda kept, added: time.monotonic() - added > URL_LIFETIME_S)
            return self.folder / name if name in self._kept else None

    def _forget(self, expired) -> None:
        while self._kept and expired(self._kept, next(iter(self._kept.values()))):
            name, _ = self._kept.popitem(last=False)
            (self.folder / name).unlink(missing_ok=True)


def generates(family) -> bool:
    """Whether the model makes an image from a prompt alone (a family whose `min_images` is 0); the edit models
    take at least one image."""
    return getattr(family, "min_images", 1) == 0


def extra_fields() -> list[str]:
    """GhostEdit's settings an API call may add: /edit's parameters that OpenAI's own fields do not stand for."""
    return [name for name in edit_parameters() if name not in REPLACED_BY_OPENAI]


def _preset_values(text: str) -> dict:
    """/edit's toggle values of `config`: a preset (baseline, best, exact...) or settings such as
    "fp8=torchao,compile=regional", as the command line's --configs takes them, without LoRA files (LoRAs come by
    name from /options, in the lora fields)."""
    for item in (part.strip() for part in text.split(",")):
        if item.startswith("lora=") or item in LIGHTNING:
            raise OpenAIError(400, f"config {item!r}: LoRAs come by name (a name from the Gradio API's /options) in "
                                   "the lora, lora_2 and lora_3 fields; a Lightning LoRA once fetched on the page is "
                                   "one of them (with steps, cfg_scale 1 and scheduler lightning)", param="config")
    try:
        settings = OptimizationConfig.parse(text).settings()
    except GhostEditError as error:
        raise OpenAIError(400, f"config: {error}", param="config") from None
    return {setting_parameter(name): list(value) if isinstance(value, tuple) else value
            for name, value in settings.items()}


def _converted(name: str, texts: list[str], hint):
    """A form field's text as the type /edit's parameter has (api.parameter_types)."""
    origin, arguments = typing.get_origin(hint), typing.get_args(hint)
    if origin is list:
        return [item.strip() for text in texts for item in text.split(",") if item.strip()]
    text = texts[-1].strip()
    if origin in (typing.Union, types.UnionType) and type(None) in arguments:
        if text.lower() in ("", "none", "null"):
            return None
        hint = next(argument for argument in arguments if argument is not type(None))
    if hint is bool:
        if text.lower() not in ("true", "false", "1", "0"):
            raise OpenAIError(400, f"{name} must be true or false; got {text!r}", param=name)
        return text.lower() in ("true", "1")
    if hint in (int, float):
        return _number(name, text, hint, None, None)
    return text


def _number(name: str, text, kind, low, high):
    if text is None or text == "":
        return None
    try:
        value = kind(text)
    except (TypeError, ValueError):
        raise OpenAIError(400, f"{name} must be a {'whole ' if kind is int else ''}number; got {text!r}",
                          param=name) from None
    if (low is not None and value < low) or (high is not None and value > high):
        raise OpenAIError(400, f"{name} must be between {low} and {high}; got {value}", param=name)
    return value


def _flag(text) -> bool:
    return str(text).lower() in ("true", "1")


def _text(value) -> str:
    """A JSON value as the text a form field would carry."""
    return json.dumps(value) if isinstance(value, bool) else str(value)


def _as_queue_join(request: Request) -> Request:
    """The API call's request as the queue's events carry one: at /gradio_api/queue/join, the route the queue knows
    its events by (it takes the app's public URL from it); headers, client and the rest as they came."""
    path = request.scope["path"].rsplit("/v1/", 1)[0] + f"{API_PREFIX}/queue/join"
    return Request({**request.scope, "path": path, "raw_path": path.encode()})


def _answer_for(error: BaseException) -> OpenAIError:
    """The API's answer to an error of the engine or of the request's checks."""
    if isinstance(error, OpenAIError):
        return error
    if isinstance(error, InputImageError):
        return OpenAIError(400, str(error), param="mask" if str(error).startswith("the mask") else "image",
                           code="invalid_image")
    if isinstance(error, (InvalidRequestError, UnavailableOptionError)):
        return OpenAIError(400, str(error))
    if isinstance(error, GhostEditError):
        return OpenAIError(500, str(error), "server_error")
    return OpenAIError(500, f"the edit failed: {type(error).__name__}: {error}", "server_error")


def _encoded(image, output_format: str, compression: int | None) -> bytes:
    buffer = io.BytesIO()
    pillow_format, _ = OUTPUT_FORMATS[output_format]
    if output_format == "png":
        image.save(buffer, pillow_format, compress_level=PNG_COMPRESS_LEVEL)
    else:
        image.save(buffer, pillow_format, quality=100 if compression is None else 100 - compression)
    return buffer.getvalue()
