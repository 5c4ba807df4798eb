"""Toggle `scheduler`: the sampling schedule of a run. `model`: the model's own (flow matching with a shift that
grows with the image size and a terminal shift). `lightning`: the schedule the model's Lightning LoRA was distilled
for (Family.lightning_schedule, computed as diffusers computes it): for the Edit models base and max shift log(3),
exponential time shift, no terminal shift (models/family.py's LIGHTNING_SCHEDULER); for Qwen-Image-2.1 its own
schedule without the terminal stretch. For the steps at CFG 1 of such a LoRA (ghostedit/optimize/presets.py)."""
import contextlib

from ..registry import RUN, Choice, RunContext, Toggle, register


@contextlib.contextmanager
def _schedule(context: RunContext, choice: str):
    if choice == "model":  # the pipeline's own: its family's schedule
        yield
        return
    pipe = context.prepared.pipe
    previous = pipe.scheduler
    pipe.use_schedule(pipe.family.lightning_schedule())
    try:
        yield
    finally:
        pipe.scheduler = previous


register(Toggle(
    name="scheduler", label="Sampling schedule",
    help="the model's own, or the one its Lightning LoRA was distilled for (with that LoRA, its steps, CFG 1)",
    choices=(Choice("model", "the model's own"),
             Choice("lightning", "Lightning (the schedule of the model's Lightning LoRA: no terminal shift)")),
    default="model", changes=RUN, order=95, run_context=_schedule, families={},
))
