"""Flag `joint-layout` (lossless rewrite): the joint attention of each block through GhostEdit's JointAttention,
which joins text and image q, k, v in the projections' layout (ghostedit/optimize/rewrites.py). The FP8 attentions
and the fused q/k/v projections run through it."""
from .. import attention
from ...models.family import QWEN_IMAGE_21_DIT
from ..registry import OFF, ON, Choice, PrepareContext, Toggle, register


def _prepare(context: PrepareContext, value: str) -> None:
    if value == ON:
        from .. import rewrites
        with_fp8_attention = context.config.value("attention") in attention.FP8_BACKENDS
        layers = rewrites.joint_attention(context.dit, fp8_scales=with_fp8_attention)
        context.shared["joint attention layers"] = layers
        context.report["joint-layout"] = f"{len(layers)} joint attention layers in the projections' layout"


register(Toggle(
    name="joint-layout", label="joint attention without transposing copies", group="rewrites",
    help="q, k and v stay in the projections' [batch, seq, heads, dim] layout",
    choices=(Choice(OFF, "off"), Choice(ON, "on")), order=20, prepare=_prepare,
    families={QWEN_IMAGE_21_DIT: "Qwen-Image-2.1's DiT is single-stream: its q, k and v already stay in the "
                                 "projections' layout, with no text and image streams to join"},
))
