"""Flag `inductor-multi-kernel` (lossless): Inductor generates each reduction two ways, whole rows in registers and
looped, and times both on first use (by default it loops over rows longer than 1024)."""
from .. import compile as compile_blocks
from ..registry import OFF, ON, Choice, Requires, Toggle, register

register(Toggle(
    name="inductor-multi-kernel", label="Inductor reductions timed two ways (with compile)", group="rewrites",
    help="persistent and looped reductions, the faster picked on first use",
    choices=(Choice(OFF, "off"), Choice(ON, "on", requires=(
        Requires("compile", not_values=("off",), why="it sets how compiled kernels are made"),))),
    order=92, compile_options={"triton.multi_kernel": 1},
    availability=lambda value, device: compile_blocks.availability("regional", device),
    families={},  # Inductor options: whatever DiT compile compiles
))
