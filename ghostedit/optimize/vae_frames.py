"""The VAE on one frame as an image network (`vae=image`): its causal 3-D convolutions as 2-D ones, channels-last.

Qwen-Image's VAE is a video VAE. On an image (one frame, no cached frames) each causal 3-D convolution pads the
frame with kernel_t - 1 frames of zeros in front and convolves all of them: with 3x3x3 kernels, two thirds of the
work multiply zeros. The padded frames contribute nothing, so the output is the 2-D convolution of the frame with the
kernel's last temporal slice: the same function, up to floating-point rounding (cuDNN sums in another order). Run
channels-last, cuDNN's NHWC kernels also skip the layout conversions it makes around every NCHW convolution (an H100
profile of an edit: docs/benchmarks/profile-edit). A convolution that sees cached frames or more than one frame (a
video) runs as released.
"""
from __future__ import annotations

import contextlib

import torch


def _single_frame_weights(vae) -> dict:
    """{causal conv: its weight's last temporal slice, channels-last} for every causal 3-D convolution of `vae`
    that zero-pads a lone frame (stride 1 in time, padding kernel_t - 1 frames in front)."""
    from diffsynth.models.qwen_image_vae import QwenImageCausalConv3d
    weights = {}
    for module in vae.modules():
        if isinstance(module, QwenImageCausalConv3d) and module.stride[0] == 1 \
                and module._padding[4] == module.kernel_size[0] - 1:
            weights[module] = module.weight[:, :, -1].contiguous(memory_format=torch.channels_last)
    return weights


def _image_forward(conv, weight):
    def forward(x, cache_x=None):
        if cache_x is not None or x.shape[2] != 1:
            return type(conv).forward(conv, x, cache_x)
        frame = x[:, :, 0].contiguous(memory_format=torch.channels_last)
        padding = (conv._padding[2], conv._padding[0])   # (height, width): F.pad's order is (w, w, h, h, t, t)
        output = torch.nn.functional.conv2d(frame, weight, conv.bias, conv.stride[1:], padding, conv.dilation[1:])
        return output.unsqueeze(2)
    return forward


@contextlib.contextmanager
def image_convolutions(vae):
    """`vae`'s causal convolutions run as 2-D ones on a lone frame, for the length of the context. The slices are
    taken at entry (a few MB per layer on the device), so a VAE moved or reloaded between runs is read afresh."""
    weights = _single_frame_weights(vae)
    if not weights:
        raise ValueError(f"{type(vae).__name__} has no causal 3-D convolution to run as a 2-D one: vae=image serves "
                         "DiffSynth's Qwen-Image VAE")
    for conv, weight in weights.items():
        conv.forward = _image_forward(conv, weight)
    try:
        yield len(weights)
    finally:
        for conv in weights:
            del conv.forward
