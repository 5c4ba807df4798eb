"""A Hugging Face Space on ZeroGPU: what happens at start-up, outside every GPU window.

ZeroGPU lends a GPU to each call of a `@spaces.GPU` function (gpu.py says for how long) and runs it in a fresh
process forked from the app's, so what a call builds is gone after it. Hence, at start-up:
- the base weights are downloaded and loaded in the app's process (ZeroGPU moves them onto the lent GPU at each call),
  so no GPU window is spent on a download or a load;
- the stock configuration's pipeline is prepared, and its DiT blocks are compiled ahead of time with the `spaces`
  package's AoTInductor helpers in one GPU call: one block's inputs are captured during a small edit
  (`spaces.aoti_capture`), the block is exported with its sequence lengths dynamic (`torch.export`) and compiled
  (`spaces.aoti_compile`), and the compiled block is applied to every block with that block's own weights
  (`spaces.aoti_apply`), as the fast Qwen-Image-Edit Spaces do. Every later call starts from these compiled blocks.
  A just-in-time compile (the compile toggle) would be redone in every call, so on ZeroGPU that toggle says so and
  is refused (optimize/compile.py).
Anywhere else (no `spaces` package, or SPACES_ZERO_GPU unset) start-up changes nothing.
"""
from __future__ import annotations

import os

import torch
from PIL import Image
from torch.utils._pytree import tree_map

from ..config import EditRequest, OptimizationConfig
from ..optimize.compile import token_dims

AOT_COMPILE_SECONDS = 1500   # one GPU window for the capture, the export and AoTInductor's compile of one block
AOT_CONFIG = OptimizationConfig()  # the stock configuration: the one whose prepared DiT the blocks belong to
# A small edit that reaches the first block: its shapes only seed the export (sequence lengths are dynamic)
AOT_EXAMPLE = dict(prompt="make it night", steps=2, cfg_scale=1.0, width=256, height=256)
INDUCTOR_CONFIGS = {"conv_1x1_as_mm": True, "epilogue_fusion": False, "coordinate_descent_tuning": True,
                    "coordinate_descent_check_all_directions": True, "max_autotune": True,
                    "triton.cudagraphs": True}
IMAGE_TOKENS = torch.export.Dim("image_tokens")
TEXT_TOKENS = torch.export.Dim("text_tokens")


def zero_gpu() -> bool:
    """On a ZeroGPU Space: the `spaces` package is there and the Space says so (SPACES_ZERO_GPU)."""
    if os.environ.get("SPACES_ZERO_GPU", "").lower() not in ("1", "true"):
        return False
    try:
        import spaces  # noqa: F401
    except ImportError:
        return False
    return True


def prepare_space(engine) -> list[str]:
    """At start-up on ZeroGPU: load the weights and compile the stock DiT's blocks ahead of time; returns what it
    did, in words (printed in the log). Elsewhere: nothing."""
    if not zero_gpu():
        return []
    engine.load(AOT_CONFIG)  # downloads (huggingface_hub) and loads, in this process: no GPU window
    blocks = compile_ahead_of_time(engine)
    return [f"weights of {engine.spec.source} loaded at start-up",
            f"{blocks} DiT blocks of the stock configuration compiled ahead of time (AoTInductor)"]


def compile_ahead_of_time(engine) -> int:
    """Compiles the stock prepared DiT's blocks with AoTInductor in one GPU call and applies the compiled block to
    each of them with its own weights; returns how many blocks."""
    import spaces
    from spaces.zero.torch.aoti import ZeroGPUCompiledModel, ZeroGPUWeights

    prepared, _ = engine.prepare(AOT_CONFIG)
    blocks = list(prepared.dit.transformer_blocks)
    example = EditRequest(images=[Image.new("RGB", (256, 256), (128, 128, 128))], **AOT_EXAMPLE)

    @spaces.GPU(duration=AOT_COMPILE_SECONDS)
    def compile_block():
        with spaces.aoti_capture(blocks[0]) as call:
            engine.run(example, AOT_CONFIG)
        exported = torch.export.export(blocks[0], args=call.args, kwargs=call.kwargs,
                                       dynamic_shapes=block_dynamic_shapes(call.kwargs))
        return spaces.aoti_compile(exported, INDUCTOR_CONFIGS)

    compiled = compile_block()
    for block in blocks:  # one compiled program, each block's own weights
        spaces.aoti_apply(ZeroGPUCompiledModel(compiled.archive_file, ZeroGPUWeights(block.state_dict())), block)
    prepared.report["compile"] = "DiT blocks compiled ahead of time at start-up (ZeroGPU, AoTInductor)"
    return len(blocks)


def block_dynamic_shapes(kwargs: dict) -> dict:
    """The dynamic dimensions of a DiT block call (models/qwen_image/dit.py): the image and text sequence lengths
    (the output size, the input images and the prompt change them; compile.token_dims finds them, as for the
    just-in-time compile); everything else as captured."""
    tokens = {"image": IMAGE_TOKENS, "text": TEXT_TOKENS}
    found = {id(tensor): {dim: tokens[which] for dim, which in dims.items()} or None
             for tensor, dims in token_dims(kwargs)}
    shapes = tree_map(lambda value: found.get(id(value)) if isinstance(value, torch.Tensor) else None, kwargs)
    return {**shapes, "options": []}  # the run's DitOptions: a pytree constant (no leaves) of the exported block
