"""Flag `fused-gelu-quant` (lossless next to fp8=torchao): each feed-forward layer's GELU and the rowwise FP8
quantization of its output in one Triton kernel (kernels/gelu_quant.py; the forward's `fused_gelu_quant` path)."""
from ...models.family import QWEN_IMAGE_21_DIT
from .. import fp8, rewrites
from ..registry import OFF, ON, Choice, PrepareContext, Requires, Toggle, register


def _prepare(context: PrepareContext, value: str) -> None:
    if value == ON:
        layers = rewrites.check_feed_forward_quant(context.dit, "the fused GELU quantization")
        context.report["fused-gelu-quant"] = f"{layers} feed-forward layers: GELU and FP8 quantization in one kernel"


register(Toggle(
    name="fused-gelu-quant", label="GELU and its FP8 quantization in one kernel", group="rewrites",
    help="the feed-forward layers' GELU output is quantized for the FP8 down projection in the kernel that computes "
         "it, reading each row from memory once",
    choices=(Choice(OFF, "off"), Choice(ON, "on", requires=(
        Requires("fp8", values=("torchao",), why="it feeds torchao's FP8 down projection"),),
        needs_fused_loras="runtime LoRA layers sit on the feed-forward projections it calls directly")),
    order=65, prepare=_prepare, option="fused_gelu_quant",
    availability=lambda value, device: fp8.availability("torchao", device),
    families={QWEN_IMAGE_21_DIT: "Qwen-Image-2.1's feed-forward is SwiGLU: there is no GELU to fuse"},
))
