"""Flag `carried-residual` (lossless rewrite): each DiT block's last residual addition done by the next block, fused
into its first LayerNorm (the forward's `carried_residual` path, in both families: models/qwen_image/dit.py, two
streams' additions; models/qwen_image_21/dit.py, its one stream's, the prefix cache's keys and values untouched).
Where a run's block loop cannot hand the additions on (the step cache runs the blocks one by one and watches each
one's output) the run says so in its words and notes and the blocks add their own, as released."""
import contextlib

from ..registry import OFF, ON, Choice, PrepareContext, RunContext, Toggle, register


def why_not_carried(config) -> str | None:
    """Why this run's blocks cannot hand their additions on, or None."""
    if config.value("step-cache") != OFF:
        return "the step cache watches each block's output, with its additions done"
    return None


def _prepare(context: PrepareContext, value: str) -> None:
    if value == ON:
        blocks = len(context.dit.blocks)
        context.report["carried-residual"] = f"{blocks} blocks hand their last residual addition to the next block"


@contextlib.contextmanager
def _carried(context: RunContext, value: str):
    if value == ON:
        reason = why_not_carried(context.config)
        if reason is None:
            context.options["carried_residual"] = True
        else:
            context.not_applied("carried-residual", f"not applied on this run: {reason}")
    yield


register(Toggle(
    name="carried-residual", label="block-end residual fused into the next block", group="rewrites",
    help="each block leaves its feed-forward's residual addition to the next block, where it joins the LayerNorm "
         "kernel: one pass over the tokens fewer per block",
    choices=(Choice(OFF, "off"), Choice(ON, "on")), order=40, prepare=_prepare, run_context=_carried, families={},
))
