"""Flag `fp8-attention-out` (next to fused-qk-norm-rope and fp8=torchao): the FP8 attention's output goes into the
output projections' FP8 GEMMs as cuDNN wrote it, instead of dequantized and quantized again (the forward's
`fp8_attention_out` path in both families, where fused-qk-norm-rope's runs: on Qwen-Image-2.1 the steps that read
the prefix cache, and a run with the cache off says it was not applied). One rounding fewer than without it."""
from ...kernels.attention import availability
from .. import rewrites
from ..registry import OFF, ON, Choice, PrepareContext, Requires, Toggle, register
from .fused_qk_norm_rope import said_where_not_fused


def _prepare(context: PrepareContext, value: str) -> None:
    if value == ON:
        fused = rewrites.check_fp8_attention_out(context.dit)
        context.report["fp8-attention-out"] = f"{fused} attention layers: the FP8 attention output goes into the " \
                                              "output projections' FP8 GEMMs as it is"


register(Toggle(
    name="fp8-attention-out", label="FP8 attention output straight into the FP8 output projections",
    group="rewrites",
    help="the output projections multiply the FP8 attention's output as cuDNN wrote it (its scale as every row's) "
         "instead of a bf16 copy that they quantize again per row",
    choices=(Choice(OFF, "off"), Choice(ON, "on", requires=(
        Requires("attention", values=("cudnn-fp8",), why="only cuDNN writes the attention output in FP8"),
        Requires("fused-qk-norm-rope", values=(ON,), why="it takes the attention output on that rewrite's path"),
        Requires("fp8", values=("torchao",), why="it feeds torchao's FP8 output projections")),
        needs_fused_loras="runtime LoRA layers sit on the output projections it calls directly")),
    order=67, prepare=_prepare, option="fp8_attention_out", run_context=said_where_not_fused("fp8-attention-out"),
    availability=lambda value, device: availability("cudnn-fp8", device), families={},
))
