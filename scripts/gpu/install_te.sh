#!/usr/bin/env bash
# Runs on the GPU machine (no network), from the repo root, in the last of the transfers that
# scripts/gpu/build_te_wheel.sh prints: earlier calls copied .whl-te-partN/* into /tmp/parts, this call
# carries .whl-te. Reassembles the core wheel, installs every wheel in ONE pip call into /tmp/site-te
# (pip --target replaces a package folder that a later call installs again), then a smoke test.
#
#   bash scripts/gpu/install_te.sh [OTHER.whl ...]    # then: source scripts/gpu/setup.sh
set -euo pipefail
site=${SITE:-/tmp/site-te} parts=${PARTS:-/tmp/parts}  # site-te: on the PYTHONPATH scripts/gpu/setup.sh sets
cd "$(dirname "$0")/.."
mkdir -p "$parts"
cp .whl-te/*.part[0-9]* "$parts/" 2>/dev/null || true   # a last part may ride in .whl-te itself
whls=(.whl-te/*.whl)
for w in $(ls "$parts" | sed 's/\.part[0-9]*$//' | sort -u); do
  cat "$parts/$w".part* > "/tmp/$w"
  whls+=("/tmp/$w")
done
(cd /tmp && sha256sum -c "$OLDPWD/.whl-te/SHA256SUMS")   # every part arrived, in order
python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target "$site" "${whls[@]}" "$@"
export PYTHONPATH=$site${PYTHONPATH:+:$PYTHONPATH}

python3 - <<'EOF'
import torch, transformer_engine, transformer_engine.pytorch as te, transformer_engine_torch as tex
from transformer_engine.common.recipe import Float8CurrentScaling
print("torch", torch.__version__, torch.version.git_version[:8], "| TE", transformer_engine.__version__, "| cuDNN", tex.get_cudnn_version(), "|", torch.cuda.get_device_name())
lin = te.Linear(256, 256, params_dtype=torch.bfloat16, device="cuda")
x = torch.randn(64, 256, device="cuda", dtype=torch.bfloat16, requires_grad=True)
with te.autocast(enabled=True, recipe=Float8CurrentScaling()):  # = te.fp8_autocast(fp8_recipe=...), deprecated
    y = lin(x)
y.float().sum().backward()
ref = x.detach().float() @ lin.weight.detach().float().t() + lin.bias.detach().float()
print("fp8 Linear", tuple(y.shape), y.dtype, "rel err vs fp32 %.3g" % ((y.float() - ref).norm() / ref.norm()).item(), "| grad", x.grad is not None)
EOF
