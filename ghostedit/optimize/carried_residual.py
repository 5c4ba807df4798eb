"""The residual addition that ends each DiT block, carried into the next block (the `carried-residual` rewrite).

A Qwen DiT block ends with `image = image + gate * feed_forward_output` (and the same for the text stream), and
the next block starts with a LayerNorm of that sum. Compiled block by block, the addition is a kernel of its own at
the end of one compiled region (it reads the residual stream and the feed-forward output and writes the stream)
and the next region's LayerNorm reads the stream again. Here a block hands the addition on undone, as its three
parts (the stream before it, the gate, the feed-forward output), and the next block does it first: Inductor then
fuses it into that block's LayerNorm, modulation and FP8 quantization, as it already fuses the addition in the
middle of a block into the second LayerNorm. The last block's addition is done after the loop. The sums are the
released block's, rounded as compiled code rounds its own fused additions.

Only GhostEdit's block loop (`run_blocks`: the flag's run-time context puts it in DiffSynth's place, and cuda-graph
captures it) hands the parts on. A block called alone, or from DiffSynth's loop, finishes its addition itself, as
released: under the step cache (its wrappers call the blocks one by one) and under sequence parallel (its hooks
split each block's input tokens, not the parts handed on) a run says so and runs the blocks that way.
"""
from __future__ import annotations

import types

import torch

from ..device import UnavailableOptionError
from ..diffsynth_patches import check_version
from . import block_loop

check_version()  # the block forward below reads DiffSynth's block attributes ("DiT block forward")

Pending = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]  # image gate, image update, text gate, text update


def carry_residuals(dit: torch.nn.Module) -> int:
    """Gives every block of the DiT the forward below; returns how many."""
    for block in dit.transformer_blocks:
        block.forward = types.MethodType(carried_block_forward, block)
        block.carries_residual = True
    return len(dit.transformer_blocks)


def carries(blocks) -> bool:
    return all(getattr(block, "carries_residual", False) for block in blocks)


def finish(image: torch.Tensor, text: torch.Tensor, pending: Pending) -> tuple[torch.Tensor, torch.Tensor]:
    """The addition a block left undone: (image, text)."""
    image_gate, image_update, text_gate, text_update = pending
    return image + image_gate * image_update, text + text_gate * text_update


def nothing_pending(image: torch.Tensor, text: torch.Tensor, modulate_index=None) -> Pending:
    """What the first block adds: zeros shaped as a block's parts, so that every block runs one compiled graph
    (x + 0 * 0 is x). The image's gate is per token where the image tokens take two modulations (zero_cond_t)."""
    text_gate = text.new_zeros((text.shape[0], 1, text.shape[-1]))
    image_gate = torch.zeros_like(image) if modulate_index is not None else text_gate.clone()
    return image_gate, torch.zeros_like(image), text_gate, torch.zeros_like(text)


def run_blocks(blocks, image: torch.Tensor, text: torch.Tensor, **inputs) -> tuple[torch.Tensor, torch.Tensor]:
    """DiffSynth's loop over `blocks` (no ControlNet, no KV cache): (text, image). Blocks that carry their residual
    hand it to the next; the last one's is added here."""
    if not carries(blocks):
        for block in blocks:
            text, image = block(image=image, text=text, **inputs)
        return text, image
    pending = nothing_pending(image, text, inputs.get("modulate_index"))
    for block in blocks:
        text, image, pending = block(image=image, text=text, pending=pending, **inputs)
    image, text = finish(image, text, pending)
    return text, image


def why_not_carried(config) -> str | None:
    """Why this run's blocks cannot hand their additions on, or None."""
    from ..parallel import ulysses
    if config.value("step-cache") != "off":
        return "the step cache runs the blocks one by one through wrappers of its own"
    if ulysses.active():
        return "sequence parallel (Ulysses) splits each block's input tokens, and not the parts handed on"
    return None


def carried(pipe):
    """Every DiT forward of `pipe` runs its blocks through run_blocks."""
    return block_loop.one_entry(pipe, _CarriedLoop)


class _CarriedLoop(torch.nn.Module):
    """The one entry of the block list a forward sees: it runs all the DiT's blocks through run_blocks."""

    def __init__(self, blocks: torch.nn.ModuleList):
        super().__init__()
        self.blocks = blocks

    def forward(self, image, text, kv_cache=None, **inputs):
        if kv_cache is not None:
            raise UnavailableOptionError("carried-residual runs DiffSynth's plain block loop: a KV cache is kept per "
                                         "block")
        return run_blocks(self.blocks, image, text, **inputs)


def carried_block_forward(self, image, text, temb, image_rotary_emb=None, attention_mask=None,
                          enable_fp8_attention=False, modulate_index=None, kv_cache=None, pending: Pending = None):
    """DiffSynth's QwenImageTransformerBlock.forward, which first adds what the block before left `pending` and
    then leaves its own last addition undone: (text, image, pending). Without `pending`, the block as released:
    (text, image)."""
    if pending is not None:
        image, text = finish(image, text, pending)
    image_mod_attention, image_mod_mlp = self.img_mod(temb).chunk(2, dim=-1)
    text_temb = torch.chunk(temb, 2, dim=0)[0] if modulate_index is not None else temb
    text_mod_attention, text_mod_mlp = self.txt_mod(text_temb).chunk(2, dim=-1)

    image_in, image_gate = self._modulate(self.img_norm1(image), image_mod_attention, index=modulate_index)
    text_in, text_gate = self._modulate(self.txt_norm1(text), text_mod_attention)
    image_attention, text_attention = self.attn(
        image=image_in, text=text_in, image_rotary_emb=image_rotary_emb, attention_mask=attention_mask,
        enable_fp8_attention=enable_fp8_attention, kv_cache=kv_cache)
    image = image + image_gate * image_attention
    text = text + text_gate * text_attention

    image_in, image_gate = self._modulate(self.img_norm2(image), image_mod_mlp, index=modulate_index)
    text_in, text_gate = self._modulate(self.txt_norm2(text), text_mod_mlp)
    left = (image_gate if modulate_index is not None else _own(image_gate), self.img_mlp(image_in),
            _own(text_gate), self.txt_mlp(text_in))
    if pending is None:
        image, text = finish(image, text, left)
        return text, image
    return text, image, left


def _own(gate: torch.Tensor) -> torch.Tensor:
    """A [batch, 1, width] gate, a view into the modulation's output, as a tensor of its own with the strides of
    nothing_pending's zeros: compiled code guards on the strides of its inputs, even along a dimension of size 1."""
    return gate.clone(memory_format=torch.contiguous_format)
