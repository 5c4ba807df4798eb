"""Flag `real-rope` (lossless rewrite): the rotary embedding with real cos/sin instead of complex numbers, which
Inductor cannot fuse (the forward's `real_rope` path in each DiT family's file, models/rotary.py)."""
from ..registry import OFF, ON, Choice, PrepareContext, Toggle, register


def _prepare(context: PrepareContext, value: str) -> None:
    if value == ON:
        context.report["real-rope"] = "rotary embedding with real cos/sin"


register(Toggle(
    name="real-rope", label="real-valued RoPE (fuses under compile)", group="rewrites",
    help="DiffSynth rotates q and k with complex numbers, which compiled code leaves as separate kernels",
    choices=(Choice(OFF, "off"), Choice(ON, "on")), order=30, prepare=_prepare, option="real_rope",
    families={},
))
