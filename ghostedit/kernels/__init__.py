"""Compute kernels that know no model: the attention backends and their dispatch by name (attention.py), the FP8
attentions of cuDNN and FlashAttention-3 (fp8_attention.py), FP8 values fed to torchao's FP8 linear layers (fp8.py),
GhostEdit's Triton kernels (triton_code.py) and the ops that launch them: q/k normalization, RoPE and FP8 cast
(qk_norm_rope.py), GELU and its rowwise FP8 quantization (gelu_quant.py), SwiGLU's silu(gate) * up and its rowwise
FP8 quantization (swiglu_quant.py).

The lowest layer of the package: a model family's forward (ghostedit/models) calls these through its seams, and the
toggles (ghostedit/optimize) say which to run; nothing here imports a model, a toggle or DiffSynth."""
