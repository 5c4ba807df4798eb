"""Model sources: the embedded tiny models, the full-size synthetic ones, and real weights (hub repo or local folder);
what each is and whether it runs here. Qwen-Image-Edit (`tiny`, `synthetic`) and Qwen-Image-2.1 (`tiny-2.1`,
`synthetic-2.1`, and their `-turbo`). Loading one is loading.py's."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from ..device import Availability, gpu_capacity_bytes, needs_cuda
from .family import (QWEN_IMAGE_21_DIT, RELEASED, SYNTHETIC, SYNTHETIC_21, SYNTHETIC_21_TURBO, TINY, TINY_21,
                     TINY_21_TURBO, Family, detect, family_words)

DEFAULT_REPO = "Qwen/Qwen-Image-Edit-2509"
# Parameters of the released Qwen-Image-Edit components (the DiT's 38.05 GiB in bf16 as measured on the synthetic
# model; Qwen2.5-VL-7B with its vision tower; the VAE): what placement plans with before the weights are loaded
FULL_SIZE_PARAMETERS = {"dit": 20_430_000_000, "text_encoder": 8_290_000_000, "vae": 127_000_000}
HUB_DEFAULT_STEPS = 40  # what a repo id shows before its files are read (2509 and 2511's; the original Edit's 50)
TINY_PARAMETERS = {"dit": 340_480, "text_encoder": 226_272, "vae": 668_043}
# Qwen-Image-2.1's components (counted on the meta device from the released configs: the 7.1B DiT, Qwen3-VL-8B, the
# RGBA VAE)
FULL_SIZE_PARAMETERS_21 = {"dit": 7_115_124_736, "text_encoder": 8_767_123_696, "vae": 337_740_404}
TINY_PARAMETERS_21 = {"dit": 164_032, "text_encoder": 260_704, "vae": 134_428}
# The embedded models by name: (kind, family)
EMBEDDED = {"tiny": ("tiny", TINY), "synthetic": ("synthetic", SYNTHETIC), "tiny-2.1": ("tiny", TINY_21),
            "tiny-2.1-turbo": ("tiny", TINY_21_TURBO), "synthetic-2.1": ("synthetic", SYNTHETIC_21),
            "synthetic-2.1-turbo": ("synthetic", SYNTHETIC_21_TURBO)}
EMBEDDED_MODELS = {"tiny": "Qwen-Image-Edit", "synthetic": "Qwen-Image-Edit", "tiny-2.1": "Qwen-Image-2.1",
                   "synthetic-2.1": "Qwen-Image-2.1", "tiny-2.1-turbo": "Qwen-Image-2.1-Turbo",
                   "synthetic-2.1-turbo": "Qwen-Image-2.1-Turbo"}  # what each embedded model is built as


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
        return self.known_family.default_steps if self.known_family else HUB_DEFAULT_STEPS

    @property
    def default_area(self) -> int:
        return self.known_family.default_area if self.known_family else 1024 * 1024

    @property
    def known_family(self) -> Family | None:
        """The family, or for a released repo id not downloaded yet, the one its name is released as (what the
        page and the CLI show before the download; the folder's own configs decide at load)."""
        return self.family or RELEASED.get(self.source.removeprefix("hf:").removeprefix("modelscope:"))

    @property
    def licence(self) -> str | None:
        """The licence of real weights where it is not Apache 2.0 (Qwen-Image-2.1's research licence); the embedded
        models' random weights are GhostEdit's own."""
        family = self.known_family
        return family.licence if family and self.kind in ("hub", "local") else None

    def nominal_sizes(self, dtypes: dict[str, torch.dtype]):
        """Bytes of each component in its dtype, from the model's parameter counts (before anything is loaded)."""
        is_21 = self.known_family is not None and self.known_family.dit == QWEN_IMAGE_21_DIT
        if self.kind == "tiny":
            parameters = TINY_PARAMETERS_21 if is_21 else TINY_PARAMETERS
        else:
            parameters = FULL_SIZE_PARAMETERS_21 if is_21 else FULL_SIZE_PARAMETERS
        return Sizes(*(parameters[name] * dtypes[name].itemsize for name in ("dit", "text_encoder", "vae")))

    @property
    def description(self) -> str:
        model = EMBEDDED_MODELS.get(self.family.name) if self.family else None
        return {
            "tiny": f"embedded tiny {model} (random weights, for CPUs and tests)",
            "synthetic": f"full-size {model} architecture with random weights (benchmarks)",
            "hub": f"{self.source} from the model hub",
            "local": f"weights in {self.source}",
        }[self.kind]


    @property
    def recognised(self) -> str:
        """Which model this is and why, in words; a repo id's is read from its files once they are downloaded."""
        if self.family is None:
            return (f"which model {self.source} is (Qwen-Image-Edit, -2509 or -2511) is read from its files when "
                    "they are downloaded")
        return ("" if self.family.repo is None else "recognised as ") + family_words(self.family)


def default_source(device: str) -> str:
    """The model the app and the CLI use unless told: the tiny one without a GPU, the released one with."""
    return DEFAULT_REPO if device.startswith("cuda") else "tiny"


def resolve(source: str) -> ModelSpec:
    """What `source` names; a folder is recognised from its own configs (family.py) and refused here if GhostEdit
    cannot run it exactly."""
    if source in EMBEDDED:
        return ModelSpec(source, *EMBEDDED[source])
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
