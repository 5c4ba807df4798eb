"""What importing Transformer Engine changes in a PyTorch process, and how TE stores FP8 weights (GPU machine).

    python3 scripts/gpu/te_probe.py            # without TE
    python3 scripts/gpu/te_probe.py with-te    # TE imported right after torch through GhostEdit's import_te
    python3 scripts/gpu/te_probe.py with-te raw  # plain `import transformer_engine.pytorch`

Prints the cuDNN version torch runs with, times SDPA with PyTorch's own dispatch and with the cuDNN kernel forced,
and a bf16 GEMM, at the Qwen DiT's shapes; with TE, also the type and bytes of a te.Linear weight created under
TE's quantized model init.
"""
import sys

import torch

if "with-te" in sys.argv:
    from ghostedit.optimize.te import import_te
    te = import_te() if "raw" not in sys.argv else __import__("transformer_engine.pytorch").pytorch
from torch.nn.attention import SDPBackend, sdpa_kernel

from ghostedit.telemetry import median_ms


def ms(fn, repeats=20):
    return round(median_ms(fn, "cuda", repeats, warmup=3), 3)


def forced_cudnn(q, k, v):
    with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v)


x = torch.randn(8448, 3072, device="cuda", dtype=torch.bfloat16)
w = torch.randn(12288, 3072, device="cuda", dtype=torch.bfloat16)
q, k, v = (torch.randn(1, 24, 8448, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))
try:
    cudnn = torch.backends.cudnn.version()
except RuntimeError as error:  # the failure this probe exists to show
    cudnn = "UNUSABLE: " + str(error).splitlines()[0][:160]
print("TE imported:", "with-te" in sys.argv, "raw" if "raw" in sys.argv else "", "| cuDNN seen by torch:", cudnn)
print("gemm 8448x3072x12288 ms", ms(lambda: torch.nn.functional.linear(x, w)))
print("sdpa, PyTorch's dispatch, ms", ms(lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v)))
try:
    print("sdpa, cuDNN forced, ms", ms(lambda: forced_cudnn(q, k, v)))
except RuntimeError as error:
    print("sdpa, cuDNN forced: FAILS:", str(error).splitlines()[0][:300])

if "with-te" in sys.argv:
    from ghostedit.optimize.te import _model_init, recipe
    from ghostedit.tensors import storage_bytes
    start = torch.cuda.memory_allocated()
    with _model_init(recipe("current")):
        linear = te.Linear(3072, 12288, params_dtype=torch.bfloat16, device="cuda")
    print("te.Linear under quantized init:", type(linear.weight).__name__, linear.weight.dtype,
          "| allocated MiB", round((torch.cuda.memory_allocated() - start) / 2**20, 1),
          "(bf16 weight would be 72, FP8 36) | storage_bytes MiB", round(storage_bytes(linear) / 2**20, 1),
          "| has __tensor_flatten__:", hasattr(linear.weight, "__tensor_flatten__"))
