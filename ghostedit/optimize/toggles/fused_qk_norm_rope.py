"""Flag `fused-qk-norm-rope` (lossless next to an FP8 attention): the joint attention's q and k normalized,
rotated and cast to FP8 in one Triton kernel that writes them joined (ghostedit/optimize/fp8_qk.py)."""
from .. import attention
from ..registry import OFF, ON, Choice, PrepareContext, Requires, Toggle, register


def _prepare(context: PrepareContext, value: str) -> None:
    if value == ON:
        from .. import rewrites
        layers = rewrites.fuse_qk_norm_rope(context.shared["joint attention layers"])
        context.report["fused-qk-norm-rope"] = (
            f"{layers} attention layers: q and k normalized, rotated and cast to FP8 in one kernel, written joined "
            "(under sequence parallel the unfused path runs: the image stream's q and k go to other ranks first)")


register(Toggle(
    name="fused-qk-norm-rope", label="q/k RMSNorm, RoPE and FP8 cast in one kernel", group="rewrites",
    help="the FP8 attention's q and k are normalized, rotated and quantized by one kernel that writes text and "
         "image joined, instead of compiled kernels and a copy that joins them",
    choices=(Choice(OFF, "off"), Choice(ON, "on", requires=(
        Requires("attention", values=attention.FP8_BACKENDS, why="it writes q and k in FP8 for an FP8 attention"),
        Requires("real-rope", values=(ON,), why="it reads the rotary embedding as real cos and sin"),))),
    order=35, prepare=_prepare,
    availability=lambda value, device: attention.fp8_availability(device),
))
