"""A configuration's compiled code is kept as a package: a process with empty compile caches that finds the package
loads the code instead of compiling it."""
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
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
    second = run_edit(str(tmp_path), image)
    assert second["misses"] == 0 and second["hits"] > 0
    assert "loaded from a compiled package" in second["report"]
