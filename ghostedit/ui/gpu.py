"""Hugging Face ZeroGPU: the functions that use the GPU are decorated with `spaces.GPU` when the `spaces` package is
installed, each call asking for the GPU seconds that an edit of its steps, size, CFG and configuration needs
(gpu_seconds). Outside a ZeroGPU Space that decorator returns the function unchanged, and without the package nothing
is decorated, so the app runs the same everywhere else. Start-up on ZeroGPU (weights, ahead-of-time compile) is in
space.py."""
from __future__ import annotations

import inspect
import math
from typing import Callable

# One DiT forward of a 1024x1024 edit (the output's and the input's tokens), seconds, as measured on an H100 with
# the real model (docs/benchmarks.md): stock bf16, blocks compiled, FP8 weights eager, FP8 and compiled.
DIT_FORWARD_S = {("off", False): 0.43, ("off", True): 0.31, ("fp8", False): 0.73, ("fp8", True): 0.24}
ENCODE_DECODE_S = 6.0   # text and image encoding plus VAE decoding of a 1024x1024 edit
START_S = 10.0          # the weights onto the GPU at the start of a ZeroGPU call, the pipeline's own set-up
FP8_PREPARE_S = 20.0    # quantizing the DiT's linear weights
LORA_FUSE_S = 5.0       # fusing one LoRA into the DiT
MARGIN = 2.5            # ZeroGPU's slice of an H200 (MIG) is slower than a whole H100; an edit cut off is lost
GPU_SECONDS_MAX = 600
MEGAPIXEL = 1024 * 1024


def gpu_seconds(arguments: dict, default_area: int, default_steps: int, runs: int = 1) -> int:
    """GPU seconds for `runs` edits with these endpoint arguments: start, preparation (FP8, fused LoRAs), encoding
    and decoding, and steps x DiT forwards (two per step with CFG > 1) at the edit's size, with a margin."""
    steps = int(arguments.get("steps") or default_steps)
    width, height = int(arguments.get("width") or 0), int(arguments.get("height") or 0)
    scale = (width * height if width and height else default_area) / MEGAPIXEL
    forwards = 2 if float(arguments.get("cfg_scale") or 4.0) > 1 else 1
    fp8 = "off" if (arguments.get("fp8") or "off") == "off" else "fp8"
    compiled = (arguments.get("compile") or "off") != "off"
    loras = sum(1 for name, value in arguments.items()
                if name.startswith("lora") and not name.endswith(("_mode", "_scale")) and value not in (None, "none"))
    prepare = (FP8_PREPARE_S if fp8 == "fp8" else 0.0) + LORA_FUSE_S * loras
    edit = START_S + prepare + ENCODE_DECODE_S * scale + steps * forwards * DIT_FORWARD_S[fp8, compiled] * scale
    return min(GPU_SECONDS_MAX, math.ceil(runs * edit * MARGIN))


def on_gpu(fn: Callable, spec, runs_for: Callable[[dict], int] = lambda arguments: 1) -> Callable:
    """`fn` as a ZeroGPU entry point for the model `spec` (its default size and steps), asking for gpu_seconds of
    the call's arguments, where `runs_for` tells from them how many edits the call makes."""
    try:
        import spaces
    except ImportError:
        return fn
    signature = inspect.signature(fn)

    def duration(*args, **kwargs) -> int:
        # the values arrive as sent (preprocess=False): the handler refuses bad ones with their reason, so a value
        # that cannot be read here asks for the most time rather than failing before the handler runs
        try:
            arguments = signature.bind_partial(*args, **kwargs).arguments
            return gpu_seconds(arguments, spec.default_area, spec.default_steps, runs_for(arguments))
        except (TypeError, ValueError):
            return GPU_SECONDS_MAX

    return spaces.GPU(duration=duration)(fn)
