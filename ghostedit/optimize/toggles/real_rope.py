"""Flag `real-rope` (lossless rewrite): the rotary embedding with real cos/sin instead of complex numbers, which
Inductor cannot fuse (ghostedit/optimize/rewrites.py)."""
from ..registry import OFF, ON, Choice, PrepareContext, Toggle, register


def _prepare(context: PrepareContext, value: str) -> None:
    if value == ON:
        from .. import rewrites
        rewrites.use_real_rope(context.dit)
        context.report["real-rope"] = "rotary embedding with real cos/sin"


register(Toggle(
    name="real-rope", label="real-valued RoPE (fuses under compile)", group="rewrites",
    help="DiffSynth rotates q and k with complex numbers, which compiled code leaves as separate kernels",
    choices=(Choice(OFF, "off"), Choice(ON, "on")), order=30, prepare=_prepare,
))
