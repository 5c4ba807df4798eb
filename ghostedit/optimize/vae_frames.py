"""The VAE on one frame as an image network: its causal 3-D convolutions as 2-D ones, channels-last (`vae=image`),
and with `vae=image-fused` its RMS norms in one kernel each, with the SiLU that follows them. Both serve DiffSynth's
Qwen-Image VAE; `image-fused` also serves Qwen-Image-2.1's RGBA VAE (QwenImage21VAE), whose layers have the same
structure and norms.

Qwen-Image's VAE is a video VAE. On an image (one frame, no cached frames) each causal 3-D convolution pads the
frame with kernel_t - 1 frames of zeros in front and convolves all of them: with 3x3x3 kernels, two thirds of the
work multiply zeros. The padded frames contribute nothing, so the output is the 2-D convolution of the frame with the
kernel's last temporal slice: the same function, up to floating-point rounding (cuDNN sums in another order). Run
channels-last, cuDNN's NHWC kernels also skip the layout conversions it makes around every NCHW convolution (an H100
profile of an edit: lab/results/profile-edit). A convolution that sees cached frames or more than one frame (a
video) runs as released.

The same profile had most of the VAE's GPU time in elementwise kernels around its RMS norms: the reference's float32
normalization (a cast, a norm, a division, a cast back), then the scale, gamma, the bias and the SiLU, each a pass
over tensors of up to 100 M values at 1024x1024. GhostEdit's Triton kernel (kernels/triton_code.channel_rms_norm) reads each
pixel's channels once and writes the result once, rounding to bf16 where those kernels round; on the H100 its
outputs match theirs bit for bit but where the sum of squares, summed in another order, rounds otherwise
(lab/probes: vae_norm_probe.py). The upsampling before each upsampling convolution also runs in the VAE's dtype
instead of through float32 (nearest neighbours copy values: the same bits), the layers that write NCHW hand their
output on channels-last, and each residual block's two convolutions leave their bias to the kernel after them
(PyTorch adds it in a strided pass of its own). A norm of a video's frames, or on a CPU, runs as released, with its
SiLU.

Qwen-Image-2.1's VAE has nothing for `vae=image` to do: its causal convolution (QwenImage21CausalConv3d) is an
nn.Conv2d that drops the time axis and pads the frame in height and width only. Its RMS norm is the Edit VAE's as the
kernel computes it (F.normalize in float32, rounded to the input's dtype, times the scale and gamma, the SiLU after
it in a residual block and at the encoder's and decoder's end), its upsampling goes through float32 as the Edit
VAE's, its resampling and residual blocks are the same layers: `image-fused` runs it the same way, its 2-D
convolutions channels-last.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

import torch

from .. import tensors


def _single_frame_weights(vae) -> dict:
    """{causal conv: its weight's last temporal slice, channels-last} for every causal 3-D convolution of `vae`
    that zero-pads a lone frame (stride 1 in time, padding kernel_t - 1 frames in front). Kept with the VAE while it
    stays where it is: taking them at every edit cost it milliseconds."""
    return tensors.kept_while_placed(vae, "single-frame weights", _slices)


def _slices(vae) -> dict:
    """The Edit VAE's qualifying causal 3-D convolutions' last temporal slices; the 2.1 VAE's causal convolutions
    (2-D already) their own weights, channels-last."""
    from diffsynth.models.qwen_image_21_vae import QwenImage21CausalConv3d
    from diffsynth.models.qwen_image_vae import QwenImageCausalConv3d
    weights = {}
    for module in vae.modules():
        if isinstance(module, QwenImageCausalConv3d) and module.stride[0] == 1 \
                and module._padding[4] == module.kernel_size[0] - 1:
            weights[module] = module.weight[:, :, -1].contiguous(memory_format=torch.channels_last)
        elif isinstance(module, QwenImage21CausalConv3d):
            weights[module] = module.weight.contiguous(memory_format=torch.channels_last)
    return weights


def already_2d(vae) -> bool:
    """Whether `vae`'s causal convolutions are 2-D ones already (Qwen-Image-2.1's VAE)."""
    from diffsynth.models.qwen_image_21_vae import QwenImage21CausalConv3d
    return any(isinstance(module, QwenImage21CausalConv3d) for module in vae.modules())


def _image_forward(conv, weight):
    def forward(x, cache_x=None):
        if cache_x is not None or x.shape[2] != 1:
            return type(conv).forward(conv, x, cache_x)
        return frame_convolution(conv, weight, x, conv.bias)
    return forward


def frame_convolution(conv, weight, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """The causal convolution `conv` of x's lone frame as a 2-D one with `weight` (its last temporal slice, or its
    own 2-D weight), with `bias` (PyTorch adds a convolution's bias in a pass of its own after cuDNN's)."""
    frame = x[:, :, 0].contiguous(memory_format=torch.channels_last)
    padding = (conv._padding[2], conv._padding[0])   # (height, width): F.pad's order is (w, w, h, h[, t, t])
    return torch.nn.functional.conv2d(frame, weight, bias, conv.stride[-2:], padding, conv.dilation[-2:]).unsqueeze(2)


@contextlib.contextmanager
def image_convolutions(vae):
    """`vae`'s causal convolutions run as 2-D ones on a lone frame, channels-last, for the length of the context
    (their weights' slices, a few MB per layer on the device, kept with the VAE)."""
    weights = _single_frame_weights(vae)
    if not weights:
        raise ValueError(f"{type(vae).__name__} has no causal convolution to run as a 2-D one: vae=image serves "
                         "DiffSynth's Qwen-Image VAEs")
    for conv, weight in weights.items():
        conv.forward = _image_forward(conv, weight)
    try:
        yield len(weights)
    finally:
        for conv in weights:
            del conv.forward


# ---- vae=image-fused: the RMS norms and the residual blocks' ends in GhostEdit's kernels ----

ROW_VALUES, WARPS = 4096, 8   # values per Triton program (whole rows), warps: vae_norm_probe.py (lab/probes)
RESIDUAL_BLOCK = 4096   # values per program of the residual addition
NORMALIZE_EPS = 1e-12   # F.normalize's default, which the released norm uses


KERNEL_DEVICES = ("cuda",)   # where the kernel runs (tests add "cpu" under Triton's interpreter)


def _kernels_run_on(x: torch.Tensor) -> bool:
    """Whether the kernels take `x`: on their device, one frame (a video's frames run as released)."""
    return x.device.type in KERNEL_DEVICES and not (x.dim() == 5 and x.shape[2] != 1)


def _channel_rows(x: torch.Tensor) -> torch.Tensor | None:
    """`x` ([batch, channels, ...]) as [pixels, channels] rows, copied channels-last if it is not (the output of a
    layer that writes NCHW: the convolution after the norm wants it channels-last anyway); None where the kernels
    do not run."""
    return x.movedim(1, -1).contiguous().view(-1, x.shape[1]) if _kernels_run_on(x) else None


def _per_channel(bias: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    return bias.reshape(1, -1, *[1] * (like.dim() - 2))


def _as_laid_out(rows: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """[pixels, channels] rows back in the shape of `like`, channels-last."""
    return rows.view(like.movedim(1, -1).shape).movedim(-1, 1)


def fused_rms_norm(norm, x: torch.Tensor, silu: bool, input_bias: torch.Tensor | None = None) -> torch.Tensor:
    """`norm` (the VAE's float32 RMS norm) of channels-last `x` (plus `input_bias`, the bias the convolution before
    it left out) in one Triton kernel, with the SiLU after it if `silu`; any other input as released."""
    rows = _channel_rows(x)
    if rows is None:
        out = type(norm).forward(norm, x if input_bias is None else x + _per_channel(input_bias, x))
        return torch.nn.functional.silu(out) if silu else out
    bias = norm.bias if isinstance(norm.bias, torch.Tensor) else None
    out_rows = channel_rms_norm_launch(rows, norm.gamma.reshape(-1), None if bias is None else bias.reshape(-1),
                                       float(norm.scale), silu, input_bias=input_bias)
    return _as_laid_out(out_rows, x)


def bias_residual(x: torch.Tensor, bias: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
    """(x + a convolution's bias per channel) + residual, a residual block's end, in one Triton kernel on
    channels-last tensors (as released elsewhere)."""
    rows, residual_rows = _channel_rows(x), _channel_rows(residual)
    if rows is None or residual_rows is None:
        return x + _per_channel(bias, x) + residual
    import triton
    from ..kernels import triton_code
    out = torch.empty_like(rows)
    triton_code.channel_bias_residual[(triton.cdiv(rows.numel(), RESIDUAL_BLOCK),)](
        rows, bias, residual_rows, out, rows.numel(), n_channels=rows.shape[1], BLOCK=RESIDUAL_BLOCK)
    return _as_laid_out(out, x)


def channel_chunk(channels: int) -> int:
    """The largest power of two that divides `channels`, at most 128: the chunks then need no mask."""
    return min(channels & -channels, 128)


def channel_rms_norm_launch(rows: torch.Tensor, gamma: torch.Tensor, bias: torch.Tensor | None, scale: float,
                            silu: bool, chunk: int | None = None, row_values: int = ROW_VALUES,
                            warps: int = WARPS, input_bias: torch.Tensor | None = None) -> torch.Tensor:
    """kernels.channel_rms_norm over contiguous [pixels, channels] rows; the output in the same layout."""
    import triton
    from ..kernels import triton_code
    n_rows, n_channels = rows.shape
    chunk = chunk or channel_chunk(n_channels)
    chunks = triton.cdiv(n_channels, chunk)
    per_program = triton.next_power_of_2(max(1, row_values // (chunk * chunks)))
    out = torch.empty_like(rows)
    triton_code.channel_rms_norm[(triton.cdiv(n_rows, per_program),)](
        rows, gamma if input_bias is None else input_bias, gamma, gamma if bias is None else bias, out, n_rows, scale,
        NORMALIZE_EPS, n_channels=n_channels, CHUNK=chunk, CHUNKS=chunks, ROWS=per_program,
        INPUT_BIAS=input_bias is not None, HAS_BIAS=bias is not None, SILU=silu, num_warps=warps)
    return out


@dataclass
class _FusedLayers:
    """What vae=image-fused takes over in a VAE, found in one walk of its modules."""
    norms: list = field(default_factory=list)        # (norm, the module whose SiLU follows it, or None)
    upsamples: list = field(default_factory=list)    # nearest-neighbour upsampling layers
    relayouts: list = field(default_factory=list)    # resampling layers and attention blocks (NCHW outputs)
    blocks: list = field(default_factory=list)       # residual blocks whose SiLU the norms apply
    pads: list = field(default_factory=list)         # the zero padding before downsampling convolutions


def _released(layer: str) -> tuple:
    """DiffSynth's class of `layer` (ResidualBlock, ...) in both VAEs: QwenImage<layer>, QwenImage21<layer>."""
    from diffsynth.models import qwen_image_21_vae, qwen_image_vae
    return getattr(qwen_image_vae, f"QwenImage{layer}"), getattr(qwen_image_21_vae, f"QwenImage21{layer}")


def _fused_layers(vae) -> _FusedLayers:
    """A residual block's two norms and the encoder's and decoder's last are followed by their module's SiLU (which
    the kernel then applies), an attention block's is not."""
    residual_blocks, ends, attention = _released("ResidualBlock"), _released("Encoder3d") + _released("Decoder3d"), \
        _released("AttentionBlock")
    upsamples, relayouts = _released("Upsample"), _released("Resample") + attention
    found = _FusedLayers()
    for module in vae.modules():
        silu_owner = module if isinstance(getattr(module, "nonlinearity", None), torch.nn.SiLU) else None
        if isinstance(module, residual_blocks):
            found.norms += [(module.norm1, silu_owner), (module.norm2, silu_owner)]
            if silu_owner is not None:
                found.blocks.append(module)
        elif isinstance(module, ends):
            found.norms.append((module.norm_out, silu_owner))
        elif isinstance(module, attention):
            found.norms.append((module.norm, None))
        if isinstance(module, upsamples) and module.mode in ("nearest", "nearest-exact"):
            found.upsamples.append(module)
        elif isinstance(module, relayouts):
            found.relayouts.append(module)
        elif isinstance(module, torch.nn.ZeroPad2d):
            found.pads.append(module)
    return found


def _norm_forward(norm, silu: bool):
    return lambda x: fused_rms_norm(norm, x, silu)


def _residual_block_forward(block, weights: dict):
    """A residual block on one frame with its norms fused: its two 3x3 convolutions run without their bias, which
    the next kernel adds (the second norm; the residual addition), rounded as PyTorch's separate addition rounds;
    anything else as released."""
    def forward(x, feat_cache=None, feat_idx=[0]):
        fits = feat_cache is None and _kernels_run_on(x) and block.conv1 in weights \
            and block.conv2 in weights and block.conv1.bias is not None and block.conv2.bias is not None
        if not fits:
            return type(block).forward(block, x, feat_cache, feat_idx)
        residual = block.conv_shortcut(x)
        y = frame_convolution(block.conv1, weights[block.conv1], block.norm1(x), None)
        y = fused_rms_norm(block.norm2, y, silu=True, input_bias=block.conv1.bias)
        y = frame_convolution(block.conv2, weights[block.conv2], block.dropout(y), None)
        return bias_residual(y, block.conv2.bias, residual)
    return forward


def _channels_last_pad(pad):
    """A ZeroPad2d before a downsampling convolution, its output channels-last where its input is: PyTorch's pad
    writes NCHW, a strided copy of the whole image, and the convolution's output then needs another."""
    def forward(x):
        if not _kernels_run_on(x) or x.dim() != 4 or not x.is_contiguous(memory_format=torch.channels_last):
            return type(pad).forward(pad, x)
        left, right, top, bottom = pad.padding
        batch, channels, height, width = x.shape
        out = torch.empty((batch, channels, height + top + bottom, width + left + right), dtype=x.dtype,
                          device=x.device, memory_format=torch.channels_last).zero_()
        out[:, :, top:top + height, left:left + width] = x
        return out
    return forward


def _same_dtype_upsample(upsample):
    return lambda x: torch.nn.Upsample.forward(upsample, x)


def _channels_last_output(module):
    """`module`'s forward, its output of one frame handed on channels-last: a resampling layer's and the attention
    block's come out in NCHW, and the residual addition after them would mix layouts (a strided kernel)."""
    def forward(*args, **kwargs):
        out = type(module).forward(module, *args, **kwargs)
        if out.dim() != 5 or out.shape[2] != 1:
            return out
        return out[:, :, 0].contiguous(memory_format=torch.channels_last).unsqueeze(2)
    return forward


@contextlib.contextmanager
def fused_norms(vae):
    """`vae`'s RMS norms in one kernel each (taking over the SiLU after them), its residual blocks' biases added by
    those kernels, its nearest-neighbour upsampling in the VAE's dtype, and the outputs of its padding, resampling
    layers and attention blocks channels-last, for the length of the context; yields how many norms."""
    layers = tensors.kept_while_placed(vae, "fused layers", _fused_layers)
    weights = _single_frame_weights(vae)
    activations = {owner: owner.nonlinearity for _, owner in layers.norms if owner is not None}
    for norm, owner in layers.norms:
        norm.forward = _norm_forward(norm, silu=owner is not None)
    for owner in activations:
        owner.nonlinearity = torch.nn.Identity()   # the norms apply it
    for upsample in layers.upsamples:
        upsample.forward = _same_dtype_upsample(upsample)
    for module in layers.relayouts:
        module.forward = _channels_last_output(module)
    for block in layers.blocks:
        block.forward = _residual_block_forward(block, weights)
    for pad in layers.pads:
        pad.forward = _channels_last_pad(pad)
    try:
        yield len(layers.norms)
    finally:
        for norm, _ in layers.norms:
            del norm.forward
        for owner, activation in activations.items():
            owner.nonlinearity = activation
        for module in [*layers.upsamples, *layers.relayouts, *layers.blocks, *layers.pads]:
            del module.forward
