"""A configuration's compiled code is kept as a package: a process with empty compile caches that finds the package
loads the code instead of compiling it. The package is made here, by this process's first compiled edit; the
process that loads it is a new one."""
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

from ghostedit import EditRequest, OptimizationConfig
from ghostedit.models.tiny import TINY_MODEL_NAME, ensure_tiny_model

REPO = Path(__file__).resolve().parent.parent
IMAGE = REPO / "assets" / "examples" / "house.png"
REQUEST = dict(prompt="make it night", width=64, height=64, steps=2)
CONFIG = "compile=regional"
EDIT = f"""
import json, sys
from torch._dynamo.utils import counters
from ghostedit import EditRequest, OptimizationConfig
from ghostedit.engine import Engine
result = Engine("tiny", device="cpu").run(EditRequest(images=[sys.argv[1]], **{REQUEST!r}),
                                          OptimizationConfig.parse({CONFIG!r}))
print(json.dumps({{"hits": counters["inductor"]["fxgraph_cache_hit"], "misses": counters["inductor"]["fxgraph_cache_miss"],
                  "report": result.prepared_report["compile"]}}))
"""


def test_a_process_with_empty_caches_loads_the_compiled_package(tmp_path, monkeypatch):
    from ghostedit.engine import Engine
    os.symlink(ensure_tiny_model(), tmp_path / TINY_MODEL_NAME)  # the session's tiny model, in a home of its own
    monkeypatch.setenv("GHOSTEDIT_HOME", str(tmp_path))
    torch._dynamo.reset()  # this process's earlier compiles of the same blocks are not this configuration's
    made = Engine("tiny", device="cpu").run(EditRequest(images=[str(IMAGE)], **REQUEST), OptimizationConfig.parse(CONFIG))
    assert "compiled on first call" in made.prepared_report["compile"]
    assert list((tmp_path / "compiled").glob("*.bin"))

    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": tempfile.mkdtemp()}  # empty compile caches
    out = subprocess.run([sys.executable, "-c", EDIT, str(IMAGE)], cwd=REPO, env=env, capture_output=True,
                         text=True, check=True).stdout
    loaded = json.loads(out.strip().splitlines()[-1])
    assert loaded["misses"] == 0 and loaded["hits"] > 0
    assert "loaded from a compiled package" in loaded["report"]
