"""`python app.py --mcp` on the tiny model, driven with the `mcp` client package over Streamable HTTP: the tools are
edit_image, options and system, their descriptions say what each argument means and which values it takes, and an
edit returns an image (the same pixels the app's /edit endpoint returns for the same request)."""
import argparse
import asyncio
import base64
import io
import sys

import numpy as np
import pytest
from PIL import Image

from app_client import RUN_JSON, lossless, wait_until
from app_server import REPO, running_app

HOUSE = REPO / "assets" / "examples" / "house.png"
EDIT = dict(prompt="make it a haunted house at night", steps=3, width=128, height=128, seed=5, fp8="off")


async def _session(url: str, work):
    from mcp import ClientSession
    from mcp.client.streamable_http import streamablehttp_client
    async with streamablehttp_client(url) as (read, write, _):
        async with ClientSession(read, write) as session:
            await session.initialize()
            return await work(session)


@pytest.fixture(scope="module")
def mcp_app(tmp_path_factory):
    """app.py as a Space with the MCP variable set runs it (the same as `python app.py --mcp`)."""
    with running_app(tmp_path_factory.mktemp("mcp"), env={"GHOSTEDIT_MCP": "1"}) as running:
        yield running


def test_mcp_option_and_variable(monkeypatch):
    from ghostedit.ui.serve import add_serve_arguments, check_mcp
    for variable, argv, expected in (("", [], False), ("", ["--mcp"], True), ("1", [], True)):
        monkeypatch.setenv("GHOSTEDIT_MCP", variable)
        parser = argparse.ArgumentParser()
        add_serve_arguments(parser)
        assert parser.parse_args(argv).mcp is expected
    monkeypatch.setitem(sys.modules, "mcp", None)  # as if gradio[mcp] were not installed: refused, with the fix
    with pytest.raises(SystemExit, match=r"pip install \"gradio\[mcp\]"):
        check_mcp()


def test_tools_are_listed_with_their_arguments_described(mcp_app):
    tools = {tool.name: tool for tool in asyncio.run(_session(
        mcp_app.url + "gradio_api/mcp/", lambda session: session.list_tools())).tools}
    assert set(tools) == {"edit_image", "options", "system"}
    # the log says so once launch() returns, which comes a little after the server answers
    wait_until(lambda: "MCP tools edit_image, options, system" in mcp_app.log.read_text(), timeout=60)
    edit = tools["edit_image"]
    properties = edit.inputSchema["properties"]
    assert set(edit.inputSchema["required"]) == {"prompt"}  # no image: text-to-image (Qwen-Image-2.1)
    assert "instruction" in edit.description and "the edited image" in edit.description
    assert properties["steps"]["description"].startswith("denoising steps, 1 to")
    assert properties["fp8"]["enum"][:2] == ["off", "storage"] and properties["fp8"]["default"] == "off"
    assert "storage (" in properties["fp8"]["description"]           # each value with what it means
    assert properties["compile"]["enum"] == ["off", "regional", "max-autotune"]
    assert properties["rewrites"]["items"]["enum"][0] == "joint-layout"
    assert "fused (into the weights) or runtime" in properties["lora_mode"]["description"]
    assert "white = change" in properties["mask"]["description"] and properties["strength"]["default"] == 1.0
    assert properties["paste_back"]["type"] == "boolean" and "above 0 to 1" in properties["strength"]["description"]
    assert "available" in tools["options"].description and "GPU" in tools["system"].description


def test_an_edit_through_mcp_returns_the_image(mcp_app):
    data = base64.b64encode(HOUSE.read_bytes()).decode()

    async def work(session):
        edited = await session.call_tool("edit_image", {"image": f"data:image/png;base64,{data}", **EDIT})
        options = await session.call_tool("options", {})
        refused = await session.call_tool("edit_image", {"image": f"data:image/png;base64,{data}",
                                                         **EDIT, "attention": "fa3"})
        return edited, options, refused

    edited, options, refused = asyncio.run(_session(mcp_app.url + "gradio_api/mcp/", work))
    assert not edited.isError, edited.content
    image_content = next(content for content in edited.content if content.type == "image")
    assert image_content.mimeType == "image/png"
    image = Image.open(io.BytesIO(base64.b64decode(image_content.data)))
    assert image.size == (128, 128)
    assert "tiny" in options.content[0].text and "fa3" in options.content[0].text
    assert refused.isError and "fa3" in refused.content[0].text

    from gradio_client import Client, handle_file  # the same request through the page's /edit endpoint
    session = Client(mcp_app.url, verbose=False)
    run = session.predict(image=handle_file(str(HOUSE)), api_name="/edit", **EDIT)[RUN_JSON]
    assert run["seed"] == EDIT["seed"]
    png = lossless(session)[0]  # the page's view is a JPEG; its download the PNG
    assert np.abs(np.asarray(Image.open(png).convert("RGB"), dtype=np.int16)
                  - np.asarray(image.convert("RGB"), dtype=np.int16)).max() == 0
