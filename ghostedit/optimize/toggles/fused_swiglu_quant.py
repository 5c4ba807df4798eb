"""Flag `fused-swiglu-quant` (lossless next to fp8=torchao): each of Qwen-Image-2.1's feed-forward layers computes
silu(gate) * up and its rowwise FP8 quantization in one Triton kernel (kernels/swiglu_quant.py; the 2.1 forward's
`fused_swiglu_quant` path), with the roundings of eager PyTorch and torchao. Exact on an H200, and slower there
than the persistent reduction Inductor compiles for the same work (lab/LOG.md, section 9): the fastest 2.1
configuration leaves it out."""
from ...models.family import QWEN_IMAGE_DIT
from .. import fp8, rewrites
from ..registry import OFF, ON, Choice, PrepareContext, Requires, Toggle, register


def _prepare(context: PrepareContext, value: str) -> None:
    if value == ON:
        layers = rewrites.check_feed_forward_quant(context.dit, "the fused SwiGLU quantization")
        context.report["fused-swiglu-quant"] = (f"{layers} feed-forward layers: silu(gate) * up and FP8 quantization "
                                                "in one kernel")


register(Toggle(
    name="fused-swiglu-quant", label="SwiGLU and its FP8 quantization in one kernel", group="rewrites",
    help="the feed-forward layers' silu(gate) * up is quantized for the FP8 down projection in the kernel that "
         "computes it, with eager PyTorch's and torchao's roundings; measured slower than compile's own kernel "
         "with inductor-persistent-rows on an H200",
    choices=(Choice(OFF, "off"), Choice(ON, "on", requires=(
        Requires("fp8", values=("torchao",), why="it feeds torchao's FP8 down projection"),),
        needs_fused_loras="a runtime LoRA layer sits on the down projection it calls directly")),
    order=65, prepare=_prepare, option="fused_swiglu_quant",
    availability=lambda value, device: fp8.availability("torchao", device),
    families={QWEN_IMAGE_DIT: "the Qwen-Image-Edit DiT's feed-forward is GELU, not SwiGLU: fused-gelu-quant is its "
                              "rewrite"},
))
