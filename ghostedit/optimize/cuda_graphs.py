"""CUDA graphs of the DiT's forward (flag `cuda-graph`): each input shape's whole forward (the embeddings, the block
loop, the output layers) captured once and replayed, so that the GPU runs the thousands of kernels of a forward back
to back instead of waiting for Python to launch each one (the gaps between kernels, and the whole forward whenever
the CPU falls behind). Graphing the block loop alone left the layers around it to Python: torchao's FP8 linears
outside the blocks cost the CPU about a millisecond each, and an H100 profile had the GPU idle for milliseconds
around the loop's graph, waiting for them (lab/LOG.md, section 1).

A shape is captured at its second forward: the first runs the forward, on the tensors the graph will read, as the
warm-up a capture needs (compile, autotuning, cuDNN's plans, Inductor's multi-kernel picks: none may happen
mid-capture). A graph replays fixed memory: the forward's inputs are copied into the graph's own tensors before each
replay and its outputs copied out after. What the forward reads on the host is part of a shape's signature (the
prompt's length, read off its mask). It reads the weights where they lay at capture, and it replays the kernels the
run-time choices picked then (the attention backend), so the graphs are dropped whenever a run comes with other
fused LoRAs (whose switch can give a layer new tensors) or another configuration, and that run captures again. The
graphs of one prepared DiT share one memory pool: they never run at once, and each one's outputs are copied out
before the next replay.

A prepared pipeline holds its DiT's graphs (engine/prepare.py); a run that replays them hands them to the forward in
its options (models/seams.py, ForwardGraphs), and the forward runs itself through `ShapeGraphs.run`. The store of
graphs by input signature also serves the text encoder's layers (text_encoder_graphs.py)."""
from __future__ import annotations

import contextlib
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch.utils import _pytree as pytree

from .. import tensors
from . import registry

MAX_GRAPHS = 8   # shapes kept per prepared DiT (output sizes, prompt lengths), the least recently used dropped


@dataclass
class _Graph:
    replay: Callable[[], None]
    inputs: list[Any]          # the function's inputs as the graph reads them (tensors at fixed addresses)
    outputs: list              # the tensors the graph writes its outputs to
    output_spec: Any           # how they make up the function's result


class CudaCapture:
    """Captures on a stream of its own, where every shape's warm-up runs too, as torch.cuda.graph's notes ask: what
    a library sets up on its first use of a stream happens before a capture, not inside it. Other threads may use
    the GPU meanwhile (thread-local capture): a prepare running beside an edit is not captured."""

    device_type = "cuda"

    def __init__(self):
        self._stream = None

    @contextlib.contextmanager
    def warming(self):
        if self._stream is None:
            self._stream = torch.cuda.Stream()
        self._stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(self._stream):
            yield
        torch.cuda.current_stream().wait_stream(self._stream)

    def capture(self, function: Callable[[], tuple], pool):
        """`function` as a CUDA graph in `pool` (None: a new one): (replay, its outputs, pool)."""
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=pool, stream=self._stream, capture_error_mode="thread_local"):
            outputs = function()
        return graph.replay, outputs, graph.pool()


class ShapeGraphs:
    """Captured graphs of functions by name and input signature (a shape's first call is its warm-up, the second is
    captured, later ones replay), sharing one memory pool: `what` names the calls in the words."""

    def __init__(self, capture=None, what: str = "DiT forwards replayed", limit: int = MAX_GRAPHS,
                 capture_stage: str | None = None, capture_at_first_call: bool = False):
        """`limit`: signatures held, the least recently used dropped; `capture_stage`: the words of a recorder stage
        each capture is timed as, left out of its denoising step (None: counted where it happens);
        `capture_at_first_call`: a signature is captured right after its warm-up, in its first call (for a function
        called once per edit: the next edit replays it)."""
        self._capture = capture or CudaCapture()
        self.what, self._limit, self._capture_stage = what, limit, capture_stage
        self._capture_at_first_call = capture_at_first_call
        self._graphs: OrderedDict[tuple, _Graph] = OrderedDict()
        self._warmed: OrderedDict[tuple, list] = OrderedDict()   # a warmed signature's inputs, until captured
        # tensors the functions keep from one call to the next at fixed addresses, by signature (Qwen-Image-2.1's
        # prefix cache: its filling forward writes them, its cached forwards read them); they live as long as the
        # graphs that read them
        self.kept: dict = {}
        self._owner: tuple | None = None
        self._pool = None
        self._recorder = None
        self.forwards = self.replayed = self.captured = 0

    @contextlib.contextmanager
    def running(self, owner: tuple, recorder):
        """One run: `owner` says what the graphs are valid for (a DiT's: `owner` below); graphs captured for another
        owner are dropped, and so are all graphs once the kept tensors have more signatures than graphs are held
        (a graph may read any of them: none is dropped alone)."""
        if self._owner is None or self._owner[0] != owner[0] or self._owner[1] is not owner[1] or \
                len(self.kept) > self._limit:
            self._graphs.clear()
            self._warmed.clear()
            self.kept.clear()
            self._pool = None
            self._owner = owner
        self._recorder = recorder
        self.forwards = self.replayed = self.captured = 0
        try:
            yield self
        finally:
            self._recorder = None

    def run(self, function: Callable[[dict], Any], inputs: dict, name: Any = None):
        """`function(inputs)`, from a graph where one is captured for `name` at these inputs' signature."""
        self.forwards += 1
        leaves, spec = pytree.tree_flatten(inputs)
        key = (name, spec, tuple(_leaf_key(leaf, self._capture.device_type) for leaf in leaves))
        graph = self._graphs.get(key)
        if graph is None and key not in self._warmed:
            output = self._warm_up(function, leaves, spec, key)
            if self._capture_at_first_call:
                self._record(function, self._warmed.pop(key), spec, key)
            return output
        held = graph.inputs if graph is not None else self._warmed.pop(key)
        for tensor, leaf in zip(held, leaves):
            if isinstance(leaf, torch.Tensor):
                tensor.copy_(leaf)
        if graph is None:
            graph = self._record(function, held, spec, key)
        self._graphs.move_to_end(key)
        graph.replay()
        self.replayed += 1
        return pytree.tree_unflatten([output.clone() for output in graph.outputs], graph.output_spec)

    def _warm_up(self, function, leaves, spec, key):
        """The function run on the tensors the graph will read: compiled code guards on its inputs' make (a view's
        base, say), so a capture given other tensors than its warm-up would recompile, and compile, mid-capture."""
        held = [leaf.clone() if isinstance(leaf, torch.Tensor) else leaf for leaf in leaves]
        self._warmed[key] = held
        _keep_newest(self._warmed, self._limit)
        with self._capture.warming():
            return function(pytree.tree_unflatten(held, spec))

    def _record(self, function, held: list, spec, key) -> _Graph:
        arguments = pytree.tree_unflatten(held, spec)
        stage = (contextlib.nullcontext() if self._capture_stage is None else  # the step's replays that follow run
                 self._recorder.stage("CUDA graph capture", self._capture_stage, out_of_step=True))  # as later ones
        with stage:
            replay, outputs, self._pool = self._capture.capture(lambda: function(arguments), self._pool)
        output_leaves, output_spec = pytree.tree_flatten(outputs)
        graph = self._graphs[key] = _Graph(replay, held, output_leaves, output_spec)
        self.captured += 1
        _keep_newest(self._graphs, self._limit)
        return graph

    def words(self) -> str:
        when = ("right after its warm-up" if self._capture_at_first_call
                else "at its second call, the first is its warm-up")
        return (f"{self.replayed} of {self.forwards} {self.what} from CUDA graphs, {self.captured} captured on this "
                f"run ({len(self._graphs)} shapes held; a shape is captured {when})")


def _keep_newest(shapes: OrderedDict, limit: int) -> None:
    """Drops the least recently used shapes beyond `limit`."""
    while len(shapes) > limit:
        shapes.popitem(last=False)


def _leaf_key(leaf, graph_device: str) -> tuple:
    """What a graph on `graph_device` (a device type) depends on in one input: a tensor's make; a host tensor's
    values too (the function reads them in Python: a captured graph holds what it read at capture); any other value
    itself."""
    if isinstance(leaf, torch.Tensor):
        make = tuple(leaf.shape), leaf.stride(), leaf.dtype, leaf.device
        on_host = leaf.device.type == "cpu" and graph_device != "cpu"
        return ("host tensor", *make, tuple(leaf.flatten().tolist())) if on_host else ("tensor", *make)
    return "value", leaf


def dit_graphs() -> ShapeGraphs:
    """A prepared DiT's store of graphs (kept with the prepared pipeline, as long as its DiT)."""
    return ShapeGraphs(capture_stage="capturing the DiT's forward as a CUDA graph at this shape")


def owner(config, prepared) -> tuple:
    """What a prepared DiT's graphs are valid for: the configuration's DiT settings (the attention backend a graph
    replays, among others; the encoders' settings leave the DiT's graphs as they are) and the fused LoRAs object the
    prepared pipeline holds."""
    return registry.component_settings(config, "dit"), prepared.loras


def why_not_capturable(dit: torch.nn.Module, device: str, config, mesh=None) -> str | None:
    """Why this DiT's forward cannot be replayed from a graph on this run, or None. A graph replays every block and
    reads every weight at one address on the device; sequence parallel's collectives are captured with it where the
    process group is NCCL's (their split sizes are part of a shape's signature), not gloo's."""
    if config.value("step-cache") != "off":
        return "the step cache decides at each forward which blocks run, and a graph replays all of them"
    if mesh is not None and mesh.ulysses_degree > 1 and mesh.backend != "nccl":
        return f"sequence parallel over {mesh.backend}, whose collectives a CUDA graph cannot capture"
    target = torch.device(device)
    elsewhere = {str(held) for held in tensors.devices(dit)
                 if held.type != target.type or target.index not in (None, held.index)}
    if elsewhere:
        return (f"some of the DiT's weights are on {', '.join(sorted(elsewhere))}, not {device} (the memory "
                "placement streams them to the GPU layer by layer)")
    return None
