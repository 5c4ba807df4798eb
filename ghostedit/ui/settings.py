"""From the page's controls to engine objects: toggle choices (those this machine cannot run are marked, their reason
shown on hover), the one-line summaries of the settings sections, the LoRA folder, the configuration and edit request
of a run, and the configurations of "Run variants"."""
from __future__ import annotations

import base64
import binascii
import threading
from dataclasses import replace
from pathlib import Path
from typing import Callable

from ..config import (MAX_INPUT_IMAGES, SEED_RANGE, EditRequest, LoraChoice, OptimizationConfig, file_sha256,
                      resolved_settings)
from ..device import Availability
from ..optimize import registry
from ..errors import InvalidRequestError
from ..loras import list_loras, resolve_lora, save_uploaded_lora

NO_LORA = "none"
BUILTIN_PREFIX = "built-in/"
LORA_SLOTS = 3  # LoRAs the page stacks (the API takes the same: lora, lora_2, lora_3)
MAX_IMAGES_PER_RUN = 8
FROM_INPUT = "from the input"
ASPECT_PRESETS = (FROM_INPUT, "1:1", "4:3", "3:4", "3:2", "2:3", "16:9", "9:16")


UNAVAILABLE = "not on this machine"  # marks a choice that cannot run here; its reason shows on hover


def image_parameters() -> list[str]:
    """The API parameters of the input images: image, image_2, ... up to the most any model takes."""
    return ["image"] + [f"image_{number}" for number in range(2, MAX_INPUT_IMAGES + 1)]


def lora_parameter(slot: int, part: str = "") -> str:
    """The API parameter of a LoRA slot: lora, lora_mode, lora_scale; lora_2, lora_2_mode, lora_2_scale..."""
    return ("lora" if slot == 1 else f"lora_{slot}") + (f"_{part}" if part else "")


def setting_parameter(setting: str) -> str:
    """The API parameter of a toggle setting (its name, a valid Python name)."""
    return setting.replace("-", "_")


def lora_parameters() -> list[str]:
    return [lora_parameter(slot, part) for slot in range(1, LORA_SLOTS + 1) for part in ("", "mode", "scale")]


def toggle_parameters() -> list[str]:
    """The API parameters of the toggles: the LoRA slots, then one per setting of the registry."""
    return lora_parameters() + [setting_parameter(setting) for setting in registry.settings()]


def variants() -> dict[str, str]:
    """"Run variants": the stock baseline, the baseline plus one setting of the panel (each LoRA mode, each speed
    setting of the registry), or the whole panel."""
    words = {"baseline": "baseline (stock: every setting at its default, no LoRA)",
             "lora-fused": "+ LoRAs fused", "lora-runtime": "+ LoRAs runtime"}
    words.update({setting: f"+ {_setting_label(setting)}" for setting in _speed_settings()})
    words["all"] = "all: every setting of the panel"
    return words


def _speed_settings() -> list[str]:
    """The settings a "+" variant can add: all but where the weights live (not a speed setting of a run)."""
    return [setting for setting in registry.settings()
            if setting in registry.groups() or registry.get(setting).changes != registry.PLACEMENT]


def _setting_label(setting: str) -> str:
    return "lossless rewrites" if setting in registry.groups() else registry.get(setting).label


DEFAULT_VARIANTS = ["baseline", "all"]


def toggle_choices(setting: str, options: dict[str, Availability]) -> list[tuple[str, str]]:
    """Choices as (label, value); a choice this machine cannot run is marked so in one line (its reason:
    unavailable_reasons, shown on hover, and the System tab)."""
    return [(registry.words(setting, value) if available.ok else f"{registry.words(setting, value)} · {UNAVAILABLE}",
             value) for value, available in options.items()]


def unavailable_reasons(options: dict[str, dict[str, Availability]]) -> dict[str, str]:
    """{the label of a choice this machine cannot run: why}, for every setting: the page shows it on hover."""
    return {label: options[setting][value].reason for setting in options
            for label, value in toggle_choices(setting, options[setting]) if not options[setting][value].ok}


def generation_summary(steps, cfg_scale, seed, width, height, count) -> str:
    """The Generation section's one line: what a run will use."""
    size = f"{width:g}×{height:g}" if width and height else "size from the input"
    images = f"{count:g} images" if count and count > 1 else "1 image"
    return (f"Generation · {_shown(steps)} steps · CFG {_shown(cfg_scale)} · seed {_shown(seed)} · {size} · "
            f"{images}")


def lora_summary(values: dict) -> str:
    """The LoRAs section's one line: each LoRA picked, with its mode and scale."""
    picked = [f"{Path(str(values[lora_parameter(slot)])).stem} ({values.get(lora_parameter(slot, 'mode')) or 'fused'} "
              f"×{_shown(values.get(lora_parameter(slot, 'scale')), 1)})"
              for slot in range(1, LORA_SLOTS + 1) if values.get(lora_parameter(slot)) not in (None, "", NO_LORA)]
    return "LoRAs · " + (", ".join(picked) if picked else "none")


def slots_shown(shown: int, filled, add: bool = False) -> int:
    """How many of a row of optional slots (extra images, extra LoRAs) to show: those shown, one more when added,
    and at least up to the last one that holds a value."""
    last = max((index + 1 for index, value in enumerate(filled) if value not in (None, "", NO_LORA)), default=0)
    return min(len(filled), max(shown + (1 if add else 0), last))


def _shown(value, default="–") -> str:
    if value is None or value == "":
        return str(default)
    return f"{value:g}" if isinstance(value, (int, float)) else str(value)


class LoraLibrary:
    """The LoRA files of a folder (ghostedit.loras checks names and contents), plus built-in LoRAs made for a
    specific model (the tiny model's)."""

    def __init__(self, folder: Path, builtin: dict[str, tuple[str, Callable[[], Path]]] | None = None,
                 hash_after: Callable[[], object] | None = None):
        """`builtin`: {file name: (the model it was made for, a function that returns its path)}. The folder's files
        are hashed in the background, once `hash_after()` returns (the app's start-up warm-up, whose weights load
        from the same disk; None: at once): a LoRA is identified by its content (LoraChoice), and a first use would
        otherwise read it whole on the request's path (a rank-32 LoRA of the full-size DiT is 590 MB)."""
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.builtin = dict(builtin or {})
        self.hashing = threading.Thread(target=self._hash_files, args=(hash_after,), name="ghostedit-lora-hashes",
                                        daemon=True)
        self.hashing.start()

    def _hash_files(self, hash_after: Callable[[], object] | None) -> None:
        if hash_after is not None:
            hash_after()
        for name in list_loras(self.folder):
            try:
                file_sha256(resolve_lora(self.folder, name))
            except (OSError, ValueError):  # gone, unreadable or refused since it was listed: its first use says why
                continue

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
        """Stores an uploaded LoRA in the folder under a safe name (after checking its content) and hashes it while
        the upload is still being waited for; returns the name."""
        name = save_uploaded_lora(self.folder, uploaded, original_name)
        file_sha256(resolve_lora(self.folder, name))
        return name


def panel_config(library: LoraLibrary, values: dict) -> OptimizationConfig:
    """The configuration the panel's values ask for ({API parameter: value}, as toggle_parameters() names them).
    The values may come as an API caller sent them: each is checked by the LoRA library or the configuration."""
    loras = []
    for slot in range(1, LORA_SLOTS + 1):
        path = library.path(values.get(lora_parameter(slot)))
        if path is not None:
            loras.append(LoraChoice.from_file(path, _or(values.get(lora_parameter(slot, "scale")), 1.0),
                                              _or(values.get(lora_parameter(slot, "mode")), "fused")))
    settings = {}
    for setting in registry.settings():
        value = values.get(setting_parameter(setting))
        if value is not None:
            settings[setting] = _listed(setting, value) if setting in registry.groups() else value
    return OptimizationConfig(loras=loras, **settings)


def _or(value, default):
    return default if value is None else value


def _listed(name: str, values) -> tuple:
    if values is None:
        return ()
    if not isinstance(values, (list, tuple)):
        raise InvalidRequestError(f"{name} must be a list; got {values!r}")
    return tuple(values)


def uploaded_images(payloads, upload_folder: Path) -> list[str | bytes]:
    """The files behind input images as Gradio's API delivers them, unopened (None: no image): EditRequest reads
    each with images.load_image, which takes hostile files safely and says what is wrong with them. A payload is a
    file in Gradio's upload folder or a base64 data URL (as FileData, or the URL itself: Gradio's MCP bridge hands an
    optional image's over as sent); nothing else on the server is ever read. An empty payload is no image."""
    return [_uploaded_image(payload, upload_folder) for payload in payloads if not _empty(payload)]


def _empty(payload) -> bool:
    return payload in (None, "") or (isinstance(payload, dict) and not payload.get("path") and not payload.get("url"))


def _uploaded_image(payload, upload_folder: Path) -> str | bytes:
    path, url = (payload.get("path"), payload.get("url")) if isinstance(payload, dict) else (None, payload)
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


def edit_request(images, prompt: str, negative_prompt: str, steps, cfg_scale, seed, width, height,
                 keep_alpha: bool = False, **start) -> EditRequest:
    """Width and height 0 mean: the input's aspect ratio at the model's default area; `keep_alpha`: the model reads
    the images' alpha (Qwen-Image-2.1); `start`: the mask and strength (mask_inputs.start_values). EditRequest checks
    every value (API callers can send anything)."""
    return EditRequest(images=[image for image in images if image is not None], prompt=prompt or "",
                       negative_prompt=negative_prompt or "", steps=steps, cfg_scale=cfg_scale, seed=seed,
                       width=width or None, height=height or None, keep_alpha=keep_alpha, **start)


def reused_values(library: LoraLibrary, params: dict, toggles: dict) -> dict:
    """{API parameter: value} that put a earlier run's settings back in the panel (a run's `params` and `toggles`
    as history.RunRecord keeps them). A LoRA no longer in the library is left out, and said so by the caller."""
    values = {name: params[name] for name in ("prompt", "negative_prompt", "steps", "cfg_scale", "seed", "width",
                                              "height")}
    values.update({setting_parameter(setting): value for setting, value in toggles.items() if setting != "loras"})
    by_name = {Path(value).stem: value for _, value in library.choices() if value != NO_LORA}
    found = [lora for lora in toggles["loras"] if lora["name"] in by_name]
    for slot in range(1, LORA_SLOTS + 1):
        lora = found[slot - 1] if slot <= len(found) else None
        values[lora_parameter(slot)] = by_name[lora["name"]] if lora else NO_LORA
        values[lora_parameter(slot, "mode")] = lora["mode"] if lora else "fused"
        values[lora_parameter(slot, "scale")] = lora["scale"] if lora else 1.0
    return values


def preset_size(preset: str, area: int) -> tuple[int, int]:
    """(width, height) of an aspect-ratio preset at the model's default output area, multiples of 16; (0, 0), the
    input's own aspect ratio, for FROM_INPUT."""
    if preset == FROM_INPUT:
        return 0, 0
    if preset not in ASPECT_PRESETS:
        raise InvalidRequestError(f"unknown aspect ratio {preset!r}: choose from {', '.join(ASPECT_PRESETS)}")
    across, down = (int(side) for side in preset.split(":"))
    width = (area * across / down) ** 0.5
    return max(16, round(width / 16) * 16), max(16, round(width * down / across / 16) * 16)


def image_count(value) -> int:
    """How many images one run makes (the API's `count`); None means one."""
    if value is None:
        return 1
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != int(value) \
            or not 1 <= value <= MAX_IMAGES_PER_RUN:
        raise InvalidRequestError(f"count must be a whole number from 1 to {MAX_IMAGES_PER_RUN}; got {value!r}")
    return int(value)


def seeded_requests(edit: EditRequest, count: int) -> list[EditRequest]:
    """`count` requests for the same edit with seeds seed, seed+1, ... (wrapping past the largest seed)."""
    span = SEED_RANGE[1] - SEED_RANGE[0] + 1
    return [edit if index == 0 else replace(edit, seed=SEED_RANGE[0] + (edit.seed - SEED_RANGE[0] + index) % span)
            for index in range(count)]


def variant_configs(names: list[str], panel: OptimizationConfig) -> tuple[list[tuple[str, OptimizationConfig]], list]:
    """The (variant, configuration) pairs to run, in the order of variants(), and notes on variants left out because
    they repeat an earlier one. A "+" variant whose setting is at its default in the panel is an error that says
    what to set: it would otherwise silently repeat the baseline."""
    words = variants()
    names = _listed("variants", names)
    unknown = [name for name in names if not isinstance(name, str) or name not in words]
    if unknown:
        raise InvalidRequestError(f"unknown variants {unknown}: choose from {', '.join(words)}")
    if not names:
        raise InvalidRequestError("choose at least one variant to run")
    runs, notes = [], []
    for name in (name for name in words if name in names):
        config = _variant(name, panel)
        earlier = next((other for other, existing in runs if existing == config), None)
        if earlier is None:
            runs.append((name, config))
        else:
            notes.append(f"“{words[name]}” is the same configuration as “{words[earlier]}”: run once")
    return runs, notes


def _variant(name: str, panel: OptimizationConfig) -> OptimizationConfig:
    stock = OptimizationConfig(memory=panel.value("memory"))  # where the weights live is no variant's difference
    if name == "baseline":
        return stock
    if name == "all":
        return panel
    if name.startswith("lora-"):
        if not panel.loras:
            raise InvalidRequestError(f"“{variants()[name]}” adds the LoRAs picked in the panel, but no LoRA is picked")
        mode = name.removeprefix("lora-")
        return stock.replace(loras=tuple(replace(lora, mode=mode) for lora in panel.loras))
    value = panel.settings()[name]
    if value == stock.settings()[name]:
        raise InvalidRequestError(f"“{variants()[name]}” adds the panel's {name} setting, but the panel has it at the "
                                  "stock setting: choose one first")
    return _with_requirements(stock, panel, {name: value})


def _with_requirements(stock: OptimizationConfig, panel: OptimizationConfig, settings: dict) -> OptimizationConfig:
    """The stock configuration with `settings`, plus the panel's value of every setting those need (compile for an
    Inductor setting, say): a variant adds one setting and what it cannot run without."""
    chosen = dict(settings)
    while True:
        values = resolved_settings({**stock.settings(), **chosen})
        missing = {registry.get(requirement.toggle).group or requirement.toggle
                   for toggle in registry.toggles() for requirement in toggle.choice(values[toggle.name]).requires
                   if not requirement.accepts(values[requirement.toggle])}
        if not missing - set(chosen):
            return stock.replace(**chosen)
        chosen.update({setting: panel.settings()[setting] for setting in missing})
