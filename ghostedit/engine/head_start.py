"""The compile head start: a compiled configuration's transformer block traced and compiled (or its compiled code
found in the compile caches) on a one-block stand-in, on a thread of its own, while the DiT itself is prepared.

The blocks share one compiled graph whose token dimensions are dynamic (optimize/compile.py), so a forward of any
DiT of the same configuration at any shape compiles the code the real DiT's first forward would: Dynamo keeps it
on the block's code, its guards read the block's structure and its tensors' kinds, not which block it is, and the
real DiT's first forward finds it there. A restart otherwise spent most of its first forward in Dynamo's trace, one
thread of Python after preparing (docs/benchmarks.md, section 2); preparing is mostly copies to the GPU, which
leave Python to the trace. The stand-in's forward runs inside the configuration's run-time contexts, so it is
joined before preparation returns: no run ever overlaps it.
"""
from __future__ import annotations

import contextlib
import copy
import threading
import time
from dataclasses import dataclass

import torch

from ..errors import error_summary
from ..optimize import compile as compile_blocks
from ..telemetry import RunRecorder
from .prepare import PreparedPipeline, pipeline_with_dit, prepare_dit
from .runner import TEXT_TOKENS_ESTIMATE, dit_inputs, fall_back_to_eager, running, without_cuda_graph

# The stand-in's output side: on a GPU the default edit's (a never-compiled kernel is tuned for its first shape);
# on the CPU the tiny model's tests' size
STANDIN_SIDE = {"cuda": 1024, "cpu": 64}


@dataclass
class HeadStart:
    error: Exception | None = None
    seconds: float = 0.0

    def settle(self, prepared: PreparedPipeline) -> None:
        """What the head start left for the prepared DiT: words in its report; after a compile error the eager
        fallback the first forward would have come to (compiling again would fail again); after another error a
        warning, and the first forward compiles."""
        if self.error is None:
            prepared.report["compile head start"] = (f"the block compiled on a one-block stand-in while the DiT was "
                                                     f"prepared ({self.seconds:.1f} s)")
        elif compile_blocks.is_compile_error(self.error):
            fall_back_to_eager(prepared, self.error)
        else:
            prepared.warnings.append(f"the compile head start failed ({type(self.error).__name__}: "
                                     f"{error_summary(self.error)}); the first forward compiles the blocks itself")
            prepared.report["compile head start"] = "failed: the first forward compiles"


def applies(config) -> bool:
    """Compiled configurations without runtime LoRAs (whose layers are matched to the whole DiT's names)."""
    return config.value("compile") != "off" and not config.runtime_loras


@contextlib.contextmanager
def compiling_beside(base, config, recorder: RunRecorder, device: str, dtype: torch.dtype):
    """Around the DiT's preparation: a stand-in prepared and its first forward started first, joined at the end
    (when the stand-in is not needed, nothing). Yields the HeadStart to settle on the prepared pipeline."""
    head = HeadStart()
    if not applies(config):
        yield None
        return
    with recorder.stage("compile head start", "preparing a one-block stand-in to compile beside the DiT",
                        into_prepare=True):
        standin = _prepared_standin(base, config, device)
        thread = threading.Thread(target=_first_forward, args=(standin, config, device, dtype, head),
                                  name="ghostedit-compile-head-start", daemon=True)
        thread.start()
    try:
        yield head
    finally:
        with recorder.stage("compile head start wait", "waiting for the compile beside the DiT", into_prepare=True):
            thread.join()


def _prepared_standin(base, config, device: str) -> PreparedPipeline:
    dit, report = prepare_dit(_one_block(base.dit), config, RunRecorder(device), device)
    return PreparedPipeline(("compile head start", config.cache_key), config,
                            pipeline_with_dit(base, dit, encoders=False), 0, report, {})


def _one_block(dit: torch.nn.Module) -> torch.nn.Module:
    """The DiT with its first transformer block alone, sharing every module and weight with it (preparation copies
    it again before changing anything)."""
    skeleton = copy.copy(dit)
    skeleton._modules = {**dit._modules, "transformer_blocks": torch.nn.ModuleList(list(dit.transformer_blocks)[:1])}
    return skeleton


def _first_forward(standin: PreparedPipeline, config, device: str, dtype: torch.dtype, head: HeadStart) -> None:
    began = time.perf_counter()
    try:
        side = STANDIN_SIDE["cuda" if device.startswith("cuda") else "cpu"]
        inputs = dit_inputs(standin.dit, side, side, TEXT_TOKENS_ESTIMATE, device, dtype,
                            zero_cond_t=standin.pipe.family.zero_cond_t)
        with running(standin, without_cuda_graph(config), inputs, device, RunRecorder(device)) as (call, _):
            call()
    except Exception as error:  # settled after the join
        head.error = error
    finally:
        head.seconds = time.perf_counter() - began

