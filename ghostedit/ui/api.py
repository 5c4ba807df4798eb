"""The public signatures of the edit endpoints: one parameter per request value, per LoRA slot and per toggle
setting of the registry, each with its description (Gradio shows it in the API page and as MCP tool help), built
around the handlers, which take the values as one dict."""
from __future__ import annotations

import inspect
from typing import Callable, Literal

import gradio as gr
from gradio.data_classes import FileData

from ..config import CFG_RANGE, MAX_INPUT_IMAGES, SEED_RANGE, SIZE_RANGE, STEPS_RANGE
from ..optimize import registry
from .mask_inputs import START_PARAMETERS, start_types
from .settings import (LORA_SLOTS, MAX_IMAGES_PER_RUN, NO_LORA, image_parameters, lora_parameter, lora_parameters,
                       setting_parameter, variants)

# The input images' parameters: image, image_2 ... image_10 (Qwen-Image-2.1 takes up to 10; the Edit models 1 to 3)
IMAGE_PARAMETERS = tuple(image_parameters())
REQUEST_PARAMETERS = {
    "image": "the image to edit (a file); none: text-to-image, with a model that generates (Qwen-Image-2.1)",
    "image_2": f"an optional second input image, edited together with the first (up to {MAX_INPUT_IMAGES} with "
               "Qwen-Image-2.1, 3 with Qwen-Image-Edit-2509/2511)",
    **{name: f"an optional input image number {name.removeprefix('image_')}" for name in IMAGE_PARAMETERS[2:]},
    "prompt": "the edit instruction, e.g. 'make it a haunted house at night' (text-to-image: what to make)",
    "negative_prompt": "what the edit should avoid (used when cfg_scale > 1)",
    "steps": f"denoising steps, {STEPS_RANGE[0]} to {STEPS_RANGE[1]} (default: the model's)",
    "cfg_scale": f"true classifier-free guidance, {CFG_RANGE[0]:g} to {CFG_RANGE[1]:g}; 1 halves the DiT work",
    "seed": f"noise seed, {SEED_RANGE[0]} to {SEED_RANGE[1]}",
    "width": f"output width, a multiple of 16 (Qwen-Image-2.1: 32) up to {SIZE_RANGE[1]}; 0: from an input image's aspect ratio (the first for Qwen-Image-Edit and masked edits, the last for 2509, 2511 and 2.1)",
    "height": f"output height, a multiple of 16 up to {SIZE_RANGE[1]}; 0: from the first image's aspect ratio",
    "count": f"how many images to make, 1 to {MAX_IMAGES_PER_RUN}, with seeds seed, seed+1, ... (default 1); each "
             "joins the comparison",
}


def parameter_descriptions() -> dict[str, str]:
    """{API parameter: what it means and which values it takes} for /edit, from the registry."""
    described = dict(REQUEST_PARAMETERS)
    for slot in range(1, LORA_SLOTS + 1):
        which = "a LoRA" if slot == 1 else f"LoRA number {slot}, stacked on the ones before"
        described[lora_parameter(slot)] = f"{which}: a name from /options 'loras', or 'none'"
        described[lora_parameter(slot, "mode")] = "fused (into the weights) or runtime (PEFT layers)"
        described[lora_parameter(slot, "scale")] = "the LoRA's strength, e.g. 1.0"
    for setting in registry.settings():
        if setting in registry.groups():
            flags = registry.groups()[setting]
            described[setting_parameter(setting)] = ("a list of any of: " + "; ".join(
                f"{flag.name} ({flag.label})" for flag in flags))
        else:
            toggle = registry.get(setting)
            described[setting_parameter(setting)] = (f"{toggle.help}. One of: " + "; ".join(
                f"{choice.value} ({choice.label})" for choice in toggle.choices) + f". Default {toggle.default}")
    return {**described, **START_PARAMETERS}


def edit_parameters() -> list[str]:
    """The parameters of /edit in order: the request, the LoRA slots, one per setting of the registry, then the
    mask and strength (last: a caller passing the others by position is not moved)."""
    return list(REQUEST_PARAMETERS) + lora_parameters() + [setting_parameter(setting)
                                                           for setting in registry.settings()] + list(START_PARAMETERS)


def parameter_types(default_steps: int, default_cfg: float = 4.0) -> dict[str, tuple[object, object]]:
    """{API parameter: (type hint, default)} for typed endpoints (gr.api, MCP tools): a toggle takes one of its
    values (a JSON-schema enum), a group a list of its flags. inspect.Parameter.empty: required."""
    required = inspect.Parameter.empty
    types = {**{name: (FileData | None, None) for name in IMAGE_PARAMETERS},
             "prompt": (str, required), "negative_prompt": (str, ""), "steps": (int, default_steps),
             "cfg_scale": (float, default_cfg), "seed": (int, 0), "width": (int, 0), "height": (int, 0),
             "count": (int, 1)}
    for slot in range(1, LORA_SLOTS + 1):
        types[lora_parameter(slot)] = (str, NO_LORA)
        types[lora_parameter(slot, "mode")] = (Literal["fused", "runtime"], "fused")
        types[lora_parameter(slot, "scale")] = (float, 1.0)
    for setting in registry.settings():
        if setting in registry.groups():
            flags = tuple(flag.name for flag in registry.groups()[setting])
            types[setting_parameter(setting)] = (list[Literal[flags]], [])
        else:
            toggle = registry.get(setting)
            types[setting_parameter(setting)] = (Literal[toggle.values], toggle.default)
    return {**types, **start_types()}


def typed_tool(body: Callable, name: str, summary: str, names: list[str], default_steps: int,
               returns: tuple[str, object], default_cfg: float = 4.0) -> Callable:
    """A function named `name` with one typed parameter per name, required ones first (then the request), which
    calls `body(values, request)`; its docstring says what each argument means and which values it takes (Args)
    and what comes back (Returns), as Gradio's API page and MCP tool list read them. `returns`: (words, type)."""
    described, types = parameter_descriptions(), parameter_types(default_steps, default_cfg)
    names = sorted(names, key=lambda parameter: types[parameter][1] is not inspect.Parameter.empty)

    def call(*arguments, **keywords):
        bound = call.__signature__.bind(*arguments, **keywords)
        bound.apply_defaults()
        values = dict(bound.arguments)
        return body(values, values.pop("request"))

    parameters = [inspect.Parameter(parameter, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=types[parameter][1],
                                    annotation=types[parameter][0]) for parameter in names]
    parameters.append(inspect.Parameter("request", inspect.Parameter.POSITIONAL_OR_KEYWORD, default=None,
                                        annotation=gr.Request))
    words, result = returns
    call.__signature__ = inspect.Signature(parameters, return_annotation=result)
    call.__annotations__ = {**{parameter.name: parameter.annotation for parameter in parameters}, "return": result}
    call.__name__ = call.__qualname__ = name
    call.__doc__ = (summary + "\n\nArgs:\n" + "\n".join(f"    {parameter}: {described[parameter]}"
                                                         for parameter in names) + f"\n\nReturns:\n    {words}")
    return call


def endpoint(method: Callable, summary: str, names: list[str], extra: dict[str, str] | None = None) -> Callable:
    """A generator function with one positional parameter per name (then a session `history`, the request and
    progress), which calls `method(values, history, request, progress)`: Gradio reads the signature for the API
    and passes values positionally."""
    described = {**parameter_descriptions(), **(extra or {})}

    def call(*arguments):
        *values, history, request, progress = arguments
        yield from method(dict(zip(names, values)), history, request, progress)

    parameters = [inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=None) for name in names]
    parameters += [inspect.Parameter("history", inspect.Parameter.POSITIONAL_OR_KEYWORD, default=None),
                   inspect.Parameter("request", inspect.Parameter.POSITIONAL_OR_KEYWORD, default=None,
                                     annotation=gr.Request),
                   inspect.Parameter("progress", inspect.Parameter.POSITIONAL_OR_KEYWORD, default=gr.Progress())]
    call.__signature__ = inspect.Signature(parameters)
    call.__annotations__ = {"request": gr.Request}  # Gradio finds the request by type hint
    call.__name__ = method.__name__
    call.__doc__ = summary + "\n\nArgs:\n" + "\n".join(f"    {name}: {described[name]}" for name in names)
    return call


def served(fn: Callable, serve: Callable, stream: bool) -> Callable:
    """An endpoint `fn` (its signature, name and docs) whose generator `serve(answers, request)` turns into what
    Gradio sends: with `stream` each item serve yields, else the one it returns (Gradio tells the two apart by the
    function, not by what it returns)."""
    # an endpoint's last arguments are the history, the request and progress (endpoint())
    if stream:
        def call(*arguments):
            yield from serve(fn(*arguments), arguments[-2])
    else:
        def call(*arguments):
            return serve(fn(*arguments), arguments[-2])
    call.__signature__ = inspect.signature(fn)
    call.__annotations__ = {"request": gr.Request}
    call.__name__, call.__doc__ = fn.__name__, fn.__doc__
    return call


def variants_description() -> str:
    return "a list of variants to run: " + "; ".join(f"{name} ({words})" for name, words in variants().items())
