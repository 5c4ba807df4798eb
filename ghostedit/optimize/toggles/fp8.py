"""Toggle `fp8`: FP8 for the DiT's linear layers (lossy; the modes are implemented in ghostedit/optimize/fp8.py)."""
from ...models.family import QWEN_IMAGE_21_DIT
from .. import fp8
from ..registry import Choice, PrepareContext, RunContext, Toggle, register

TE_NOT_FOR_21 = {QWEN_IMAGE_21_DIT: "Transformer Engine's layers replace the Edit DiT's image-stream linears; "
                                    "Qwen-Image-2.1 runs torchao's FP8"}


def _prepare(context: PrepareContext, mode: str) -> None:
    if mode == "off":
        return
    with context.stage("quantize", "quantizing to FP8"):
        context.report["fp8"] = fp8.apply_fp8(context.dit, mode, context.device).text


def _forward(context: RunContext, mode: str):
    return fp8.forward_context(context.prepared.dit, mode)


register(Toggle(
    name="fp8", label="FP8",
    help="FP8 weights (storage) or FP8 compute (torchao, Transformer Engine) for the DiT's linear layers: half the "
         "weight memory; lossy",
    choices=(
        Choice("off", "off (bf16 weights)"),
        Choice("storage", "storage (FP8 weights, bf16 compute)", lossy=True,
               help="torchao Float8WeightOnlyConfig: half the weight memory, dequantized in every layer"),
        Choice("torchao", "torchao (FP8 compute)", lossy=True,
               help="torchao Float8DynamicActivationFloat8WeightConfig, rowwise scales: FP8 tensor cores"),
        Choice("te", "Transformer Engine (FP8 compute, current scaling)", lossy=True,
               help="TE Linear layers for the image stream under FP8 autocast", families=TE_NOT_FOR_21),
        Choice("te-delayed", "Transformer Engine (FP8 compute, delayed scaling)", lossy=True,
               help="the same with scales from an amax history", families=TE_NOT_FOR_21),
    ),
    order=60, prepare=_prepare, run_context=_forward, availability=fp8.availability, tag=lambda mode: f"fp8-{mode}",
    families={},
))
