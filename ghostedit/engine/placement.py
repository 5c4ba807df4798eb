"""Where each model component lives, decided once from the card's size and the memory mode, with the reason.

gpu       everything on the GPU; a bf16 configuration runs on the base DiT's own weights, an FP8 one beside them.
balanced  the base bf16 DiT in pinned host memory, the text encoder and VAE on the GPU; each configuration's DiT
          is built on the GPU from the base (bf16: a copy; FP8: quantized layer by layer, so the bf16 DiT is
          never whole on the card). Fused LoRAs are fused on the GPU from the pinned base weights.
low       as balanced, and the text encoder stays in pinned host memory, streamed to the GPU layer by layer
          while it encodes (a 24 GB card runs an FP8 DiT this way).
auto      the first of gpu, balanced and low in which the configurations it must run fit (gpu: a bf16 and an FP8
          DiT beside the base; balanced and low: an FP8 DiT), with room for activations.
A configuration that does not fit the chosen placement is refused with what it needs (engine.check).
"""
from __future__ import annotations

from dataclasses import dataclass

from ..device import Availability, gpu_capacity_bytes
from ..models import Sizes
from ..telemetry import GIB

MODES = ("auto", "gpu", "balanced", "low")
GPU, HOST, STREAMED, CPU = "gpu", "host", "streamed", "cpu"
WHERE_WORDS = {GPU: "GPU", HOST: "pinned host memory", STREAMED: "pinned host memory, streamed to the GPU "
               "layer by layer while it runs", CPU: "host memory (no GPU)"}
# Room beside the weights: a 1024x1024 edit's activations with the FP8 DiT peaked at 1.9 GiB in the H100 run of
# stop 10, plus the CUDA context and the libraries' workspaces, which torch's allocator does not count
RESERVE_GIB = 2.5 + 1.5
# auto puts the base DiT on the card only with this much more room: on an 80 GB H100 the base, an FP8 copy and the
# text encoder (73 GiB of weights) ran out of memory at first use
GPU_MODE_MARGIN_GIB = 8.0


@dataclass(frozen=True)
class Placement:
    mode: str                          # the mode asked for
    chosen: str                        # the concrete mode (auto resolved)
    where: dict[str, str]              # component -> GPU, HOST, STREAMED or CPU
    why: str
    capacity_bytes: int

    def describe(self) -> dict[str, dict[str, str]]:
        """{component: {"where": words, "why": words}} for the System tab, `options` and the telemetry."""
        return {component: {"where": WHERE_WORDS[where], "why": self.why} for component, where in self.where.items()}

    @property
    def base_on_gpu(self) -> bool:
        return self.where["dit"] in (GPU, CPU)


def decide(mode: str, device: str, sizes: Sizes) -> Placement:
    if not device.startswith("cuda"):
        return Placement(mode, "cpu", dict.fromkeys(("dit", "text_encoder", "vae"), CPU),
                         "there is no GPU: everything is in host memory", 0)
    return plan(mode, gpu_capacity_bytes(device), sizes)


def plan(mode: str, capacity: int, sizes: Sizes) -> Placement:
    """The placement on a card of `capacity` bytes."""
    chosen = mode if mode != "auto" else _auto(sizes, capacity)
    where = {"gpu": {"dit": GPU, "text_encoder": GPU, "vae": GPU},
             "balanced": {"dit": HOST, "text_encoder": GPU, "vae": GPU},
             "low": {"dit": HOST, "text_encoder": STREAMED, "vae": GPU}}[chosen]
    return Placement(mode, chosen, where, _why(mode, chosen, sizes, capacity), capacity)


def _needs(chosen: str, sizes: Sizes) -> int:
    """GPU bytes the mode needs for the configurations auto must run (the FP8 DiT; with the base on the GPU also a
    bf16 one, which shares the base's weights, and a LoRA fused into it)."""
    activations = int(RESERVE_GIB * GIB)
    fp8_dit = sizes.dit // 2
    if chosen == "gpu":
        return 2 * sizes.dit + sizes.text_encoder + sizes.vae + int(GPU_MODE_MARGIN_GIB * GIB)
    if chosen == "balanced":
        return fp8_dit + sizes.text_encoder + sizes.vae + activations
    return fp8_dit + sizes.vae + activations


def _auto(sizes: Sizes, capacity: int) -> str:
    for chosen in ("gpu", "balanced"):
        if _needs(chosen, sizes) <= capacity:
            return chosen
    return "low"


def _why(mode: str, chosen: str, sizes: Sizes, capacity: int) -> str:
    need = _needs(chosen, sizes) / GIB
    if mode != "auto":
        return f"memory={mode} was asked for ({need:.1f} GiB needed of this card's {capacity / GIB:.1f})"
    return {"gpu": f"the card ({capacity / GIB:.1f} GiB) holds the base DiT, a second DiT and the text encoder "
                   f"({need:.1f} GiB)",
            "balanced": f"the card ({capacity / GIB:.1f} GiB) cannot hold the base DiT beside another "
                        f"({_needs('gpu', sizes) / GIB:.1f} GiB), but holds an FP8 DiT and the text encoder "
                        f"({need:.1f} GiB)",
            "low": f"the card ({capacity / GIB:.1f} GiB) cannot hold an FP8 DiT beside the text encoder "
                   f"({_needs('balanced', sizes) / GIB:.1f} GiB): the text encoder is streamed"}[chosen]


def fits(placement: Placement, sizes: Sizes, config) -> Availability:
    """Whether a configuration fits this placement on the card, and if not what it needs."""
    if placement.chosen == "cpu":
        return Availability.yes()
    on_gpu = sizes.vae + int(RESERVE_GIB * GIB)
    on_gpu += sizes.text_encoder if placement.where["text_encoder"] == GPU else 0
    if placement.base_on_gpu:
        on_gpu += sizes.dit + (sizes.prepared_dit(config) if config.value("fp8") != "off" else 0)
    else:
        on_gpu += sizes.prepared_dit(config)
    if on_gpu <= placement.capacity_bytes:
        return Availability.yes()
    return Availability.no(f"{config.prepared_label} needs about {on_gpu / GIB:.1f} GiB of GPU memory with "
                           f"memory={placement.chosen}; this card has {placement.capacity_bytes / GIB:.1f} GiB: "
                           "choose FP8 weights or memory=low")
