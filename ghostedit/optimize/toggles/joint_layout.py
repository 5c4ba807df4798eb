"""Flag `joint-layout` (lossless rewrite): each block's joint attention joins text and image q, k and v in the
projections' layout (the forward's `joint_layout` path, models/qwen_image/dit.py). The FP8 attentions and the fused
q/k/v projections run through it: with an FP8 attention, preparing works out the FP8 scales of q and k from their
bounds. Qwen-Image-2.1's single-stream DiT always keeps q, k and v in that layout (one stream, nothing to join):
there the flag names what its forward does anyway, so that fused-qkv, which implies it, runs there too."""
from ...kernels.attention import FP8_BACKENDS
from .. import rewrites
from ..registry import OFF, ON, Choice, PrepareContext, Toggle, register


def _prepare(context: PrepareContext, value: str) -> None:
    if value == ON:
        layers = len(context.dit.attention_layers())
        if context.config.value("attention") in FP8_BACKENDS:
            rewrites.fp8_scales(context.dit)
        context.report["joint-layout"] = f"{layers} joint attention layers in the projections' layout"


register(Toggle(
    name="joint-layout", label="joint attention without transposing copies", group="rewrites",
    help="q, k and v stay in the projections' [batch, seq, heads, dim] layout",
    choices=(Choice(OFF, "off"), Choice(ON, "on")), order=20, prepare=_prepare, option="joint_layout",
    families={},
))
