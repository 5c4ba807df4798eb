"""Command-line arguments shared by `edit`, `bench` and `serve`: the model source, the edit request and one option
per toggle setting, each option made from the toggle registry (a new toggle gets its flag here with no change)."""
from __future__ import annotations

import argparse

from .config import CFG_RANGE, LORA_MODES, MAX_INPUT_IMAGES, SEED_RANGE, EditRequest, LoraChoice, OptimizationConfig
from .device import default_device
from .downloads import printer
from .models import default_source
from .models.dtypes import DTYPES
from .optimize import registry
from .optimize.presets import LIGHTNING

DEFAULT_CFG = 4.0
DEFAULT_PROMPT = "turn the scene into a ghostly night"  # the bench's and the probes' edit


def add_model_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default=None,
                        help="tiny, synthetic (Qwen-Image-Edit), tiny-2.1, tiny-2.1-turbo, synthetic-2.1, "
                             "synthetic-2.1-turbo (Qwen-Image-2.1), a Hugging Face repo id such as "
                             "Qwen/Qwen-Image-2.1 (modelscope:<id> for ModelScope) or a local folder (default: tiny "
                             "without a GPU, Qwen/Qwen-Image-Edit-2509 with one)")
    parser.add_argument("--device", default=None, help="cuda or cpu (default: cuda when available)")
    parser.add_argument("--dtype", choices=tuple(DTYPES), default=None,
                        help="one dtype for every component (default: what is fast on the device: bf16 on a GPU; "
                             "on a CPU the VAE and text encoder in float32)")


def model_and_device(args) -> tuple[str, str]:
    """The model source and device that --model and --device ask for, defaults filled by one rule
    (models.default_source) for the app, `edit`, `options` and `bench` alike."""
    device = args.device or default_device()
    return args.model or default_source(device), device


def add_request_arguments(parser: argparse.ArgumentParser, image_required: bool = True,
                          prompt_required: bool | None = None) -> None:
    parser.add_argument("--image", action="append", required=image_required, default=None,
                        help=f"input image; repeat for up to {MAX_INPUT_IMAGES}, edited together (the model's own "
                             "limit: Qwen-Image-Edit 1, -2509 and -2511 3, Qwen-Image-2.1 10, or none: "
                             "text-to-image)")
    parser.add_argument("--prompt", required=image_required if prompt_required is None else prompt_required,
                        default=DEFAULT_PROMPT, help="the edit instruction (without --image: what to generate)")
    parser.add_argument("--negative-prompt", default="", help="what the edit should avoid (used when --cfg > 1)")
    parser.add_argument("--steps", type=int, default=None,
                        help="denoising steps (default: the model's: 50 for Qwen-Image-Edit, 40 for 2509 and 2511, "
                             "4 for tiny)")
    parser.add_argument("--cfg", type=float, default=None,
                        help=f"true classifier-free guidance scale, {CFG_RANGE[0]:g} to {CFG_RANGE[1]:g}; "
                             "1 runs one DiT forward per step instead of two (default: the model's, Qwen-Image-Edit "
                             "4, Qwen-Image-2.1 1; a Lightning preset's 1)")
    parser.add_argument("--seed", type=int, default=0,
                        help=f"noise seed, {SEED_RANGE[0]} to {SEED_RANGE[1]} (default 0)")
    parser.add_argument("--width", type=int, default=None,
                        help="output width, a multiple of 16 (Qwen-Image-2.1: 32) (default: an input image's aspect "
                             "ratio at the model's default area: the first image's for Qwen-Image-Edit and for a "
                             "masked edit, the last one's for 2509, 2511 and 2.1; give both or neither)")
    parser.add_argument("--height", type=int, default=None, help="output height, a multiple of 16 (2.1: 32; with --width)")
    parser.add_argument("--mask", default=None, metavar="FILE",
                        help="an inpainting mask for the first --image (white = change; in a file with transparency, "
                             "transparent = change), of its aspect ratio: the edit keeps the rest, and the output "
                             "takes the first image's aspect ratio")
    parser.add_argument("--strength", type=float, default=1.0,
                        help="how much of the first --image to redo, above 0 to 1: the edit starts from it noised to "
                             "that point and runs that share of the steps (default 1: from noise)")
    parser.add_argument("--padding-mask-crop", type=int, default=None, metavar="PIXELS",
                        help="with --mask: edit only the box around the mask widened by PIXELS, then lay the result "
                             "over the image")
    parser.add_argument("--paste-back", action="store_true",
                        help="with --mask: the first image's own pixels outside the mask, exactly")


def request_from_args(args, default_steps: int, default_cfg: float = DEFAULT_CFG,
                      keep_alpha: bool = False) -> EditRequest:
    """`keep_alpha`: the model reads the images' alpha (Qwen-Image-2.1)."""
    return EditRequest(images=args.image or [], prompt=args.prompt, negative_prompt=args.negative_prompt,
                       steps=default_steps if args.steps is None else args.steps,
                       cfg_scale=default_cfg if args.cfg is None else args.cfg,
                       seed=args.seed, width=args.width, height=args.height, keep_alpha=keep_alpha,
                       mask=args.mask, strength=args.strength, padding_mask_crop=args.padding_mask_crop,
                       paste_back=args.paste_back)


def add_preset_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--preset", choices=tuple(LIGHTNING), default=None,
                        help="; ".join(f"{preset.name}: {preset.words}" for preset in LIGHTNING.values())
                             + ". Stacks with --lora (a style LoRA) and the other settings; --steps and --cfg, if "
                               "given, win over the preset's")


def preset_cfg(args, default: float) -> float:
    """The CFG the --preset asks for (before anything is downloaded), else `default`."""
    preset = LIGHTNING.get(getattr(args, "preset", None) or "")
    return preset.cfg_scale if preset else default


def apply_preset(args, model: str, config: OptimizationConfig, default_steps: int):
    """The configuration, default steps and default CFG once --preset is applied: its LoRA (downloaded with
    progress on first use) first in the stack, its schedule, its steps and CFG."""
    if not getattr(args, "preset", None):
        return config, default_steps, DEFAULT_CFG
    preset = LIGHTNING[args.preset]
    lightning = OptimizationConfig.parse(preset.name, model=model, on_download=printer())
    return (config.replace(loras=lightning.loras + config.loras, scheduler=lightning.value("scheduler")),
            preset.steps, preset.cfg_scale)


def add_toggle_arguments(parser: argparse.ArgumentParser, defaults_to_none: bool = False) -> None:
    """--<toggle> for every single toggle, --<group> (a list) for every group of flags, and the LoRAs.
    `defaults_to_none`: leave every option unset unless given (the bench applies given ones over its configs)."""
    # each choice's words and whether it runs here: `ghostedit options` (not repeated in every help)
    for toggle in registry.singles():
        parser.add_argument(f"--{toggle.name}", choices=toggle.values,
                            default=None if defaults_to_none else toggle.default,
                            help=f"{toggle.help} (default {toggle.default})")
    for group, flags in registry.groups().items():
        parser.add_argument(f"--{group}", nargs="*", choices=[flag.name for flag in flags],
                            default=None if defaults_to_none else [], metavar=group.upper(),
                            help=f"any of: {', '.join(flag.name for flag in flags)}")
    parser.add_argument("--lora", action="append", default=[], metavar="FILE[:SCALE[:MODE]]",
                        help="a LoRA .safetensors file, or one on the Hugging Face Hub (owner/name, "
                             "owner/name:FILE.safetensors or a Hub URL; downloaded with progress); repeat to stack "
                             "LoRAs (each with its own scale and mode)")
    parser.add_argument("--lora-scale", type=float, default=1.0, help="scale of every --lora that gives none")
    parser.add_argument("--lora-mode", choices=LORA_MODES, default="fused",
                        help="mode of every --lora that gives none: fused into the weights, or runtime (PEFT layers)")


def settings_from_args(args) -> dict:
    """The toggle settings given on the command line (unset ones left out)."""
    settings = {name: getattr(args, name.replace("-", "_")) for name in registry.settings()}
    return {name: tuple(value) if isinstance(value, list) else value for name, value in settings.items()
            if value is not None}


def loras_from_args(args) -> tuple[LoraChoice, ...]:
    return tuple(LoraChoice.parse(text, args.lora_scale, args.lora_mode, on_download=printer()) for text in args.lora)


def config_from_args(args) -> OptimizationConfig:
    return OptimizationConfig(loras=loras_from_args(args), **settings_from_args(args))
