"""How long fusing a rank-32 LoRA into the 840 linears of the full-size Qwen-Image DiT takes on the GPU, through
LoraLayer.add_to (the switch path's arithmetic: base copied to float32, addmm_ from pinned factors, written back in
bf16), against the same operations written out inline (the switch path before LoRA formats were added). Only
ghostedit.optimize.lora is imported (no DiffSynth): runs with the GPU machine's own torch.

    python3 scripts/gpu/lora_fuse_probe.py
"""
import time

import torch

from ghostedit.optimize.lora import LoraLayer

DIM, BLOCKS, RANK = 3072, 60, 32
# (out, in) of the 14 linears a Qwen-Image LoRA trains in each block
SHAPES = [(DIM, DIM)] * 10 + [(4 * DIM, DIM), (DIM, 4 * DIM)] * 2


def layers(device):
    """One base weight and one prepared-weight tensor per shape (reused: the traffic per layer is the same), and a
    pinned LoRA layer per linear."""
    generator = torch.Generator().manual_seed(0)
    bases = {shape: torch.randn(shape, device=device, dtype=torch.bfloat16) for shape in set(SHAPES)}
    targets = {shape: torch.empty(shape, device=device, dtype=torch.bfloat16) for shape in set(SHAPES)}
    loras = [LoraLayer("low-rank", torch.randn(RANK, fan_in, generator=generator).bfloat16(),
                       torch.randn(fan_out, RANK, generator=generator).bfloat16(), 0.5)
             for _ in range(BLOCKS) for fan_out, fan_in in SHAPES]
    if device.startswith("cuda"):
        loras = [layer.pinned() for layer in loras]
    return bases, targets, loras


def through_add_to(bases, targets, loras, device):
    for layer in loras:
        shape = (layer.up.shape[0], layer.down.shape[1])
        weight = bases[shape].to(device, non_blocking=True, copy=True).float()
        layer.add_to(weight, 0.8, device)
        targets[shape].copy_(weight)


def inline(bases, targets, loras, device):
    for layer in loras:
        shape = (layer.up.shape[0], layer.down.shape[1])
        weight = bases[shape].to(device, non_blocking=True, copy=True).float()
        up, down = (factor.to(device, non_blocking=True).float() for factor in (layer.up, layer.down))
        weight.addmm_(up, down, alpha=0.8 * layer.factor)
        targets[shape].copy_(weight)


def timed(function, *args) -> float:
    torch.cuda.synchronize()
    start = time.perf_counter()
    function(*args)
    torch.cuda.synchronize()
    return time.perf_counter() - start


if __name__ == "__main__":
    device = "cuda"
    bases, targets, loras = layers(device)
    print(torch.cuda.get_device_name(), f"{len(loras)} layers, rank {RANK}")
    for function in (inline, through_add_to):
        function(bases, targets, loras, device)  # warm-up
    for _ in range(3):
        print(" ".join(f"{function.__name__}: {timed(function, bases, targets, loras, device):.3f} s"
                       for function in (inline, through_add_to)), flush=True)
