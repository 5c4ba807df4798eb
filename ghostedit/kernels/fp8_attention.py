"""FP8 attention: cuDNN's fused FP8 flash attention (the `cudnn-fp8` backend) and FlashAttention-3's FP8 kernel
(`fa3-fp8`). Both lossy.

q, k and v are each scaled to FP8's range with one per-tensor factor and cast to float8_e4m3fn; the kernel computes
QK^T and PV on FP8 tensor cores, with the softmax probabilities also in FP8. cuDNN takes the probabilities (at most
1 before normalization) scaled onto FP8's range and writes the output in FP8, scaled as v is (attention output rows
are convex combinations of v's rows, so they never exceed v's largest value); FlashAttention-3 takes the three
descale factors and writes the output in bf16. The quantization and the output's rescaling are plain tensor code,
which torch.compile fuses into the neighbouring kernels (RoPE before, the output projection's quantization after);
each kernel call is a custom op that compiled blocks keep whole.

On Hopper, cuDNN writes FP8 attention output only in FP8 (a bf16 output needs Blackwell and cuDNN 9.13).
cuDNN's graph API comes from NVIDIA's cudnn-frontend Python package (`nvidia-cudnn-frontend`), bound to the cuDNN
that PyTorch runs with. FlashAttention-3 (`flash_attn_interface`) has no wheel on the package index:
scripts/gpu/build_fa3_wheel.sh builds one.
"""
from __future__ import annotations

import contextlib
import functools
import math
import os
import threading

import torch

from ..device import load_torch_cudnn
from .fp8 import FP8, FP8_MAX

# the softmax probabilities before normalization lie in [0, 1]: mapped onto FP8's whole range
SOFTMAX_SCALE = FP8_MAX
BACKENDS = ("cudnn-fp8", "fa3-fp8")  # the attention backends this module computes

_Q, _K, _V, _O, _AMAX_O = 1, 2, 3, 4, 5
_DESCALE_Q, _DESCALE_K, _DESCALE_V, _DESCALE_S, _SCALE_S, _SCALE_O = 10, 11, 12, 13, 14, 15
_SEQ_LEN_Q, _SEQ_LEN_KV = 20, 21



@contextlib.contextmanager
def _library_path_first(folder: str | None):
    previous = os.environ.get("LD_LIBRARY_PATH")
    if folder:
        os.environ["LD_LIBRARY_PATH"] = folder + (os.pathsep + previous if previous else "")
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop("LD_LIBRARY_PATH", None)
        else:
            os.environ["LD_LIBRARY_PATH"] = previous


@functools.cache
def cudnn_frontend():
    """cudnn-frontend's Python API. It binds to the first libcudnn it finds on LD_LIBRARY_PATH, read at import:
    PyTorch's own cuDNN folder is put first for that moment."""
    with _library_path_first(load_torch_cudnn()):
        import cudnn
    return cudnn


def largest_magnitude(x: torch.Tensor) -> torch.Tensor:
    """max |x|, in two stages, over the contiguous last dimension first: compiled for dynamic shapes, one reduction
    over the whole tensor ran as a single program (measured: 0.23 ms for a 52 MB q, a fourteenth of the memory
    bandwidth)."""
    return x.abs().amax(dim=-1).amax()


def fp8_scale(amax: torch.Tensor) -> torch.Tensor:
    """The factor that maps `amax` (a largest magnitude, or a known bound on it) onto FP8's largest value. Worked out
    once where it can be: compiled code recomputes a scalar for every element that uses it (here in float64)."""
    from torchao.float8.float8_utils import amax_to_scale  # torchao loads with a run, not with the app
    return amax_to_scale(amax, FP8)


def to_fp8(x: torch.Tensor, amax: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x in float8_e4m3fn, scaled so that `amax` (its largest magnitude, or a known bound on it) becomes FP8's
    largest value, and the factor that undoes the scaling, shaped [1, 1, 1, 1] as cuDNN takes it."""
    return _scaled_fp8(x, fp8_scale(amax))


def _scaled_fp8(x: torch.Tensor, scale: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    from torchao.float8.float8_utils import to_fp8_saturated
    return to_fp8_saturated(x.float() * scale, FP8), descale(scale)


def descale(scale: torch.Tensor) -> torch.Tensor:
    """The factor that undoes an FP8 `scale`, shaped [1, 1, 1, 1] as cuDNN takes it."""
    return scale.reciprocal().reshape(1, 1, 1, 1)


def dequantized(output: torch.Tensor, output_descale: torch.Tensor, dtype=torch.bfloat16) -> torch.Tensor:
    """The FP8 attention's output [batch, seq, heads, head_dim] in `dtype`, its real values."""
    return (output.float() * output_descale).to(dtype)


def _handle(cudnn, device: torch.device):
    """This thread's cuDNN handle on `device` (a handle must not be used by two threads at once), on the current
    stream."""
    handle = _thread_handle(threading.get_ident(), device)
    cudnn.set_stream(handle=handle, stream=torch.cuda.current_stream(device).cuda_stream)
    return handle


@functools.cache
def _thread_handle(thread: int, device: torch.device):
    """A handle per thread and device, made once: a thread that ended leaves its handle to the next one Python
    gives its number."""
    with torch.cuda.device(device):
        return cudnn_frontend().create_handle()


def operation_graph(cudnn, handle, shape, q_stride, k_stride, v_stride, output_stride, padding_mask=False):
    """cuDNN's FP8 attention graph for these shapes and strides, validated, before any execution plan. With
    `padding_mask`, each batch item's real lengths come in int32 [batch, 1, 1, 1] tensors (uids _SEQ_LEN_Q and
    _SEQ_LEN_KV) and the rows past them are padding."""
    batch, heads, seq_q, seq_kv, head_dim = shape
    graph = cudnn.pygraph(handle=handle, io_data_type=cudnn.data_type.FP8_E4M3,
                          intermediate_data_type=cudnn.data_type.FLOAT, compute_data_type=cudnn.data_type.FLOAT)

    def fp8_tensor(uid, seq, stride):
        return graph.tensor(uid=uid, dim=[batch, heads, seq, head_dim], stride=list(stride),
                            data_type=cudnn.data_type.FP8_E4M3)

    def scalar(uid):
        return graph.tensor(uid=uid, dim=[1, 1, 1, 1], stride=[1, 1, 1, 1], data_type=cudnn.data_type.FLOAT)

    def lengths(uid):
        return graph.tensor(uid=uid, dim=[batch, 1, 1, 1], stride=[1, 1, 1, 1], data_type=cudnn.data_type.INT32)

    masking = dict(use_padding_mask=True, seq_len_q=lengths(_SEQ_LEN_Q), seq_len_kv=lengths(_SEQ_LEN_KV)) \
        if padding_mask else {}
    output, _stats, _amax_s, amax_o = graph.sdpa_fp8(
        q=fp8_tensor(_Q, seq_q, q_stride), k=fp8_tensor(_K, seq_kv, k_stride), v=fp8_tensor(_V, seq_kv, v_stride),
        descale_q=scalar(_DESCALE_Q), descale_k=scalar(_DESCALE_K), descale_v=scalar(_DESCALE_V),
        descale_s=scalar(_DESCALE_S), scale_s=scalar(_SCALE_S), scale_o=scalar(_SCALE_O),
        generate_stats=False, attn_scale=1.0 / math.sqrt(head_dim), use_causal_mask=False, **masking)
    output.set_uid(_O).set_output(True).set_dim([batch, heads, seq_q, head_dim]).set_stride(list(output_stride)) \
        .set_data_type(cudnn.data_type.FP8_E4M3)
    amax_o.set_uid(_AMAX_O).set_output(True).set_dim([1, 1, 1, 1]).set_stride([1, 1, 1, 1]) \
        .set_data_type(cudnn.data_type.FLOAT)
    graph.validate()
    graph.build_operation_graph()
    return graph


@functools.cache
def _plan(shape, q_stride, k_stride, v_stride, output_stride, device: torch.device):
    """cuDNN's built graph and its workspace bytes for these shapes and strides, built once (kept for the process:
    it depends on nothing but them)."""
    cudnn = cudnn_frontend()
    graph = operation_graph(cudnn, _handle(cudnn, device), shape, q_stride, k_stride, v_stride, output_stride)
    graph.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
    graph.check_support()
    graph.build_plans()
    return graph, graph.get_workspace_size()


@functools.cache
def _softmax_scales(device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    scale = torch.full((1, 1, 1, 1), SOFTMAX_SCALE, dtype=torch.float32, device=device)
    return scale, scale.reciprocal()


def _bshd_output_stride(batch, heads, seq, head_dim):
    """Strides of a [batch, seq, heads, head_dim] tensor, listed in [batch, heads, seq, head_dim] order."""
    return (seq * heads * head_dim, head_dim, heads * head_dim, 1)


def _joined(parts: list[torch.Tensor]) -> torch.Tensor:
    """FP8 parts in [batch, seq, heads, head_dim] joined along the sequence (copied as bytes)."""
    if len(parts) == 1:
        return parts[0]
    return torch.cat([part.view(torch.uint8) for part in parts], dim=1).view(FP8)


def variant_pack(q, k, v, output, q_descale, k_descale, v_descale) -> dict:
    """The tensors of one execution of the graph by uid: q, k, v and the output in [batch, heads, seq, head_dim]
    order, the output scaled as v is."""
    scale_s, descale_s = _softmax_scales(q.device)
    return {_Q: q, _K: k, _V: v, _O: output, _AMAX_O: torch.empty((1, 1, 1, 1), dtype=torch.float32, device=q.device),
            _DESCALE_Q: q_descale, _DESCALE_K: k_descale, _DESCALE_V: v_descale,
            _DESCALE_S: descale_s, _SCALE_S: scale_s, _SCALE_O: v_descale.reciprocal()}


@torch.library.custom_op("ghostedit::cudnn_fp8_attention", mutates_args=())
def cudnn_fp8_attention(q: list[torch.Tensor], k: list[torch.Tensor], v: list[torch.Tensor],
                        q_descale: torch.Tensor, k_descale: torch.Tensor, v_descale: torch.Tensor) -> torch.Tensor:
    """q, k, v: each a list of float8_e4m3fn parts in [batch, seq, heads, head_dim] (any strides, head_dim
    contiguous), joined along the sequence here: compiled code hands over each stream in FP8 as the kernel that
    made it wrote it. The descale factors are [1, 1, 1, 1]. Returns the attention output in float8_e4m3fn,
    [batch, seq, heads, head_dim], scaled as v is: multiply by v_descale for the real values."""
    cudnn = cudnn_frontend()
    q, k, v = (_joined(parts).permute(0, 2, 1, 3) for parts in (q, k, v))  # the graph's [batch, heads, seq, dim]
    q, k, v = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v))
    batch, heads, seq_q, head_dim = q.shape
    shape = (batch, heads, seq_q, k.shape[2], head_dim)
    output_stride = _bshd_output_stride(batch, heads, seq_q, head_dim)
    handle = _handle(cudnn, q.device)
    output = torch.empty((batch, seq_q, heads, head_dim), dtype=FP8, device=q.device)
    pack = variant_pack(q, k, v, output.permute(0, 2, 1, 3), q_descale, k_descale, v_descale)
    graph, workspace_bytes = _plan(shape, q.stride(), k.stride(), v.stride(), output_stride, q.device)
    graph.execute(pack, torch.empty(max(workspace_bytes, 1), dtype=torch.uint8, device=q.device), handle=handle)
    return output


@cudnn_fp8_attention.register_fake
def _(q, k, v, q_descale, k_descale, v_descale):
    batch, _, heads, head_dim = q[0].shape
    return q[0].new_empty((batch, sum(part.shape[1] for part in q), heads, head_dim))


@torch.library.custom_op("ghostedit::fa3_fp8_attention", mutates_args=())
def fa3_fp8_attention(q: list[torch.Tensor], k: list[torch.Tensor], v: list[torch.Tensor],
                      q_descale: torch.Tensor, k_descale: torch.Tensor, v_descale: torch.Tensor) -> torch.Tensor:
    """FlashAttention-3's FP8 kernel over q, k, v given as cudnn_fp8_attention takes them (float8_e4m3fn parts in
    [batch, seq, heads, head_dim], joined along the sequence here; descale factors [1, 1, 1, 1]). Returns the
    attention output's real values in bf16, [batch, seq, heads, head_dim]: the kernel applies the descales."""
    import flash_attn_interface
    q, k, v = (_joined(parts) for parts in (q, k, v))
    batch, _, heads, _ = q.shape
    # the kernel takes a factor per batch item and head; one per tensor is that, broadcast
    q_descale, k_descale, v_descale = (factor.reshape(1, 1).expand(batch, heads)
                                       for factor in (q_descale, k_descale, v_descale))
    output = flash_attn_interface.flash_attn_func(q, k, v, q_descale=q_descale, k_descale=k_descale,
                                                  v_descale=v_descale)
    return output[0] if isinstance(output, tuple) else output


@fa3_fp8_attention.register_fake
def _(q, k, v, q_descale, k_descale, v_descale):
    batch, _, heads, head_dim = q[0].shape
    return q[0].new_empty((batch, sum(part.shape[1] for part in q), heads, head_dim), dtype=torch.bfloat16)


def joint_attention(streams, q_scale: torch.Tensor | None = None, k_scale: torch.Tensor | None = None,
                    backend: str = "cudnn-fp8", v_scale: torch.Tensor | None = None) -> torch.Tensor:
    """FP8 attention (the FP8 `backend`) over streams joined along the sequence, in order: each stream's bf16
    (q, k, v) in [batch, seq, heads, head_dim]; the output in their dtype, in the same layout. q and k are cast per
    stream, with the joined tensor's one scale, and joined in FP8 by the kernel's op, so their casts fuse into the
    kernels that make them (RMSNorm and RoPE); v, a GEMM's output, is joined and cast in one pass. q and k are
    scaled by the given factors (fp8_scale of a bound), else by their largest values; v by `v_scale` where given
    (the whole sequence's, when this process holds part of it), else by its largest value."""
    queries, keys, values = zip(*streams)
    q8, q_descale = fp8_parts(queries, q_scale)
    k8, k_descale = fp8_parts(keys, k_scale)
    return attend(q8, q_descale, k8, k_descale, values, backend, v_scale)


def attend(q8: list[torch.Tensor], q_descale: torch.Tensor, k8: list[torch.Tensor], k_descale: torch.Tensor,
           values, backend: str = "cudnn-fp8", v_scale: torch.Tensor | None = None) -> torch.Tensor:
    """The attention of FP8 q and k (parts the kernel's op joins) over the bf16 `values` of each stream, which are
    joined and cast in one pass, by the FP8 `backend`; the output in the values' dtype, [batch, seq, heads,
    head_dim]."""
    output, output_descale = attend_as_written(q8, q_descale, k8, k_descale, values, backend, v_scale)
    return real_values(output, output_descale, values[0].dtype)


def real_values(output: torch.Tensor, output_descale: torch.Tensor | None, dtype) -> torch.Tensor:
    """An FP8 attention's output as attend_as_written gives it (FP8 with its factor, or real values with None), as
    real values in `dtype`."""
    if output_descale is None:
        return output.to(dtype)
    return dequantized(output, output_descale, dtype)


def attend_as_written(q8: list[torch.Tensor], q_descale: torch.Tensor, k8: list[torch.Tensor], k_descale: torch.Tensor,
                      values, backend: str = "cudnn-fp8",
                      v_scale: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """attend's output as the kernel writes it, [batch, seq, heads, head_dim], and the factor [1, 1, 1, 1] that gives
    its real values: cuDNN's in float8_e4m3fn with its factor, FlashAttention-3's real values in bf16 with None.
    Without `v_scale` the values are joined and cast in one pass at their largest value's scale; with it each part
    is cast with it (the same bits as the joined tensor's cast) and the kernel's op joins them."""
    if v_scale is None:
        v8, v_descale = fp8_parts([torch.cat(values, dim=1)] if len(values) > 1 else values, None)
    else:
        v8, v_descale = fp8_parts(values, v_scale)
    return attend_fp8(q8, q_descale, k8, k_descale, v8, v_descale, backend)


def attend_fp8(q8: list[torch.Tensor], q_descale: torch.Tensor, k8: list[torch.Tensor], k_descale: torch.Tensor,
               v8: list[torch.Tensor], v_descale: torch.Tensor,
               backend: str = "cudnn-fp8") -> tuple[torch.Tensor, torch.Tensor | None]:
    """The FP8 `backend` over q, k and v given in FP8 (parts in [batch, seq, heads, head_dim] the kernel's op joins
    along the sequence) with their descale factors: the output as attend_as_written gives it."""
    if backend not in BACKENDS:
        raise ValueError(f"{backend!r} is not an FP8 attention; they are {', '.join(BACKENDS)}")
    if backend == "fa3-fp8":
        return fa3_fp8_attention(q8, k8, v8, q_descale, k_descale, v_descale), None
    return cudnn_fp8_attention(q8, k8, v8, q_descale, k_descale, v_descale), v_descale


def fp8_parts(parts, scale: torch.Tensor | None) -> tuple[list[torch.Tensor], torch.Tensor]:
    """Each part cast to FP8 with `scale` (None: the parts' largest magnitude's, empty parts left out: a cached
    prefix's stream has no queries), and the factor that undoes it."""
    if scale is None:
        scale = fp8_scale(torch.stack([largest_magnitude(part) for part in parts if part.numel()]).amax())
    cast = [_scaled_fp8(part, scale) for part in parts]
    return [part8 for part8, _ in cast], cast[0][1]


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, backend: str = "cudnn-fp8") -> torch.Tensor:
    """FP8 attention (the FP8 `backend`) of bf16 q, k, v in [batch, heads, seq, head_dim], each scaled by its
    largest value; the output in their dtype, in [batch, seq, heads, head_dim]."""
    return joint_attention([(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))], backend=backend)
