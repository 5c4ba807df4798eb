"""One edit on several processes (GPUs, or CPU processes on gloo), launched with
`torchrun --nproc-per-node N -m ghostedit edit ...`. The rooms:

mesh.py     the torch.distributed process group and the ("cfg", "ulysses") device mesh, from the torchrun environment
cfg.py      CFG parallel: the conditional and unconditional passes on two ranks, predictions exchanged
ulysses.py  sequence parallel: the image tokens and their rotary frequencies split over ranks, all-to-all around
            the joint attention (optimize/attention.py calls it while it is active)

Every rank runs the whole pipeline (encoders, scheduler, VAE) and ends with the same latent; rank 0 writes the
image. In a single process `current()` is None and `edit_context` changes nothing.
"""
from __future__ import annotations

import contextlib

from ..errors import InvalidRequestError
from .cfg import guiding_in_parallel
from .mesh import MODE_HELP, MODES, ParallelMesh, current, setup, teardown, world_size_from_environment
from .ulysses import SequenceSharding

__all__ = ["MODES", "MODE_HELP", "ParallelMesh", "current", "setup", "teardown", "world_size_from_environment",
           "edit_context", "describe"]


def describe() -> str:
    """The parallel degree of this process's edits, in words (shown in the telemetry)."""
    mesh = current()
    return "single process" if mesh is None else mesh.describe()


@contextlib.contextmanager
def edit_context(pipe, dit, cfg_scale: float):
    """Around one edit on a prepared pipeline: its CFG steps split over the CFG ranks and its DiT forwards over
    the Ulysses ranks, as the current mesh says; nothing in a single process."""
    mesh = current()
    if mesh is None:
        yield
        return
    if mesh.cfg_degree > 1 and cfg_scale == 1.0:
        raise InvalidRequestError("this process runs CFG parallel, which needs true CFG (cfg > 1)")
    with contextlib.ExitStack() as stack:
        if mesh.cfg_degree > 1:
            stack.enter_context(guiding_in_parallel(pipe, mesh))
        if mesh.ulysses_degree > 1:
            stack.enter_context(SequenceSharding(dit, mesh))
        yield
