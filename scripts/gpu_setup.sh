#!/usr/bin/env bash
# On the GPU machine (no network): reassemble wheels carried in 45 MiB parts, install every carried wheel in one pip
# call into /tmp/site, and print what the machine has. Source it: `source scripts/gpu_setup.sh`.
# Carried folders (see ../shared/tools/device-wheels): .whl-* with whole wheels; parts copied beforehand into
# /tmp/parts by `mkdir -p /tmp/parts && cp .whl-<x>-partN/* /tmp/parts/`, one run call per part folder.
set -u
if [ ! -d /tmp/site/diffsynth ]; then
  if [ -d /tmp/parts ]; then
    (cd /tmp/parts && for w in $(ls | sed 's/\.part[0-9]*$//' | sort -u); do cat "$w".part* > "/tmp/$w"; done)
  fi
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl-*/*.whl /tmp/*.whl 2>&1 | grep -v "^WARNING: Target directory" | tail -5
fi
export PYTHONPATH=/tmp/site:/tmp/site/nvidia_cutlass_dsl/dsl_packages:$PWD
export GHOSTEDIT_HOME=/tmp/ghostedit-home PYTHONUNBUFFERED=1
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
