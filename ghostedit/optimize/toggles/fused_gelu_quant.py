"""Flag `fused-gelu-quant` (lossless next to fp8=torchao): each feed-forward layer's GELU and the rowwise FP8
quantization of its output in one Triton kernel (ghostedit/optimize/fp8_mlp.py)."""
from .. import fp8
from ..registry import OFF, ON, Choice, PrepareContext, Requires, Toggle, register


def _prepare(context: PrepareContext, value: str) -> None:
    if value == ON:
        from ...kernels import gelu_quant as fp8_mlp
        with context.stage("fuse GELU quantization", "fusing GELU with its FP8 quantization"):
            layers = fp8_mlp.fuse_gelu_quantization(context.dit)
        context.report["fused-gelu-quant"] = f"{layers} feed-forward layers: GELU and FP8 quantization in one kernel"


register(Toggle(
    name="fused-gelu-quant", label="GELU and its FP8 quantization in one kernel", group="rewrites",
    help="the feed-forward layers' GELU output is quantized for the FP8 down projection in the kernel that computes "
         "it, reading each row from memory once",
    choices=(Choice(OFF, "off"), Choice(ON, "on", requires=(
        Requires("fp8", values=("torchao",), why="it feeds torchao's FP8 down projection"),),
        needs_fused_loras="runtime LoRA layers sit on the feed-forward projections it calls directly")),
    order=65, prepare=_prepare,
    availability=lambda value, device: fp8.availability("torchao", device),
))
