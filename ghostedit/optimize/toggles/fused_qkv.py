"""Flag `fused-qkv` (lossless rewrite): one projection for q, k and v per stream (a 3x wider GEMM; one activation
quantization instead of three under FP8), through the joint layout (the forward's `fused_qkv` path in each DiT
family's file; preparing joins the weights: optimize/rewrites.py)."""
from .. import rewrites
from ..registry import OFF, ON, Choice, PrepareContext, Toggle, register


def _prepare(context: PrepareContext, value: str) -> None:
    if value == ON:
        with context.stage("fuse QKV", "fusing q/k/v projections"):
            fused = rewrites.fuse_qkv(context.dit)
        context.report["fused-qkv"] = f"{fused} attention layers with fused q/k/v projections"


register(Toggle(
    name="fused-qkv", label="one fused Q/K/V projection", group="rewrites",
    help="three projections become one wider one",
    choices=(Choice(OFF, "off"), Choice(ON, "on", implies=(("joint-layout", ON),),
                                         needs_fused_loras="runtime LoRA layers sit on the separate q/k/v projections")),
    order=25, prepare=_prepare, option="fused_qkv", families={},
))
