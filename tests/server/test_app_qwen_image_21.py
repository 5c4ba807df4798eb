"""The real app on the embedded tiny Qwen-Image-2.1 (`python app.py --model tiny-2.1 --mcp`), driven through its API
with gradio_client and through MCP: text-to-image with no input image, an edit with several transparent references,
the outputs PNG with their alpha channel, the prefix cache's tokens in the run's telemetry."""
import asyncio
import base64
import io

import numpy as np
import pytest
from gradio_client import Client, handle_file
from PIL import Image

from app_client import BEFORE_AFTER, RUN_JSON
from app_server import running_app

SMALL = dict(steps=2, width=64, height=64, seed=3)


@pytest.fixture(scope="module")
def app_21(tmp_path_factory):
    with running_app(tmp_path_factory.mktemp("app-2.1"), env={"GHOSTEDIT_MCP": "1"}, model="tiny-2.1") as running:
        yield running


@pytest.fixture(scope="module")
def transparent(tmp_path_factory) -> str:
    """A PNG whose left half is fully transparent."""
    pixels = np.zeros((48, 64, 4), dtype=np.uint8)
    pixels[..., 1], pixels[:, 32:, 3] = 180, 255
    path = tmp_path_factory.mktemp("inputs") / "half.png"
    Image.fromarray(pixels, "RGBA").save(path)
    return str(path)


def test_text_to_image_without_an_image_gives_a_png_with_alpha(app_21):
    outputs = Client(app_21.url, verbose=False).predict(prompt="a lighthouse at dusk", api_name="/edit", **SMALL)
    before, after = (Image.open(path) for path in outputs[BEFORE_AFTER])
    assert after.mode == "RGBA" and after.size == (64, 64)
    assert before.mode == "RGBA" and before.getextrema()[3] == (0, 0), "no input: an empty before"
    run = outputs[RUN_JSON]
    assert run["telemetry"]["dit_tokens"][1] == 16 < run["telemetry"]["dit_tokens"][0]
    assert run["cfg_scale"] == 1.0, "2.1's default: no guidance"


def test_an_edit_with_four_transparent_references(app_21, transparent):
    images = {"image": handle_file(transparent), **{f"image_{n}": handle_file(transparent) for n in (2, 3, 4)}}
    outputs = Client(app_21.url, verbose=False).predict(prompt="put them side by side", api_name="/edit",
                                                        **images, **SMALL)
    _, after = (Image.open(path) for path in outputs[BEFORE_AFTER])
    assert after.mode == "RGBA"
    assert outputs[RUN_JSON]["telemetry"]["notes"] == []


def test_the_mcp_tool_generates_and_edits_with_ten_references(app_21, transparent):
    data = base64.b64encode(open(transparent, "rb").read()).decode()
    url = f"data:image/png;base64,{data}"

    async def work(session):
        generated = await session.call_tool("edit_image", {"prompt": "a red kite", **SMALL})
        edited = await session.call_tool("edit_image", {"image": url, **{f"image_{n}": url for n in range(2, 11)},
                                                        "prompt": "make a collage", **SMALL})
        return generated, edited

    from mcp import ClientSession
    from mcp.client.streamable_http import streamablehttp_client

    async def session_work():
        async with streamablehttp_client(app_21.url + "gradio_api/mcp/") as (read, write, _):
            async with ClientSession(read, write) as session:
                await session.initialize()
                return await work(session)

    for result in asyncio.run(session_work()):
        assert not result.isError, result.content
        content = next(part for part in result.content if part.type == "image")
        image = Image.open(io.BytesIO(base64.b64decode(content.data)))
        assert image.mode == "RGBA" and image.size == (64, 64)
