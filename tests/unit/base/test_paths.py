"""What GhostEdit keeps under GHOSTEDIT_HOME: the compile caches a restarted process (or a new machine given only
that folder, a Space's persistent storage) finds again."""
import os
import subprocess
import sys


def caches_after_import(env: dict) -> list[str]:
    script = "import os, ghostedit; print(os.environ['TORCHINDUCTOR_CACHE_DIR']); print(os.environ['TRITON_CACHE_DIR'])"
    return subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True,
                          check=True).stdout.split()


def test_compile_caches_live_under_ghostedit_home(tmp_path):
    env = {key: value for key, value in os.environ.items() if key not in ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR")}
    assert caches_after_import({**env, "GHOSTEDIT_HOME": str(tmp_path)}) == [str(tmp_path / "inductor-cache"),
                                                                           str(tmp_path / "triton-cache")]
    # a folder the person named is kept
    assert caches_after_import({**env, "GHOSTEDIT_HOME": str(tmp_path), "TRITON_CACHE_DIR": "/elsewhere"})[1] == \
        "/elsewhere"
