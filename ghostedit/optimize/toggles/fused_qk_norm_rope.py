"""Flag `fused-qk-norm-rope` (lossless next to an FP8 attention): the joint attention's q and k normalized,
rotated and cast to FP8 in one Triton kernel that writes them joined (kernels/qk_norm_rope.py; the forward's
`fused_qk_norm_rope` path)."""
from ...kernels.attention import FP8_BACKENDS, fp8_availability
from .. import rewrites
from ..registry import OFF, ON, Choice, PrepareContext, Requires, Toggle, register


def _prepare(context: PrepareContext, value: str) -> None:
    if value == ON:
        layers = rewrites.check_qk_norm_rope(context.dit)
        context.report["fused-qk-norm-rope"] = (
            f"{layers} attention layers: q and k normalized, rotated and cast to FP8 in one kernel, written joined "
            "(under sequence parallel on each rank's tokens, the FP8 bytes sent to the others)")


register(Toggle(
    name="fused-qk-norm-rope", label="q/k RMSNorm, RoPE and FP8 cast in one kernel", group="rewrites",
    help="the FP8 attention's q and k are normalized, rotated and quantized by one kernel that writes text and "
         "image joined, instead of compiled kernels and a copy that joins them",
    choices=(Choice(OFF, "off"), Choice(ON, "on", requires=(
        Requires("attention", values=FP8_BACKENDS, why="it writes q and k in FP8 for an FP8 attention"),
        Requires("real-rope", values=(ON,), why="it reads the rotary embedding as real cos and sin"),))),
    order=35, prepare=_prepare, option="fused_qk_norm_rope",
    availability=lambda value, device: fp8_availability(device),
))
