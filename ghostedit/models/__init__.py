"""Model sources: the embedded tiny model, the full-size synthetic one, and real weights (hub repo or local folder)."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from ..device import Availability
from .family import SYNTHETIC, TINY, Family, detect, exact_pipeline

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


def availability(spec: ModelSpec, device: str) -> Availability:
    if spec.kind == "synthetic":
        from .synthetic import availability as synthetic_availability
        return synthetic_availability(device)
    return Availability.yes()


def load_base_pipeline(spec: ModelSpec, device: str, dtypes: dict[str, torch.dtype], base_dit_on_gpu: bool = True,
                       dit_only: bool = False, text_encoder_on_gpu: bool = True, on_download=None):
    """The unmodified pipeline every prepared configuration derives from, each component in its dtype (see
    dtypes.py; the pipeline's own dtype is the DiT's), the DiT in pinned host memory unless `base_dit_on_gpu`.
    `dit_only`: the DiT alone (the DiT-level bench); the synthetic model then builds nothing else. `on_download`: a
    hub repo's download plan and progress (downloads.py)."""
    from ..diffsynth_patches import quiet_loader
    from .dtypes import apply_component_dtypes
    quiet_loader()
    from .exact import ExactPipeline
    torch_dtype = dtypes["dit"]
    if spec.kind == "synthetic" and dit_only:
        from .synthetic import build_synthetic_dit
        pipe = ExactPipeline(device=device, torch_dtype=torch_dtype)
        pipe.use_family(spec.family)
        pipe.dit = build_synthetic_dit(device, torch_dtype, in_host_memory=not base_dit_on_gpu)
        return pipe
    if spec.kind == "tiny":
        from .tiny import load_tiny_pipeline
        pipe = exact_pipeline(load_tiny_pipeline(device, torch_dtype), spec.family)
    elif spec.kind == "synthetic":
        from .synthetic import build_synthetic_pipeline
        pipe = exact_pipeline(build_synthetic_pipeline(device, torch_dtype, dit_in_host_memory=not base_dit_on_gpu,
                                                   text_encoder_in_host_memory=not text_encoder_on_gpu), spec.family)
    else:
        from .hub import load_pretrained_pipeline
        pipe = load_pretrained_pipeline(spec, device, torch_dtype, on_download)
        if not base_dit_on_gpu and device.startswith("cuda"):
            from ..pinned import pin_module
            # DiffSynth's loader puts every weight on the device first
            pin_module(pipe.dit, end_to_end=pipe.dit.joinable_parts())
    apply_component_dtypes(pipe, dtypes)
    from .exact import float32_rotary
    float32_rotary(pipe.text_encoder)
    if dit_only:
        pipe.text_encoder = pipe.vae = None
    return pipe



