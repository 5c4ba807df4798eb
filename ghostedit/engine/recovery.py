"""Running out of memory: an attempt that runs out of GPU memory is tried once more after every prepared pipeline
is freed; a second failure becomes a GpuOutOfMemoryError that says what to try. Cancelled and failed attempts leave
without the frames that hold their tensors, so their memory is free when the error reaches the caller."""
from __future__ import annotations

import gc
import logging
import re
import traceback

import torch

from ..device import empty_cache
from ..errors import GpuOutOfMemoryError
from ..telemetry import GIB, RunCancelled

OUT_OF_MEMORY_RETRY_NOTE = ("ran out of GPU memory on the first try: every cached pipeline was freed and the edit "
                            "was run again")

logger = logging.getLogger(__name__)


def recovering_memory(attempt, what: str, free, device: str, mesh=None):
    """`attempt()` and whether it was retried after running out of memory; `free()` drops the prepared pipelines
    and returns the bytes it freed; `mesh`: the process mesh of a parallel edit (None in one process)."""
    result, error = _outcome(attempt)
    # One rank of a parallel edit cannot start over alone: the others wait in its collectives, and a restarted run
    # would meet them at another step with tensors of the same shapes
    retried = isinstance(error, torch.OutOfMemoryError) and mesh is None
    if retried:
        _free_after_out_of_memory(free)
        result, error = _outcome(attempt)
    if isinstance(error, torch.OutOfMemoryError):
        _free_after_out_of_memory(free)
        error = GpuOutOfMemoryError(_message(what, error, device, retried))
    if error is not None:
        gc.collect()
        empty_cache(device)
        raise error
    return result, retried


def _free_after_out_of_memory(free) -> None:
    logger.warning("out of memory: freed %.2f GiB of prepared pipelines", free() / GIB)


def _message(what: str, error: torch.OutOfMemoryError, device: str, retried: bool) -> str:
    memory = "GPU memory" if device.startswith("cuda") else "memory"
    wanted = re.search(r"Tried to allocate ([\d.]+ \w+)", str(error))
    needed = f" (it needed another {wanted[1]})" if wanted else ""
    tried = ("GhostEdit freed every cached pipeline and tried once more, and it still did not fit" if retried else
             "one rank of a parallel edit cannot try again alone, so the edit stops")
    return (f"out of {memory} while {what}{needed}: {tried}. Try a smaller output size, fewer input images, "
            "FP8 weights or memory=low")


def _outcome(attempt):
    """(result, None), or (None, error) for running out of memory or being cancelled, the error detached from the
    frames of the failed attempt (its traceback and any exception it interrupted)."""
    try:
        return attempt(), None
    except (torch.OutOfMemoryError, RunCancelled) as error:
        if isinstance(error, torch.OutOfMemoryError):
            logger.warning("out of memory:\n%s", traceback.format_exc())  # text only: a record would keep the frames
        error.__traceback__ = error.__context__ = error.__cause__ = None
        return None, error
