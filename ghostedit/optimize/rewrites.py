"""Lossless rewrites of DiffSynth's Qwen DiT: the same function, computed with fewer or better-fused kernels.

real-rope   DiffSynth rotates q and k with complex numbers (view_as_complex); Inductor cannot generate code for
            complex ops and leaves them as separate eager kernels. The same rotation written with real cos/sin
            tensors fuses into the neighbouring kernels.
fused-qkv   One projection for q, k and v (a 3x wider GEMM) per stream instead of three, and one activation
            quantization instead of three under FP8.
Both run DiffSynth's joint attention through GhostEdit's JointAttention (the same computation), which FP8 attention
also uses for its bounds on q and k.
inductor-cdt  Inductor's coordinate-descent tuning of its generated kernels while compiling (slower compile).
Each is measured alone by the bench and offered only as a toggle; none changes the model's function beyond
floating-point rounding.
"""
from __future__ import annotations

import torch
from diffsynth.models import qwen_image_dit
from einops import rearrange

from . import attention

_diffsynth_rotary = None


def install() -> None:
    """Let DiffSynth's rotary function also take (cos, sin) pairs (idempotent); complex input keeps its path."""
    global _diffsynth_rotary
    if _diffsynth_rotary is None:
        _diffsynth_rotary = qwen_image_dit.apply_rotary_emb_qwen
        qwen_image_dit.apply_rotary_emb_qwen = _rotary


def _rotary(x: torch.Tensor, freqs):
    if not isinstance(freqs, tuple):
        return _diffsynth_rotary(x, freqs)
    cos, sin = freqs
    pairs = x.float().reshape(*x.shape[:-1], -1, 2)
    real, imag = pairs.unbind(-1)
    rotated = torch.stack((real * cos - imag * sin, real * sin + imag * cos), dim=-1)
    return rotated.flatten(3).type_as(x)


def _as_cos_sin(freqs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return freqs.real.float().contiguous(), freqs.imag.float().contiguous()


def use_real_rope(dit: torch.nn.Module) -> None:
    """The DiT's position embedding hands (cos, sin) pairs to the blocks instead of complex frequencies."""
    install()
    embed = dit.pos_embed
    complex_forward = embed.forward

    def forward(*args, **kwargs):
        image_freqs, text_freqs = complex_forward(*args, **kwargs)
        return _as_cos_sin(image_freqs), _as_cos_sin(text_freqs)
    embed.forward = forward


def _fused_linear(linears: list[torch.nn.Linear]) -> torch.nn.Linear:
    first = linears[0]
    fused = torch.nn.Linear(first.in_features, sum(l.out_features for l in linears), bias=first.bias is not None,
                            device=first.weight.device, dtype=first.weight.dtype)
    with torch.no_grad():
        fused.weight.copy_(torch.cat([l.weight for l in linears]))
        if first.bias is not None:
            fused.bias.copy_(torch.cat([l.bias for l in linears]))
    fused.requires_grad_(False)
    return fused


def fuse_qkv(dit: torch.nn.Module) -> int:
    """Replaces each block's q/k/v projections (both streams) with one projection each. Must run on plain
    linear layers: after LoRA fusing, before quantization."""
    count = 0
    for module in joint_attention(dit):
        module.to_qkv = _fused_linear([module.to_q, module.to_k, module.to_v])
        module.add_qkv = _fused_linear([module.add_q_proj, module.add_k_proj, module.add_v_proj])
        for name in ("to_q", "to_k", "to_v", "add_q_proj", "add_k_proj", "add_v_proj"):
            delattr(module, name)
        count += 1
    return count


def joint_attention(dit: torch.nn.Module) -> list[torch.nn.Module]:
    """Each block's joint attention, now computed by GhostEdit's JointAttention (idempotent). It calls DiffSynth's
    attention function as GhostEdit's dispatcher replaces it, with its bounds on q and k."""
    attention.install()
    modules = [m for m in dit.modules() if isinstance(m, qwen_image_dit.QwenDoubleStreamAttention)]
    for module in modules:
        module.__class__ = JointAttention
    return modules


class JointAttention(qwen_image_dit.QwenDoubleStreamAttention):
    """DiffSynth's joint attention, computed as DiffSynth computes it, with projections that may be fused (fused-qkv)
    and with bounds on q and k handed to the attention backend: the FP8 backend scales by them instead of measuring
    each tensor's largest value (q and k come out of RMSNorm, so |q| <= sqrt(head_dim) * max|norm weight|, and
    RoPE rotates pairs without changing their length)."""

    def _projections(self, image, text):
        if hasattr(self, "to_qkv"):
            return self.to_qkv(image).chunk(3, -1), self.add_qkv(text).chunk(3, -1)
        return ((self.to_q(image), self.to_k(image), self.to_v(image)),
                (self.add_q_proj(text), self.add_k_proj(text), self.add_v_proj(text)))

    def _bounds(self) -> dict:
        return {"q_bound": self._bound(self.norm_q, self.norm_added_q),
                "k_bound": self._bound(self.norm_k, self.norm_added_k)}

    def _bound(self, *norms) -> torch.Tensor:
        """The largest magnitude the normalized (and rotated) q or k of these norms can take, with a margin for
        bf16 rounding (DiffSynth builds these RMSNorms with weights)."""
        return torch.stack([norm.weight.abs().amax() for norm in norms]).amax().float() * (self.head_dim ** 0.5 * 1.02)

    def forward(self, image, text, image_rotary_emb=None, attention_mask=None, enable_fp8_attention=False,
                kv_cache=None):
        if kv_cache is not None:
            raise RuntimeError("GhostEdit's joint attention does not support DiffSynth's KV cache")
        heads = self.num_heads
        image_qkv, text_qkv = self._projections(image, text)
        img_q, img_k, img_v = (rearrange(t, "b s (h d) -> b h s d", h=heads) for t in image_qkv)
        txt_q, txt_k, txt_v = (rearrange(t, "b s (h d) -> b h s d", h=heads) for t in text_qkv)
        img_q, img_k = self.norm_q(img_q), self.norm_k(img_k)
        txt_q, txt_k = self.norm_added_q(txt_q), self.norm_added_k(txt_k)
        if image_rotary_emb is not None:
            img_freqs, txt_freqs = image_rotary_emb
            rotate = qwen_image_dit.apply_rotary_emb_qwen  # looked up at call time: may be the patched one
            img_q, img_k = rotate(img_q, img_freqs), rotate(img_k, img_freqs)
            txt_q, txt_k = rotate(txt_q, txt_freqs), rotate(txt_k, txt_freqs)
        joint = qwen_image_dit.qwen_image_flash_attention(
            torch.cat([txt_q, img_q], dim=2), torch.cat([txt_k, img_k], dim=2), torch.cat([txt_v, img_v], dim=2),
            num_heads=heads, attention_mask=attention_mask, enable_fp8_attention=enable_fp8_attention,
            **self._bounds() if attention.takes_bounds() else {},
        ).to(img_q.dtype)
        seq_txt = txt_q.shape[2]
        return self.to_out(joint[:, seq_txt:]), self.to_add_out(joint[:, :seq_txt])


def inductor_options(rewrites: tuple[str, ...]) -> dict:
    """Extra Inductor options the rewrites ask for, given to the compiled blocks."""
    return {"coordinate_descent_tuning": True} if "inductor-cdt" in rewrites else {}
