"""Toggle `attention`: the attention backend of the DiT (the backends: ghostedit/kernels/attention.py; the forward's
dispatch: models/seams.py), set in the run's options.

Switching between exact backends prepares nothing (the backend is chosen for each run); only the FP8 attentions
change the prepared DiT (FP8 scales of q and k, through the joint layout they imply)."""
import contextlib

from ...device import Availability
from ...kernels import attention
from ...models.family import QWEN_IMAGE_21_DIT, QWEN_IMAGE_DIT
from ...models.seams import FLEX
from ..registry import ON, Choice, Requires, RunContext, Toggle, register

# Qwen-Image-2.1's DiT runs the block-causal structure through PyTorch's SDPA (its default, or a kernel named),
# flex_attention or an FP8 attention (models/seams.py: span by span where a step fills the prefix cache); the other
# backends are wired into the Edit DiT's joint attention only
NOT_FOR_21 = {QWEN_IMAGE_21_DIT: "wired into the Edit DiT's joint attention; Qwen-Image-2.1's block-causal "
                                 "attention runs PyTorch's SDPA (its own pick or a named kernel), flex_attention or "
                                 "an FP8 attention"}
FLEX_HELP = "one flex_attention call over Qwen-Image-2.1's block-causal mask (its fused kernel needs compile)"
FP8_HELP = ("q, k and v in FP8, one scale each. Qwen-Image-2.1: the steps from the prefix cache attend wholly in "
            "FP8; the step that fills it (the first of each CFG branch) runs the reference images' and the "
            "target's spans in FP8 and the causal text span exact (PyTorch SDPA with its mask, which the FP8 "
            "kernels do not take); a batch of prompts of different lengths (padded: a mask at every step) is refused")


@contextlib.contextmanager
def _chosen(context: RunContext, backend: str):
    words = backend
    if backend == "auto":
        with context.recorder.stage("attention auto", "timing attention backends at this shape", into_prepare=True):
            dit = context.prepared.dit
            backend, words = attention.resolve(backend, dit.heads, dit.head_dim, context.sequence_length,
                                               context.device)
    elif backend == "diffsynth":
        words = f"DiffSynth default ({attention.diffsynth_default()})"
    context.ran["attention"] = backend
    context.ran.setdefault("words", {})["attention"] = words
    context.options["attention"] = backend
    yield


register(Toggle(
    name="attention", label="Attention backend",
    help="which kernel computes the DiT's joint attention; the lossy ones only when named",
    choices=(
        Choice("diffsynth", "DiffSynth default", help="FA3 if installed, else PyTorch SDPA's own dispatch"),
        Choice("auto", "auto (fastest exact backend measured here)", families=NOT_FOR_21),
        Choice("sdpa-cudnn", "PyTorch SDPA: cuDNN"),
        Choice("sdpa-flash", "PyTorch SDPA: flash"),
        Choice("sdpa-efficient", "PyTorch SDPA: memory-efficient"),
        Choice("sdpa-math", "PyTorch SDPA: math"),
        Choice("fa4", "FlashAttention-4", families=NOT_FOR_21),
        Choice("fa3", "FlashAttention-3", families=NOT_FOR_21),
        Choice("fa2", "FlashAttention-2", families=NOT_FOR_21),
        Choice("sage", "SageAttention (INT8, lossy)", lossy=True, families=NOT_FOR_21),
        Choice("cudnn-fp8", "cuDNN FP8 attention (lossy)", help=FP8_HELP, lossy=True,
               implies=(("joint-layout", ON),)),
        Choice("fa3-fp8", "FlashAttention-3 FP8 attention (lossy)", help=FP8_HELP, lossy=True,
               implies=(("joint-layout", ON),)),
        Choice(FLEX, "flex_attention (Qwen-Image-2.1's block mask)", help=FLEX_HELP,
               requires=(Requires("compile", not_values=("off",), why="flex_attention runs its fused kernel only "
                                  "compiled; uncompiled it computes the whole score matrix"),),
               families={QWEN_IMAGE_DIT: "the Edit DiT's joint attention has no mask to give flex_attention"}),
    ),
    default="diffsynth", order=15,
    prepared_key=lambda backend: backend if backend in attention.FP8_BACKENDS else None,
    run_context=_chosen, availability=lambda backend, device: Availability.yes() if backend == FLEX else
    attention.availability(backend, device), tag=lambda backend: backend, families={},
))
