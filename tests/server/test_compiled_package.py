"""A configuration's compiled code is kept as a package: a process with empty compile caches that finds the package
loads the code instead of compiling it, also on another machine that installed the exported package (from a folder
or a Hub repo); a package made for another torch or device is refused with the reason."""
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import torch

from app_server import running_app
from fake_hub import Repo, hub_serving
from ghostedit.optimize import packages

REPO = Path(__file__).resolve().parents[2]
EDIT = """
import json, sys
from torch._dynamo.utils import counters
from ghostedit import EditRequest, OptimizationConfig
from ghostedit.engine import Engine
result = Engine("tiny", device="cpu").run(EditRequest(images=[sys.argv[1]], prompt="make it night", width=64,
                                                      height=64, steps=2), OptimizationConfig(compile="regional"))
print(json.dumps({"hits": counters["inductor"]["fxgraph_cache_hit"], "misses": counters["inductor"]["fxgraph_cache_miss"],
                  "report": result.prepared_report["compile"]}))
"""


def cli(home, *args) -> str:
    env = {**os.environ, "GHOSTEDIT_HOME": str(home)}
    return subprocess.run([sys.executable, "-m", "ghostedit", "compiled", *map(str, args)], cwd=REPO, env=env,
                          capture_output=True, text=True, check=True).stdout


def run_edit(home: str, image: str) -> dict:
    env = {**os.environ, "GHOSTEDIT_HOME": home, "TORCHINDUCTOR_CACHE_DIR": tempfile.mkdtemp()}  # empty caches
    out = subprocess.run([sys.executable, "-c", EDIT, image], cwd=REPO, env=env, capture_output=True, text=True,
                         check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def test_a_process_with_empty_caches_loads_the_compiled_package(tmp_path):
    image = str(REPO / "assets" / "examples" / "house.png")
    first = run_edit(str(tmp_path), image)
    assert first["misses"] > 0 and "compiled on first call" in first["report"]
    assert list((tmp_path / "compiled").glob("*.bin"))
    assert "compile-regional: torch" in cli(tmp_path, "list") and ", CPU, " in cli(tmp_path, "list")
    assert "exported compile-regional" in cli(tmp_path, "export", tmp_path / "shipped")
    other_machine = tmp_path / "other-machine"  # never compiled anything
    assert "installed compile-regional" in cli(other_machine, "install", tmp_path / "shipped", "--device", "cpu")
    second = run_edit(str(other_machine), image)
    assert second["misses"] == 0 and second["hits"] > 0
    assert "loaded from a compiled package" in second["report"]


def shipped_package(torch_version: str, device: str) -> dict[str, bytes]:
    manifest = {"configuration": "compile-regional", "torch": torch_version, "device": device, "saved": "2026-11-24"}
    return {"abc.bin": b"compiled code", "abc.json": json.dumps(manifest).encode()}


@pytest.mark.parametrize("torch_version, device, reason", [
    ("1.0.0", "CPU", "made with torch 1.0.0"),
    (None, "NVIDIA H100 80GB HBM3", "made for NVIDIA H100 80GB HBM3, this machine runs on CPU")])
def test_a_package_for_another_torch_or_device_is_refused_with_the_reason(tmp_path, monkeypatch, torch_version,
                                                                            device, reason):
    monkeypatch.setenv("GHOSTEDIT_HOME", str(tmp_path / "home"))
    for name, content in shipped_package(torch_version or torch.__version__, device).items():
        (tmp_path / name).write_bytes(content)
    [(package, refused)] = packages.install(str(tmp_path), "cpu")
    assert reason in refused and not list(packages.folder().glob("*.bin"))


def test_an_unreadable_manifest_is_named(tmp_path, monkeypatch):
    monkeypatch.setenv("GHOSTEDIT_HOME", str(tmp_path / "home"))
    (tmp_path / "abc.bin").write_bytes(b"compiled code")
    (tmp_path / "abc.json").write_text('{"configuration": "compile-regional"}')
    with pytest.raises(ValueError, match="abc.json is not a compiled-package manifest"):
        packages.install(str(tmp_path), "cpu")


def test_packages_install_from_a_hub_repo(tmp_path, monkeypatch):
    monkeypatch.setenv("GHOSTEDIT_HOME", str(tmp_path / "home"))
    repos = {"ghostedit/compiled-cpu": Repo({**shipped_package(torch.__version__, "CPU"), "README.md": b"hi"})}
    with hub_serving(repos, tmp_path / "hf-cache", monkeypatch):
        [(package, refused)] = packages.install("ghostedit/compiled-cpu", "cpu")
    assert refused is None
    installed = packages.listed()
    assert [p.configuration for p in installed] == ["compile-regional"]
    assert installed[0].path.read_bytes() == b"compiled code"
    assert installed[0].path == packages.package_path("compile-regional", torch.__version__, "CPU")


def test_the_app_installs_packages_before_serving(tmp_path):
    """A Space sets GHOSTEDIT_COMPILED_FROM: the app installs the packages before it serves, and says so."""
    shipped = tmp_path / "shipped"
    shipped.mkdir()
    for name, content in shipped_package(torch.__version__, "CPU").items():
        (shipped / name).write_bytes(content)
    home = tmp_path / "home"
    env = {"GHOSTEDIT_HOME": str(home), "GHOSTEDIT_COMPILED_FROM": str(shipped)}
    with running_app(tmp_path, env=env) as app:
        assert "installed compile-regional: torch" in app.log.read_text()
        key = packages.package_path("compile-regional", torch.__version__, "CPU").name
        assert (home / "compiled" / key).read_bytes() == b"compiled code"
