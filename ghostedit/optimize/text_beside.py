"""The text stream's FP8 GEMMs on a second CUDA stream, beside the image stream's memory-bound kernels (the
`text-side-stream` rewrite).

A block's text stream has a few hundred rows, so its GEMMs fill part of the GPU and run below the FP8 ceiling, one
after the image stream's kernels. The image stream's LayerNorms and GELU quantization, meanwhile, wait on memory and
leave the tensor cores idle. Here the text stream's joined q/k/v projection starts on a second stream as soon as its
LayerNorm is done, before the image stream's LayerNorm, and the text feed-forward (up projection, GhostEdit's GELU
quantization kernel, down projection) before the image stream's second LayerNorm; the main stream waits for each
where its result is first needed, after the image stream's GEMM of the same layer. The kernels are the ones the
engine runs without the rewrite (torchao's row quantization in the compiled code, then the torch._scaled_mm calls
torchao makes on the layers' own FP8 weight tensors, so fused LoRAs stay in effect), on the same inputs: only the
stream differs, so the output is the same bit for bit (scripts/gpu/overlap_probe.py, graph_check.py).

Two custom ops, opaque to the compiled blocks, carry it: `text_layers_beside` hands the work to the side stream and
returns its result unfinished; `text_layers_joined` makes the main stream wait for it. The join declares that it
changes the result (it does not), which orders every later reader after it, and it takes the side stream's inputs,
so that the compiled code keeps their memory until the side stream is done with it. The result's memory is recorded
for the main stream, which frees it.
"""
from __future__ import annotations

import types
from typing import Optional

import torch

from .fp8 import is_torchao_fp8

_SIDE_STREAMS: dict[torch.device, torch.cuda.Stream] = {}

Started = tuple[torch.Tensor, torch.Size, tuple[torch.Tensor, ...]]  # the result's rows, its shape, what it reads


def side_stream(device: torch.device) -> torch.cuda.Stream:
    """One side stream per GPU, made once (a CUDA graph replays the stream it captured)."""
    if device not in _SIDE_STREAMS:
        _SIDE_STREAMS[device] = torch.cuda.Stream(device)
    return _SIDE_STREAMS[device]


def _fp8_matmul(values, scales, weight, weight_scale, bias, fast_accum):
    return torch._scaled_mm(values, weight.t(), scale_a=scales, scale_b=weight_scale.t(), bias=bias,
                            out_dtype=torch.bfloat16, use_fast_accum=fast_accum)


def _layers(values, scales, up, up_scale, up_bias, down, down_scale, down_bias, fast_accum):
    """One FP8 linear (q/k/v), or a feed-forward: up projection, GELU quantized per row, down projection."""
    from .fp8_mlp import gelu_rowwise_fp8_launch
    out = _fp8_matmul(values, scales, up, up_scale, up_bias, fast_accum)
    if down is None:
        return out
    activation, activation_scale = gelu_rowwise_fp8_launch(out)
    return _fp8_matmul(activation, activation_scale, down, down_scale, down_bias, fast_accum)


@torch.library.custom_op("ghostedit::text_layers_beside", mutates_args=())
def layers_beside(values: torch.Tensor, scales: torch.Tensor, up: torch.Tensor, up_scale: torch.Tensor,
                  up_bias: Optional[torch.Tensor], down: Optional[torch.Tensor], down_scale: Optional[torch.Tensor],
                  down_bias: Optional[torch.Tensor], fast_accum: bool) -> torch.Tensor:
    main, side = torch.cuda.current_stream(values.device), side_stream(values.device)
    side.wait_stream(main)
    with torch.cuda.stream(side):
        out = _layers(values, scales, up, up_scale, up_bias, down, down_scale, down_bias, fast_accum)
    out.record_stream(main)
    return out


@layers_beside.register_fake
def _(values, scales, up, up_scale, up_bias, down, down_scale, down_bias, fast_accum):
    return values.new_empty((values.shape[0], (up if down is None else down).shape[0]), dtype=torch.bfloat16)


@torch.library.custom_op("ghostedit::text_layers_joined", mutates_args=("result",))
def layers_joined(result: torch.Tensor, kept: list[torch.Tensor]) -> None:
    torch.cuda.current_stream(result.device).wait_stream(side_stream(result.device))


@layers_joined.register_fake
def _(result, kept):
    return None


def _quantized_rows(linear: torch.nn.Linear, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`rows` quantized for `linear` as torchao's linear quantizes its input: (FP8 values, scales)."""
    from torchao.quantization.quantize_.common import _choose_quant_func_and_quantize_tensor
    quantized = _choose_quant_func_and_quantize_tensor(rows, linear.weight.act_quant_kwargs)
    return quantized.qdata, quantized.scale


def _start(x: torch.Tensor, up: torch.nn.Linear, down: torch.nn.Linear | None = None) -> Started:
    values, scales = _quantized_rows(up, x.reshape(-1, x.shape[-1]))
    last = down if down is not None else up
    out = layers_beside(values, scales, up.weight.qdata, up.weight.scale, up.bias,
                        None if down is None else down.weight.qdata, None if down is None else down.weight.scale,
                        None if down is None else down.bias, up.weight.mm_config.use_fast_accum)
    return out, x.shape[:-1] + (last.out_features,), (values, scales)


def start_linear(linear: torch.nn.Linear, x: torch.Tensor) -> Started:
    """`linear(x)` begun on the side stream; finish() gives it."""
    return _start(x, linear)


def start_feed_forward(feed_forward: torch.nn.Module, x: torch.Tensor) -> Started:
    """DiffSynth's QwenFeedForward of `x` (as fp8_mlp.fp8_mlp_forward computes it) begun on the side stream."""
    return _start(x, feed_forward.net[0].proj, feed_forward.net[2])


def finish(started: Started, after: torch.Tensor) -> torch.Tensor:
    """The started result, once the main stream has waited for it; `after` (a result of the image stream's GEMM)
    places the wait after that GEMM in the compiled code."""
    out, shape, kept = started
    layers_joined(out, [after, *kept])
    return out.reshape(shape)


def put_text_beside(dit: torch.nn.Module) -> int:
    """Marks every block of the DiT (carried_residual's forward, fused q/k/v, torchao FP8 text layers, fused GELU
    quantization) to run its text stream beside; returns how many."""
    from .fp8_mlp import fp8_mlp_forward
    blocks = list(dit.transformer_blocks)
    unfit = [block for block in blocks if not _fits(block, fp8_mlp_forward)]
    if unfit:
        raise ValueError(f"{len(unfit)} of {len(blocks)} blocks do not run the text stream as torchao FP8 linears "
                         "with a fused q/k/v projection and the fused GELU quantization: text-side-stream needs "
                         "fp8=torchao, fused-qkv, fused-gelu-quant and carried-residual")
    for block in blocks:
        block.text_side_stream = True
    return len(blocks)


def _fits(block: torch.nn.Module, fp8_mlp_forward) -> bool:
    feed_forward = block.txt_mlp
    return (getattr(block, "carries_residual", False) and hasattr(block.attn, "add_qkv")
            and is_torchao_fp8(block.attn.add_qkv)
            and isinstance(feed_forward.forward, types.MethodType) and feed_forward.forward.__func__ is fp8_mlp_forward)
