"""What a run asks for: the optimization configuration (the prepared-pipeline cache key) and the edit request."""
from __future__ import annotations

import functools
import hashlib
import math
import numbers
import os
import re
from dataclasses import dataclass
from pathlib import Path

from PIL import Image

from .errors import InputImageError, InvalidRequestError
from .downloads import is_lora_reference, lora_file
from .images import load_image
from .masks import check_fits, load_mask
from .optimize import registry
from .optimize.presets import LIGHTNING, PRESETS, PresetError, model_family

LORA_MODES = ("fused", "runtime")
MAX_LORAS = 4
LORA_SPEC = re.compile(r"(?P<path>.+?)(?::(?P<scale>[-+]?\d*\.?\d+(?:[eE][-+]?\d+)?)(?::(?P<mode>fused|runtime))?)?")

MAX_INPUT_IMAGES = 10  # the most any model takes (Qwen-Image-2.1); each family's own limits are checked at run time
STEPS_RANGE = (1, 100)
CFG_RANGE = (1.0, 20.0)
SIZE_RANGE = (64, 2048)
SEED_RANGE = (0, 2**32 - 1)
STRENGTH_RANGE = (0.0, 1.0)
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
    """A LoRA file, identified by content so a replaced file with the same name is a different configuration.
    "fused": merged into the DiT's weights (switched in place on a prepared pipeline); "runtime": PEFT layers whose
    scale is set per run."""
    path: str
    sha256: str
    scale: float = 1.0
    mode: str = "fused"

    def __post_init__(self):
        check_choice("LoRA mode", self.mode, LORA_MODES)
        object.__setattr__(self, "scale", _finite_number("LoRA scale", self.scale))

    @classmethod
    def from_file(cls, path: str | Path, scale: float = 1.0, mode: str = "fused") -> "LoraChoice":
        # absolute, links kept: a Hub download is a link named after the file to a blob named after its hash
        path = Path(os.path.abspath(path))
        return cls(path=str(path), sha256=file_sha256(path), scale=scale, mode=mode)

    @classmethod
    def parse(cls, text: str, scale: float = 1.0, mode: str = "fused", on_download=None) -> "LoraChoice":
        """FILE, FILE:SCALE or FILE:SCALE:MODE; the defaults fill what is left out. FILE may be a LoRA on the Hugging
        Face Hub (owner/name, owner/name:FILE.safetensors or a Hub URL): it is downloaded first, with progress to
        `on_download` (downloads.py)."""
        found = LORA_SPEC.fullmatch(text)
        path = found["path"]
        if is_lora_reference(path):
            path = lora_file(path, on_download)
        return cls.from_file(path, float(found["scale"] or scale), found["mode"] or mode)

    @property
    def name(self) -> str:
        return Path(self.path).stem

    @property
    def identity(self) -> tuple[str, str]:
        return self.path, self.sha256

    @property
    def label(self) -> str:
        return f"lora-{self.name}-{self.mode} ×{self.scale:g}"  # "@0.8" read as a scale of 0 once cut short


@dataclass(frozen=True, init=False)
class OptimizationConfig:
    """What a run asks of the model: the toggles declared in ghostedit/optimize/toggles/ (every registered one, at
    its default unless set) and the LoRAs, stacked in order. Built from untrusted values: each value is checked
    against its toggle's choices, implied settings are added (so that each pipeline has one cache key) and a
    choice whose requirement is not met is refused with the reason.

        OptimizationConfig(fp8="torchao", compile="regional", rewrites=("real-rope",), loras=(LoraChoice...,))
    """
    loras: tuple[LoraChoice, ...]
    values: tuple[tuple[str, str], ...]   # (toggle, value) for every registered toggle, by name

    def __init__(self, loras=(), **settings):
        loras = tuple(loras)
        if len(loras) > MAX_LORAS:
            raise InvalidRequestError(f"at most {MAX_LORAS} LoRAs can be stacked; got {len(loras)}")
        for lora in loras:
            if not isinstance(lora, LoraChoice):
                raise InvalidRequestError(f"a LoRA must be a LoraChoice; got {type(lora).__name__}")
        object.__setattr__(self, "loras", loras)
        object.__setattr__(self, "values", tuple(sorted(resolved_settings(settings).items())))
        for message in _refusals(self):
            raise InvalidRequestError(message)

    def value(self, toggle: str) -> str:
        """The toggle's value (a configuration made before a toggle was registered has it at its default)."""
        return dict(self.values).get(toggle) or registry.get(toggle).default

    def flags(self, group: str) -> tuple[str, ...]:
        """The flags of a group that are on, in preparation order."""
        return tuple(toggle.name for toggle in registry.groups().get(group, []) if self.value(toggle.name) == registry.ON)

    def settings(self) -> dict:
        """{setting: value}, a group's value the tuple of its flags that are on: what the constructor takes."""
        result = {toggle.name: self.value(toggle.name) for toggle in registry.singles()}
        result.update({group: self.flags(group) for group in registry.groups()})
        return result

    def replace(self, loras=None, **settings) -> "OptimizationConfig":
        return OptimizationConfig(loras=self.loras if loras is None else loras, **{**self.settings(), **settings})

    def for_runtime_loras(self) -> "OptimizationConfig":
        """This configuration without the choices that refuse runtime LoRAs (each back at its toggle's default)."""
        refusing = {toggle.name for toggle in registry.toggles()
                    if toggle.choice(self.value(toggle.name)).needs_fused_loras}
        settings = {name: value for name, value in self.settings().items() if name not in refusing}
        for group, flags in settings.items():
            if isinstance(flags, tuple):
                settings[group] = tuple(flag for flag in flags if flag not in refusing)
        return OptimizationConfig(loras=self.loras, **settings)

    @property
    def fused_loras(self) -> tuple[LoraChoice, ...]:
        return tuple(lora for lora in self.loras if lora.mode == "fused")

    @property
    def runtime_loras(self) -> tuple[LoraChoice, ...]:
        return tuple(lora for lora in self.loras if lora.mode == "runtime")

    @property
    def cache_key(self) -> tuple:
        """What the prepared pipeline depends on: the toggles that change it (as much of each value as matters) and
        which runtime LoRAs it carries. Fused LoRAs are written into a prepared pipeline's weights in place, and
        runtime scales are set per run: neither is part of the key."""
        prepared = tuple((toggle.name, toggle.prepared_key(self.value(toggle.name))) for toggle in registry.toggles()
                         if toggle.changes == registry.PREPARED)
        return prepared, tuple(lora.identity for lora in self.runtime_loras)

    @property
    def lossy(self) -> bool:
        return any(toggle.is_lossy(self.value(toggle.name)) for toggle in registry.toggles())

    @classmethod
    def parse(cls, text: str, model: str | None = None, on_download=None) -> "OptimizationConfig":
        """From the command line: "baseline", a named preset ("best", "exact"), or comma-separated settings such
        as "fp8=torchao,compile=regional,attention=auto,rewrites=real-rope+fused-qkv,lora=ghost.safetensors:0.8"
        (lora= may repeat: the LoRAs stack; each is FILE[:SCALE[:MODE]], FILE a local file or a LoRA on the Hub).
        A preset can be extended: "best,lora=ghost.safetensors". A Lightning preset ("lightning-4", "lightning-8")
        adds the Lightning LoRA made for `model` (downloaded on first use, progress to `on_download`) and the
        Lightning schedule; the request's steps and CFG are the preset's (optimize/presets.py LIGHTNING)."""
        settings, loras = {}, []
        for item in filter(None, (part.strip() for part in text.split(","))):
            if item in ("baseline", "stock"):
                continue
            if item in PRESETS:
                settings.update(cls.parse(PRESETS[item]).settings())
                continue
            if item in LIGHTNING:
                loras.append(lightning_lora(LIGHTNING[item], model, on_download))
                settings["scheduler"] = "lightning"
                continue
            name, _, value = item.partition("=")
            if name == "lora":
                loras.append(LoraChoice.parse(value, on_download=on_download))
            elif name in registry.groups():
                settings[name] = tuple(filter(None, value.split("+")))
            elif name in registry.settings():
                settings[name] = value
            else:
                raise InvalidRequestError(f"unknown setting {name!r} in {text!r}: use "
                                          f"{', '.join(f'{s}=' for s in registry.settings())} or lora=")
        return cls(loras=loras, **settings)

    @property
    def text(self) -> str:
        """The parse() form of this configuration, without LoRAs (their files are local)."""
        parts = []
        for setting, value in self.settings().items():
            if isinstance(value, tuple):
                if value:
                    parts.append(f"{setting}={'+'.join(value)}")
            elif value != registry.get(setting).default:
                parts.append(f"{setting}={value}")
        return ",".join(parts) or "baseline"

    @property
    def label(self) -> str:
        """Short words for tables: each toggle away from its default, then the LoRAs."""
        parts = [part for toggle in registry.toggles() if (part := toggle.label_part(self.value(toggle.name)))]
        parts += [lora.label for lora in self.loras]
        return " + ".join(parts) or "stock"

    @property
    def prepared_label(self) -> str:
        """The label of what is prepared: the toggles that change the prepared pipeline (not an exact attention
        backend, chosen per run), runtime LoRAs without a scale (set per run), no fused LoRAs (written into the
        weights per run)."""
        parts = [toggle.label_part(self.value(toggle.name)) for toggle in registry.toggles()
                 if toggle.changes == registry.PREPARED
                 and toggle.prepared_key(self.value(toggle.name)) != toggle.prepared_key(toggle.default)]
        parts += [f"lora-{lora.name}-runtime" for lora in self.runtime_loras]
        return " + ".join(parts) or "stock"


def lightning_lora(preset, model: str | None, on_download=None) -> LoraChoice:
    """The Lightning LoRA of `preset` for the model `model` (a repo id or folder), fused at scale 1."""
    if model is None:
        raise InvalidRequestError(f"{preset.name} picks the Lightning LoRA made for the model: name the model")
    try:
        family = model_family(model)
    except PresetError as error:
        raise InvalidRequestError(f"{preset.name}: {error}") from error
    return LoraChoice.parse(preset.lora_reference(family), on_download=on_download)


def resolved_settings(settings: dict) -> dict[str, str]:
    """Every toggle's value: the given ones checked, defaults for the rest, implied settings added."""
    values = {toggle.name: toggle.default for toggle in registry.toggles()}
    groups = registry.groups()
    for name, value in settings.items():
        if name in groups:
            flags = _listed(name, value)
            members = {toggle.name for toggle in groups[name]}
            for flag in flags:
                check_choice(f"each of {name}", flag, tuple(sorted(members)))
            values.update({member: registry.ON if member in flags else registry.OFF for member in members})
        elif name in values and registry.get(name).group is None:
            check_choice(registry.get(name).label, value, registry.get(name).values)
            values[name] = value
        else:
            raise InvalidRequestError(f"unknown setting {name!r}: the settings are {', '.join(registry.settings())}")
    changed = True
    while changed:  # implied settings may imply more
        changed = False
        for toggle in registry.toggles():
            for other, implied in toggle.choice(values[toggle.name]).implies:
                if values[other] != implied:
                    values[other], changed = implied, True
    return values


def _listed(name: str, value) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str) or not isinstance(value, (list, tuple, set, frozenset)):
        raise InvalidRequestError(f"{name} must be a list; got {value!r}")
    return tuple(value)


def _refusals(config: OptimizationConfig):
    """Why each choice whose requirements are not met cannot run in this configuration."""
    for toggle in registry.toggles():
        choice = toggle.choice(config.value(toggle.name))
        for requirement in choice.requires:
            if not requirement.accepts(config.value(requirement.toggle)):
                yield (f"{toggle.name if toggle.group else f'{toggle.name}={choice.value}'} needs "
                       f"{requirement.toggle} {_wanted(requirement)}: {requirement.why}")
        if choice.needs_fused_loras and config.runtime_loras:
            yield f"{toggle.name} needs fused LoRAs: {choice.needs_fused_loras}"


def _wanted(requirement) -> str:
    if requirement.values:
        return "set to " + " or ".join(requirement.values)
    return "set to anything but " + " or ".join(requirement.not_values)


@dataclass(frozen=True)
class EditRequest:
    """The run parameters: everything that does not change what gets prepared.

    Built from untrusted values (the app's API is public), so every field is checked here. Anything out of range
    is refused with InvalidRequestError, never clamped: a clamped value would quietly run something other than
    what was asked, and the app's controls cannot send such values, so only API callers see the message.
    `images` may be PIL images, paths, bytes or binary file objects: each is loaded and checked by
    images.load_image (InputImageError) and kept as an RGB PIL image (`keep_alpha`: RGBA where it has transparency,
    for a model that reads alpha); so may `mask` (masks.load_mask: white = change, or transparent = change in a file
    with transparency), kept in mode L or RGB. No image: text-to-image, for a model that generates (the engine checks
    the model's own limits).

    The mask, `strength`, `padding_mask_crop` and `paste_back` act on the image being edited, the first one (the
    page's "Image to edit"); with either of the first two the edit starts from that image (models/exact.py Start
    says how), and without a size the output takes that image's aspect ratio. `strength` s (0 to 1] runs the last
    s of the steps from the image noised to that point (1: from noise, as a plain edit). `padding_mask_crop`: edit
    only the box around the mask widened by that many pixels of the output, then lay the result over the image;
    `paste_back`: the image's own pixels outside the mask, exactly."""
    images: tuple[Image.Image, ...]
    prompt: str
    negative_prompt: str = ""
    steps: int = 4
    cfg_scale: float = 4.0
    seed: int = 0
    width: int | None = None
    height: int | None = None
    mask: Image.Image | None = None
    strength: float = 1.0
    padding_mask_crop: int | None = None
    paste_back: bool = False
    keep_alpha: bool = False

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
        self._set("strength", _real_number("strength", self.strength, STRENGTH_RANGE))
        if self.strength == 0:  # any other strength runs at least one step (masks.first_step)
            raise InvalidRequestError("strength 0 would run no step and give the image back: use a strength above "
                                      "0, up to 1")
        if self.padding_mask_crop is not None:
            self._set("padding_mask_crop", _whole_number("padding_mask_crop", self.padding_mask_crop,
                                                         (0, SIZE_RANGE[1])))
        if not isinstance(self.paste_back, bool):
            raise InvalidRequestError(f"paste_back must be true or false; got {self.paste_back!r}")
        if self.mask is None and (self.padding_mask_crop is not None or self.paste_back):
            raise InvalidRequestError("padding_mask_crop and paste_back act on the mask's outside: give a mask")
        self._set("images", _checked_images(self.images, self.keep_alpha))  # last: the slowest checks
        if (self.mask is not None or self.strength < 1) and not self.images:
            raise InvalidRequestError("a mask and a strength below 1 act on an input image: give one")
        if self.mask is not None:
            self._set("mask", _checked_mask(self.mask, self.images[0]))

    def _set(self, name: str, value) -> None:
        object.__setattr__(self, name, value)

    @property
    def starts_from_image(self) -> bool:
        """Whether the edit starts from its first image (a mask or a strength below 1), not from noise alone."""
        return self.mask is not None or self.strength < 1.0

    def start_settings(self) -> dict:
        """How the edit starts from its first image, for its telemetry: {} for a plain edit."""
        if not self.starts_from_image:
            return {}
        return {"mask": None if self.mask is None else list(self.mask.size), "strength": self.strength,
                "padding_mask_crop": self.padding_mask_crop, "paste_back": self.paste_back}


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


def _checked_images(images, keep_alpha: bool) -> tuple[Image.Image, ...]:
    if isinstance(images, (Image.Image, str, bytes, os.PathLike)):
        images = [images]
    images = list(images)
    if len(images) > MAX_INPUT_IMAGES:
        raise InvalidRequestError(f"a run takes at most {MAX_INPUT_IMAGES} input images; got {len(images)}")
    return tuple(_loaded(image, index, len(images), keep_alpha) for index, image in enumerate(images, 1))


def _checked_mask(mask, image: Image.Image) -> Image.Image:
    try:
        mask = load_mask(mask)
    except InputImageError as error:
        raise InputImageError(f"the mask: {error}") from error
    check_fits(mask, image)
    return mask


def _loaded(image, index: int, count: int, keep_alpha: bool) -> Image.Image:
    try:
        return load_image(image, keep_alpha)
    except InputImageError as error:
        if count == 1:
            raise
        raise InputImageError(f"input image {index}: {error}") from error
