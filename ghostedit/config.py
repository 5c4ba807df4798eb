"""What a run asks for: the optimization configuration (the prepared-pipeline cache key) and the edit request."""
from __future__ import annotations

import functools
import hashlib
import math
import numbers
import os
import re
from dataclasses import dataclass, replace
from pathlib import Path

from PIL import Image

from .errors import InputImageError, InvalidRequestError
from .images import load_image

LORA_MODES = ("fused", "runtime")
FP8_MODES = ("off", "storage", "torchao", "te", "te-delayed")
# "diffsynth" leaves DiffSynth's own choice in place (FA3 if installed, else PyTorch SDPA's dispatch): the stock baseline.
ATTENTION_BACKENDS = ("diffsynth", "auto", "sdpa-cudnn", "sdpa-flash", "sdpa-efficient", "sdpa-math", "fa4", "fa3", "fa2", "sage", "cudnn-fp8")
COMPILE_MODES = ("off", "regional", "max-autotune")
# Lossless rewrites of the DiT (see optimize/rewrites.py); the Inductor ones are settings of compile
INDUCTOR_REWRITES = ("inductor-cdt", "inductor-multi-kernel")
REWRITES = ("real-rope", "joint-layout", "fused-qkv") + INDUCTOR_REWRITES

MAX_INPUT_IMAGES = 3
STEPS_RANGE = (1, 100)
CFG_RANGE = (1.0, 20.0)
SIZE_RANGE = (64, 2048)
SEED_RANGE = (0, 2**32 - 1)
MAX_PROMPT_CHARS = 2000  # ~500 tokens; the edit pipeline encodes the whole prompt, it never truncates
# Qwen's chat-template tokens ("<|im_end|>", "<|image_pad|>"...): in a prompt they would break the template
CONTROL_TOKEN = re.compile(r"<\|[^|<>\s]{1,40}\|>")


def check_choice(name: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise InvalidRequestError(f"{name} must be one of {', '.join(choices)}; got {value!r}")


def file_sha256(path: Path) -> str:
    """The file's SHA-256; read again only when the file changed (the panel asks at every toggle change, and real
    LoRAs weigh gigabytes)."""
    stat = Path(path).stat()
    return _sha256_of(str(Path(path).resolve()), stat.st_size, stat.st_mtime_ns)


@functools.lru_cache(maxsize=256)
def _sha256_of(path: str, size: int, mtime_ns: int) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


@dataclass(frozen=True)
class LoraChoice:
    """A LoRA file, identified by content so a replaced file with the same name is a different configuration."""
    path: str
    sha256: str
    scale: float = 1.0
    mode: str = "fused"

    def __post_init__(self):
        check_choice("LoRA mode", self.mode, LORA_MODES)
        object.__setattr__(self, "scale", _finite_number("LoRA scale", self.scale))

    @classmethod
    def from_file(cls, path: str | Path, scale: float = 1.0, mode: str = "fused") -> "LoraChoice":
        path = Path(path).resolve()
        return cls(path=str(path), sha256=file_sha256(path), scale=scale, mode=mode)

    @property
    def name(self) -> str:
        return Path(self.path).stem


@dataclass(frozen=True)
class OptimizationConfig:
    lora: LoraChoice | None = None
    fp8: str = "off"
    attention: str = "diffsynth"
    compile: str = "off"
    rewrites: tuple[str, ...] = ()

    def __post_init__(self):
        check_choice("FP8 mode", self.fp8, FP8_MODES)
        check_choice("attention backend", self.attention, ATTENTION_BACKENDS)
        check_choice("compile mode", self.compile, COMPILE_MODES)
        for rewrite in self.rewrites:
            check_choice("rewrite", rewrite, REWRITES)
        rewrites = set(self.rewrites)
        if self.attention == "cudnn-fp8" or "fused-qkv" in rewrites:
            rewrites.add("joint-layout")  # both run through GhostEdit's JointAttention (see optimize/rewrites.py)
        object.__setattr__(self, "rewrites", tuple(sorted(rewrites)))  # one key per set of rewrites
        if "fused-qkv" in self.rewrites and self.lora is not None and self.lora.mode == "runtime":
            raise InvalidRequestError("fused-qkv needs a fused LoRA: runtime LoRA layers sit on the separate q/k/v "
                                      "projections")
        for rewrite in set(self.rewrites) & set(INDUCTOR_REWRITES):
            if self.compile == "off":
                raise InvalidRequestError(f"{rewrite} sets how compiled kernels are made: it needs compile on")

    @property
    def cache_key(self) -> "OptimizationConfig":
        """A runtime LoRA's scale is applied per run, so it is not part of what gets prepared."""
        if self.lora is not None and self.lora.mode == "runtime":
            return replace(self, lora=replace(self.lora, scale=0.0))
        return self

    @classmethod
    def parse(cls, text: str) -> "OptimizationConfig":
        """From the command line: "baseline", or comma-separated toggles such as
        "fp8=torchao,compile=regional,attention=auto,rewrites=real-rope+fused-qkv,lora=loras/ghost.safetensors:0.8:runtime"."""
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
            elif name == "rewrites":
                fields[name] = tuple(value.split("+"))
            else:
                raise ValueError(f"unknown toggle {name!r} in {text!r}: use fp8=, attention=, compile=, rewrites=, lora=")
        return cls(**fields)

    @property
    def label(self) -> str:
        parts = ["bf16" if self.fp8 == "off" else f"fp8-{self.fp8}"]
        if self.attention != "diffsynth":
            parts.append(self.attention)
        if self.compile != "off":
            parts.append(f"compile-{self.compile}")
        parts.extend(self.rewrites)
        if self.lora is not None:
            parts.append(f"lora-{self.lora.name}-{self.lora.mode}@{self.lora.scale:g}")
        return " + ".join(parts)


@dataclass(frozen=True)
class EditRequest:
    """The run parameters: everything that does not change what gets prepared.

    Built from untrusted values (the app's API is public), so every field is checked here. Anything out of range
    is refused with InvalidRequestError, never clamped: a clamped value would quietly run something other than
    what was asked, and the app's controls cannot send such values, so only API callers see the message.
    `images` may be PIL images, paths, bytes or binary file objects: each is loaded and checked by
    images.load_image (InputImageError) and kept as an RGB PIL image."""
    images: tuple[Image.Image, ...]
    prompt: str
    negative_prompt: str = ""
    steps: int = 4
    cfg_scale: float = 4.0
    seed: int = 0
    width: int | None = None
    height: int | None = None

    def __post_init__(self):
        self._set("prompt", _checked_prompt("prompt", self.prompt))
        if not self.prompt.strip():
            raise InvalidRequestError("the prompt is empty: say what the edit should do")
        self._set("negative_prompt", _checked_prompt("negative prompt", self.negative_prompt))
        self._set("steps", _whole_number("steps", self.steps, STEPS_RANGE))
        self._set("cfg_scale", _real_number("CFG scale", self.cfg_scale, CFG_RANGE))
        self._set("seed", _whole_number("seed", self.seed, SEED_RANGE))
        if (self.width is None) != (self.height is None):
            raise InvalidRequestError("give both width and height, or neither (the size then follows the first image)")
        for name in ("width", "height"):
            if getattr(self, name) is not None:
                self._set(name, _side(name, getattr(self, name)))
        self._set("images", _checked_images(self.images))  # last: the slowest check

    def _set(self, name: str, value) -> None:
        object.__setattr__(self, name, value)


def _checked_prompt(name: str, value) -> str:
    if not isinstance(value, str):
        raise InvalidRequestError(f"the {name} must be text; got {type(value).__name__}")
    if len(value) > MAX_PROMPT_CHARS:
        raise InvalidRequestError(f"the {name} is {len(value):,} characters long; the limit is "
                                  f"{MAX_PROMPT_CHARS:,}: shorten it")
    if token := CONTROL_TOKEN.search(value):
        raise InvalidRequestError(f"the {name} contains {token[0]!r}, a control token of the model's prompt "
                                  "template: remove it")
    return value


def _whole_number(name: str, value, bounds) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not (
            isinstance(value, numbers.Integral) or (math.isfinite(value) and float(value).is_integer())):
        raise InvalidRequestError(f"{name} must be a whole number; got {value!r}")
    return _check_range(name, int(value), bounds)


def _real_number(name: str, value, bounds) -> float:
    return _check_range(name, _finite_number(name, value), bounds)


def _finite_number(name: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
        raise InvalidRequestError(f"{name} must be a number; got {value!r}")
    return float(value)


def _side(name: str, value) -> int:
    value = _whole_number(name, value, SIZE_RANGE)
    if value % 16:
        raise InvalidRequestError(f"{name} must be a multiple of 16; got {value}")
    return value


def _check_range(name: str, value, bounds):
    low, high = bounds
    if not low <= value <= high:
        raise InvalidRequestError(f"{name} must be between {low} and {high}; got {value}")
    return value


def _checked_images(images) -> tuple[Image.Image, ...]:
    if isinstance(images, (Image.Image, str, bytes, os.PathLike)):
        images = [images]
    images = list(images)
    if not 1 <= len(images) <= MAX_INPUT_IMAGES:
        raise InvalidRequestError(f"an edit takes 1 to {MAX_INPUT_IMAGES} input images; got {len(images)}")
    return tuple(_loaded(image, index, len(images)) for index, image in enumerate(images, 1))


def _loaded(image, index: int, count: int) -> Image.Image:
    try:
        return load_image(image)
    except InputImageError as error:
        if count == 1:
            raise
        raise InputImageError(f"input image {index}: {error}") from error
