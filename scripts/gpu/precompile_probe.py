"""Does torch's caching precompile (TORCH_CACHING_PRECOMPILE=1: Dynamo's traced code and guards kept on disk) take the
Dynamo trace out of a restarted process's first call, for an FP8 + compiled configuration? Each mode runs the DiT
bench twice in new processes sharing one compile cache (cold, then restart) and prints prepare s, first call s and
the output's error against stock (equal errors: the same output). Two torchao 0.18 gaps stop the precompile's guard serialization, worked around here only:
Float8Tensor has no `empty_like` (registered to act on its inner tensors) and `quantize_` binds a functools.partial
as each Linear's `extra_repr` (dropped). On the GPU machine after setup.sh, or on a CPU with the tiny model:
    python3 scripts/gpu/precompile_probe.py --model synthetic --config best
    python3 scripts/gpu/precompile_probe.py --model tiny --device cpu --config compile=regional,fp8=storage"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
WORKAROUNDS = """
import sys, torch
from torchao.quantization import Float8Tensor
import torchao.quantization as torchao_quantization
import torchao.quantization.quant_api as quant_api
Float8Tensor.implements(torch.ops.aten.empty_like.default)(
    lambda func, types, args, kwargs: args[0]._apply_fn_to_data(lambda x: func(x, *args[1:], **kwargs)))
quantize = quant_api.quantize_
def quantize_without_bound_repr(model, *args, **kwargs):
    result = quantize(model, *args, **kwargs)
    for module in model.modules():
        module.__dict__.pop("extra_repr", None)
    return result
quant_api.quantize_ = torchao_quantization.quantize_ = quantize_without_bound_repr
from ghostedit.cli import main
sys.exit(main(sys.argv[1:]))
"""


def bench(args, precompile: bool, cache: str, out: Path) -> dict:
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": cache, "TORCH_CACHING_PRECOMPILE": "1" if precompile else "0"}
    command = ["bench", "--model", args.model, "--level", "dit", "--shapes", str(args.side), "--repeats", "2",
               "--configs", "baseline", args.config, "--out-dir", str(out)] + (["--device", args.device] if args.device else [])
    subprocess.run([sys.executable, "-c", WORKAROUNDS, *command], cwd=REPO, env=env, check=True,
                   stdout=subprocess.DEVNULL)
    row = json.loads((out / "results.json").read_text())["rows"][1]  # the error against stock: the same output
    return {name: row[name] for name in ("prepare_s", "first_call_s", "ms_per_forward", "rel_error")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="synthetic")
    parser.add_argument("--device", default=None)
    parser.add_argument("--config", default="best")
    parser.add_argument("--side", type=int, default=1024)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="precompile-probe-"))
    os.environ["GHOSTEDIT_HOME"] = str(work / "home")  # no compiled packages from earlier runs
    for precompile in (False, True):
        cache = str(work / f"inductor-{precompile}")
        for run in ("cold", "restart"):
            found = bench(args, precompile, cache, work / f"{precompile}-{run}")
            print(json.dumps({"precompile": precompile, "run": run, **found}), flush=True)
        for package in (work / "home" / "compiled").glob("*"):
            package.unlink()


if __name__ == "__main__":
    main()
