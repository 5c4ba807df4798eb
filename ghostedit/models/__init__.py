"""Model sources: the embedded tiny model, the full-size synthetic one, and real weights (hub repo or local folder);
what each is and whether it runs here. Loading one is loading.py's."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from ..device import Availability, gpu_capacity_bytes, needs_cuda
from .family import SYNTHETIC, TINY, Family, detect

DEFAULT_REPO = "Qwen/Qwen-Image-Edit-2509"
# Parameters of the released Qwen-Image-Edit components (the DiT's 38.05 GiB in bf16 as measured on the synthetic
# model; Qwen2.5-VL-7B with its vision tower; the VAE): what placement plans with before the weights are loaded
FULL_SIZE_PARAMETERS = {"dit": 20_430_000_000, "text_encoder": 8_290_000_000, "vae": 127_000_000}
HUB_DEFAULT_STEPS = 40  # what a repo id shows before its files are read (2509 and 2511's; the original Edit's 50)
TINY_PARAMETERS = {"dit": 340_480, "text_encoder": 226_272, "vae": 668_043}


@dataclass(frozen=True)
class Sizes:
    """Bytes of each component in the dtypes it runs in."""
    dit: int
    text_encoder: int
    vae: int

    def prepared_dit(self, config) -> int:
        """What a configuration's DiT adds on the GPU when the base is not there: FP8 halves the linear weights
        (Transformer Engine keeps bf16 masters: no saving)."""
        return self.dit // 2 if config.value("fp8") in ("storage", "torchao") else self.dit


@dataclass(frozen=True)
class ModelSpec:
    source: str           # what the user gave: "tiny", "synthetic", a repo id or a folder
    kind: str             # "tiny", "synthetic", "hub" or "local"
    family: Family | None  # None for a repo id until its files are there (detected from them at load)

    @property
    def default_steps(self) -> int:
        return self.family.default_steps if self.family else HUB_DEFAULT_STEPS

    @property
    def default_area(self) -> int:
        return self.family.default_area if self.family else 1024 * 1024

    def nominal_sizes(self, dtypes: dict[str, torch.dtype]):
        """Bytes of each component in its dtype, from the model's parameter counts (before anything is loaded)."""
        parameters = TINY_PARAMETERS if self.kind == "tiny" else FULL_SIZE_PARAMETERS
        return Sizes(*(parameters[name] * dtypes[name].itemsize for name in ("dit", "text_encoder", "vae")))

    @property
    def description(self) -> str:
        return {
            "tiny": "embedded tiny Qwen-Image-Edit (random weights, for CPUs and tests)",
            "synthetic": "full-size Qwen-Image-Edit architecture with random weights (benchmarks)",
            "hub": f"{self.source} from the model hub",
            "local": f"weights in {self.source}",
        }[self.kind]


def default_source(device: str) -> str:
    """The model the app and the CLI use unless told: the tiny one without a GPU, the released one with."""
    return DEFAULT_REPO if device.startswith("cuda") else "tiny"


def resolve(source: str) -> ModelSpec:
    """What `source` names; a folder is recognised from its own configs (family.py) and refused here if GhostEdit
    cannot run it exactly."""
    if source == "tiny":
        return ModelSpec(source, "tiny", TINY)
    if source == "synthetic":
        return ModelSpec(source, "synthetic", SYNTHETIC)
    if Path(source).expanduser().is_dir():
        folder = Path(source).expanduser().resolve()
        return ModelSpec(str(folder), "local", detect(folder))
    return ModelSpec(source, "hub", None)


# the full-size synthetic model: an FP8 DiT (19.5 GiB) and room for activations (a smaller card runs it with
# memory=low, engine/placement.py)
SYNTHETIC_MIN_GPU_GIB = 22


def availability(spec: ModelSpec, device: str) -> Availability:
    if spec.kind != "synthetic":
        return Availability.yes()
    gpu = needs_cuda(device, "the full-size synthetic model")
    if not gpu.ok:
        return gpu
    total = gpu_capacity_bytes(device) / 1024**3
    if total < SYNTHETIC_MIN_GPU_GIB:
        return Availability.no(f"the full-size synthetic model needs a GPU with {SYNTHETIC_MIN_GPU_GIB} GiB; this one "
                               f"has {total:.0f}")
    return Availability.yes()
