"""Qwen-Image-2.1 with cuDNN's FP8 attention is close to the exact backend on the GPU (qwen21_fp8_attention.py): at
the attention seam on the model's head size and a 1024x1024 edit's spans, and on the full-size synthetic 2.1 DiT over
three steps with the prefix cache on and off.

Close, not equal. The tolerances and why:
- the seam, 0.1 relative (norm of the difference over the exact output's norm) for each FP8 region: cuDNN rounds
  v, the softmax probabilities and the output each to float8_e4m3fn (3 mantissa bits: a relative rounding error up
  to 2^-4, about 3.6% RMS), independent roundings that add to about 6% on random q, k and v, where no key dominates
  and nothing averages them away; q and k rounded too, their errors damped in the logits. The causal text spans run
  exact SDPA: the exact path's bits.
- the DiT, 0.25 for each step's prediction against the exact one's: random synthetic weights amplify any rounding
  (the Edit family's synthetic DiT moves 0.165 from bf16 kernel choices alone and 0.197 with every FP8 path of
  best: docs/benchmarks.md, section 1), so the seam is where closeness is measured tightly; here 0.25 catches what
  is wrong rather than rounded (a lost span, a wrong scale: errors of order 1). The FP8 kernel must have run where
  the dispatch says: per block, two calls at a filling step (the reference's span, the target's) and one at a
  cached step. The exact path's own spread between the prefix cache on and off is reported beside it.
- the rewrites ported from the Edit DiT (with torchao's FP8 GEMMs and the FP8 attention, prefix cache on):
  carried-residual gives the forward without it bit for bit (the same additions moved, eager kernels);
  fused-qk-norm-rope and fp8-attention-out leave the filling step's prediction as it was (bit for bit: q and k
  computed as released there) and move each cached step's by less than the FP8 attention itself moves it from the
  exact attention (the kernel's q and k round once, from float32, where the compiled path rounds bf16 values; the
  FP8 GEMM reads the attention's FP8 output as written: one rounding fewer), and stay within REWRITES_TOLERANCE of
  the exact attention's; the FP8 kernel's calls as without them. REWRITES_TOLERANCE is 0.35, not 0.25: over
  torchao's FP8 GEMMs any change of the attention's rounding moves each prediction about 0.26 (H200, 2026-11-28,
  lab/results/qwen21-fp8-attention-h200/: the FP8 attention against the exact one 0.27 there, 0.047 over bf16
  GEMMs; fused-qk-norm-rope against the same FP8 attention 0.258), because every block quantizes its activations
  again and random weights carry each flipped rounding on; a wrong path still moves it by order 1."""
import json

from gpu_scripts import run_script

SEAM_TOLERANCE = 0.1
DIT_TOLERANCE = 0.25
REWRITES_TOLERANCE = 0.35


def test_the_fp8_attention_on_2_1_is_close_to_the_exact_backend(tmp_path):
    run_script("qwen21_fp8_attention.py", "--out", str(tmp_path))
    report = json.loads((tmp_path / "qwen21-fp8-attention" / "qwen21-fp8-attention.json").read_text())
    seam = report["seam"]
    assert seam["text_spans_bitwise_equal"]
    for region in ("reference_span", "target_filling", "target_cached"):
        assert 0 < seam[region] <= SEAM_TOLERANCE, (region, seam)
    blocks = report["blocks"]
    expected_calls = {"prefix cache on": [2 * blocks, blocks, blocks], "prefix cache off": [2 * blocks] * 3}
    for name, run in report["runs"].items():
        assert run["attention"] == "cudnn-fp8" and run["finite"], (name, run)
        assert run["fp8_calls"] == expected_calls[name], (name, run)
        for step, error in enumerate(run["relative_error"]):
            assert 0 < error <= DIT_TOLERANCE, (name, step, run)
    rewrites = report["rewrites"]
    assert all(rewrites["carried_bitwise_equal"]), rewrites
    calls = rewrites["fp8_calls"]
    assert calls["carried"] == calls["fused"] == calls["fused-out"] == calls["fp8"] == [2 * blocks, blocks, blocks]
    for name in ("fused_against_fp8", "fused_out_against_fused"):
        errors = rewrites[name]
        assert errors[0] == 0, (name, rewrites)
        for step in range(1, len(errors)):
            assert 0 < errors[step] < rewrites["fp8_attention_against_exact"][step], (name, step, rewrites)
    for name in ("fused_against_exact", "fused_out_against_exact"):
        assert all(0 < error <= REWRITES_TOLERANCE for error in rewrites[name]), (name, rewrites)
    assert not any("fused-qk-norm-rope" in words or "fp8-attention-out" in words
                   for words in rewrites["words"].values()), rewrites["words"]
