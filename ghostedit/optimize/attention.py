"""Attention backends for the Qwen DiT, switchable per configuration at run time.

DiffSynth picks its attention when `diffsynth.models.qwen_image_dit` is imported (FA3 if `flash_attn_interface`
imports, else SDPA) and its blocks call the module-level `qwen_image_flash_attention` directly. GhostEdit replaces
that function once with a dispatcher that reads the active backend; the engine activates a configuration's backend
around each run. Under torch.compile the active backend is a guarded global, so a compiled block traces one backend.
Kernels from outside PyTorch are registered as custom ops so that compiled blocks keep them whole. The FP8 attentions
(`cudnn-fp8` and `fa3-fp8`, in fp8_attention.py) and SageAttention change results beyond rounding: they run when
named, and "auto" never picks them.
"""
from __future__ import annotations

import contextlib
import functools
import importlib

import torch
import torch.nn.functional as F
from einops import rearrange
from torch.nn.attention import SDPBackend, sdpa_kernel

from ..device import Availability, needs_cuda, synchronize
from ..errors import error_summary
from ..parallel import ulysses
from ..telemetry import median_ms
from . import fp8_attention

SDPA_BACKENDS = {
    "sdpa-cudnn": SDPBackend.CUDNN_ATTENTION,
    "sdpa-flash": SDPBackend.FLASH_ATTENTION,
    "sdpa-efficient": SDPBackend.EFFICIENT_ATTENTION,
    "sdpa-math": SDPBackend.MATH,
}
# FlashAttention-3 has no wheel on the package index: a reason that it is missing says where one comes from
_FA3_WHEEL = "flash_attn_interface, whose wheel scripts/gpu/build_fa3_wheel.sh builds"
# name: (what makes it importable: a module's name or a loader, what to call it in a reason, (min, max) capability)
EXTERNAL_BACKENDS = {
    "fa4": ("flash_attn.cute", "FlashAttention-4 (flash-attn-4)", ((9, 0), (10, 3))),
    "fa3": ("flash_attn_interface", f"FlashAttention-3 ({_FA3_WHEEL})", ((9, 0), (9, 0))),
    "fa2": ("flash_attn", "FlashAttention-2 (flash_attn)", ((8, 0), None)),
    "sage": ("sageattention", "SageAttention (sageattention)", ((8, 0), None)),
    "cudnn-fp8": (fp8_attention.cudnn_frontend, "cuDNN FP8 attention (nvidia-cudnn-frontend)", ((9, 0), None)),
    "fa3-fp8": ("flash_attn_interface", f"FlashAttention-3's FP8 kernel ({_FA3_WHEEL})", ((9, 0), (9, 0))),
}
# The FP8 attentions: their q and k are cast with scales worked out when the DiT is prepared (rewrites.qk_bounds)
FP8_BACKENDS = fp8_attention.BACKENDS
# Backends that change the result beyond rounding (INT8/FP8 inputs): chosen by name only, never by "auto"
LOSSY_BACKENDS = ("sage",) + FP8_BACKENDS
# SDPA kernels that PyTorch ships for CUDA only
SDPA_GPU_ONLY = {"sdpa-cudnn": "PyTorch SDPA's cuDNN kernel", "sdpa-efficient": "PyTorch SDPA's memory-efficient kernel"}
CONCRETE_BACKENDS = tuple(SDPA_BACKENDS) + tuple(EXTERNAL_BACKENDS)

_active_backend = "diffsynth"
_diffsynth_attention = None  # DiffSynth's own function, kept for the "diffsynth" backend


# ---- external kernels as custom ops: q, k, v and output in [batch, seq, heads, head_dim], their own layout ----
# The output is what the DiT's output projection reads once flattened to [batch, seq, heads * head_dim]: taking
# it as the kernel wrote it saves two transposing copies per block (measured: 4.6 ms of a 236 ms forward).

def _first(out):
    return out[0] if isinstance(out, tuple) else out


@torch.library.custom_op("ghostedit::fa4", mutates_args=())
def _fa4(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    from flash_attn.cute import flash_attn_func
    return _first(flash_attn_func(q, k, v))


@torch.library.custom_op("ghostedit::fa3", mutates_args=())
def _fa3(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    import flash_attn_interface
    return _first(flash_attn_interface.flash_attn_func(q, k, v))


@torch.library.custom_op("ghostedit::fa2", mutates_args=())
def _fa2(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    import flash_attn
    return flash_attn.flash_attn_func(q, k, v)


@torch.library.custom_op("ghostedit::sage", mutates_args=())
def _sage(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    import sageattention
    return sageattention.sageattn(q, k, v, tensor_layout="NHD")


for _op in (_fa4, _fa3, _fa2, _sage):
    _op.register_fake(lambda q, k, v: q.new_empty(q.shape))  # the kernels return fresh contiguous tensors


def _on_transposed_views(op):
    """A kernel taking [batch, seq, heads, head_dim], called with [batch, heads, seq, head_dim] views."""
    return lambda q, k, v: op(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))


# Each called with [batch, heads, seq, head_dim] tensors; each returns [batch, seq, heads, head_dim].
_EXTERNAL = {"fa4": _on_transposed_views(_fa4), "fa3": _on_transposed_views(_fa3),
             "fa2": _on_transposed_views(_fa2), "sage": _on_transposed_views(_sage),
             "cudnn-fp8": fp8_attention.attention,
             "fa3-fp8": functools.partial(fp8_attention.attention, backend="fa3-fp8")}


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, backend: str) -> torch.Tensor:
    """Attention with one named backend; [batch, heads, seq, head_dim] in and out."""
    if backend in SDPA_BACKENDS:
        with sdpa_kernel([SDPA_BACKENDS[backend]]):
            return F.scaled_dot_product_attention(q, k, v)
    return _EXTERNAL[backend](q, k, v).transpose(1, 2)


def refuse_masks(backend: str, attention_mask, enable_fp8_attention) -> None:
    if attention_mask is not None or enable_fp8_attention:
        raise RuntimeError(f"attention backend {backend} does not take masks or FP8 attention; "
                           "use the 'diffsynth' backend for entity-masked prompts")


def _dispatching_attention(q, k, v, num_heads, attention_mask=None, enable_fp8_attention=False):
    """Drop-in for DiffSynth's `qwen_image_flash_attention`: the same signature, output [b, s, h*d]. Under
    sequence parallel (parallel/ulysses.py) the joined text and image go through its all-to-all first."""
    if ulysses.active():
        return joint_attention(ulysses.split_joined(q, k, v), num_heads, attention_mask, enable_fp8_attention)
    return _local_attention(q, k, v, num_heads, attention_mask, enable_fp8_attention)


def _local_attention(q, k, v, num_heads, attention_mask=None, enable_fp8_attention=False):
    """Attention of joined q, k, v in [b, h, s, d] with the active backend, on this process's heads and tokens."""
    backend = _active_backend
    if backend == "diffsynth":
        return _diffsynth_attention(q, k, v, num_heads, attention_mask=attention_mask,
                                    enable_fp8_attention=enable_fp8_attention)
    refuse_masks(backend, attention_mask, enable_fp8_attention)
    if backend in SDPA_BACKENDS:
        return rearrange(attend(q, k, v, backend), "b n s d -> b s (n d)")
    return _EXTERNAL[backend](q, k, v).flatten(2)


def joint_attention(streams, num_heads: int, attention_mask=None, enable_fp8_attention=False, q_scale=None,
                    k_scale=None) -> torch.Tensor:
    """Attention over streams joined along the sequence, in order, each stream's (q, k, v) in
    [batch, seq, heads, head_dim]; output [batch, seq, heads * head_dim]. The FP8 backend quantizes each stream
    before the join, q and k with the given FP8 scales (from rewrites.qk_bounds); the others get the joined
    tensors. Under sequence parallel, streams are (text, this rank's image shard), redistributed by Ulysses'
    all-to-all around the attention."""
    def attend(local_streams, local_heads):
        return _local_joint_attention(local_streams, local_heads, attention_mask, enable_fp8_attention, q_scale,
                                      k_scale)
    if ulysses.active():
        if attention_mask is not None:
            raise RuntimeError("sequence parallel does not take attention masks (entity prompts)")
        return ulysses.joint_attention(streams, attend)
    return attend(streams, num_heads)


def _local_joint_attention(streams, num_heads: int, attention_mask, enable_fp8_attention, q_scale, k_scale):
    if _active_backend in FP8_BACKENDS:
        refuse_masks(_active_backend, attention_mask, enable_fp8_attention)
        return fp8_attention.joint_attention(streams, q_scale, k_scale, _active_backend).flatten(2)
    q, k, v = (torch.cat(parts, dim=1).transpose(1, 2) for parts in zip(*streams))
    return _local_attention(q, k, v, num_heads, attention_mask, enable_fp8_attention)


def install() -> None:
    """Route DiffSynth's Qwen DiT attention through the dispatcher (idempotent)."""
    global _diffsynth_attention
    from ..diffsynth_patches import replace
    _diffsynth_attention = replace("attention dispatcher", _dispatching_attention)


@contextlib.contextmanager
def active(backend: str):
    """Make `backend` (a concrete one, or "diffsynth") the one the DiT uses inside this block."""
    global _active_backend
    install()
    previous, _active_backend = _active_backend, backend
    try:
        yield
    finally:
        _active_backend = previous


def active_backend() -> str:
    """The backend the DiT runs now (a concrete one, or "diffsynth")."""
    return _active_backend


def fp8_availability(device: str) -> Availability:
    """Whether an FP8 attention runs here: the first that does, else why none does."""
    reasons = []
    for backend in FP8_BACKENDS:
        available = availability(backend, device)
        if available.ok:
            return available
        reasons.append(available.reason)
    return Availability.no("; ".join(reasons))


def diffsynth_default() -> str:
    from diffsynth.models import qwen_image_dit
    return "fa3" if qwen_image_dit.FLASH_ATTN_3_AVAILABLE else "PyTorch SDPA (its own dispatch)"


# ---- availability: import checks and a real call on this device ----

def _probe_tensors(shape, device: str, dtype: torch.dtype = torch.bfloat16) -> list[torch.Tensor]:
    """q, k and v for a probe, from a generator of their own: a probe leaves the process's random state alone
    (weights made after it, as the synthetic model's, stay the same whichever probes ran before)."""
    generator = torch.Generator(device).manual_seed(0)
    return [torch.randn(shape, generator=generator, device=device, dtype=dtype) for _ in range(3)]


@functools.lru_cache(maxsize=None)
def availability(backend: str, device: str) -> Availability:
    if backend in ("diffsynth", "auto"):
        return Availability.yes()
    if backend in SDPA_GPU_ONLY:
        gpu = needs_cuda(device, SDPA_GPU_ONLY[backend])
        if not gpu.ok:
            return gpu
    if backend in EXTERNAL_BACKENDS:
        loader, what, (low, high) = EXTERNAL_BACKENDS[backend]
        gpu = needs_cuda(device, what, low, high)
        if not gpu.ok:
            return gpu
        try:
            loader() if callable(loader) else importlib.import_module(loader)
        except Exception as error:  # ImportError, or a broken build raising anything at import
            return Availability.no(f"{what} is not installed ({type(error).__name__}: {error_summary(error)})")
    try:
        q, k, v = _probe_tensors((1, 2, 256, 128), device)
        attend(q, k, v, backend)
        synchronize(device)
    except Exception as error:
        return Availability.no(f"{backend} cannot run on this device: {error_summary(error)}")
    return Availability.yes()


# ---- auto: the fastest backend measured here at the run's shape ----

def resolve(backend: str, dit, seq_len: int, device: str) -> tuple[str, str]:
    """The concrete backend a configuration's choice runs at this sequence length, and the words that say so:
    "auto" becomes the fastest exact backend measured here."""
    if backend != "auto":
        return backend, backend
    attn = dit.transformer_blocks[0].attn
    winner, timings = fastest_backend(device, attn.num_heads, attn.head_dim, seq_len)
    ranked = ", ".join(f"{name} {ms:.2f} ms" for name, ms in sorted(timings.items(), key=lambda item: item[1]))
    return winner, f"auto → {winner} ({ranked})"


@functools.lru_cache(maxsize=None)
def fastest_backend(device: str, heads: int, head_dim: int, seq_len: int, dtype: torch.dtype = torch.bfloat16):
    """Times every available exact backend at this shape and returns (winner, {backend: ms}); measured once per
    shape. Lossy backends are left out: "auto" must not change the result."""
    timings = {}
    q, k, v = _probe_tensors((1, heads, seq_len, head_dim), device, dtype)
    for backend in CONCRETE_BACKENDS:
        if backend in LOSSY_BACKENDS or not availability(backend, device).ok:
            continue
        timings[backend] = median_ms(lambda: attend(q, k, v, backend), device, repeats=5, warmup=2)
    winner = min(timings, key=timings.get)
    return winner, timings
