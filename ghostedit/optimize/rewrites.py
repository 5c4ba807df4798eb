"""Lossless rewrites of DiffSynth's Qwen DiT: the same function, computed with fewer or better-fused kernels.

real-rope     DiffSynth rotates q and k with complex numbers (view_as_complex); Inductor cannot generate code for
              complex ops and leaves them as separate eager kernels. The same rotation written with real cos/sin
              tensors fuses into the neighbouring kernels.
joint-layout  DiffSynth's joint attention through GhostEdit's JointAttention (the same computation), which builds
              the joined text and image q, k and v in the projections' layout instead of transposing each first.
              The FP8 attention always runs through it: it hands over bounds on q and k and lets each stream be
              quantized before the join.
fused-qkv     One projection for q, k and v (a 3x wider GEMM) per stream instead of three, and one activation
              quantization instead of three under FP8. Runs through JointAttention too.
inductor-cdt  Inductor's coordinate-descent tuning of its generated kernels while compiling (slower compile).
inductor-multi-kernel  Inductor generates each reduction two ways, whole rows in registers (persistent) and
              looped, and times both on first use: by default it loops over rows longer than 1024 (the FP8 MLP's
              quantization reads its 12288-wide rows twice).
inductor-persistent-rows  Inductor makes the persistent variant alone wherever multi-kernel would offer it (its
              16-fold row limit): the variant multi-kernel's timing picked for the DiT's norms, without compiling
              and timing the looped one (ghostedit/optimize/compile.py).
fused-qk-norm-rope  With an FP8 attention: the q and k of both streams normalized, rotated and cast to FP8 in one
              Triton kernel of GhostEdit's that writes them joined (ghostedit/optimize/fp8_qk.py).
fp8-attention-out  With fused-qk-norm-rope and fp8=torchao: the FP8 attention's output goes into the output
              projections' FP8 GEMMs as cuDNN wrote it, its one scale as every row's, instead of dequantized to bf16
              and quantized again per row (one rounding fewer).
fused-gelu-quant  With fp8=torchao: each feed-forward layer's GELU and its output's rowwise FP8 quantization in one
              Triton kernel of GhostEdit's (ghostedit/optimize/fp8_mlp.py).
carried-residual  Each block's last residual addition done by the next block, inside its first LayerNorm's kernel
              (ghostedit/optimize/carried_residual.py).
Each is measured alone by the bench and offered only as a toggle; none changes the model's function beyond
floating-point rounding.
"""
from __future__ import annotations

import torch
from diffsynth.models import qwen_image_dit

from ..diffsynth_patches import check_version, replace
from ..parallel import ulysses
from ..kernels import fp8_attention, qk_norm_rope as fp8_qk
from ..kernels.fp8 import is_torchao_fp8
from . import attention

check_version()  # JointAttention below builds on DiffSynth's attention class ("joint attention layers")

_diffsynth_rotary = None


def install() -> None:
    """Let DiffSynth's rotary function also take (cos, sin) pairs (idempotent); complex input keeps its path."""
    global _diffsynth_rotary
    _diffsynth_rotary = replace("real-valued rotary embedding", _rotary)


def _rotary(x: torch.Tensor, freqs):
    """DiffSynth's rotation of each pair (x[2i], x[2i+1]) as a complex number, computed from real tensors:
    x * cos + (x with each pair swapped) * sin, with cos and sin repeated over each pair and sin negated on its
    first element (see _as_cos_sin): each element is the sum of the same two products as the complex product's.
    Written without splitting the pairs apart and stacking them again, compiled code reads each input element
    once per use, unmasked."""
    if not isinstance(freqs, tuple):
        return _diffsynth_rotary(x, freqs)
    cos, sin = freqs
    pairs_swapped = x.unflatten(-1, (-1, 2)).flip(-1).flatten(-2)
    return (x.float() * cos + pairs_swapped.float() * sin).to(x.dtype)


def _as_cos_sin(freqs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Complex frequencies [..., head_dim / 2] as the real (cos, sin) that _rotary takes, each [..., head_dim]."""
    cos = freqs.real.float().repeat_interleave(2, dim=-1)
    sin = torch.stack((-freqs.imag.float(), freqs.imag.float()), dim=-1).flatten(-2)
    # tensors of their own, not views: compiled blocks guard on a view's base, so the blocks run from Python and a
    # CUDA graph's copies of their inputs (cuda_graphs.py) would otherwise each compile code of their own
    return cos.clone(), sin.clone()


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
                            device="meta")
    fused.weight = torch.nn.Parameter(_joined([l.weight for l in linears]), requires_grad=False)
    if first.bias is not None:
        fused.bias = torch.nn.Parameter(_joined([l.bias for l in linears]), requires_grad=False)
    return fused


def _joined(parts: list[torch.Tensor]) -> torch.Tensor:
    """The parts joined along their first dimension: a view of them where they lie end to end in one storage (a base
    in pinned host memory is laid out so: joinable_parts), else a copy. A view's values are the base's: whoever
    writes into a joined weight in place must give it a tensor of its own first (engine/loras.py does)."""
    first = parts[0].detach()
    if not _end_to_end(parts):
        return torch.cat([part.detach() for part in parts])
    shape = (sum(part.shape[0] for part in parts), *first.shape[1:])
    return first.as_strided(shape, torch.empty(shape, device="meta").stride())


def _end_to_end(parts: list[torch.Tensor]) -> bool:
    """Contiguous tensors of one dtype in one storage, each starting where the one before ends."""
    first = parts[0]
    return all(part.is_contiguous() and part.dtype == first.dtype and
               part.untyped_storage().data_ptr() == first.untyped_storage().data_ptr() for part in parts) and \
        all(after.data_ptr() == before.data_ptr() + before.numel() * before.element_size()
            for before, after in zip(parts, parts[1:]))


# fused-qkv's projections, each with the released projections it joins, in the order of its output rows
FUSED_PROJECTIONS = {"to_qkv": ("to_q", "to_k", "to_v"), "add_qkv": ("add_q_proj", "add_k_proj", "add_v_proj")}


def joinable_parts(module: torch.nn.Module) -> list[list[torch.Tensor]]:
    """The weights and the biases that fuse_qkv would join, each group in the order of the joined rows: the base
    DiT's pinned copy lays each group end to end (pinned.pin_module), so that joining them copies nothing."""
    groups = []
    for attention_layer in module.modules():
        for parts in FUSED_PROJECTIONS.values():
            linears = [getattr(attention_layer, part, None) for part in parts]
            if all(isinstance(linear, torch.nn.Linear) for linear in linears):
                groups.append([linear.weight for linear in linears])
                if all(linear.bias is not None for linear in linears):
                    groups.append([linear.bias for linear in linears])
    return groups


def fuse_qkv(layers: list[torch.nn.Module]) -> int:
    """Replaces the q/k/v projections (both streams) of these JointAttention layers with one projection each. Must
    run on plain linear layers, before quantization (fused LoRAs are written into the joined projection's rows
    later: engine/loras.py)."""
    for module in layers:
        for fused, parts in FUSED_PROJECTIONS.items():
            setattr(module, fused, _fused_linear([getattr(module, part) for part in parts]))
            for part in parts:
                delattr(module, part)
    return len(layers)


def joint_attention(dit: torch.nn.Module, fp8_scales: bool) -> list[torch.nn.Module]:
    """Each block's joint attention, now computed by GhostEdit's JointAttention. With `fp8_scales` (for the FP8
    attention) the FP8 scales of q and k are worked out once, from their bounds (LoRAs change linear layers only,
    not the RMSNorm weights); without, they are None and torchao is not loaded."""
    attention.install()
    modules = [m for m in dit.modules() if isinstance(m, qwen_image_dit.QwenDoubleStreamAttention)]
    for module in modules:
        module.__class__ = JointAttention
        bounds = qk_bounds(module) if fp8_scales else {"q": None, "k": None}
        for name, bound in bounds.items():
            module.register_buffer(f"{name}_scale", None if bound is None else fp8_attention.fp8_scale(bound),
                                   persistent=False)
    return modules


def qk_bounds(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The largest magnitudes the normalized and rotated q and k of a joint attention can take, over both streams,
    with a margin for bf16 rounding: q and k come out of RMSNorms with weights, so |q| <= sqrt(head_dim) *
    max|norm weight|, and RoPE rotates pairs without changing their length."""
    def bound(*norms):
        largest = torch.stack([norm.weight.detach().abs().amax().float() for norm in norms]).amax()
        return largest * (module.head_dim ** 0.5 * 1.02)
    return {"q": bound(module.norm_q, module.norm_added_q), "k": bound(module.norm_k, module.norm_added_k)}


def fuse_qk_norm_rope(layers: list[torch.nn.Module]) -> int:
    """These JointAttention layers compute q and k for the FP8 attention with fp8_qk's kernel; returns how many."""
    for module in layers:
        norms = (module.norm_q, module.norm_k, module.norm_added_q, module.norm_added_k)
        if len({norm.eps for norm in norms}) != 1:  # the kernel takes one eps for both streams
            raise ValueError("the fused q/k kernel needs one RMSNorm eps for q and k of both streams")
        module.fused_qk_norm_rope = True
    return len(layers)


def fp8_attention_out(layers: list[torch.nn.Module]) -> int:
    """These JointAttention layers (already on fused_qk_norm_rope's path) hand the FP8 attention's output to their
    output projections' FP8 GEMMs as it is; returns how many."""
    unfit = [module for module in layers
             if not (is_torchao_fp8(module.to_out[0]) and is_torchao_fp8(module.to_add_out))]
    if unfit:
        raise ValueError(f"{len(unfit)} of {len(layers)} attention layers' output projections are not torchao FP8 "
                         "linears: the FP8 attention output needs fp8=torchao")
    for module in layers:
        module.fp8_attention_out = True
    return len(layers)


def _per_head(freqs):
    """RoPE frequencies over [seq, head_dim / 2], made to broadcast over [batch, seq, heads, head_dim / 2]."""
    return tuple(f.unsqueeze(1) for f in freqs) if isinstance(freqs, tuple) else freqs.unsqueeze(1)


class JointAttention(qwen_image_dit.QwenDoubleStreamAttention):
    """DiffSynth's joint attention, computed as DiffSynth computes it, in the projections' own layout,
    [batch, seq, heads, head_dim]: DiffSynth transposes each of q, k and v to [batch, heads, seq, head_dim] first, so
    its joins copy and transpose them. The projections may be fused (fused-qkv), and the FP8 attention gets bounds
    on q and k (see qk_bounds) and quantizes each stream before the join, or, with fused-qk-norm-rope, gets q and k
    normalized, rotated, quantized and joined by one kernel."""
    fused_qk_norm_rope = False
    fp8_attention_out = False

    def _projections(self, image, text):
        if hasattr(self, "to_qkv"):
            return self.to_qkv(image).chunk(3, -1), self.add_qkv(text).chunk(3, -1)
        return ((self.to_q(image), self.to_k(image), self.to_v(image)),
                (self.add_q_proj(text), self.add_k_proj(text), self.add_v_proj(text)))

    def forward(self, image, text, image_rotary_emb=None, attention_mask=None, enable_fp8_attention=False,
                kv_cache=None):
        if kv_cache is not None:
            raise RuntimeError("GhostEdit's joint attention does not support DiffSynth's KV cache")
        image_qkv, text_qkv = self._projections(image, text)
        img_q, img_k, img_v = (t.unflatten(-1, (self.num_heads, -1)) for t in image_qkv)
        txt_q, txt_k, txt_v = (t.unflatten(-1, (self.num_heads, -1)) for t in text_qkv)
        seq_txt = txt_q.shape[1]
        if self.fused_qk_norm_rope and not ulysses.active():  # sequence parallel: the image q and k leave unjoined
            backend = attention.active_backend()
            attention.refuse_masks(backend, attention_mask, enable_fp8_attention)
            # complex frequencies where a caller hands the stock ones (the bench's block check), real-rope's pairs else
            image_freqs, text_freqs = (f if isinstance(f, tuple) else _as_cos_sin(f) for f in image_rotary_emb)
            output, descale = fp8_qk.joint_attention(
                self, ((txt_q, txt_k, txt_v), (img_q, img_k, img_v)), (text_freqs, image_freqs), backend)
            return (fp8_qk.out_projection(self.to_out[0], output[:, seq_txt:], descale, self.fp8_attention_out),
                    fp8_qk.out_projection(self.to_add_out, output[:, :seq_txt], descale, self.fp8_attention_out))
        img_q, img_k = self.norm_q(img_q), self.norm_k(img_k)
        txt_q, txt_k = self.norm_added_q(txt_q), self.norm_added_k(txt_k)
        if image_rotary_emb is not None:
            img_freqs, txt_freqs = (_per_head(freqs) for freqs in image_rotary_emb)
            rotate = qwen_image_dit.apply_rotary_emb_qwen  # looked up at call time: may be the patched one
            img_q, img_k = rotate(img_q, img_freqs), rotate(img_k, img_freqs)
            txt_q, txt_k = rotate(txt_q, txt_freqs), rotate(txt_k, txt_freqs)
        joint = attention.joint_attention(
            ((txt_q, txt_k, txt_v), (img_q, img_k, img_v)), self.num_heads, attention_mask, enable_fp8_attention,
            self.q_scale, self.k_scale).to(img_q.dtype)
        return self.to_out(joint[:, seq_txt:]), self.to_add_out(joint[:, :seq_txt])

