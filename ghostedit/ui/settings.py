"""From the page's controls to engine objects: toggle choices (those this machine cannot run are labelled with the
reason), the LoRA folder, the configuration and edit request of a run, and the configurations of "Run variants"."""
from __future__ import annotations

import base64
import binascii
from dataclasses import replace
from pathlib import Path
from typing import Callable

from ..config import EditRequest, LoraChoice, OptimizationConfig
from ..device import Availability
from ..errors import InvalidRequestError
from ..loras import list_loras, resolve_lora, save_uploaded_lora

NO_LORA = "none"
BUILTIN_PREFIX = "built-in/"

FP8_WORDS = {
    "off": "off (bf16 weights)",
    "storage": "storage (FP8 weights, bf16 compute)",
    "torchao": "torchao (FP8 compute)",
    "te": "Transformer Engine (FP8 compute, current scaling)",
    "te-delayed": "Transformer Engine (FP8 compute, delayed scaling)",
}
# What each FP8 mode gave on an H100 (full-size DiT, 1024x1024 edit, one forward; docs/benchmarks.md).
FP8_MEASURED = (
    "Measured on an H100, one DiT forward at a 1024² edit (stock bf16: 426 ms): storage 634 ms (half the weight "
    "memory, slower); torchao 560-770 ms eager but 242 ms with compile (1.76x, half the memory), 196 ms (2.18x) with "
    "compile, the lossless rewrites and cuDNN FP8 attention; Transformer Engine 385 ms eager (1.12x; delayed "
    "scaling 373 ms, 1.16x) and 264 ms with compile (1.64x), with no memory saving (TE keeps two FP8 copies of each "
    "weight) and only the image stream in FP8."
)
# What the attention backends gave on an H100 at a 1024² edit (docs/benchmarks.md, section 1b)
ATTENTION_MEASURED = (
    "Measured on an H100 at a 1024² edit, attention alone: cuDNN (DiffSynth's default, through SDPA) 1.38 ms, "
    "FlashAttention-4 1.30 ms, SDPA's FlashAttention-2 2.51 ms; cuDNN FP8 0.95 ms (lossy), which pays only with "
    "compile: 196 ms per DiT forward against 218 ms with exact attention."
)
ATTENTION_WORDS = {
    "diffsynth": "DiffSynth default",
    "auto": "auto (fastest exact backend measured here)",
    "sdpa-cudnn": "PyTorch SDPA: cuDNN",
    "sdpa-flash": "PyTorch SDPA: flash",
    "sdpa-efficient": "PyTorch SDPA: memory-efficient",
    "sdpa-math": "PyTorch SDPA: math",
    "fa4": "FlashAttention-4",
    "fa3": "FlashAttention-3",
    "fa2": "FlashAttention-2",
    "sage": "SageAttention (INT8, lossy)",
    "cudnn-fp8": "cuDNN FP8 attention (lossy)",
}
COMPILE_WORDS = {
    "off": "off (eager)",
    "regional": "regional (each transformer block)",
    "max-autotune": "max-autotune (each block, tuned kernels)",
}
REWRITE_WORDS = {
    "real-rope": "real-valued RoPE (fuses under compile)",
    "joint-layout": "joint attention without transposing copies",
    "fused-qkv": "one fused Q/K/V projection",
    "inductor-cdt": "Inductor kernel tuning (with compile)",
    "inductor-multi-kernel": "Inductor reductions timed two ways (with compile)",
}
TOGGLE_WORDS = {"fp8": FP8_WORDS, "attention": ATTENTION_WORDS, "compile": COMPILE_WORDS, "rewrites": REWRITE_WORDS}

# "Run variants": the stock baseline, the baseline plus one setting of the panel, or the whole panel.
VARIANTS = {
    "baseline": "baseline (stock: bf16, DiffSynth attention, no compile, no LoRA)",
    "lora-fused": "+ LoRA fused",
    "lora-runtime": "+ LoRA runtime",
    "fp8": "+ FP8",
    "attention": "+ attention",
    "compile": "+ compile",
    "rewrites": "+ rewrites",
    "all": "all: every setting of the panel",
}
DEFAULT_VARIANTS = ["baseline", "all"]


def toggle_choices(toggle: str, options: dict[str, Availability]) -> list[tuple[str, str]]:
    """Dropdown choices as (label, value); a choice this machine cannot run says so, with the reason."""
    words = TOGGLE_WORDS.get(toggle, {})
    labels = {value: words.get(value, value) for value in options}
    return [(labels[value] if available.ok else f"{labels[value]} — unavailable: {available.reason}", value)
            for value, available in options.items()]


class LoraLibrary:
    """The LoRA files of a folder (ghostedit.loras checks names and contents), plus built-in LoRAs made for a
    specific model (the tiny model's)."""

    def __init__(self, folder: Path, builtin: dict[str, tuple[str, Callable[[], Path]]] | None = None):
        """`builtin`: {file name: (the model it was made for, a function that returns its path)}."""
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.builtin = dict(builtin or {})

    def choices(self) -> list[tuple[str, str]]:
        return ([("no LoRA", NO_LORA)] + [(name, name) for name in list_loras(self.folder)]
                + [(f"{name} (built-in, made for the {model} model)", BUILTIN_PREFIX + name)
                   for name, (model, _) in self.builtin.items()])

    def path(self, value: str | None) -> Path | None:
        """The file behind a choice: a checked file of the folder or a built-in LoRA; None for no LoRA."""
        if not value or value == NO_LORA:
            return None
        if isinstance(value, str) and value.startswith(BUILTIN_PREFIX) and value.removeprefix(BUILTIN_PREFIX) in self.builtin:
            return self.builtin[value.removeprefix(BUILTIN_PREFIX)][1]()
        return resolve_lora(self.folder, value)

    def add(self, uploaded: str | Path, original_name: str) -> str:
        """Stores an uploaded LoRA in the folder under a safe name (after checking its content); returns the name."""
        return save_uploaded_lora(self.folder, uploaded, original_name)


def panel_config(library: LoraLibrary, lora: str, lora_mode: str, lora_scale: float, fp8: str, attention: str,
                 compile_mode: str, rewrites=()) -> OptimizationConfig:
    """The configuration the panel's values ask for. The values may come as an API caller sent them: each is
    checked by the LoRA library or the configuration."""
    path = library.path(lora)
    choice = None if path is None else LoraChoice.from_file(path, lora_scale, lora_mode)
    return OptimizationConfig(lora=choice, fp8=fp8, attention=attention, compile=compile_mode,
                              rewrites=_listed("rewrites", rewrites))


def _listed(name: str, values) -> tuple:
    if values is None:
        return ()
    if not isinstance(values, (list, tuple)):
        raise InvalidRequestError(f"{name} must be a list; got {values!r}")
    return tuple(values)


def uploaded_images(payloads, upload_folder: Path) -> list[str | bytes]:
    """The files behind input images as Gradio's API delivers them, unopened (None: no image): EditRequest reads
    each with images.load_image, which takes hostile files safely and says what is wrong with them. A payload is a
    file in Gradio's upload folder or a base64 data URL; nothing else on the server is ever read."""
    return [_uploaded_image(payload, upload_folder) for payload in payloads if payload is not None]


def _uploaded_image(payload, upload_folder: Path) -> str | bytes:
    path, url = (payload.get("path"), payload.get("url")) if isinstance(payload, dict) else (None, None)
    if isinstance(path, str):
        try:
            resolved = Path(path).resolve()
        except (OSError, ValueError):  # a NUL byte, a symlink loop
            resolved = None
        # Gradio checks that a path is an upload only when the payload carries FileData's "meta" field
        if resolved is None or not resolved.is_relative_to(upload_folder.resolve()):
            raise InvalidRequestError(f"the image {path!r} was not uploaded: send the image file itself")
        return str(resolved)
    if isinstance(url, str) and url.startswith("data:"):
        try:
            return base64.b64decode(url.partition(",")[2], validate=True)
        except binascii.Error as error:
            raise InvalidRequestError(f"the image's data URL does not hold base64 data ({error})") from None
    raise InvalidRequestError("an input image must be an uploaded file or a data URL")


def edit_request(images, prompt: str, negative_prompt: str, steps, cfg_scale, seed, width, height) -> EditRequest:
    """Width and height 0 mean: the input's aspect ratio at the model's default area. EditRequest checks every value
    (API callers can send anything)."""
    return EditRequest(images=[image for image in images if image is not None], prompt=prompt or "",
                       negative_prompt=negative_prompt or "", steps=steps, cfg_scale=cfg_scale, seed=seed,
                       width=width or None, height=height or None)


def variant_configs(names: list[str], panel: OptimizationConfig) -> tuple[list[tuple[str, OptimizationConfig]], list]:
    """The (variant, configuration) pairs to run, in the order of VARIANTS, and notes on variants left out because
    they repeat an earlier one. A "+" variant whose setting is off in the panel is an error that says what to set:
    it would otherwise silently repeat the baseline."""
    stock = OptimizationConfig()
    names = _listed("variants", names)
    unknown = [name for name in names if not isinstance(name, str) or name not in VARIANTS]
    if unknown:
        raise InvalidRequestError(f"unknown variants {unknown}: choose from {', '.join(VARIANTS)}")
    if not names:
        raise InvalidRequestError("choose at least one variant to run")
    runs, notes = [], []
    for name in (name for name in VARIANTS if name in names):
        config = _variant(name, panel, stock)
        earlier = next((other for other, existing in runs if existing == config), None)
        if earlier is None:
            runs.append((name, config))
        else:
            notes.append(f"“{VARIANTS[name]}” is the same configuration as “{VARIANTS[earlier]}”: run once")
    return runs, notes


def _variant(name: str, panel: OptimizationConfig, stock: OptimizationConfig) -> OptimizationConfig:
    if name == "baseline":
        return stock
    if name == "all":
        return panel
    if name.startswith("lora-"):
        if panel.lora is None:
            raise InvalidRequestError(f"“{VARIANTS[name]}” adds the LoRA picked in the panel, but no LoRA is picked")
        return replace(stock, lora=replace(panel.lora, mode=name.removeprefix("lora-")))
    value = getattr(panel, name)
    if value == getattr(stock, name):  # "off", "diffsynth", or no rewrites
        raise InvalidRequestError(f"“{VARIANTS[name]}” adds the panel's {name} setting, but the panel has it at the stock "
                         "setting: choose one first")
    return replace(stock, **{name: value})
