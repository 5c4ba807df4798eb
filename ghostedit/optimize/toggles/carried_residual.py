"""Flag `carried-residual` (lossless rewrite): each DiT block's last residual addition done by the next block, fused
into its first LayerNorm (ghostedit/optimize/carried_residual.py). Prepared: the blocks' forward; at run time:
GhostEdit's block loop, which hands the additions on, in DiffSynth's place. Where the loop cannot run (the step
cache, sequence parallel) the run says so in its words and notes and the blocks add their own, as released."""
import contextlib

from ..registry import OFF, ON, Choice, PrepareContext, RunContext, Toggle, register


def _prepare(context: PrepareContext, value: str) -> None:
    if value == ON:
        from .. import carried_residual
        blocks = carried_residual.carry_residuals(context.dit)
        context.report["carried-residual"] = f"{blocks} blocks hand their last residual addition to the next block"


@contextlib.contextmanager
def _carried(context: RunContext, value: str):
    if value == OFF:
        yield
        return
    from .. import carried_residual
    reason = carried_residual.why_not_carried(context.config)
    if reason is not None:
        context.not_applied("carried-residual", f"not applied on this run: {reason}")
        yield
        return
    with carried_residual.carried(context.prepared.pipe):
        yield


register(Toggle(
    name="carried-residual", label="block-end residual fused into the next block", group="rewrites",
    help="each block leaves its feed-forward's residual addition to the next block, where it joins the LayerNorm "
         "kernel: one pass over the tokens fewer per block",
    choices=(Choice(OFF, "off"), Choice(ON, "on")), order=40, prepare=_prepare, run_context=_carried,
))
