"""Flag `inductor-persistent-rows` (lossless): Inductor reduces a row with the whole row in registers (a persistent
reduction) wherever multi-kernel would offer that variant, and compiles it alone (ghostedit/optimize/compile.py)."""
from .. import compile as compile_blocks
from ..registry import OFF, ON, Choice, Requires, Toggle, register

register(Toggle(
    name="inductor-persistent-rows", label="Inductor rows reduced in registers (with compile)", group="rewrites",
    help="reductions keep their rows in registers up to multi-kernel's 16-fold limit (rows of 16384 values): the "
         "variant multi-kernel picks for the DiT's norms, compiled alone and not timed",
    choices=(Choice(OFF, "off"), Choice(ON, "on", requires=(
        Requires("compile", not_values=("off",), why="it sets how compiled kernels are made"),))),
    order=93, compile_options={"inductor_choices_class": compile_blocks.persistent_rows},
    availability=lambda value, device: compile_blocks.availability("regional", device),
    families={},  # Inductor options: whatever DiT compile compiles
))
