"""torch.compile of the DiT's repeated transformer block ("regional" compilation): the 60 blocks of the real model
share one compiled graph, so compiling costs one block's worth, not the whole model's; only their token dimensions
are dynamic. Also what GhostEdit adds to Inductor: multi-kernel picks kept for a restart, the persistent-rows
heuristics, the compile workers' early start and the compile cache's keys hashed while preparing."""
from __future__ import annotations

import functools
import os
import subprocess
import threading
from pathlib import Path
from typing import Callable

import torch
from torch.utils import _pytree as pytree

from ..device import Availability
from ..errors import error_summary

# Inductor options per mode (torch.compile's `mode` names these same sets; options can be extended, a mode cannot)
INDUCTOR_OPTIONS = {
    "regional": {},
    "max-autotune": {"max_autotune": True},
}


@functools.lru_cache(maxsize=None)
def availability(mode: str, device: str) -> Availability:
    if mode == "off":
        return Availability.yes()
    if os.environ.get("SPACES_ZERO_GPU", "").lower() in ("1", "true"):  # ui/space.py compiles ahead of time there
        return Availability.no("on ZeroGPU every edit runs in a fresh process, so a just-in-time compile would be "
                               "redone in each one: this Space compiles the stock configuration's DiT blocks ahead "
                               "of time at start-up instead")
    if device.startswith("cuda"):
        try:
            import triton  # noqa: F401
        except ImportError:
            return Availability.no("torch.compile on a GPU needs Triton, which is not installed")
        return Availability.yes()
    # Inductor's own search (cpp_builder.get_cpp_compiler: $CXX, else g++, run with --version), without importing
    # Inductor: a second of every start, `ghostedit options` included
    compiler = os.environ.get("CXX", "g++")
    try:
        subprocess.run([compiler, "--version"], capture_output=True, check=True, timeout=30)
    except (OSError, subprocess.SubprocessError) as error:
        return Availability.no(f"torch.compile on the CPU needs a working C++ compiler ({compiler}: "
                               f"{error_summary(error)})")
    return Availability.yes()


def compiled_blocks(model: torch.nn.Module) -> list[torch.nn.Module]:
    return list(model.blocks)


RECOMPILE_LIMIT = 64


def configure_dynamo() -> None:
    """Dynamo's settings for compiled blocks. They hold for the whole process (torch 2.11), but Inductor's heuristics
    object is one per thread (`_choose_with_persistent_rows`), so every thread that prepares or runs compiled blocks
    calls this first.

    Recompile limits: every prepared configuration compiles the same block code, each one adding guarded entries to
    that code's cache; past Dynamo's default limit of 8, later configurations would quietly run eager.
    Floats: DiffSynth's norms and dropouts keep `eps` and `p` as float attributes. Under dynamic shapes Dynamo
    traces them as symbolic floats, then fails to turn them into tensors and restarts the whole trace with them
    fixed; fixing them from the start saves that first trace."""
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, RECOMPILE_LIMIT)
    torch._dynamo.config.accumulated_recompile_limit = max(torch._dynamo.config.accumulated_recompile_limit,
                                                           16 * RECOMPILE_LIMIT)
    torch._dynamo.config.specialize_float = True
    keep_multi_kernel_picks()
    _choose_with_persistent_rows()
    _keep_the_no_op_cuda_guard()


@functools.cache
def _keep_the_no_op_cuda_guard() -> None:
    """Where torch has no GPU, each trace (FakeTensorMode) registers a no-op CUDA device guard that the calling thread
    owns (thread-local in c10, torch 2.11) and leaves the process-wide registry pointing at it: once that thread has
    ended, the next trace in any thread reads freed memory and the process crashes. The page runs each edit in a
    thread of its own (ui/live.py), so a second compiled configuration on a CPU would. Here the guard is registered
    once by a thread that lasts as long as the process, and traces find it instead of registering their own."""
    if torch.cuda.is_available():  # traces use the real CUDA guard
        return
    register = torch._C._ensureCUDADeviceGuardSet
    registered = threading.Event()

    def hold():
        register()
        registered.set()
        threading.Event().wait()  # never returns: the guard lives as long as this thread

    threading.Thread(target=hold, name="ghostedit-cuda-guard", daemon=True).start()
    registered.wait()
    torch._C._ensureCUDADeviceGuardSet = lambda: None


def persistent_rows():
    """The value of Inductor's `inductor_choices_class` option that inductor-persistent-rows sets. It is the option,
    not the object it returns, that decides: Inductor makes its heuristics object once per thread, on first use,
    so every thread that compiles blocks runs GhostEdit's (`_choose_with_persistent_rows`), which asks the option
    of the compile at hand. Being an option, it takes part in the compile cache's key."""
    return _heuristics_class()()


def _choose_with_persistent_rows() -> None:
    from torch._inductor.virtualized import V
    if not isinstance(V.choices, _heuristics_class()):  # a thread's first compile, or Inductor's own made first
        V.set_choices_handler(_heuristics_class()())  # without `with`: kept for this thread, as Inductor keeps its own


@functools.cache
def _heuristics_class():
    from torch._inductor import config
    from torch._inductor.choices import InductorChoices

    class PersistentRows(InductorChoices):
        """Inductor's heuristics, except that under persistent_rows a reduction is persistent (the whole row in
        registers) wherever multi-kernel would offer that variant: Inductor's own rule with multi-kernel's
        16-fold row limit (16384 values along a row), which covers the DiT's norms over rows of 3072. The looped
        variant is neither compiled nor timed; multi-kernel's timing picked the persistent one for the image
        stream's norms, where the time is."""

        @staticmethod
        def should_use_persistent_reduction(features, cooperative_reduction: bool) -> bool:
            if config.inductor_choices_class is not persistent_rows or config.triton.multi_kernel:
                return InductorChoices.should_use_persistent_reduction(features, cooperative_reduction)
            with config.patch({"triton.multi_kernel": 1}):
                return InductorChoices.should_use_persistent_reduction(features, cooperative_reduction)

    return PersistentRows


def keep_multi_kernel_picks() -> None:
    """Inductor's multi-kernels (inductor-multi-kernel) time their variants on first use and keep the pick in the
    compile cache, so that a restarted process runs what its first process picked without timing them again (a
    share of a restart's first call), and without picks that flip between processes where two variants time alike.
    In torch 2.11 the kept pick does not work: its file is named from each variant's Triton function, which a
    process that loaded the compiled code from the cache has not rebuilt when the multi-kernel is made, so the
    read fails. Here the file is named from each variant's source file, which Inductor names by the hash of its
    code, and the pick is read on the multi-kernel's first run, when its variants exist. Idempotent."""
    from torch._inductor.codecache import code_hash, get_path
    from torch._inductor.codegen.multi_kernel import MultiKernelCall
    if getattr(MultiKernelCall, "ghostedit_keeps_picks", False):
        return
    read_pick, run = MultiKernelCall.load_cache, MultiKernelCall.run

    def cache_file_path(self):
        key = code_hash(",".join(f"{k.kernel_hash}{k.size_hints!r}{k.triton_meta!r}" for k in self.kernels))
        return Path(get_path(key, "picked_kernel")[2])

    def run_with_kept_pick(self, *args, **kwargs):
        if self.picked_kernel is None and not self.disable_cache and not self.ghostedit_pick_read:
            self.ghostedit_pick_read = True
            if all(kernel.kernel_hash for kernel in self.kernels):
                read_pick(self)
            else:  # a variant without a source file: no name to keep its pick under, so timed in every process
                self.disable_cache = True
        run(self, *args, **kwargs)

    MultiKernelCall.cache_file_path = cache_file_path
    MultiKernelCall.load_cache = lambda self: None  # called at construction, before the variants exist
    MultiKernelCall.run = run_with_kept_pick
    MultiKernelCall.ghostedit_pick_read = False
    MultiKernelCall.ghostedit_keeps_picks = True


def start_compile_workers() -> None:
    """Starts Inductor's worker processes, which compile the generated Triton kernels, if they are not running.
    torch starts them once Dynamo hands its first graph over, and each worker imports torch and Triton first: on
    the H100 machine a cold first call waited seconds for them (lab/LOG.md, section 2). Started when
    preparation begins, they start while the DiT's weights are quantized and copied, which is GPU work."""
    from torch._inductor.async_compile import maybe_warm_pool
    maybe_warm_pool()


def start_hashing_compile_keys() -> None:
    """Computes, on a thread of its own, the hashes of torch's and Triton's own files that every compile cache key
    of this process includes (Inductor's `torch_key` and `CacheBase.get_system`, which reads and hashes Triton's
    compiler and library files; both kept for the process once made). Otherwise the first compile computes them
    in the first forward, a restart's too: with them made here, a restart's compile cache lookups took about half
    as long on the H100 machine (lab/LOG.md, section 2, the restart A/Bs). Started when preparation begins:
    reading and hashing files leave the GIL to the preparation, whose quantization waits on copies to the GPU."""
    threading.Thread(target=_compile_keys, name="ghostedit-compile-keys", daemon=True).start()


def _compile_keys() -> None:
    from torch._inductor.codecache import CacheBase, torch_key
    torch_key()
    CacheBase.get_system()


def compile_regions(model: torch.nn.Module, mode: str, extra_options: dict | None = None) -> int:
    """Compiles each transformer block. Inductor options go with the compiled module (not the global config),
    so configurations with different options get their own compiled code rather than reusing another's."""
    configure_dynamo()
    blocks = compiled_blocks(model)
    options = {**INDUCTOR_OPTIONS[mode], **(extra_options or {})}
    # one torch.compile for all blocks: each call with Inductor options copies Inductor's whole configuration, and
    # one call per block was most of the preparation's compile step (lab/LOG.md, section 2)
    compiled = torch.compile(torch.nn.Module._call_impl, dynamic=None, options=options or None)
    for block in blocks:
        if getattr(model, "one_graph_per_step_kind", False):  # Qwen-Image-2.1: see its DiT
            block._compiled_call_impl = functools.partial(compiled, block)
        else:
            compile_over_tokens(block, compiled)
    return len(blocks)


def compile_over_tokens(block: torch.nn.Module, compiled: Callable) -> None:
    """Compiles `block` through `compiled` (torch.compile of nn.Module's call, shared by the blocks) with its token
    dimensions dynamic and every other dimension static: one compiled graph serves every output size, number of
    edit images and prompt length, and Dynamo traces the widths, heads and batch as the numbers they are.
    `dynamic=True` made every dimension symbolic, and a restart's first forward, which traces the block again, took
    longer (lab/LOG.md, section 2, the restart A/Bs). Marks count when Dynamo traces, and Dynamo keeps a
    marked dimension dynamic in every later trace of the block's code (the blocks share it), so they are set until
    a call has gone through. A dimension that is not marked and changes makes Dynamo compile again with it dynamic
    (torch's automatic dynamic shapes)."""
    traced = False

    def call(*args, **kwargs):
        nonlocal traced
        if not traced:
            for tensor, dims in token_dims(kwargs):
                for dim in dims:
                    torch._dynamo.maybe_mark_dynamic(tensor, dim)
        output = compiled(block, *args, **kwargs)
        traced = True
        return output

    block._compiled_call_impl = call


def token_dims(inputs: dict) -> list[tuple[torch.Tensor, dict[int, str]]]:
    """Each tensor among a transformer block's keyword inputs (nested in tuples and lists too) with the dimension
    that runs along the image's or the text's tokens, {dimension: "image" or "text"}, or {} if none. The image's
    and the text's own are dimension 1; any other tensor's is its first dimension of one of those lengths (rotary
    tables [tokens, ...], zero_cond_t's modulation index [batch, tokens], carried-residual's parts [batch, tokens,
    width]); a length of 1 is never one (the gates [batch, 1, width]). Where the image and the text have the same
    length, the other tensors' dimension of that length is named "text"."""
    lengths = {inputs["image"].shape[1]: "image", inputs["text"].shape[1]: "text"}
    found = [(inputs["image"], {1: "image"}), (inputs["text"], {1: "text"})]
    others = {name: value for name, value in inputs.items() if name not in ("image", "text")}
    for leaf in pytree.tree_leaves(others):
        if isinstance(leaf, torch.Tensor):
            dim = next((d for d, size in enumerate(leaf.shape) if size > 1 and size in lengths), None)
            found.append((leaf, {} if dim is None else {dim: lengths[leaf.shape[dim]]}))
    return found


def is_compiled(model: torch.nn.Module) -> bool:
    return any(block._compiled_call_impl is not None for block in compiled_blocks(model))


def revert_to_eager(model: torch.nn.Module) -> None:
    for block in compiled_blocks(model):
        block._compiled_call_impl = None


def is_compile_error(error: BaseException) -> bool:
    """Errors raised by Dynamo or Inductor while compiling (Inductor's errors derive from Dynamo's base)."""
    from torch._dynamo.exc import TorchDynamoException
    return isinstance(error, TorchDynamoException)

