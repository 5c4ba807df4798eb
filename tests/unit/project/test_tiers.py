"""The test tiers: folders under tests/ (unit/<part of the package>, engine, server, browser, gpu); the server,
browser and gpu tests get their tier's marker by their folder or a browser fixture (tests/conftest.py, the markers of
pytest.ini), and `python -m pytest` deselects the gpu tier, which `-m gpu` selects on the GPU machine."""
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
THIS = "tests/unit/project/test_tiers.py"


def collected(*args: str) -> tuple[set[str], str]:
    """The test files `pytest --collect-only` selects with these arguments after pytest.ini's, and its output."""
    ran = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-n", "0", "-p", "no:cacheprovider",
                          *args], cwd=REPO, capture_output=True, text=True)
    assert ran.returncode in (0, 5), ran.stdout + ran.stderr  # 5: no test selected
    return {line.split("::")[0] for line in ran.stdout.splitlines() if "::" in line}, ran.stdout


def test_the_gpu_tier_is_deselected_unless_asked_for():
    files, output = collected("tests/gpu", THIS)
    assert files == {THIS} and "deselected" in output
    files, _ = collected("-m", "gpu", "tests/gpu", THIS)
    assert files == {"tests/gpu/test_graph_check.py", "tests/gpu/test_parallel_smoke.py",
                     "tests/gpu/test_seed_check.py", "tests/gpu/test_qwen21_fp8_attention.py",
                     "tests/gpu/test_qwen21_graphs.py", "tests/gpu/test_qwen21_swiglu_quant.py",
                     "tests/gpu/test_text_encoder_graph_check.py"}


def test_browser_and_server_tests_are_marked_by_their_folder():
    paths = ("tests/browser/test_app_browser.py", "tests/server/test_mcp.py", THIS)
    assert collected("-m", "browser", *paths)[0] == {"tests/browser/test_app_browser.py"}
    assert collected("-m", "server", *paths)[0] == {"tests/server/test_mcp.py"}
    assert collected("-m", "not browser and not server", *paths)[0] == {THIS}


def test_a_browser_test_in_a_server_file_is_in_both_tiers():
    paths = ("tests/server/test_mask_app.py", "tests/server/test_latency.py")
    browser = collected("-m", "browser", *paths)[1]
    server_only = collected("-m", "server and not browser", *paths)[1]
    assert "test_a_stroke_painted_on_the_image_is_the_runs_mask" in browser
    assert "test_the_page_says_it_is_ready_and_fills_the_comparison_after_the_picture" in browser
    assert "test_a_stroke_painted_on_the_image_is_the_runs_mask" not in server_only
    assert "test_mask_app.py" in server_only and "test_latency.py" in server_only


def test_every_test_file_is_in_a_tier_and_the_unit_tier_mirrors_the_package():
    tests = REPO / "tests"
    assert not sorted(tests.glob("test_*.py")), "a test file outside the tiers' folders"
    tiers = {path.relative_to(tests).parts[0] for path in tests.rglob("test_*.py")}
    assert tiers == {"unit", "engine", "server", "browser", "gpu"}
    package = {path.stem if path.is_file() else path.name for path in (REPO / "ghostedit").iterdir()
               if not path.name.startswith("_")}
    for folder in (tests / "unit").iterdir():
        assert folder.name in package | {"base", "project"}, f"tests/unit/{folder.name} names no part of ghostedit"
