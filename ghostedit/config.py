"""What a run asks for: the optimization configuration (the prepared-pipeline cache key) and the edit request."""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, replace
from pathlib import Path

from PIL import Image

LORA_MODES = ("fused", "runtime")
FP8_MODES = ("off", "storage", "torchao", "te")
# "diffsynth" leaves DiffSynth's own choice in place (FA3 if installed, else PyTorch SDPA's dispatch): the stock baseline.
ATTENTION_BACKENDS = ("diffsynth", "auto", "sdpa-cudnn", "sdpa-flash", "sdpa-efficient", "sdpa-math", "fa4", "fa3", "fa2", "sage")
COMPILE_MODES = ("off", "regional", "max-autotune")

MAX_INPUT_IMAGES = 3
STEPS_RANGE = (1, 100)
CFG_RANGE = (1.0, 20.0)
SIZE_RANGE = (64, 2048)
SEED_RANGE = (0, 2**32 - 1)
MAX_PROMPT_CHARS = 2000


def _check_choice(name: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ValueError(f"{name} must be one of {', '.join(choices)}; got {value!r}")


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


@dataclass(frozen=True)
class LoraChoice:
    """A LoRA file, identified by content so a replaced file with the same name is a different configuration."""
    path: str
    sha256: str
    scale: float = 1.0
    mode: str = "fused"

    def __post_init__(self):
        _check_choice("LoRA mode", self.mode, LORA_MODES)

    @classmethod
    def from_file(cls, path: str | Path, scale: float = 1.0, mode: str = "fused") -> "LoraChoice":
        path = Path(path).resolve()
        return cls(path=str(path), sha256=file_sha256(path), scale=float(scale), mode=mode)

    @property
    def name(self) -> str:
        return Path(self.path).stem


@dataclass(frozen=True)
class OptimizationConfig:
    lora: LoraChoice | None = None
    fp8: str = "off"
    attention: str = "diffsynth"
    compile: str = "off"

    def __post_init__(self):
        _check_choice("FP8 mode", self.fp8, FP8_MODES)
        _check_choice("attention backend", self.attention, ATTENTION_BACKENDS)
        _check_choice("compile mode", self.compile, COMPILE_MODES)

    @property
    def cache_key(self) -> "OptimizationConfig":
        """A runtime LoRA's scale is applied per run, so it is not part of what gets prepared."""
        if self.lora is not None and self.lora.mode == "runtime":
            return replace(self, lora=replace(self.lora, scale=0.0))
        return self

    @classmethod
    def parse(cls, text: str) -> "OptimizationConfig":
        """From the command line: "baseline", or comma-separated toggles such as
        "fp8=torchao,compile=regional,attention=auto,lora=loras/ghost.safetensors:0.8:runtime"."""
        fields = {}
        for item in filter(None, (part.strip() for part in text.split(","))):
            if item in ("baseline", "stock"):
                continue
            name, _, value = item.partition("=")
            if name == "lora":
                path, scale, mode = (value.split(":") + ["1.0", "fused"][value.count(":"):])[:3]
                fields["lora"] = LoraChoice.from_file(path, float(scale), mode)
            elif name in ("fp8", "attention", "compile"):
                fields[name] = value
            else:
                raise ValueError(f"unknown toggle {name!r} in {text!r}: use fp8=, attention=, compile=, lora=")
        return cls(**fields)

    @property
    def label(self) -> str:
        parts = [{"off": "bf16", "storage": "fp8-storage", "torchao": "fp8-torchao", "te": "fp8-te"}[self.fp8]]
        if self.attention != "diffsynth":
            parts.append(self.attention)
        if self.compile != "off":
            parts.append(f"compile-{self.compile}")
        if self.lora is not None:
            parts.append(f"lora-{self.lora.name}-{self.lora.mode}@{self.lora.scale:g}")
        return " + ".join(parts)


@dataclass(frozen=True)
class EditRequest:
    """The run parameters: everything that does not change what gets prepared."""
    images: tuple[Image.Image, ...]
    prompt: str
    negative_prompt: str = ""
    steps: int = 4
    cfg_scale: float = 4.0
    seed: int = 0
    width: int | None = None
    height: int | None = None

    def __post_init__(self):
        object.__setattr__(self, "images", tuple(self.images))
        if not 1 <= len(self.images) <= MAX_INPUT_IMAGES:
            raise ValueError(f"an edit takes 1 to {MAX_INPUT_IMAGES} input images; got {len(self.images)}")
        _check_range("steps", self.steps, STEPS_RANGE)
        _check_range("CFG scale", self.cfg_scale, CFG_RANGE)
        _check_range("seed", self.seed, SEED_RANGE)
        for name in ("width", "height"):
            value = getattr(self, name)
            if value is not None:
                _check_range(name, value, SIZE_RANGE)
                if value % 16:
                    raise ValueError(f"{name} must be a multiple of 16; got {value}")
        for name in ("prompt", "negative_prompt"):
            if len(getattr(self, name)) > MAX_PROMPT_CHARS:
                raise ValueError(f"{name.replace('_', ' ')} is longer than {MAX_PROMPT_CHARS} characters")
        if not self.prompt.strip():
            raise ValueError("the prompt is empty: say what the edit should do")


def _check_range(name: str, value, bounds) -> None:
    low, high = bounds
    if not low <= value <= high:
        raise ValueError(f"{name} must be between {low} and {high}; got {value}")
