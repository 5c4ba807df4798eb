"""Mask and strength through the real app (tiny model): /edit with a mask file through gradio_client (the image's own
pixels outside the mask with paste_back, the run's start settings, a mask that does not fit refused) and the page: a stroke painted on the image in the "Mask and strength" editor becomes the mask the run
uses (headless Debian chromium, as test_app_browser.py drives it). test_mcp.py checks the MCP tool's arguments."""
from __future__ import annotations

import io
import urllib.request

import numpy as np
import pytest
from gradio_client import handle_file
from gradio_client.exceptions import AppError
from PIL import Image

from app_client import RUN_JSON, SUMMARY, client, lossless
from conftest import ASSETS

HOUSE, HOUSE_MASK = ASSETS / "house.png", ASSETS / "house-mask.png"
SMALL = dict(prompt="give the house a red door", steps=2, width=128, height=128, seed=3)
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def test_edit_with_a_mask_keeps_the_image_outside_it(app):
    session = client(app)
    outputs = session.predict(image=handle_file(str(HOUSE)), mask=handle_file(str(HOUSE_MASK)), strength=0.9,
                              paste_back=True, api_name="/edit", **SMALL)
    run = outputs[RUN_JSON]
    assert run["start"] == {"mask": [512, 512], "strength": 0.9, "padding_mask_crop": None, "paste_back": True}
    assert "strength 0.9, masked, pasted back" in outputs[SUMMARY]
    edited = np.asarray(Image.open(lossless(session)[0]).convert("RGB"))  # the engine's pixels (the view is a JPEG)
    original = np.asarray(Image.open(HOUSE).convert("RGB").resize((128, 128), Image.LANCZOS))
    outside = np.asarray(Image.open(HOUSE_MASK).resize((128, 128), Image.LANCZOS)) == 0
    assert np.array_equal(edited[outside], original[outside]) and not np.array_equal(edited, original)


def test_a_mask_of_another_shape_is_refused_with_the_reason(app, tmp_path):
    narrow = tmp_path / "narrow.png"
    Image.new("L", (100, 300), 255).save(narrow)
    with pytest.raises(AppError, match="aspect ratio"):
        client(app).predict(image=handle_file(str(HOUSE)), mask=handle_file(str(narrow)), api_name="/edit", **SMALL)
    with pytest.raises(AppError, match="give a mask"):
        client(app).predict(image=handle_file(str(HOUSE)), paste_back=True, api_name="/edit", **SMALL)


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path="/usr/bin/chromium", headless=True, args=CHROMIUM_ARGS)
        yield browser
        browser.close()


def test_a_stroke_painted_on_the_image_is_the_runs_mask(browser, app):
    page = browser.new_context(viewport={"width": 1440, "height": 900}).new_page()
    try:
        page.goto(app.url, wait_until="load")
        page.wait_for_selector("#run", timeout=60_000)
        page.locator("#input_image input[type=file]").set_input_files(str(HOUSE))
        page.locator("#prompt textarea").fill(SMALL["prompt"])
        page.locator("#generation_section .label-wrap").first.click()  # a closed section, titled with what is set
        for elem_id, value in (("steps", 2), ("width", 128), ("height", 128)):
            box = page.locator(f"#{elem_id} input[type=number]")
            box.fill(str(value))
            box.press("Enter")
        page.get_by_text("Mask and strength (optional)").click()
        editor = page.locator("#mask_editor")
        editor.locator("button[aria-label=Brush]").first.click()
        canvas = editor.locator("canvas").first.bounding_box()
        x, y = canvas["x"] + canvas["width"] * 0.45, canvas["y"] + canvas["height"] * 0.5
        page.mouse.move(x, y)
        page.mouse.down()
        for step in range(12):
            page.mouse.move(x + step * 3, y + step, steps=2)
        page.mouse.up()
        page.wait_for_selector("#mask img", timeout=30_000)
        with urllib.request.urlopen(page.locator("#mask img").first.get_attribute("src")) as response:
            mask = np.asarray(Image.open(io.BytesIO(response.read())).convert("L"))
        assert mask.shape == (512, 512) and 0.001 < (mask > 127).mean() < 0.2  # the stroke, on the image's grid
        page.get_by_label("Paste the image back outside the mask").check()
        page.locator("#run").click()
        page.wait_for_function("document.querySelector('#run_summary')?.innerText.includes('pasted back')",
                               timeout=180_000)
        assert "masked" in page.locator("#run_summary").inner_text()
    finally:
        page.context.close()
