"""Toggle `scheduler`: the sampling schedule of a run. `model`: the model's own (flow matching with a shift that
grows with the image size and a terminal shift). `lightning`: the schedule the Lightning LoRAs were distilled for
(flow matching, base and max shift log(3), exponential time shift, no terminal shift: models/family.py's
LIGHTNING_SCHEDULER, computed as diffusers computes it), for 4 or 8 steps at CFG 1 with such a LoRA
(ghostedit/optimize/presets.py)."""
import contextlib

from ...models.family import LIGHTNING_SCHEDULER, QWEN_IMAGE_21_DIT
from ..registry import RUN, Choice, RunContext, Toggle, register


@contextlib.contextmanager
def _schedule(context: RunContext, choice: str):
    if choice == "model":  # the pipeline's own: its family's schedule
        yield
        return
    pipe = context.prepared.pipe
    previous = pipe.scheduler
    pipe.use_schedule(LIGHTNING_SCHEDULER)
    try:
        yield
    finally:
        pipe.scheduler = previous


register(Toggle(
    name="scheduler", label="Sampling schedule",
    help="the model's own, or the one Lightning LoRAs were distilled for (with such a LoRA, 4 or 8 steps, CFG 1)",
    choices=(Choice("model", "the model's own"),
             Choice("lightning", "Lightning (for Lightning LoRAs: log(3) shift, no terminal shift)",
                    families={QWEN_IMAGE_21_DIT: "the Lightning schedule is the one lightx2v's Qwen-Image-Edit LoRAs "
                                                 "were distilled for; Qwen-Image-2.1-Turbo has its own sigmas"})),
    default="model", changes=RUN, order=95, run_context=_schedule, families={},
))
