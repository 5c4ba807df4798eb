"""The real app in a real browser: headless Debian chromium driven by playwright (never `playwright install`)."""
from pathlib import Path

import pytest

from conftest import ASSETS

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
RUN_TIMEOUT_MS = 180_000


@pytest.fixture(scope="module")
def browser():
    if not CHROMIUM.exists():
        pytest.fail(f"{CHROMIUM} is missing: install Debian's chromium (apt-get install -y chromium)")
    from playwright.sync_api import sync_playwright
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS)
        yield browser
        browser.close()


@pytest.fixture
def page(browser, app):
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    page.goto(app.url, wait_until="load")
    page.wait_for_selector("#run", timeout=60_000)
    yield page
    page.close()


def set_number(page, elem_id: str, value) -> None:
    box = page.locator(f"#{elem_id} input[type=number]")
    box.fill(str(value))
    box.press("Enter")


def choose(page, elem_id: str, option_text: str) -> None:
    page.locator(f"#{elem_id} input[role=combobox]").click()
    page.locator("ul[role=listbox] li[role=option]", has_text=option_text).first.click()


def history_rows(page) -> int:
    return page.locator("#history .virtual-row").count()


def test_edit_in_the_browser_then_compare(page, artifacts):
    page.locator("#input_image input[type=file]").set_input_files(str(ASSETS / "house.png"))
    page.locator("#prompt textarea").fill("turn it into a haunted house at night")
    for elem_id, value in (("steps", 3), ("width", 128), ("height", 128)):
        set_number(page, elem_id, value)
    page.locator("#run").click()
    page.wait_for_function("document.querySelectorAll('#history .virtual-row').length === 1",
                           timeout=RUN_TIMEOUT_MS)
    assert page.locator("#result img").count() == 2  # before and after
    assert "Done in" in page.locator("#status").inner_text()
    assert "stage" in page.locator("#run_summary").inner_text()

    choose(page, "fp8", "storage")
    page.wait_for_function("document.querySelector('#prepare_notice').innerText.includes('fp8-storage')")
    page.locator("#run").click()
    page.wait_for_function("document.querySelectorAll('#history .virtual-row').length === 2",
                           timeout=RUN_TIMEOUT_MS)
    table = page.locator("#history").inner_text()
    assert "fp8-storage" in table and "(baseline)" in table
    page.wait_for_selector("#outputs_gallery img", timeout=30_000)
    page.screenshot(path=str(artifacts / "app-after-two-runs.png"), full_page=True)


def test_unavailable_choice_shows_the_reason_and_is_refused(page):
    page.locator("#fp8 input[role=combobox]").click()
    option = page.locator("ul[role=listbox] li[role=option]", has_text="torchao")
    assert "unavailable: torchao FP8 compute needs a CUDA GPU" in option.inner_text()
    option.click()
    page.wait_for_function("document.querySelector('#prepare_notice').innerText.includes('unavailable')")
    page.locator("#input_image input[type=file]").set_input_files(str(ASSETS / "house.png"))
    page.locator("#prompt textarea").fill("make it night")
    page.locator("#run").click()
    toast = page.locator("[data-testid=toast-body]")
    toast.wait_for(timeout=30_000)
    assert "needs a CUDA GPU" in toast.inner_text()
    assert history_rows(page) == 0
