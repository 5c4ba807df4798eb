"""Flag `inductor-cdt` (lossless): Inductor's coordinate-descent tuning of the kernels it generates (slower compile)."""
from .. import compile as compile_blocks
from ..registry import OFF, ON, Choice, Requires, Toggle, register

register(Toggle(
    name="inductor-cdt", label="Inductor kernel tuning (with compile)", group="rewrites",
    help="coordinate-descent tuning of each generated kernel while compiling",
    choices=(Choice(OFF, "off"), Choice(ON, "on", requires=(
        Requires("compile", not_values=("off",), why="it sets how compiled kernels are made"),))),
    order=91, compile_options={"coordinate_descent_tuning": True},
    availability=lambda value, device: compile_blocks.availability("regional", device),
    families={},  # Inductor options: whatever DiT compile compiles
))
