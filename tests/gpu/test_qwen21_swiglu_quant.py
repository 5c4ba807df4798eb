"""Qwen-Image-2.1's fused SwiGLU quantization computes what the path without it computes, on the GPU
(qwen21_swiglu_quant.py): the kernel against eager silu(gate) * up quantized by torchao, and the full-size synthetic
2.1 DiT with torchao's FP8 GEMMs over three steps with the prefix cache on, with the rewrite and without.

What is asserted and why:
- the kernel, on the rows a 1024x1024 edit with one reference computes (12288 wide): every scale bit for bit equal to
  torchao's (the same bf16 amax, the same product with float32's 1 / 448 rounded to bf16); the FP8 values' bytes
  equal but for at most VALUES_DIFFERING of them, each one FP8 step from torchao's. The kernel does every rounding
  eager PyTorch and torchao do, in the same order and mode (the SiLU with CUDA's expf from libdevice and an IEEE
  division, rounded to bf16; the bf16 product; an IEEE division by the scale; the FP8 cast to nearest even), so all
  are expected equal; the allowance is for a rounding tie that a last-bit difference of the SiLU's float32 value
  (libdevice in Triton's build against PyTorch's nvcc build) would send the other way, which only a GPU run could
  rule out. A row of zeros gets zeros and the kernel's floor scale (torchao's zero scale would give NaN). The down
  projection of the kernel's output (seams.fp8_linear, torchao's own torch._scaled_mm call) equals torchao's layer
  on eager's product bit for bit where the values and scales are equal, and within DOWN_PROJECTION otherwise.
- the DiT: the kernel runs once per block at every step (every token passes the feed-forward, at the filling step and
  at the cached ones), never without the rewrite; the first block's feed-forward output at the first step (the
  same input either way) is within DOWN_PROJECTION of the one without it (a float32 scale instead of torchao's bf16
  one moves such an output by 1e-2, one FP8 step in one value of every row by 7e-4: random rows and weights of
  these sizes, the GEMM emulated in float32 on a CPU); each step's prediction is within
  PREDICTION_TOLERANCE of the one without it, the bound tests/gpu/test_qwen21_fp8_attention.py sets for any change of
  rounding over torchao's FP8 GEMMs (every block quantizes its activations again and random weights carry each
  flipped rounding on); a wrong path moves it by order 1. Whether each prediction is bit for bit the same is
  reported beside it (expected where the kernel's values are torchao's)."""
import json
import math

from gpu_scripts import run_script

VALUES_DIFFERING = 1e-5      # of the FP8 values, at most
DOWN_PROJECTION = 1e-3       # relative
PREDICTION_TOLERANCE = 0.35  # relative, each step


def test_the_fused_swiglu_quantization_computes_torchaos_quantization_of_eager_swiglu(tmp_path):
    run_script("qwen21_swiglu_quant.py", "--out", str(tmp_path))
    report = json.loads((tmp_path / "qwen21-swiglu-quant" / "qwen21-swiglu-quant.json").read_text())
    kernel = report["kernel"]
    assert kernel["scales_equal"], kernel
    assert kernel["values_differing"] <= VALUES_DIFFERING * kernel["values"], kernel
    assert kernel["values_differing"] == 0 or kernel["differing_values_adjacent"], kernel
    zero_row = kernel["zero_row"]
    assert zero_row["values_zero"] and math.isclose(zero_row["scale"], zero_row["floor"], rel_tol=2 ** -7), zero_row
    if kernel["values_differing"] == 0:
        assert kernel["down_projection_equal"], kernel
    assert kernel["down_projection_error"] <= DOWN_PROJECTION, kernel

    dit = report["dit"]
    steps = len(dit["relative_error"])
    assert dit["calls"] == {"without": [0] * steps, "with": [dit["blocks"]] * steps}, dit
    assert dit["finite"] and not any("fused-swiglu-quant" in words for words in dit["words"].values()), dit
    assert dit["first_feed_forward_error"] <= DOWN_PROJECTION, dit
    assert all(error <= PREDICTION_TOLERANCE for error in dit["relative_error"]), dit
