#!/usr/bin/env bash
# On the GPU machine (no network): install the wheels carried there, then print what the machine has.
# Source it: `source scripts/gpu/setup.sh`.
# Wheels arrive over several device calls (at most 64 MiB each; ../shared/tools/device-wheels lays them out):
# each call copies its whole wheels into /tmp/wheels and its 45 MiB parts into /tmp/parts:
#   mkdir -p /tmp/wheels /tmp/parts; cp .whl-x/*.whl /tmp/wheels/; cp .whl-x-partN/* /tmp/parts/
# This reassembles the parts and installs everything in ONE pip call (pip --target replaces a package folder
# that a later call installs again).
set -u
if [ ! -d /tmp/site/diffsynth ]; then
  mkdir -p /tmp/wheels
  if [ -d /tmp/parts ]; then
    (cd /tmp/parts && for w in $(ls | sed 's/\.part[0-9]*$//' | sort -u); do cat "$w".part* > "/tmp/wheels/$w"; done)
  fi
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site /tmp/wheels/*.whl 2>&1 |
    { grep -v "^WARNING: Target directory" || true; } | tail -5
fi
export PYTHONPATH=/tmp/site:/tmp/site/nvidia_cutlass_dsl/dsl_packages:$PWD:/tmp/site-te  # site-te: scripts/gpu/install_te.sh
export GHOSTEDIT_HOME=/tmp/ghostedit-home PYTHONUNBUFFERED=1
# What the machine has; QUIET_SETUP=1 (scripts/gpu/bench.sh) skips the report, whose imports take ~15 s
[ -n "${QUIET_SETUP:-}" ] && return 0
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader
python3 - <<'PY'
import importlib
import torch
print("torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.get_device_name())
for name in ("diffsynth", "torchao", "transformers", "flash_attn.cute", "transformer_engine.pytorch"):
    try:
        module = importlib.import_module(name)
        print(name, getattr(module, "__version__", "ok"))
    except Exception as error:
        print(name, "NOT AVAILABLE:", type(error).__name__, str(error).splitlines()[0][:200])
PY
