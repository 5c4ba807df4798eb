"""The Qwen-Image(-Edit) DiT: GhostEdit's own module classes over the parameters DiffSynth loads (the same state dict
and attribute names as DiffSynth's QwenImageDiT; DiffSynth's loader builds this class from its model table), and its
forward, read top to bottom. The run's choices come in one `DitOptions` (models/seams.py) and travel down to every
block; each fast path is a named branch on an option, computing what the released model computes with fewer or
better-fused kernels:

real_rope          the rotary embedding with real cos/sin instead of complex numbers (which Inductor cannot fuse)
joint_layout       q, k and v kept in the projections' [batch, seq, heads, head_dim] layout and joined there,
                   instead of transposed first; the FP8 attentions run on this path
fused_qkv          one projection for q, k and v per stream (the weights joined at preparation: `fuse_qkv`)
fused_qk_norm_rope with an FP8 attention: q and k of both streams normalized, rotated and cast to FP8 by one
                   kernel that writes them joined (kernels/qk_norm_rope.py)
fp8_attention_out  the FP8 attention's output into the output projections' FP8 GEMMs as cuDNN wrote it
fused_gelu_quant   the feed-forward's GELU and its rowwise FP8 quantization in one kernel (kernels/gelu_quant.py)
carried_residual   each block's last residual addition done by the next block, where compiled code fuses it into
                   that block's first LayerNorm; the last one after the loop

Seams (models/seams.py): attention through `seams.attention`; every projection is a module that preparation may
replace (FP8, LoRA); the block loop behind the step cache; the whole forward replayed from CUDA graphs; the image
tokens split over ranks by the sequence split. This DiT has no prefix KV cache: its text and condition tokens attend
to the noisy image at every step, so their keys change.

What the released model computes here and DiffSynth does not: the feed-forward's activation is GELU with the tanh
approximation (DiffSynth's x * sigmoid(1.702 x) differs from the trained model, diffusers' reference).
"""
from __future__ import annotations

import torch
from diffsynth.models.general_modules import AdaLayerNorm, RMSNorm, TimestepEmbeddings
from diffsynth.models.qwen_image_dit import QwenEmbedRope, apply_rotary_emb_qwen, qwen_image_flash_attention
from einops import rearrange

from ...kernels import fp8_attention
from ...kernels.gelu_quant import gelu_rowwise_fp8
from ...kernels.qk_norm_rope import qk_norm_rope_fp8
from .. import seams
from ..rotary import cos_sin, real_rotation
from ..seams import DitOptions

LATENT_CHANNELS = 16
PATCH = 2   # latent pixels per token side
# fused_qkv's projections, each with the released projections it joins, in the order of its output rows
FUSED_PROJECTIONS = {"to_qkv": ("to_q", "to_k", "to_v"), "add_qkv": ("add_q_proj", "add_k_proj", "add_v_proj")}
# inputs DiffSynth's pipeline hands its DiT forward that this forward does not compute: refused when given
NOT_COMPUTED = {"entity_prompt_emb": "entity prompts", "blockwise_controlnet_conditioning": "a blockwise ControlNet",
                "context_latents": "in-context control images", "layer_input_latents": "layered images",
                "layer_num": "layered images", "kv_cache": "DiffSynth's KV cache"}
NOT_COMPUTED_WHEN_TRUE = {"edit_rope_interpolation": "rope interpolation", "enable_fp8_attention":
                          "DiffSynth's FP8 attention", "use_gradient_checkpointing": "gradient checkpointing"}


# ---- the modules: the released parameters under DiffSynth's names ----

class QwenImageDiT(torch.nn.Module):
    """The DiT at the sizes of a diffusers transformer config (tiny, released, anything between)."""

    fused_projections = FUSED_PROJECTIONS

    def __init__(self, num_layers: int = 60, num_attention_heads: int = 24, attention_head_dim: int = 128,
                 joint_attention_dim: int = 3584, axes_dims_rope: tuple[int, ...] = (16, 56, 56)):
        super().__init__()
        dim = num_attention_heads * attention_head_dim
        self.pos_embed = QwenEmbedRope(theta=10000, axes_dim=list(axes_dims_rope), scale_rope=True)
        self.time_text_embed = TimestepEmbeddings(256, dim, diffusers_compatible_format=True, scale=1000,
                                                  align_dtype_to_timestep=False)
        self.txt_norm = RMSNorm(joint_attention_dim, eps=1e-6)
        self.img_in = torch.nn.Linear(PATCH * PATCH * LATENT_CHANNELS, dim)
        self.txt_in = torch.nn.Linear(joint_attention_dim, dim)
        self.transformer_blocks = torch.nn.ModuleList(
            TransformerBlock(dim, num_attention_heads, attention_head_dim) for _ in range(num_layers))
        self.norm_out = AdaLayerNorm(dim, single=True)
        self.proj_out = torch.nn.Linear(dim, PATCH * PATCH * LATENT_CHANNELS)

    @property
    def blocks(self) -> torch.nn.ModuleList:
        """The repeated blocks (regional compile compiles each; the block loop runs them)."""
        return self.transformer_blocks

    def joinable_parts(self) -> list[list[torch.Tensor]]:
        """The weight and bias groups fused_qkv joins (seams.joinable_parts)."""
        return seams.joinable_parts(self, FUSED_PROJECTIONS)

    def attention_layers(self) -> list[JointAttention]:
        return [block.attn for block in self.transformer_blocks]

    def feed_forwards(self) -> list[FeedForward]:
        return [mlp for block in self.transformer_blocks for mlp in (block.img_mlp, block.txt_mlp)]

    @property
    def heads(self) -> int:
        return self.transformer_blocks[0].attn.num_heads

    @property
    def head_dim(self) -> int:
        return self.transformer_blocks[0].attn.head_dim

    def forward(self, latents: torch.Tensor, timestep: torch.Tensor, prompt_emb: torch.Tensor,
                prompt_emb_mask: torch.Tensor, height: int, width: int, edit_latents=None, zero_cond_t: bool = False,
                options: DitOptions = DitOptions()) -> torch.Tensor:
        """The velocity for `latents` [1, 16, height / 8, width / 8] at `timestep` (0-1000), conditioned on the
        prompt's embedding [1, text tokens, joint_attention_dim] (its mask, kept in host memory, gives its length)
        and the edit images' latents (a tensor or a list); with `zero_cond_t` (2511) the edit images' tokens are
        modulated at timestep 0."""
        img_shapes = [(1, latents.shape[2] // PATCH, latents.shape[3] // PATCH)]
        txt_seq_lens = prompt_emb_mask.sum(dim=1).tolist()
        timestep = timestep / 1000
        image = rearrange(latents, "B C (H P) (W Q) -> B (H W) (C P Q)", H=height // 16, W=width // 16, P=2, Q=2)
        image_seq_len = image.shape[1]
        if edit_latents is not None:
            edits = edit_latents if isinstance(edit_latents, list) else [edit_latents]
            img_shapes += [(e.shape[0], e.shape[2] // PATCH, e.shape[3] // PATCH) for e in edits]
            image = torch.cat([image] + [rearrange(e, "B C (H P) (W Q) -> B (H W) (C P Q)", H=e.shape[2] // 2,
                                                   W=e.shape[3] // 2, P=2, Q=2) for e in edits], dim=1)
        # detached: a linear's output is a view of a flattened product, and compiled blocks guard on a view's base
        # (the first block would compile code of its own)
        image = self.img_in(image).detach()
        modulate_index = None
        if zero_cond_t:
            timestep = torch.cat([timestep, timestep * 0], dim=0)
            modulate_index = _condition_index(image_seq_len, image.shape[1], image.device)
        conditioning = self.time_text_embed(timestep, image.dtype)
        text = self.txt_in(self.txt_norm(prompt_emb)).detach()
        image_freqs, text_freqs = self.pos_embed(img_shapes, txt_seq_lens, device=latents.device)
        if options.real_rope:
            image_freqs, text_freqs = cos_sin(image_freqs), cos_sin(text_freqs)

        split = options.sequence_split
        if split is not None:   # this rank's image tokens, with their rotary table and modulation index
            split = split.over(image.shape[1])
            options = options.replace(sequence_split=split)
            image = split.shard(image, 1)
            image_freqs = tuple(split.shard(f, 0) for f in image_freqs) if options.real_rope else \
                split.shard(image_freqs, 0)
            modulate_index = None if modulate_index is None else split.shard(modulate_index, 1)

        block_inputs = {"temb": conditioning, "image_rotary_emb": (image_freqs, text_freqs),
                        "modulate_index": modulate_index, "options": options}
        text, image = run_blocks(self.transformer_blocks, image, text, block_inputs, options)

        if split is not None:
            image = split.gather(image, 1)
        if zero_cond_t:
            conditioning = conditioning.chunk(2, dim=0)[0]
        image = self.proj_out(self.norm_out(image, conditioning))
        image = image[:, :image_seq_len]
        return rearrange(image, "B (H W) (C P Q) -> B C (H P) (W Q)", H=height // 16, W=width // 16, P=2, Q=2)


def _condition_index(output_tokens: int, tokens: int, device) -> torch.Tensor:
    """zero_cond_t's modulation index [1, tokens]: 0 for the output image's tokens (modulated at the step's
    timestep), 1 for the edit images' (at timestep 0). Made on the device: a copy from host memory would make the CPU
    wait, and a CUDA graph capture refuses it."""
    index = torch.ones((1, tokens), dtype=torch.int, device=device)
    index[:, :output_tokens] = 0
    return index


# ---- the block loop ----

def run_blocks(blocks, image: torch.Tensor, text: torch.Tensor, inputs: dict,
               options: DitOptions) -> tuple[torch.Tensor, torch.Tensor]:
    """Every block in turn: (text, image). Behind the step cache a block may end the loop (the cache adds the
    remaining blocks' change); with carried_residual each block hands its last addition to the next, and the last
    one's is added here."""
    cache = options.step_cache
    if options.carried_residual:
        pending = nothing_pending(image, text, inputs["modulate_index"])
        for block in blocks:
            text, image, pending = block(image=image, text=text, pending=pending, **inputs)
        image, text = finish(image, text, pending)
        return text, image
    for index, block in enumerate(blocks):
        before = image
        text, image = block(image=image, text=text, **inputs)
        if cache is not None:
            image, stop = cache.after_block(index, before, image, index == len(blocks) - 1)
            if stop:
                break
    return text, image


Pending = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]  # image gate, image update, text gate, text update


def finish(image: torch.Tensor, text: torch.Tensor, pending: Pending) -> tuple[torch.Tensor, torch.Tensor]:
    """The residual addition a block left undone (carried_residual): (image, text)."""
    image_gate, image_update, text_gate, text_update = pending
    return image + image_gate * image_update, text + text_gate * text_update


def nothing_pending(image: torch.Tensor, text: torch.Tensor, modulate_index=None) -> Pending:
    """What the first block adds: zeros shaped as a block's parts, so that every block runs one compiled graph
    (x + 0 * 0 is x). The image's gate is per token where the image tokens take two modulations (zero_cond_t)."""
    text_gate = text.new_zeros((text.shape[0], 1, text.shape[-1]))
    image_gate = torch.zeros_like(image) if modulate_index is not None else text_gate.clone()
    return image_gate, torch.zeros_like(image), text_gate, torch.zeros_like(text)


# ---- one block ----

class TransformerBlock(torch.nn.Module):
    """Modulated joint attention of the text and image streams, then each stream's feed-forward."""

    def __init__(self, dim: int, num_attention_heads: int, attention_head_dim: int, eps: float = 1e-6):
        super().__init__()
        self.dim = dim
        self.num_attention_heads = num_attention_heads
        self.attention_head_dim = attention_head_dim
        self.img_mod = torch.nn.Sequential(torch.nn.SiLU(), torch.nn.Linear(dim, 6 * dim))
        self.img_norm1 = torch.nn.LayerNorm(dim, elementwise_affine=False, eps=eps)
        self.attn = JointAttention(dim, num_attention_heads, attention_head_dim)
        self.img_norm2 = torch.nn.LayerNorm(dim, elementwise_affine=False, eps=eps)
        self.img_mlp = FeedForward(dim)
        self.txt_mod = torch.nn.Sequential(torch.nn.SiLU(), torch.nn.Linear(dim, 6 * dim))
        self.txt_norm1 = torch.nn.LayerNorm(dim, elementwise_affine=False, eps=eps)
        self.txt_norm2 = torch.nn.LayerNorm(dim, elementwise_affine=False, eps=eps)
        self.txt_mlp = FeedForward(dim)

    def forward(self, image, text, temb, image_rotary_emb, modulate_index=None, options: DitOptions = DitOptions(),
                pending: Pending | None = None):
        """(text, image); with `pending` (carried_residual) the block first adds what the block before left and
        leaves its own last addition undone, the same additions moved so that compiled code fuses each into the
        next LayerNorm: (text, image, pending)."""
        if pending is not None:
            image, text = finish(image, text, pending)
        img_mod_attn, img_mod_mlp = self.img_mod(temb).chunk(2, dim=-1)
        if modulate_index is not None:
            temb = torch.chunk(temb, 2, dim=0)[0]
        txt_mod_attn, txt_mod_mlp = self.txt_mod(temb).chunk(2, dim=-1)

        img_modulated, img_gate = _modulate(self.img_norm1(image), img_mod_attn, modulate_index)
        txt_modulated, txt_gate = _modulate(self.txt_norm1(text), txt_mod_attn)
        img_attn_out, txt_attn_out = self.attn(img_modulated, txt_modulated, image_rotary_emb, options)
        image = image + img_gate * img_attn_out
        text = text + txt_gate * txt_attn_out

        img_modulated_2, img_gate_2 = _modulate(self.img_norm2(image), img_mod_mlp, modulate_index)
        txt_modulated_2, txt_gate_2 = _modulate(self.txt_norm2(text), txt_mod_mlp)
        if pending is not None:
            left = (img_gate_2 if modulate_index is not None else _own(img_gate_2),
                    self.img_mlp(img_modulated_2, options), _own(txt_gate_2), self.txt_mlp(txt_modulated_2, options))
            return text, image, left
        img_mlp_out = self.img_mlp(img_modulated_2, options)
        txt_mlp_out = self.txt_mlp(txt_modulated_2, options)
        image = image + img_gate_2 * img_mlp_out
        text = text + txt_gate_2 * txt_mlp_out
        return text, image


def _modulate(x, mod_params, index=None):
    """x * (1 + scale) + shift, and the gate, from a modulation's output [batch, 3 * dim]; with `index` (zero_cond_t)
    the first half of the batch modulates the tokens where index is 0, the second half the others."""
    shift, scale, gate = mod_params.chunk(3, dim=-1)
    if index is not None:
        actual_batch = shift.size(0) // 2
        shift_0, shift_1 = shift[:actual_batch], shift[actual_batch:]
        scale_0, scale_1 = scale[:actual_batch], scale[actual_batch:]
        gate_0, gate_1 = gate[:actual_batch], gate[actual_batch:]
        index_expanded = index.unsqueeze(-1)
        shift_result = torch.where(index_expanded == 0, shift_0.unsqueeze(1), shift_1.unsqueeze(1))
        scale_result = torch.where(index_expanded == 0, scale_0.unsqueeze(1), scale_1.unsqueeze(1))
        gate_result = torch.where(index_expanded == 0, gate_0.unsqueeze(1), gate_1.unsqueeze(1))
    else:
        shift_result = shift.unsqueeze(1)
        scale_result = scale.unsqueeze(1)
        gate_result = gate.unsqueeze(1)
    return x * (1 + scale_result) + shift_result, gate_result


def _own(gate: torch.Tensor) -> torch.Tensor:
    """A [batch, 1, width] gate, a view into the modulation's output, as a tensor of its own with the strides of
    nothing_pending's zeros: compiled code guards on the strides of its inputs, even along a dimension of size 1."""
    return gate.clone(memory_format=torch.contiguous_format)


# ---- joint attention ----

class JointAttention(torch.nn.Module):
    """The text and image streams' q, k and v, each normalized per head and rotated, attending jointly (text first);
    each stream's part of the output through its own projection."""

    def __init__(self, dim: int, num_heads: int, head_dim: int):
        super().__init__()
        self.num_heads = num_heads
        self.head_dim = head_dim
        self.to_q, self.to_k, self.to_v = (torch.nn.Linear(dim, dim) for _ in range(3))
        self.norm_q = RMSNorm(head_dim, eps=1e-6)
        self.norm_k = RMSNorm(head_dim, eps=1e-6)
        self.add_q_proj, self.add_k_proj, self.add_v_proj = (torch.nn.Linear(dim, dim) for _ in range(3))
        self.norm_added_q = RMSNorm(head_dim, eps=1e-6)
        self.norm_added_k = RMSNorm(head_dim, eps=1e-6)
        self.to_out = torch.nn.Sequential(torch.nn.Linear(dim, dim))
        self.to_add_out = torch.nn.Linear(dim, dim)
        # the FP8 scales of q and k from their bounds (set at preparation for an FP8 attention: fp8_scales)
        self.register_buffer("q_scale", None, persistent=False)
        self.register_buffer("k_scale", None, persistent=False)

    def forward(self, image, text, image_rotary_emb, options: DitOptions):
        if options.joint_layout:
            return self._joint_layout(image, text, image_rotary_emb, options)
        return self._released_layout(image, text, image_rotary_emb, options)

    def _released_layout(self, image, text, image_rotary_emb, options: DitOptions):
        """As released: each of q, k and v transposed to [batch, heads, seq, head_dim] before the join."""
        img_q, img_k, img_v = self.to_q(image), self.to_k(image), self.to_v(image)
        txt_q, txt_k, txt_v = self.add_q_proj(text), self.add_k_proj(text), self.add_v_proj(text)
        seq_txt = txt_q.shape[1]
        img_q, img_k, img_v = (rearrange(t, "b s (h d) -> b h s d", h=self.num_heads) for t in (img_q, img_k, img_v))
        txt_q, txt_k, txt_v = (rearrange(t, "b s (h d) -> b h s d", h=self.num_heads) for t in (txt_q, txt_k, txt_v))
        img_q, img_k = self.norm_q(img_q), self.norm_k(img_k)
        txt_q, txt_k = self.norm_added_q(txt_q), self.norm_added_k(txt_k)
        img_freqs, txt_freqs = image_rotary_emb
        img_q, img_k = _rotate(img_q, img_freqs), _rotate(img_k, img_freqs)
        txt_q, txt_k = _rotate(txt_q, txt_freqs), _rotate(txt_k, txt_freqs)
        joint = seams.attention(((txt_q, txt_k, txt_v), (img_q, img_k, img_v)), options, layout="bhsd",
                                sharded=(False, True), fp8_scales=(self.q_scale, self.k_scale),
                                diffsynth=diffsynth_attention).to(img_q.dtype)
        txt_attn_output, img_attn_output = joint[:, :seq_txt, :], joint[:, seq_txt:, :]
        return self.to_out(img_attn_output), self.to_add_out(txt_attn_output)

    def _projections(self, image, text, options: DitOptions):
        if options.fused_qkv:
            return self.to_qkv(image).chunk(3, -1), self.add_qkv(text).chunk(3, -1)
        return ((self.to_q(image), self.to_k(image), self.to_v(image)),
                (self.add_q_proj(text), self.add_k_proj(text), self.add_v_proj(text)))

    def _joint_layout(self, image, text, image_rotary_emb, options: DitOptions):
        """q, k and v in the projections' own layout, [batch, seq, heads, head_dim], joined there."""
        image_qkv, text_qkv = self._projections(image, text, options)
        img_q, img_k, img_v = (t.unflatten(-1, (self.num_heads, -1)) for t in image_qkv)
        txt_q, txt_k, txt_v = (t.unflatten(-1, (self.num_heads, -1)) for t in text_qkv)
        seq_txt = txt_q.shape[1]
        if options.fused_qk_norm_rope:
            output, descale = self._fused_fp8_attention((txt_q, txt_k, txt_v), (img_q, img_k, img_v),
                                                        image_rotary_emb, options)
            return (seams.out_projection(self.to_out[0], output[:, seq_txt:], descale, options.fp8_attention_out),
                    seams.out_projection(self.to_add_out, output[:, :seq_txt], descale, options.fp8_attention_out))
        img_q, img_k = self.norm_q(img_q), self.norm_k(img_k)
        txt_q, txt_k = self.norm_added_q(txt_q), self.norm_added_k(txt_k)
        img_freqs, txt_freqs = (_per_head(freqs) for freqs in image_rotary_emb)
        img_q, img_k = _rotate(img_q, img_freqs), _rotate(img_k, img_freqs)
        txt_q, txt_k = _rotate(txt_q, txt_freqs), _rotate(txt_k, txt_freqs)
        joint = seams.attention(((txt_q, txt_k, txt_v), (img_q, img_k, img_v)), options, sharded=(False, True),
                                fp8_scales=(self.q_scale, self.k_scale), diffsynth=diffsynth_attention).to(img_q.dtype)
        return self.to_out(joint[:, seq_txt:]), self.to_add_out(joint[:, :seq_txt])

    def _fused_fp8_attention(self, text_qkv, image_qkv, freqs, options: DitOptions):
        """The FP8 attention with q and k of both streams normalized, rotated and cast by one kernel that writes
        them joined: the output as the kernel writes it and the factor that gives its real values (None for
        FlashAttention-3's real bf16). Under a sequence split the kernel runs on this rank's tokens and the FP8
        bytes go to the other ranks; v is cast at the whole sequence's scale: the one-process values."""
        (txt_q, txt_k, txt_v), (img_q, img_k, img_v) = text_qkv, image_qkv
        (image_cos, image_sin), (text_cos, text_sin) = (f if isinstance(f, tuple) else cos_sin(f) for f in freqs)
        q8, k8 = qk_norm_rope_fp8([txt_q, img_q], [txt_k, img_k], [self.norm_added_q.weight, self.norm_q.weight],
                                  [self.norm_added_k.weight, self.norm_k.weight], [text_cos, image_cos],
                                  [text_sin, image_sin], self.q_scale, self.k_scale, self.norm_q.eps)
        q_descale, k_descale = fp8_attention.descale(self.q_scale), fp8_attention.descale(self.k_scale)
        split = options.sequence_split
        if split is None:
            return fp8_attention.attend_as_written([q8], q_descale, [k8], k_descale, (txt_v, img_v),
                                                   options.attention)
        v8, v_descale = fp8_attention.fp8_parts((txt_v, img_v), seams.value_scale((txt_v, img_v), split))
        seq_txt = txt_q.shape[1]
        kernel_descale = []

        def attend(streams):
            (text_q8, text_k8, text_v8), (image_q8, image_k8, image_v8) = streams
            output, descale = fp8_attention.attend_fp8([text_q8, image_q8], q_descale, [text_k8, image_k8],
                                                       k_descale, [text_v8, image_v8], v_descale, options.attention)
            kernel_descale.append(descale)
            return output
        output = split.attention(((q8[:, :seq_txt], k8[:, :seq_txt], v8[0]), (q8[:, seq_txt:], k8[:, seq_txt:], v8[1])),
                                 (False, True), attend)
        return output, kernel_descale[0]

    def fuse_qkv(self) -> None:
        """One projection for q, k and v per stream (fused_qkv): the weights joined in the order of the output rows.
        On plain linear layers, before quantization (fused LoRAs are written into the joined rows later)."""
        for fused, parts in FUSED_PROJECTIONS.items():
            setattr(self, fused, seams.fused_linear([getattr(self, part) for part in parts]))
            for part in parts:
                delattr(self, part)

    def qk_norms(self) -> tuple[RMSNorm, ...]:
        return self.norm_q, self.norm_k, self.norm_added_q, self.norm_added_k

    def output_projections(self) -> tuple[torch.nn.Module, torch.nn.Module]:
        return self.to_out[0], self.to_add_out

    def qk_bounds(self) -> dict[str, torch.Tensor]:
        """The largest magnitudes the normalized and rotated q and k can take, over both streams (seams.normed_bound:
        q and k come out of RMSNorms with weights, then RoPE)."""
        return {"q": seams.normed_bound((self.norm_q, self.norm_added_q), self.head_dim),
                "k": seams.normed_bound((self.norm_k, self.norm_added_k), self.head_dim)}

    def fp8_scales(self) -> None:
        """The FP8 scales of q and k worked out once from their bounds, for an FP8 attention (LoRAs change linear
        layers only, not the RMSNorm weights)."""
        for name, bound in self.qk_bounds().items():
            setattr(self, f"{name}_scale", fp8_attention.fp8_scale(bound))


def diffsynth_attention(q, k, v, mask):
    """DiffSynth's own attention for this DiT (the backend "diffsynth": FlashAttention-3 if installed, else SDPA's
    own dispatch), q, k, v in [batch, heads, seq, head_dim]."""
    return qwen_image_flash_attention(q, k, v, num_heads=q.size(1), attention_mask=mask)


def _rotate(x: torch.Tensor, freqs) -> torch.Tensor:
    """The rotary embedding: DiffSynth's complex rotation, or real_rope's (cos, sin) pair."""
    if isinstance(freqs, tuple):
        return real_rotation(x, freqs)
    return apply_rotary_emb_qwen(x, freqs)


def _per_head(freqs):
    """RoPE frequencies over [seq, head_dim / 2], made to broadcast over [batch, seq, heads, head_dim / 2]."""
    return tuple(f.unsqueeze(1) for f in freqs) if isinstance(freqs, tuple) else freqs.unsqueeze(1)


# ---- the feed-forward ----

class GELUProjection(torch.nn.Module):
    """The feed-forward's up projection and its activation: GELU with the tanh approximation, as trained."""

    def __init__(self, dim_in: int, dim_out: int):
        super().__init__()
        self.proj = torch.nn.Linear(dim_in, dim_out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.gelu(self.proj(x), approximate="tanh")


class FeedForward(torch.nn.Module):
    """Up projection to 4x the width, GELU, down projection (DiffSynth's `net`: projection, dropout of p=0, linear)."""

    def __init__(self, dim: int):
        super().__init__()
        self.net = torch.nn.ModuleList([GELUProjection(dim, 4 * dim), torch.nn.Dropout(0.0),
                                        torch.nn.Linear(4 * dim, dim)])

    def projections(self) -> tuple[torch.nn.Module, torch.nn.Module]:
        return self.net[0].proj, self.net[2]

    def forward(self, hidden: torch.Tensor, options: DitOptions = DitOptions()) -> torch.Tensor:
        if options.fused_gelu_quant:  # the GELU's output quantized per row in its kernel, into the FP8 down projection
            up = self.net[0].proj(hidden)
            activation, activation_scale = gelu_rowwise_fp8(up.reshape(-1, up.shape[-1]))
            out = seams.fp8_linear(self.net[2], activation, activation_scale)
            return out.reshape(*hidden.shape[:-1], out.shape[-1])
        for module in self.net:
            hidden = module(hidden)
        return hidden


# ---- what the pipeline calls ----

def model_fn(dit: QwenImageDiT = None, options: DitOptions = DitOptions(), progress_id: int = 0, **inputs):
    """The DiT forward as DiffSynth's pipeline calls it (`pipe.model_fn`, with the pipeline's whole state as
    keywords): the inputs this forward computes, from CUDA graphs where the run replays them."""
    taken = forward_inputs(inputs)
    for cache in (options.step_cache, options.prefix_cache):
        if cache is not None:
            cache.begin(progress_id)
    if options.graphs is not None:
        # a split forward runs other kernels (its all-to-alls, its shard's shapes) on the same inputs: a graph of
        # its own (scripts/gpu/split_check.py once replayed the one-GPU graph for the split and called them equal)
        return options.graphs.run(lambda held: dit(**held, options=options), taken, name=options.sequence_split)
    return dit(**taken, options=options)


FORWARD_INPUTS = ("latents", "timestep", "prompt_emb", "prompt_emb_mask", "height", "width", "edit_latents",
                  "zero_cond_t")


def forward_inputs(inputs: dict) -> dict:
    """The pipeline state's inputs this forward takes; what it does not compute is refused, with what it is."""
    for name, what in NOT_COMPUTED.items():
        if inputs.get(name) is not None:
            raise NotImplementedError(f"GhostEdit's Qwen-Image DiT does not compute {what} ({name})")
    for name, what in NOT_COMPUTED_WHEN_TRUE.items():
        if inputs.get(name):
            raise NotImplementedError(f"GhostEdit's Qwen-Image DiT does not compute {what} ({name})")
    return {name: inputs[name] for name in FORWARD_INPUTS if name in inputs}
