"""Toggle `attention`: the attention backend of the DiT (the backends: ghostedit/kernels/attention.py; the forward's
dispatch: models/seams.py), set in the run's options.

Switching between exact backends prepares nothing (the backend is chosen for each run); only the FP8 attentions
change the prepared DiT (FP8 scales of q and k, through the joint layout they imply)."""
import contextlib

from ...kernels import attention
from ..registry import ON, Choice, RunContext, Toggle, register


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
        Choice("auto", "auto (fastest exact backend measured here)"),
        Choice("sdpa-cudnn", "PyTorch SDPA: cuDNN"),
        Choice("sdpa-flash", "PyTorch SDPA: flash"),
        Choice("sdpa-efficient", "PyTorch SDPA: memory-efficient"),
        Choice("sdpa-math", "PyTorch SDPA: math"),
        Choice("fa4", "FlashAttention-4"),
        Choice("fa3", "FlashAttention-3"),
        Choice("fa2", "FlashAttention-2"),
        Choice("sage", "SageAttention (INT8, lossy)", lossy=True),
        Choice("cudnn-fp8", "cuDNN FP8 attention (lossy)", lossy=True, implies=(("joint-layout", ON),)),
        Choice("fa3-fp8", "FlashAttention-3 FP8 attention (lossy)", lossy=True, implies=(("joint-layout", ON),)),
    ),
    default="diffsynth", order=15,
    prepared_key=lambda backend: backend if backend in attention.FP8_BACKENDS else None,
    run_context=_chosen, availability=attention.availability, tag=lambda backend: backend,
))
