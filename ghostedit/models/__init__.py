"""Model sources: the embedded tiny model, the full-size synthetic one, and real weights (hub repo or local folder)."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from ..device import Availability

DEFAULT_REPO = "Qwen/Qwen-Image-Edit-2509"


@dataclass(frozen=True)
class ModelSpec:
    source: str           # what the user gave: "tiny", "synthetic", a repo id or a folder
    kind: str             # "tiny", "synthetic", "hub" or "local"
    default_area: int     # output pixels when the request gives no size
    default_steps: int

    @property
    def description(self) -> str:
        return {
            "tiny": "embedded tiny Qwen-Image-Edit (random weights, for CPUs and tests)",
            "synthetic": "full-size Qwen-Image-Edit architecture with random weights (benchmarks)",
            "hub": f"{self.source} from the model hub",
            "local": f"weights in {self.source}",
        }[self.kind]


def resolve(source: str) -> ModelSpec:
    if source == "tiny":
        return ModelSpec(source, "tiny", 256 * 256, 4)
    if source == "synthetic":
        return ModelSpec(source, "synthetic", 1024 * 1024, 40)
    if Path(source).expanduser().is_dir():
        return ModelSpec(str(Path(source).expanduser().resolve()), "local", 1024 * 1024, 40)
    return ModelSpec(source, "hub", 1024 * 1024, 40)


def availability(spec: ModelSpec, device: str) -> Availability:
    if spec.kind == "synthetic":
        from .synthetic import availability as synthetic_availability
        return synthetic_availability(device)
    return Availability.yes()


def load_base_pipeline(spec: ModelSpec, device: str, dtypes: dict[str, torch.dtype]):
    """The unmodified pipeline every prepared configuration derives from, each component in its dtype (see
    dtypes.py); the pipeline's own dtype is the DiT's."""
    from .dtypes import apply_component_dtypes
    torch_dtype = dtypes["dit"]
    if spec.kind == "tiny":
        from .tiny import load_tiny_pipeline
        pipe = load_tiny_pipeline(device, torch_dtype)
    elif spec.kind == "synthetic":
        from .synthetic import build_synthetic_pipeline
        pipe = build_synthetic_pipeline(device, torch_dtype)
    else:
        from .hub import load_pretrained_pipeline
        pipe = load_pretrained_pipeline(spec, device, torch_dtype)
    apply_component_dtypes(pipe, dtypes)
    return pipe


def load_base_dit(spec: ModelSpec, device: str, dtypes: dict[str, torch.dtype]):
    """The unmodified DiT alone, for DiT-level benchmarks: the synthetic one is built without the rest."""
    if spec.kind == "synthetic":
        from .synthetic import build_synthetic_dit
        return build_synthetic_dit(device, dtypes["dit"])
    return load_base_pipeline(spec, device, dtypes).dit
