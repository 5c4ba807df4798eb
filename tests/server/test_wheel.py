"""GhostEdit as a wheel ships what it reads at run time: the package is built (`pip wheel`) from the files pyproject.toml
names, installed into an empty folder (`pip install --target`, the dependencies from this environment), and served
from outside the repository on the tiny model; the page's toggles show the measured figures of the package data, and
ZeroGPU's durations come from them, as in the repository."""
import json
import os
import shutil
import subprocess
import sys

import pytest
from gradio_client import Client

from app_server import REPO, running_app
from ghostedit import figures
from ghostedit.ui import gpu

SOURCES = ("pyproject.toml", "requirements.txt", "README.md", "ghostedit")   # what the build reads
LAUNCHER = "import sys\nfrom ghostedit.cli import main\nsys.exit(main(['serve', *sys.argv[1:]]))\n"


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """(the folder the wheel is installed in, an empty folder outside the repository with a launcher for the app)."""
    folder = tmp_path_factory.mktemp("wheel")
    shutil.copytree(REPO, folder / "src", ignore=lambda path, names: [
        name for name in names if name == "__pycache__" or (path == str(REPO) and name not in SOURCES)])
    pip = [sys.executable, "-m", "pip", "-q", "--disable-pip-version-check"]
    subprocess.run([*pip, "wheel", "--no-deps", "-w", folder / "dist", folder / "src"], check=True)
    wheel, = (folder / "dist").glob("ghostedit-*.whl")
    subprocess.run([*pip, "install", "--no-deps", "--target", folder / "site", wheel], check=True)
    outside = folder / "outside"
    outside.mkdir()
    (outside / "serve.py").write_text(LAUNCHER)
    return folder / "site", outside


def in_installed(site, outside, code: str) -> str:
    """What `code` prints in a process that imports GhostEdit from the installed wheel."""
    ran = subprocess.run([sys.executable, "-c", code], cwd=outside, env={**os.environ, "PYTHONPATH": str(site)},
                         capture_output=True, text=True)
    assert ran.returncode == 0, ran.stderr[-3000:]
    return ran.stdout


def test_the_installed_wheel_holds_the_figures_and_zerogpu_durations(installed):
    site, outside = installed
    found = json.loads(in_installed(site, outside, (
        "import json, ghostedit\nfrom ghostedit import figures\nfrom ghostedit.ui import gpu\n"
        "print(json.dumps({'file': ghostedit.__file__, 'info': figures.toggle_info('fp8'),"
        " 'seconds': gpu.gpu_seconds({'steps': 4, 'cfg_scale': 1}, 1024 * 1024, 40)}))")))
    assert found["file"].startswith(str(site))   # the wheel's GhostEdit, not the repository's
    assert found["info"] == figures.toggle_info("fp8") and "Measured on" in found["info"]
    assert found["seconds"] == gpu.gpu_seconds({"steps": 4, "cfg_scale": 1}, 1024 * 1024, 40) < gpu.GPU_SECONDS_MAX


def test_the_app_served_from_the_wheel_shows_the_measured_figures(installed, tmp_path):
    site, outside = installed
    with running_app(tmp_path, outside / "serve.py", env={"PYTHONPATH": str(site)}, cwd=outside) as app:
        config = Client(app.url, verbose=False).config
    info = {component["props"].get("elem_id"): component["props"].get("info") for component in config["components"]}
    for setting in ("fp8", "compile", "attention"):
        assert info[setting] == figures.toggle_info(setting), setting
        assert f"Measured on {figures.measured_on(figures.PAGE_RUN)}" in info[setting]
