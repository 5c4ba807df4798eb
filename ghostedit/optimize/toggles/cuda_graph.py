"""Flag `cuda-graph` (lossless): the DiT's whole forward captured as a CUDA graph per shape and replayed
(ghostedit/optimize/cuda_graphs.py; the forward runs from the graphs the run's options hold: the Edit DiT's
`model_fn`, Qwen-Image-2.1's `step_forward`, a graph per prefix-cache state there). It changes only how a
run goes: the graphs belong to the prepared DiT and are kept from run to run; what they did goes into the run's
words. Where the forward cannot be captured (the step cache on, weights streamed from host memory, a gloo process
group) the run says so in its words and notes and runs it from Python."""
import contextlib

from ...device import Availability, needs_cuda
from .. import cuda_graphs
from ..registry import OFF, ON, RUN, Choice, RunContext, Toggle, register


@contextlib.contextmanager
def _graphed(context: RunContext, value: str):
    if value == OFF:
        yield
        return
    reason = cuda_graphs.why_not_capturable(context.prepared.dit, context.device, context.config, context.mesh)
    if reason is not None:  # said in the run's words and notes: the forward runs from Python
        context.not_applied("cuda-graph", f"not applied on this run: {reason}")
        yield
        return
    graphs = context.prepared.graphs
    with graphs.running(cuda_graphs.owner(context.config, context.prepared), context.recorder):
        context.options["graphs"] = graphs
        try:
            yield
        finally:
            context.ran.setdefault("words", {})["cuda-graph"] = graphs.words()


def _availability(value: str, device: str) -> Availability:
    return Availability.yes() if value == OFF else needs_cuda(device, "cuda-graph (CUDA graphs)")


register(Toggle(
    name="cuda-graph", label="DiT forward replayed as a CUDA graph", group="rewrites",
    help="each shape's whole DiT forward is captured at its second call and replayed after: the GPU runs the "
         "kernels back to back, without waiting for Python to launch each one (memory for one forward's activations "
         "stays held between forwards)",
    choices=(Choice(OFF, "off"), Choice(ON, "on")),
    changes=RUN, order=97, run_context=_graphed, availability=_availability, families={},
))
