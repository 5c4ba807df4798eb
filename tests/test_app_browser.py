"""The real app in a real browser: headless Debian chromium driven by playwright (never `playwright install`)."""
import os
import re
from pathlib import Path

import pytest
from playwright.sync_api import TimeoutError as PlaywrightTimeoutError, expect

from conftest import ASSETS

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
RUN_TIMEOUT_MS = 180_000
TOAST = "[data-testid=toast-body]"


@pytest.fixture(scope="module")
def browser():
    if not CHROMIUM.exists():
        pytest.fail(f"{CHROMIUM} is missing: install Debian's chromium (apt-get install -y chromium)")
    from playwright.sync_api import sync_playwright
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS)
        yield browser
        browser.close()


VIEWPORTS = {"phone": {"width": 390, "height": 844}, "desktop": {"width": 1440, "height": 900}}
# the committed screenshots (docs/screenshots) are renewed with GHOSTEDIT_SCREENSHOTS=docs/screenshots; a plain
# test run leaves its own in test-artifacts/, so that it changes nothing in git
SCREENSHOTS = Path(__file__).resolve().parent.parent / os.environ.get("GHOSTEDIT_SCREENSHOTS",
                                                                      "test-artifacts/screenshots")

# Words of every table cell on the page that are broken across lines or cut off by their cell: a table is readable
# when each cell is at least as wide as its longest word (or the table scrolls sideways)
UNREADABLE_WORDS = """() => {
  const bad = [];
  for (const cell of document.querySelectorAll('table th, table td')) {
    const box = cell.getBoundingClientRect();
    if (box.width === 0 || box.height === 0) continue;  // Gradio's hidden measuring rows
    const walker = document.createTreeWalker(cell, NodeFilter.SHOW_TEXT);
    for (let node = walker.nextNode(); node; node = walker.nextNode()) {
      for (const match of node.textContent.matchAll(/\\S+/g)) {
        const range = document.createRange();
        range.setStart(node, match.index);
        range.setEnd(node, match.index + match[0].length);
        const rects = [...range.getClientRects()].filter((rect) => rect.width > 0);
        const lines = new Set(rects.map((rect) => Math.round(rect.top)));
        const cut = rects.some((rect) => rect.right > box.right + 1 || rect.bottom > box.bottom + 1);
        if (lines.size > 1 || cut) bad.push(`${match[0]} (${lines.size > 1 ? 'broken' : 'cut'}, in a cell ` +
                                            `${Math.round(box.width)}x${Math.round(box.height)} px)`);
      }
    }
  }
  return bad;
}"""
WATCH_PROGRESS_BAR = """() => {
  window.sawProgressBar = false;
  new MutationObserver(() => { if (document.querySelector('#status progress')) window.sawProgressBar = true; })
    .observe(document.body, {subtree: true, childList: true});
}"""


def open_page(browser, app, viewport=VIEWPORTS["desktop"]):
    """A page in a context of its own: its own browser storage, so its own history."""
    page = browser.new_context(viewport=viewport).new_page()
    page.goto(app.url, wait_until="load")
    page.wait_for_selector("#run", timeout=60_000)
    return page


@pytest.fixture
def page(browser, app):
    page = open_page(browser, app)
    yield page
    page.context.close()


def assert_tables_readable(page, where: str) -> None:
    page.wait_for_timeout(300)  # column widths settle after an update
    unreadable = page.evaluate(UNREADABLE_WORDS)
    assert not unreadable, f"words broken or cut in the tables of {where}: {unreadable}"


def set_number(page, elem_id: str, value) -> None:
    box = page.locator(f"#{elem_id} input[type=number]")
    box.fill(str(value))
    box.press("Enter")


def choose(page, elem_id: str, option_text: str) -> None:
    """Picks the first option naming `option_text`, and fails here if the dropdown did not take it."""
    combobox = page.locator(f"#{elem_id} input[role=combobox]")
    combobox.click()
    page.locator("ul[role=listbox] li[role=option]", has_text=option_text).first.click()
    expect(combobox).to_have_value(re.compile(re.escape(option_text)))


def history_rows(page) -> int:
    return page.locator("#history .virtual-row").count()


def wait_for_rows(page, rows: int) -> None:
    """Until the history has `rows` runs; an error shown meanwhile fails at once, with its words."""
    page.wait_for_function(f"document.querySelectorAll('#history .virtual-row').length === {rows}"
                           f" || document.querySelector('{TOAST} .toast-title.error') !== null", timeout=RUN_TIMEOUT_MS)
    assert history_rows(page) == rows, f"an error was shown: {toast_texts(page)}"


def toast_texts(page) -> list[str]:
    return page.locator(TOAST).all_inner_texts()


def fill_edit(page, prompt="turn it into a haunted house at night") -> None:
    page.locator("#input_image input[type=file]").set_input_files(str(ASSETS / "house.png"))
    page.locator("#prompt textarea").fill(prompt)
    for elem_id, value in (("steps", 2), ("width", 128), ("height", 128)):
        set_number(page, elem_id, value)


@pytest.mark.parametrize("screen", list(VIEWPORTS))
def test_edit_compare_and_reload_readable_on_every_screen(browser, app, screen):
    """Runs from the keyboard, shows a progress bar, keeps every table readable at 390 px and 1440 px wide, and
    keeps the history across a page reload."""
    page = open_page(browser, app, VIEWPORTS[screen])
    fill_edit(page)
    page.evaluate(WATCH_PROGRESS_BAR)
    page.locator("#prompt textarea").press("Control+Enter")
    wait_for_rows(page, 1)
    assert page.evaluate("window.sawProgressBar")
    assert page.locator("#result img").count() == 2  # before and after
    assert "Done in" in page.locator("#status").inner_text()
    assert "stage" in page.locator("#run_summary").inner_text()

    choose(page, "fp8", "storage")
    page.wait_for_function("document.querySelector('#prepare_notice').innerText.includes('fp8-storage')")
    page.locator("#prompt textarea").press("Enter")  # Enter in the instruction runs too
    wait_for_rows(page, 2)
    table = page.locator("#history").inner_text()
    assert "fp8-storage" in table and "(baseline)" in table and "haunted house" in table
    page.wait_for_selector("#outputs_gallery img", timeout=30_000)
    page.wait_for_selector("#time_plot canvas, #time_plot svg", timeout=30_000)
    assert_tables_readable(page, f"the edit tab at {screen} width")
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    size = VIEWPORTS[screen]
    page.screenshot(path=str(SCREENSHOTS / f"ghostedit-{size['width']}x{size['height']}.png"), full_page=True)

    page.reload(wait_until="load")
    page.wait_for_selector("#run", timeout=60_000)
    wait_for_rows(page, 2)
    assert "fp8-storage" in page.locator("#history").inner_text()

    page.get_by_role("tab", name="System").click()
    page.wait_for_function("document.querySelectorAll('#backends .virtual-row').length > 5", timeout=30_000)
    assert_tables_readable(page, f"the System tab at {screen} width")
    page.context.close()


def test_reuse_settings_aspect_presets_several_images_and_dark_mode(page):
    page.locator("#aspect").get_by_label("1:1").check()
    page.wait_for_function("document.querySelector('#width input[type=number]').value === '256'")
    assert page.locator("#height input[type=number]").input_value() == "256"
    fill_edit(page, "make it night")
    set_number(page, "count", 2)
    page.locator("#run").click()
    wait_for_rows(page, 2)
    page.wait_for_function("document.querySelectorAll('#run_images img').length === 2", timeout=30_000)
    table = page.locator("#history").inner_text()
    assert "seed 0" in page.locator("#run_images").inner_text() and "seed 1" in page.locator("#run_images").inner_text()

    set_number(page, "seed", 7)
    page.locator("#prompt textarea").fill("something else")
    choose(page, "reuse_run", "#1 ")
    page.locator("#reuse").click()
    page.wait_for_function("document.querySelector('#prompt textarea').value === 'make it night'")
    assert page.locator("#seed input[type=number]").input_value() == "0"
    assert "#1" in table

    assert not page.evaluate("document.body.classList.contains('dark')")
    page.locator("#theme_toggle").click()
    assert page.evaluate("document.body.classList.contains('dark')")
    page.reload(wait_until="load")
    page.wait_for_selector("#run", timeout=60_000)
    assert page.evaluate("document.body.classList.contains('dark')")  # kept in this browser


def test_unavailable_choice_shows_the_reason_and_is_refused(page):
    page.locator("#fp8 input[role=combobox]").click()
    option = page.locator("ul[role=listbox] li[role=option]", has_text="torchao")
    assert "unavailable: torchao FP8 compute needs a CUDA GPU" in option.inner_text()
    option.click()
    page.wait_for_function("document.querySelector('#prepare_notice').innerText.includes('unavailable')")
    fill_edit(page, "make it night")
    page.locator("#run").click()
    toast = page.locator(TOAST)
    toast.wait_for(timeout=30_000)
    assert "needs a CUDA GPU" in toast.inner_text()
    assert history_rows(page) == 0

    choose(page, "fp8", "off")
    # the notice changes the page's layout under the run button: a click while it moves may miss
    page.wait_for_function("!document.querySelector('#prepare_notice').innerText.includes('unavailable')")
    page.locator("#run").click()  # the earlier error is not this run's: its toast goes
    try:
        page.locator(TOAST, has_text="needs a CUDA GPU").wait_for(state="detached", timeout=5_000)
    except PlaywrightTimeoutError:
        pytest.fail(f"the earlier error is still shown: {toast_texts(page)}")
    wait_for_rows(page, 1)


# ---- Qwen-Image-2.1 on the page ----

@pytest.fixture(scope="module")
def app_21(tmp_path_factory):
    from app_server import running_app
    with running_app(tmp_path_factory.mktemp("app-2.1"), model="tiny-2.1") as running:
        yield running


def test_qwen_image_21_generates_without_an_image_edits_four_and_shows_transparency(browser, app_21, tmp_path):
    """The tiny 2.1 on the page: both 2.1 repos offered; a run with no input image (text-to-image); a run with four
    transparent references; the output a PNG with its alpha channel, shown over a checkerboard."""
    import io

    import numpy as np
    from PIL import Image

    page = open_page(browser, app_21)
    page.locator("#model input[role=combobox]").click()
    offered = page.locator("ul[role=listbox] li[role=option]").all_inner_texts()
    assert "Qwen/Qwen-Image-2.1" in offered and "Qwen/Qwen-Image-2.1-Turbo" in offered, offered
    page.keyboard.press("Escape")
    assert page.locator("#cfg input[type=number]").input_value() == "1", "2.1 runs without guidance by default"
    page.locator("#prompt textarea").fill("a lighthouse at dusk")
    for elem_id, value in (("steps", 2), ("width", 64), ("height", 64)):
        set_number(page, elem_id, value)
    page.locator("#run").click()
    wait_for_rows(page, 1)
    after = page.locator("#result img").last
    assert all("conic-gradient" in background for background in page.evaluate(
        "() => [...document.querySelectorAll('#result img')].map(image => getComputedStyle(image).backgroundImage)"))
    png = Image.open(io.BytesIO(page.request.get(after.get_attribute("src")).body()))
    assert png.mode == "RGBA" and png.size == (64, 64)

    pixels = np.zeros((48, 64, 4), dtype=np.uint8)
    pixels[..., 2], pixels[:, 32:, 3] = 200, 255
    half = tmp_path / "half.png"
    Image.fromarray(pixels, "RGBA").save(half)
    page.get_by_text("More input images").click()
    for elem_id in ("input_image", "input_image_2", "input_image_3", "input_image_4"):
        page.locator(f"#{elem_id} input[type=file]").set_input_files(str(half))
    page.locator("#prompt textarea").fill("put the four together")
    page.locator("#run").click()
    wait_for_rows(page, 2)
    png = Image.open(io.BytesIO(page.request.get(page.locator("#result img").last.get_attribute("src")).body()))
    assert png.mode == "RGBA"
    page.context.close()
