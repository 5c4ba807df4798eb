"""One edit on several processes (GPUs, or CPU processes on gloo), launched with
`torchrun --nproc-per-node N -m ghostedit edit ...`. The rooms:

mesh.py     the torch.distributed process group and the ("cfg", "ulysses") device mesh, from the torchrun environment
cfg.py      CFG parallel: the conditional and unconditional passes on two ranks, predictions exchanged
ulysses.py  sequence parallel: the DiT forward's sequence split (its image tokens over ranks, or 2.1's prefix and
            target tokens, all-to-all around the attention), handed to the forward in the run's options

Every rank runs the whole pipeline (encoders, scheduler, VAE) and ends with the same latent; rank 0 writes the
image. The process's mesh travels with its engine; in a single process there is none and nothing changes.
"""
from __future__ import annotations

import contextlib

from ..errors import InvalidRequestError
from .cfg import guiding_in_parallel
from .mesh import MODE_HELP, MODES, ParallelMesh, setup, teardown, world_size_from_environment
from .ulysses import Ulysses

__all__ = ["MODES", "MODE_HELP", "ParallelMesh", "Ulysses", "setup", "teardown", "world_size_from_environment",
           "edit_context", "describe"]


def describe(mesh: ParallelMesh | None) -> str:
    """The parallel degree of an edit on `mesh`, in words (shown in the telemetry)."""
    return "single process" if mesh is None else mesh.describe()


@contextlib.contextmanager
def edit_context(pipe, mesh: ParallelMesh | None, cfg_scale: float):
    """Around one edit on a prepared pipeline: its CFG steps split over the CFG ranks, as the mesh says (the Ulysses
    split goes into the DiT forward's options); nothing in a single process."""
    if mesh is None or mesh.cfg_degree == 1:
        yield
        return
    if cfg_scale == 1.0:
        raise InvalidRequestError("this process runs CFG parallel, which needs true CFG (cfg > 1)")
    with guiding_in_parallel(pipe, mesh):
        yield
