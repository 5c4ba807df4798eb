"""Flag `text-side-stream` (lossless rewrite): each block's text-stream GEMMs (the joined q/k/v projection, the
feed-forward) on a second CUDA stream, beside the image stream's memory-bound kernels
(ghostedit/optimize/text_beside.py)."""
from .. import fp8
from ..registry import OFF, ON, Choice, PrepareContext, Requires, Toggle, register


def _prepare(context: PrepareContext, value: str) -> None:
    if value == ON:
        from .. import text_beside
        blocks = text_beside.put_text_beside(context.dit)
        context.report["text-side-stream"] = f"{blocks} blocks run their text stream's GEMMs on a second CUDA stream"


register(Toggle(
    name="text-side-stream", label="text stream's GEMMs on a second CUDA stream", group="rewrites",
    help="the text stream's few rows leave most of the GPU idle in their GEMMs; run beside the image stream's "
         "LayerNorm and GELU kernels, which wait on memory, they overlap them (the same kernels, the same output)",
    choices=(Choice(OFF, "off"), Choice(ON, "on", requires=(
        Requires("fp8", values=("torchao",), why="it runs torchao's FP8 GEMMs on the text layers' weights"),
        Requires("fused-qkv", values=(ON,), why="it starts the text stream's joined q/k/v projection"),
        Requires("fused-gelu-quant", values=(ON,), why="its feed-forward runs that rewrite's GELU kernel"),
        Requires("carried-residual", values=(ON,), why="that rewrite's block forward starts the text stream first")),
        needs_fused_loras="runtime LoRA layers sit on the text projections it calls directly")),
    order=68, prepare=_prepare,
    availability=lambda value, device: fp8.availability("torchao", device),
))
