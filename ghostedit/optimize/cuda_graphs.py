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
prompt's length, read off its mask), and what it builds on the device from host values is a constant of its graph
(HostConstants). It reads the weights where they lay at capture, and it replays the kernels the run-time choices
picked then (the attention backend), so the graphs are dropped whenever a run comes with other fused LoRAs (whose
switch can give a layer new tensors) or another configuration, and that run captures again. The graphs of one
prepared DiT share one memory pool: they never run at once, and each one's outputs are copied out before the next
replay.

It sits between the engine and DiffSynth's model_fn, as the step cache does (step_cache.py, both through
block_loop.wrapped_model_fn), and hands model_fn the inputs it names. The store of graphs by input signature (ShapeGraphs) also serves the text encoder's layers
(text_encoder_graphs.py)."""
from __future__ import annotations

import contextlib
import inspect
import sys
import weakref
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch.utils import _pytree as pytree

from .. import tensors
from ..device import UnavailableOptionError
from ..diffsynth_patches import check_version
from . import block_loop, registry

check_version()  # HostConstants stands in for DiffSynth's pipeline module's torch ("capture-time torch")

MAX_GRAPHS = 8   # shapes kept per prepared DiT (output sizes, prompt lengths), the least recently used dropped


@dataclass
class _Graph:
    replay: Callable[[], None]
    inputs: list[Any]          # the function's inputs as the graph reads them (tensors at fixed addresses)
    outputs: list              # the tensors the graph writes its outputs to
    output_spec: Any           # how they make up the function's result
    host_constants: list       # pinned host tensors the graph copies from at each replay (HostConstants)


class HostConstants:
    """While a forward is captured, the `torch` its module's code calls: DiffSynth's model_fn builds zero_cond_t's
    modulation index with torch.tensor(..., device=...), a copy from pageable host memory that makes the CPU wait,
    which a capture refuses. Here such a tensor is made in pinned host memory, kept with the graph, and copied
    without waiting; each replay copies the same values again (they come from the shapes and host values of the
    forward's inputs, its signature). It stands in for the module's global `torch` for the length of the capture,
    rather than being a TorchFunctionMode: compiled code guards on the mode stack and would compile again mid-capture."""

    def __init__(self, module=None):
        self.kept: list[torch.Tensor] = []
        self._module = module

    def tensor(self, data, *args, device=None, **kwargs) -> torch.Tensor:
        if not _on_gpu(device):
            return torch.tensor(data, *args, device=device, **kwargs)
        pinned = torch.tensor(data, *args, **kwargs).pin_memory()
        self.kept.append(pinned)
        return pinned.to(device, non_blocking=True)

    def __getattr__(self, name):
        return getattr(torch, name)

    def __enter__(self):
        if self._module is not None:
            self._module.torch = self
        return self

    def __exit__(self, *exc_info):
        if self._module is not None:
            self._module.torch = torch


def _on_gpu(device) -> bool:
    return device is not None and torch.device(device).type == "cuda"


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

    def capture(self, function: Callable[[], tuple], pool, host_module=None):
        """`function` as a CUDA graph in `pool` (None: a new one), `host_module`'s code calling HostConstants for
        torch: (replay, its outputs, pool, host constants)."""
        graph = torch.cuda.CUDAGraph()
        constants = HostConstants(host_module)
        with torch.cuda.graph(graph, pool=pool, stream=self._stream, capture_error_mode="thread_local"), constants:
            outputs = function()
        return graph.replay, outputs, graph.pool(), constants.kept


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

    def run(self, function: Callable[[dict], Any], inputs: dict, name: Any = None, host_module=None):
        """`function(inputs)`, from a graph where one is captured for `name` at these inputs' signature; a capture
        has `host_module`'s code build its tensors from host values through HostConstants."""
        self.forwards += 1
        leaves, spec = pytree.tree_flatten(inputs)
        key = (name, spec, tuple(_leaf_key(leaf, self._capture.device_type) for leaf in leaves))
        graph = self._graphs.get(key)
        if graph is None and key not in self._warmed:
            output = self._warm_up(function, leaves, spec, key)
            if self._capture_at_first_call:
                self._record(function, self._warmed.pop(key), spec, key, host_module)
            return output
        held = graph.inputs if graph is not None else self._warmed.pop(key)
        for tensor, leaf in zip(held, leaves):
            if isinstance(leaf, torch.Tensor):
                tensor.copy_(leaf)
        if graph is None:
            graph = self._record(function, held, spec, key, host_module)
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

    def _record(self, function, held: list, spec, key, host_module) -> _Graph:
        arguments = pytree.tree_unflatten(held, spec)
        stage = (contextlib.nullcontext() if self._capture_stage is None else  # the step's replays that follow run
                 self._recorder.stage("CUDA graph capture", self._capture_stage, out_of_step=True))  # as later ones
        with stage:
            replay, outputs, self._pool, constants = self._capture.capture(lambda: function(arguments), self._pool,
                                                                           host_module)
        output_leaves, output_spec = pytree.tree_flatten(outputs)
        graph = self._graphs[key] = _Graph(replay, held, output_leaves, output_spec, constants)
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


# model_fn's inputs that a graph cannot replay, with what they are
NOT_CAPTURED = {"blockwise_controlnet_conditioning": "a blockwise ControlNet (it reads the step's index)",
                "entity_prompt_emb": "entity prompts (their attention masks)",
                "kv_cache": "a KV cache (kept per block, outside the graph)"}
# model_fn's inputs read only by the blockwise ControlNet: left out of a graph's signature, or each step would
# capture a graph of its own
STEP_INDEX_ONLY = ("progress_id", "num_inference_steps")


def graph_inputs(named, inputs: dict) -> tuple[dict, dict]:
    """The inputs DiffSynth's model_fn names (`named`: its parameters; it takes the pipeline's whole state and reads
    these, the rest, images and settings of other units, it ignores), less STEP_INDEX_ONLY, as (models, the graph's
    inputs); NOT_CAPTURED ones are refused. The models (the DiT) are handed over as they are, not as part of a graph's
    signature: a graph reads their weights where they lay at capture (its owner says when they change), and a
    signature holding the DiT would keep it, and all its weights, alive as long as its graphs."""
    for name, what in NOT_CAPTURED.items():
        if inputs.get(name) is not None:
            raise UnavailableOptionError(f"cuda-graph replays the plain DiT forward, without {what}")
    taken = {name: value for name, value in inputs.items() if name in named and name not in STEP_INDEX_ONLY}
    models = {name: value for name, value in taken.items() if isinstance(value, torch.nn.Module)}
    return models, {name: value for name, value in taken.items() if name not in models}


_stores: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()   # prepared DiT -> its ShapeGraphs


def graphs_of(dit: torch.nn.Module) -> ShapeGraphs:
    """The graphs of a prepared DiT, kept as long as the DiT is (they hold no reference to it)."""
    if dit not in _stores:
        _stores[dit] = ShapeGraphs(capture_stage="capturing the DiT's forward as a CUDA graph at this shape")
    return _stores[dit]


def owner(config, prepared) -> tuple:
    """What a prepared DiT's graphs are valid for: the configuration's DiT settings (the attention backend a graph
    replays, among others; the encoders' settings leave the DiT's graphs as they are) and the fused LoRAs object the
    prepared pipeline holds."""
    return registry.component_settings(config, "dit"), prepared.loras


def why_not_capturable(dit: torch.nn.Module, device: str, config) -> str | None:
    """Why this DiT's forward cannot be replayed from a graph on this run, or None. A graph replays every block,
    reads every weight at one address on the device, and would replay sequence parallel's all-to-alls with the state
    of their capture."""
    from ..parallel import ulysses
    if config.value("step-cache") != "off":
        return "the step cache decides at each forward which blocks run, and a graph replays all of them"
    if ulysses.active():
        return "sequence parallel (Ulysses) is active: its all-to-alls around each attention are not captured"
    target = torch.device(device)
    elsewhere = {str(held) for held in tensors.devices(dit)
                 if held.type != target.type or target.index not in (None, held.index)}
    if elsewhere:
        return (f"some of the DiT's weights are on {', '.join(sorted(elsewhere))}, not {device} (the memory "
                "placement streams them to the GPU layer by layer)")
    return None


def graphed(pipe, graphs: ShapeGraphs):
    """Every DiT forward of `pipe` runs from `graphs` (a context)."""
    def from_graphs(model_fn):
        named = inspect.signature(model_fn).parameters   # through functools.wraps: DiffSynth's own function's
        module = sys.modules[inspect.unwrap(model_fn).__module__]   # DiffSynth's pipeline module

        def graphed_model_fn(**inputs):
            models, taken = graph_inputs(named, inputs)
            return graphs.run(lambda held: model_fn(**models, **held), taken, host_module=module)
        return graphed_model_fn
    return block_loop.wrapped_model_fn(pipe, from_graphs)
