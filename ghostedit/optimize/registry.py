"""The toggle registry: every speed toggle is declared once, in its own file under ghostedit/optimize/toggles/, and
everything else (the configuration and its cache key, the preparation recipe, the run-time contexts, the CLI flags,
the UI controls, "Run variants", the API options and the bench) reads the declaration from here.

A toggle has choices; a choice says what it needs (another toggle's setting), what it implies, whether it is lossy,
and its words. The toggle says what it changes: the prepared pipeline (and so the cache key: only what its
`prepared_key` keeps of the value), or only how a run goes. It may bring a preparation step (run in `order`, lossless
steps before lossy ones) and work to start before the first step (`begin`), a run-time context, Inductor options for
compiled code, and an availability check that gives the reason when a choice cannot run on this machine. Where it
changes how the DiT's forward computes, it sets a field of the run's options (models/seams.py, DitOptions): a flag
names the field it turns on (`option`), a run-time context sets one in `RunContext.options`.

A flag is a toggle with the choices "off" and "on" that belongs to a group (the lossless rewrites): the command line,
the API and the page show a group as one multi-choice setting, e.g. `rewrites=real-rope+joint-layout`.

A toggle acts on a DiT family's forward (models/family.py names them: the Edit models' DiT, Qwen-Image-2.1's): it
says, for each family, that it applies or why it does not (`families`; a choice may add its own reasons). A toggle
that says nothing was written for the Edit DiT alone. Away from its default, a toggle that does not apply to the
model's family is refused with its reason.
"""
from __future__ import annotations

import contextlib
import functools
import importlib
import pkgutil
from dataclasses import dataclass, field
from typing import Any, Callable, ContextManager

from ..device import Availability
from ..models.family import QWEN_IMAGE_21_DIT
from . import toggles as toggle_files

PREPARED = "prepared"   # the toggle changes the prepared pipeline: part of the cache key
RUN = "run"             # the toggle changes only how a run goes: switching it prepares nothing
PLACEMENT = "placement"  # the toggle changes where the model's weights live (the model store applies it)
OFF, ON = "off", "on"
# Why a toggle that says nothing about Qwen-Image-2.1 does not apply to it
NOT_PORTED = {QWEN_IMAGE_21_DIT: "written for the Qwen-Image-Edit DiT's forward (models/qwen_image/dit.py); "
                                 "Qwen-Image-2.1's single-stream DiT (models/qwen_image_21/dit.py) "
                                 "has no such path yet"}


@dataclass(frozen=True)
class Requires:
    """A choice needs another toggle set to one of `values` (or, with `not_values`, to anything else)."""
    toggle: str
    not_values: tuple[str, ...] = ()
    values: tuple[str, ...] = ()
    why: str = ""

    def accepts(self, value: str) -> bool:
        return value in self.values if self.values else value not in self.not_values


@dataclass(frozen=True)
class Choice:
    value: str
    label: str
    help: str = ""
    lossy: bool = False
    requires: tuple[Requires, ...] = ()
    implies: tuple[tuple[str, str], ...] = ()   # (toggle, value) set by this choice
    needs_fused_loras: str = ""                 # why, when runtime LoRAs cannot run with this choice
    families: dict = field(default_factory=dict, hash=False, compare=False)  # DiT family -> why not there


@dataclass
class PrepareContext:
    """What a preparation step works on: the DiT being prepared (a copy sharing the base's weights, so a step must
    replace a tensor rather than change it), the configuration, the device, a stage timer and the report."""
    dit: Any
    config: Any
    device: str
    stage: Callable[[str, str], ContextManager]
    report: dict[str, str]
    shared: dict = field(default_factory=dict)  # handed from one step to a later one (e.g. joint attention layers)


@dataclass
class RunContext:
    """What a run-time context sees: the prepared pipeline, the run's configuration, the device, the number of
    tokens a DiT forward attends over at this run's shape, the recorder (to time what it does as a stage of its
    own) and the process mesh of a parallel edit (None in one process). `options` collects the fields of the run's
    DitOptions that the toggles set."""
    prepared: Any
    config: Any
    device: str
    sequence_length: int
    recorder: Any
    mesh: Any = None
    step_cache_threshold: float | None = None    # every skipping step-cache choice's threshold (the bench's)
    ran: dict = field(default_factory=dict)   # what a context resolved, for the result (e.g. "auto" -> a backend)
    options: dict = field(default_factory=dict)

    def not_applied(self, toggle: str, words: str) -> None:
        """What a toggle did not do on this run, and why: in the run's words and in its notes."""
        self.ran.setdefault("words", {})[toggle] = words
        self.recorder.telemetry.notes.append(f"{toggle} {words}")


@dataclass(frozen=True)
class Toggle:
    name: str                # the configuration key, CLI flag (--name) and API parameter
    label: str
    help: str
    choices: tuple[Choice, ...]
    default: str = OFF
    changes: str = PREPARED
    group: str | None = None                       # flags (off/on) shown together under this name
    order: int = 50                                # position among preparation steps
    prepare: Callable[[PrepareContext, str], None] | None = None
    begin: Callable[[PrepareContext, str], None] | None = None  # started before the first step, to overlap them
    prepared_key: Callable[[str], Any] = staticmethod(lambda value: value)
    run_context: Callable[[RunContext, str], ContextManager] | None = None
    compile_options: dict = field(default_factory=dict)   # Inductor options this toggle adds when not off
    availability: Callable[[str, str], Availability] = staticmethod(lambda value, device: Availability.yes())
    tag: Callable[[str], str] | None = None        # its part of a configuration's label (default: name-value)
    component: str = "dit"                         # the model component it changes: dit, text_encoder or vae
    families: dict = field(default_factory=lambda: dict(NOT_PORTED), hash=False, compare=False)  # DiT family -> why
    # it does not apply there (a family it applies to is absent)
    option: str | None = None                      # a flag's DitOptions field, set while the flag is on

    def label_part(self, value: str) -> str | None:
        if value == self.default:
            return None
        if self.group is not None:
            return self.name
        return self.tag(value) if self.tag else f"{self.name}-{value}"

    def __post_init__(self):
        values = [choice.value for choice in self.choices]
        if self.default not in values:
            raise ValueError(f"toggle {self.name}: default {self.default!r} is not one of its choices {values}")
        if self.group is not None and set(values) != {OFF, ON}:
            raise ValueError(f"toggle {self.name}: a flag of group {self.group!r} takes the choices off and on")

    @property
    def values(self) -> tuple[str, ...]:
        return tuple(choice.value for choice in self.choices)

    def choice(self, value: str) -> Choice:
        for choice in self.choices:
            if choice.value == value:
                return choice
        raise KeyError(value)

    def is_lossy(self, value: str) -> bool:
        return self.choice(value).lossy


_TOGGLES: dict[str, Toggle] = {}


def register(toggle: Toggle) -> Toggle:
    """Adds a toggle (a toggle file calls this at import; a test may add its own). Names are unique."""
    if toggle.name in _TOGGLES and _TOGGLES[toggle.name] is not toggle:
        raise ValueError(f"a toggle named {toggle.name!r} is already registered")
    if toggle.group is not None and toggle.group in _TOGGLES:
        raise ValueError(f"group {toggle.group!r} has the name of a toggle")
    _TOGGLES[toggle.name] = toggle
    return toggle


def unregister(name: str) -> None:
    _TOGGLES.pop(name, None)


@functools.cache
def _discover() -> None:
    """Imports every module of ghostedit.optimize.toggles once: each registers its toggle. Toggle files import only
    what declaring needs; their steps import the heavy code (torchao, DiffSynth's modules) when they run."""
    for module in pkgutil.iter_modules(toggle_files.__path__):
        importlib.import_module(f"{toggle_files.__name__}.{module.name}")


def toggles() -> list[Toggle]:
    """Every toggle, in preparation order (then by name)."""
    _discover()
    return sorted(_TOGGLES.values(), key=lambda toggle: (toggle.order, toggle.name))


def get(name: str) -> Toggle:
    _discover()
    return _TOGGLES[name]


def singles() -> list[Toggle]:
    """The toggles shown as a setting of their own (not a flag of a group)."""
    return [toggle for toggle in toggles() if toggle.group is None]


def groups() -> dict[str, list[Toggle]]:
    """{group name: its flags}, in preparation order."""
    grouped: dict[str, list[Toggle]] = {}
    for toggle in toggles():
        if toggle.group is not None:
            grouped.setdefault(toggle.group, []).append(toggle)
    return grouped


def settings() -> list[str]:
    """The names a configuration is set by: every single toggle and every group, in preparation order."""
    names = []
    for toggle in toggles():
        name = toggle.group or toggle.name
        if name not in names:
            names.append(name)
    return names


def availability(toggle: Toggle, value: str, device: str) -> Availability:
    return toggle.availability(value, device)


def family_availability(toggle: Toggle, value: str, family: str) -> Availability:
    """Whether `value` of `toggle` runs on the DiT family `family`: its default always does (a toggle that does not
    apply is then simply not there), any other value where neither the toggle nor the choice gives a reason."""
    reason = toggle.choice(value).families.get(family)
    if not reason and value != toggle.default:
        reason = toggle.families.get(family)
    return Availability.no(reason) if reason else Availability.yes()


def options(device: str, family: str | None = None) -> dict[str, dict[str, Availability]]:
    """{setting: {choice: availability}} on this device (and for the DiT family `family`, when given); a group
    lists its flags as its choices."""
    def available(toggle: Toggle, value: str) -> Availability:
        here = toggle.availability(value, device)
        return family_availability(toggle, value, family) if here.ok and family else here

    result: dict[str, dict[str, Availability]] = {}
    for toggle in toggles():
        if toggle.group is None:
            result[toggle.name] = {value: available(toggle, value) for value in toggle.values}
        else:
            result.setdefault(toggle.group, {})[toggle.name] = available(toggle, ON)
    return result


def words(setting: str, value: str) -> str:
    """The UI words for a setting's choice (a group's choice is one of its flags)."""
    _discover()
    if setting in groups():
        return get(value).label
    return get(setting).choice(value).label


def run_contexts(config, context: RunContext) -> ContextManager:
    """Every toggle's run-time context for this configuration, entered in preparation order, each flag's option set
    first. A toggle of a component the pipeline has not loaded has nothing to act on (the DiT-level bench loads the
    DiT alone)."""
    for toggle in toggles():
        if toggle.option is not None and config.value(toggle.name) == ON:
            context.options[toggle.option] = True
    stack = contextlib.ExitStack()
    for toggle in toggles():
        if toggle.run_context is not None and getattr(context.prepared.pipe, toggle.component) is not None:
            stack.enter_context(toggle.run_context(context, config.value(toggle.name)))
    return stack


def component_settings(config, component: str) -> tuple:
    """The configuration's choices of the toggles that change `component` (dit, text_encoder, vae)."""
    return tuple((toggle.name, config.value(toggle.name)) for toggle in toggles() if toggle.component == component)


def compile_options(config) -> tuple[dict, list[str]]:
    """The Inductor options the configuration's toggles add, and the words for each toggle that adds some."""
    options, said = {}, []
    for toggle in toggles():
        if toggle.compile_options and config.value(toggle.name) != OFF:
            options.update(toggle.compile_options)
            said.append(toggle.label)
    return options, said
