"""Flag `fused-qk-norm-rope` (lossless next to an FP8 attention): the attention's q and k normalized, rotated and cast
to FP8 in one Triton kernel (kernels/qk_norm_rope.py; the forward's `fused_qk_norm_rope` path in both families).
The Edit DiT's writes text and image joined, at every step. Qwen-Image-2.1's runs it at the steps that read the
prefix cache (the target's q and k; the cache keeps the bf16 keys and values the seam's FP8 path reads); the step that
fills the cache computes q and k as released, since its causal text spans attend exact in bf16 and the cache keeps
bf16 keys, so with the prefix cache off the 2.1 run says it was not applied."""
import contextlib

from ...kernels.attention import FP8_BACKENDS, fp8_availability
from ...models.family import QWEN_IMAGE_21_DIT
from .. import rewrites
from ..registry import OFF, ON, Choice, PrepareContext, Requires, RunContext, Toggle, register


def why_not_fused(context: RunContext) -> str | None:
    """Why this run's forwards take no fused q/k path, or None."""
    family = context.prepared.pipe.family   # None: a pipeline not yet given one, an Edit model's
    if family is not None and family.dit == QWEN_IMAGE_21_DIT and context.config.value("prefix-cache") == OFF:
        return ("Qwen-Image-2.1 runs it at the steps that read the prefix cache, which is off (the step that fills "
                "it computes q and k as released: its causal text spans attend exact in bf16)")
    return None


def _prepare(context: PrepareContext, value: str) -> None:
    if value == ON:
        layers = rewrites.check_qk_norm_rope(context.dit)
        context.report["fused-qk-norm-rope"] = (
            f"{layers} attention layers: q and k normalized, rotated and cast to FP8 in one kernel, written joined "
            "(under sequence parallel on each rank's tokens, the FP8 bytes sent to the others; on Qwen-Image-2.1 at "
            "the steps that read the prefix cache)")


def said_where_not_fused(flag: str):
    """The run-time context of `flag`, a rewrite on the fused q/k path: a run whose forwards take no such path says
    so, with why_not_fused's reason."""
    @contextlib.contextmanager
    def context(run: RunContext, value: str):
        reason = why_not_fused(run) if value == ON else None
        if reason is not None:
            run.not_applied(flag, f"not applied on this run: {reason}")
        yield
    return context


register(Toggle(
    name="fused-qk-norm-rope", label="q/k RMSNorm, RoPE and FP8 cast in one kernel", group="rewrites",
    help="the FP8 attention's q and k are normalized, rotated and quantized by one kernel that writes text and "
         "image joined, instead of compiled kernels and a copy that joins them",
    choices=(Choice(OFF, "off"), Choice(ON, "on", requires=(
        Requires("attention", values=FP8_BACKENDS, why="it writes q and k in FP8 for an FP8 attention"),
        Requires("real-rope", values=(ON,), why="it reads the rotary embedding as real cos and sin"),))),
    order=35, prepare=_prepare, option="fused_qk_norm_rope",
    run_context=said_where_not_fused("fused-qk-norm-rope"),
    availability=lambda value, device: fp8_availability(device), families={},
))
