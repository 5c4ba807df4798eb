"""CUDA graphs of the DiT's block loop (flag `cuda-graph`): the transformer blocks of one forward captured once per
input shape and replayed, so that the GPU runs the thousands of kernels of a forward back to back instead of waiting
for Python to launch each one (the gaps between kernels, and the whole forward whenever the CPU falls behind).

A shape is captured at its second forward: the first runs the loop, on the tensors the graph will read, as the warm-up a
capture needs (compile, autotuning, cuDNN's plans, Inductor's multi-kernel picks: none may happen mid-capture). A graph
replays fixed memory: the loop's inputs are copied into the graph's own tensors before each replay and its outputs
copied out after. It reads the weights where they lay at capture, and it replays the kernels the run-time choices picked
then (the attention backend), so the graphs are dropped whenever a run comes with other fused LoRAs (whose switch can
give a layer new tensors) or another configuration, and that run captures again. The graphs of one prepared DiT share
one memory pool: they never run at once, and each one's outputs are copied out before the next replay.

It sits where the step cache sits (step_cache.py): between the engine and DiffSynth's model_fn, putting a block list of
one entry into the DiT for the length of a forward, an entry that runs the whole loop (block_loop.py). The store of graphs by input
signature (ShapeGraphs) also serves the text encoder's layers (text_encoder_graphs.py)."""
from __future__ import annotations

import contextlib
import functools
import weakref
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch.utils import _pytree as pytree

from .. import tensors
from ..device import UnavailableOptionError
from . import block_loop, carried_residual, registry

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

    def capture(self, loop: Callable[[], tuple], pool):
        """`loop` as a CUDA graph in `pool` (None: a new one): (replay, loop's outputs, pool)."""
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=pool, stream=self._stream, capture_error_mode="thread_local"):
            outputs = loop()
        return graph.replay, outputs, graph.pool()


class ShapeGraphs:
    """Captured graphs of functions by name and input signature (a shape's first call is its warm-up, the second is
    captured, later ones replay), sharing one memory pool: `what` names the calls in the words."""

    def __init__(self, capture=None, what: str = "DiT forwards replayed their blocks", limit: int = MAX_GRAPHS,
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
        self._owner: tuple | None = None
        self._pool = None
        self._recorder = None
        self.forwards = self.replayed = self.captured = 0

    @contextlib.contextmanager
    def running(self, owner: tuple, recorder):
        """One run: `owner` says what the graphs are valid for (a DiT's: `owner` below); graphs captured for another
        owner are dropped."""
        if self._owner is None or self._owner[0] != owner[0] or self._owner[1] is not owner[1]:
            self._graphs.clear()
            self._warmed.clear()
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
        key = (name, spec, tuple(_leaf_key(leaf) for leaf in leaves))
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


def _leaf_key(leaf) -> tuple:
    if isinstance(leaf, torch.Tensor):
        return "tensor", tuple(leaf.shape), leaf.stride(), leaf.dtype, leaf.device
    return "value", leaf


def run_loop(blocks, inputs: dict) -> tuple:
    """The loop of DiffSynth's model_fn over the blocks: (text, image)."""
    return carried_residual.run_blocks(blocks, **inputs)


class _GraphedLoop(torch.nn.Module):
    """The one entry of the block list a graphed forward sees: it runs all the DiT's blocks."""

    def __init__(self, blocks: torch.nn.ModuleList, graphs: ShapeGraphs):
        super().__init__()
        self.blocks, self.graphs = blocks, graphs

    def forward(self, image, text, attention_mask=None, kv_cache=None, **inputs):
        if attention_mask is not None or kv_cache is not None:
            raise UnavailableOptionError("cuda-graph replays the plain block loop: entity masks and KV caches are "
                                         "not captured")
        return self.graphs.run(functools.partial(run_loop, self.blocks), {"image": image, "text": text, **inputs})


_stores: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()   # prepared DiT -> its ShapeGraphs


def graphs_of(dit: torch.nn.Module) -> ShapeGraphs:
    """The graphs of a prepared DiT, kept as long as the DiT is (they hold no reference to it)."""
    if dit not in _stores:
        _stores[dit] = ShapeGraphs(capture_stage="capturing the DiT's blocks as a CUDA graph at this shape")
    return _stores[dit]


def owner(config, prepared) -> tuple:
    """What a prepared DiT's graphs are valid for: the configuration's DiT settings (the attention backend a graph
    replays, among others; the encoders' settings leave the DiT's graphs as they are) and the fused LoRAs object the
    prepared pipeline holds."""
    return registry.component_settings(config, "dit"), prepared.loras


def why_not_capturable(dit: torch.nn.Module, device: str, config) -> str | None:
    """Why this DiT's block loop cannot be replayed from a graph on this run, or None. A graph replays every block,
    reads every weight at one address on the device, and would replay sequence parallel's all-to-alls with the state
    of their capture."""
    from ..parallel import ulysses
    if config.value("step-cache") != "off":
        return "the step cache decides at each forward which blocks run, and a graph replays all of them"
    if ulysses.active():
        return "sequence parallel (Ulysses) is active: its all-to-alls around each attention are not captured"
    target = torch.device(device)
    elsewhere = {str(held) for held in tensors.devices(dit.transformer_blocks)
                 if held.type != target.type or target.index not in (None, held.index)}
    if elsewhere:
        return (f"some of the DiT's weights are on {', '.join(sorted(elsewhere))}, not {device} (the memory "
                "placement streams them to the GPU layer by layer)")
    return None


def graphed(pipe, graphs: ShapeGraphs):
    """Every DiT forward of `pipe` runs its block loop through `graphs`."""
    return block_loop.one_entry(pipe, lambda blocks: _GraphedLoop(blocks, graphs))
