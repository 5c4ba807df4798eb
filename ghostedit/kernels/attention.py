"""The attention backends, by name: PyTorch SDPA's kernels, FlashAttention-2/3/4, SageAttention and the FP8 attentions
(fp8_attention.py); which of them can run here, with the reason where one cannot; and "auto", the fastest exact one
measured here at a shape.

Each SDPA backend calls its ATen kernel directly, as SDPA itself calls it once it has chosen: choosing through
`torch.nn.attention.sdpa_kernel` sets process-wide flags, which would change the kernel another engine's forward
runs in another thread meanwhile. Kernels from outside PyTorch are registered as custom ops so that compiled blocks
keep them whole. The FP8 attentions and SageAttention change results beyond rounding: they run when named, and
"auto" never picks them. Which backend a forward runs is its run's choice (models/seams.py dispatches on it).
"""
from __future__ import annotations

import functools
import importlib

import torch

from ..device import Availability, needs_cuda, synchronize
from ..errors import error_summary
from ..telemetry import median_ms
from . import fp8_attention


def _sdpa_flash(q, k, v):
    if q.device.type == "cpu":
        return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v)[0]
    return torch.ops.aten._scaled_dot_product_flash_attention(q, k, v)[0]


# [batch, heads, seq, head_dim] in and out, each the kernel SDPA runs when only that backend is enabled
SDPA_BACKENDS = {
    "sdpa-cudnn": lambda q, k, v: torch.ops.aten._scaled_dot_product_cudnn_attention(q, k, v, None, False)[0],
    "sdpa-flash": _sdpa_flash,
    "sdpa-efficient": lambda q, k, v: torch.ops.aten._scaled_dot_product_efficient_attention(q, k, v, None, False)[0],
    "sdpa-math": lambda q, k, v: torch.ops.aten._scaled_dot_product_attention_math(q, k, v)[0],
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
# The FP8 attentions: their q and k are cast with scales from bounds worked out when the DiT is prepared
FP8_BACKENDS = fp8_attention.BACKENDS
# Backends that change the result beyond rounding (INT8/FP8 inputs): chosen by name only, never by "auto"
LOSSY_BACKENDS = ("sage",) + FP8_BACKENDS
# SDPA kernels that PyTorch ships for CUDA only
SDPA_GPU_ONLY = {"sdpa-cudnn": "PyTorch SDPA's cuDNN kernel", "sdpa-efficient": "PyTorch SDPA's memory-efficient kernel"}
CONCRETE_BACKENDS = tuple(SDPA_BACKENDS) + tuple(EXTERNAL_BACKENDS)

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
EXTERNAL = {"fa4": _on_transposed_views(_fa4), "fa3": _on_transposed_views(_fa3),
             "fa2": _on_transposed_views(_fa2), "sage": _on_transposed_views(_sage),
             "cudnn-fp8": fp8_attention.attention,
             "fa3-fp8": functools.partial(fp8_attention.attention, backend="fa3-fp8")}


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, backend: str) -> torch.Tensor:
    """Attention with one named backend; [batch, heads, seq, head_dim] in and out."""
    if backend in SDPA_BACKENDS:
        return SDPA_BACKENDS[backend](q, k, v)
    return EXTERNAL[backend](q, k, v).transpose(1, 2)


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
    """What DiffSynth's own attention runs: FlashAttention-3 where `flash_attn_interface` imports (DiffSynth's test
    at its import), else PyTorch SDPA's own dispatch."""
    return "fa3" if _importable("flash_attn_interface") else "PyTorch SDPA (its own dispatch)"


@functools.cache
def _importable(module: str) -> bool:
    try:
        importlib.import_module(module)
    except ImportError:
        return False
    return True


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

def resolve(backend: str, heads: int, head_dim: int, seq_len: int, device: str) -> tuple[str, str]:
    """The concrete backend a configuration's choice runs at this shape, and the words that say so: "auto" becomes
    the fastest exact backend measured here."""
    if backend != "auto":
        return backend, backend
    winner, timings = fastest_backend(device, heads, head_dim, seq_len)
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
