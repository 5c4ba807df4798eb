"""The real-valued rotary embedding (the `real_rope` path of every DiT family): DiffSynth's and diffusers' rotation
of each pair (x[2i], x[2i+1]) as a complex number, computed from real (cos, sin) tensors instead, which Inductor can
fuse (it leaves complex operators to separate kernels). Bit-equal to the complex product in float32."""
from __future__ import annotations

import torch


def real_rotation(x: torch.Tensor, freqs: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """x rotated by (cos, sin) (cos_sin's): x * cos + (x with each pair swapped) * sin, with cos and sin repeated over
    each pair and sin negated on its first element: each element is the sum of the same two products as the complex
    product's. Written without splitting the pairs apart and stacking them again, compiled code reads each input
    element once per use, unmasked."""
    cos, sin = freqs
    pairs_swapped = x.unflatten(-1, (-1, 2)).flip(-1).flatten(-2)
    return (x.float() * cos + pairs_swapped.float() * sin).to(x.dtype)


def cos_sin(freqs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Complex frequencies [..., head_dim / 2] as the real (cos, sin) that real_rotation takes, each [..., head_dim]."""
    cos = freqs.real.float().repeat_interleave(2, dim=-1)
    sin = torch.stack((-freqs.imag.float(), freqs.imag.float()), dim=-1).flatten(-2)
    # tensors of their own, not views: compiled blocks guard on a view's base, so the blocks would run from Python
    # and a CUDA graph's copies of their inputs would otherwise each compile code of their own
    return cos.clone(), sin.clone()
