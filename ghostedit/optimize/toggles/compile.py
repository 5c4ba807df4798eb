"""Toggle `compile`: torch.compile of each transformer block (implemented in ghostedit/optimize/compile.py), with
the Inductor options that other toggles add (ghostedit.optimize.registry.compile_options)."""
import contextlib

from .. import compile as compile_blocks, packages
from ..registry import Choice, PrepareContext, RunContext, Toggle, compile_options, register


def _prepare(context: PrepareContext, mode: str) -> None:
    if mode == "off":
        return
    options, words = compile_options(context.config)
    with context.stage("compile", "setting up torch.compile"):
        blocks = compile_blocks.compile_regions(context.dit, mode, options)
        packaged = packages.load(context.config.prepared_label, context.device)
    first_call = "its code loaded from a compiled package" if packaged else "compiled on first call"
    context.report["compile"] = ", ".join([f"{mode}: {blocks} transformer blocks ({first_call})", *words])


def _begin(context: PrepareContext, mode: str) -> None:
    """What a compile needs that can start while the DiT is prepared: the workers (a GPU's Triton kernels), the
    compile cache's keys."""
    if mode == "off":
        return
    if context.device.startswith("cuda"):
        compile_blocks.start_compile_workers()
    compile_blocks.start_hashing_compile_keys()


@contextlib.contextmanager
def _dynamo_settings(context: RunContext, mode: str):
    if mode != "off":
        compile_blocks.configure_dynamo()  # in the run's thread: Inductor's heuristics object is one per thread
    yield


register(Toggle(
    name="compile", label="torch.compile",
    help="regional compilation: the repeated transformer block is compiled once and shared by all blocks",
    choices=(
        Choice("off", "off (eager)"),
        Choice("regional", "regional (each transformer block)"),
        Choice("max-autotune", "max-autotune (each block, tuned kernels)"),
    ),
    order=90, prepare=_prepare, begin=_begin, run_context=_dynamo_settings,
    availability=compile_blocks.availability, families={},
))
