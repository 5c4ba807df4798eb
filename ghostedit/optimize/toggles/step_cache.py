"""Toggle `step-cache`: a lossy step cache around the DiT's block loop, First-Block Cache at a choice of thresholds
(implemented in ghostedit/optimize/step_cache.py; the forward's block loop consults the one the run's options hold:
the Edit DiT's image stream, Qwen-Image-2.1's target tokens, which its prefix cache's steps all compute).
It changes only how a run goes: the prepared (compiled, FP8) DiT is the same with it on or off, and every edit
starts with an empty cache. What it skipped goes into the run's telemetry (`step_cache`), its words and a note that
says how little random weights tell about its quality. The bench on random weights raises the threshold
(`RunContext`'s step_cache_threshold, the bench's --step-cache-threshold): see `threshold`."""
import contextlib

from .. import step_cache
from ..registry import OFF, RUN, Choice, RunContext, Toggle, register

THRESHOLDS = (0.05, 0.08, 0.12, 0.2)
QUALITY_NOTE = ("lossy: compare its output with a run without it (PSNR/SSIM); random weights (the tiny and synthetic "
                "models) say little about a cache's quality with real weights, and change the first block's output "
                "by about 90 percent from step to step, so that these thresholds skip nothing there")


def threshold(value: str, override: float | None = None) -> float:
    """The choice's threshold, or `override` for every choice but threshold 0 (the bench on random weights, whose
    first block changes the image by about 90% from one step to the next (tiny and the full-size synthetic model
    alike), so that no offered threshold ever skips a step there: with a threshold near 1 the cache skips steps and
    the cost of a served step, under compile and FP8 too, can be measured)."""
    offered = float(value.removeprefix("fbcache-"))
    return override if offered and override is not None else offered


@contextlib.contextmanager
def _cached(context: RunContext, value: str):
    if value == OFF:
        yield
        return
    cache = step_cache.FirstBlockCache(threshold(value, context.step_cache_threshold), context.mesh)
    context.options["step_cache"] = cache
    try:
        yield
    finally:
        context.recorder.telemetry.step_cache = cache.summary()
        context.recorder.telemetry.notes.append(f"step cache: {cache.words()}; {QUALITY_NOTE}")
        context.ran.setdefault("words", {})["step-cache"] = cache.words()


def _choice(value: float) -> Choice:
    return Choice(f"fbcache-{value:g}", f"First-Block Cache, threshold {value:g} (lossy)", lossy=True,
                  help="skips the blocks after the first at a step whose first block changes the image about as "
                       f"at the last computed step (relative difference under {value:g}); {QUALITY_NOTE}")


register(Toggle(
    name="step-cache", label="Step cache (lossy)",
    help="First-Block Cache: at each step the DiT's first block decides whether the other blocks run or their "
         "change at the last computed step is reused (each CFG pass apart); " + QUALITY_NOTE,
    choices=(
        Choice(OFF, "off (every block at every step)"),
        Choice("fbcache-0", "First-Block Cache, threshold 0 (never skips: the full result, the check's cost alone)",
               help="the cache's bookkeeping without a skipped step: the output equals a run without it"),
        *(_choice(value) for value in THRESHOLDS),
    ),
    changes=RUN, order=96, run_context=_cached, tag=lambda value: value, families={},
))
