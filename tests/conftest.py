"""Shared fixtures: every test runs on the embedded tiny model, generated once per session into a temp home."""
import os
import tempfile
from pathlib import Path

import pytest

# Before ghostedit is imported anywhere: the tiny model and caches go to a fresh folder for this session.
os.environ.setdefault("GHOSTEDIT_HOME", tempfile.mkdtemp(prefix="ghostedit-test-home-"))
# Inductor checks each vector ISA the CPU flags allow by building a C++ probe and loading it in a new Python
# process: about 15 s for every process that compiles (this one, the servers, the subprocess tests). The CPU flags
# still choose the ISA; only that check is skipped, here and in the processes the tests start.
os.environ.setdefault("TORCHINDUCTOR_VEC_ISA_OK", "1")

REPO = Path(__file__).resolve().parent.parent
ASSETS = REPO / "assets" / "examples"
ARTIFACTS = REPO / "test-artifacts"
# The tiers are folders (the markers of pytest.ini mark three of them): unit/<part of the package>/ (no server, no
# browser), engine/ (whole edits and the reference against diffusers), server/ (the real app or another server over
# HTTP), browser/ (chromium against the real app), gpu/ (the GPU machine's)
MARKED_TIERS = ("server", "browser", "gpu")
BROWSER_FIXTURES = {"browser", "page"}  # a browser test in a server file (its tier is both)


@pytest.hookimpl(tryfirst=True)  # before -m deselects by marker
def pytest_collection_modifyitems(items):
    for item in items:
        tier = item.path.relative_to(Path(__file__).parent).parts[0]
        if tier in MARKED_TIERS:
            item.add_marker(getattr(pytest.mark, tier))
        if BROWSER_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.browser)


def pytest_report_header(config):
    if config.option.markexpr == "not gpu":
        return ("gpu tier (tests/gpu/) deselected: it needs a CUDA GPU; on the GPU machine: "
                "python -m pytest -m gpu tests/gpu")


@pytest.fixture(scope="session")
def engine():
    from ghostedit.engine import Engine
    return Engine("tiny", device="cpu")


@pytest.fixture(scope="session")
def house():
    from PIL import Image
    return Image.open(ASSETS / "house.png").convert("RGB")


@pytest.fixture(scope="session")
def artifacts():
    ARTIFACTS.mkdir(exist_ok=True)
    return ARTIFACTS


@pytest.fixture(scope="session")
def app(tmp_path_factory):
    """The real app on the tiny model, served on 127.0.0.1 for the API and browser tests."""
    from app_server import running_app
    with running_app(tmp_path_factory.mktemp("app")) as running:
        yield running
