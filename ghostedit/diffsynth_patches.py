"""Every change GhostEdit makes inside DiffSynth, listed here once: what it changes and why, each made only on the
DiffSynth version it was written for; any other version stops with an error that names the patches to check, rather
than running code written against another DiffSynth.

DiffSynth keeps what it does well: loading checkpoints, the text encoder, the VAE, the pipeline's units and LoRA key
formats. The DiTs' forwards are GhostEdit's own (models/qwen_image/dit.py, models/qwen_image_21/dit.py) and need no
patch; what is left is what DiffSynth's pipelines and loader need to run them."""
from __future__ import annotations

import importlib
import logging
from dataclasses import dataclass

from .device import package_version
from .errors import GhostEditError

WRITTEN_FOR = "2.1.12"
DOWNLOAD_TIPS_MODULE = "diffsynth.core.loader.config"  # where the loader's "quiet loader" download box is decided


@dataclass(frozen=True)
class Patch:
    module: str          # the DiffSynth module changed
    attribute: str       # what in it
    why: str


PATCHES = {
    "model table": Patch(
        "diffsynth.configs", "MODEL_CONFIGS (and the offload and version maps beside it)",
        "a checkpoint's DiT, text encoder and VAE (a Qwen-Image-Edit or Qwen-Image-2.1 folder's, the embedded tiny "
        "models') are entered by DiffSynth's file hash with GhostEdit's classes built from the folder's own configs "
        "(its DiTs, and the Edit VAE computing as the reference), so that DiffSynth's loader loads any size "
        "(models/checkpoint.py, models/tiny.py, models/qwen_image_21/checkpoint.py)"),
    "edit pipeline": Patch(
        "diffsynth.pipelines.qwen_image", "QwenImagePipeline (subclassed, on a loaded pipeline object: units, "
        "model_fn, cfg_guided_model_fn, vae_output_to_image; for a run: unit_runner, model_fn)",
        "a loaded pipeline becomes models/exact.py's ExactPipeline: the family's image resizing and prompt template "
        "with mm_token_type_ids, GhostEdit's DiT forward as its model_fn, true CFG rescaled to the conditional norm, "
        "rounded 8-bit output; for the length of a run its units are timed and its DiT calls take the run's "
        "options (engine/runner.py), and CFG parallel splits its passes (parallel/cfg.py)"),
    "2.1 pipeline": Patch(
        "diffsynth.pipelines.qwen_image_21", "QwenImage21Pipeline (subclassed, on a loaded pipeline object: units, "
        "scheduler, model_fn, vae_output_to_image; for a run: unit_runner, model_fn)",
        "a loaded Qwen-Image-2.1 pipeline becomes models/qwen_image_21/pipeline.py's ExactPipeline21: the references "
        "resized as diffusers' QwenImage21Pipeline resizes them, its schedule and Turbo's sigmas, GhostEdit's 2.1 "
        "DiT forward with its prefix KV cache as its model_fn, rounded RGBA output; for the length of a run its "
        "units are timed (engine/runner.py)"),
    "quiet loader": Patch(
        "diffsynth.models.model_loader", "print (and diffsynth.core.loader.config's _download_tips_printed)",
        "DiffSynth's loader prints each model it loads or finds, and each it does not ('No ... models available. "
        "This is not an error.'): a module-level `print` sends those lines to the 'ghostedit.diffsynth' logger at "
        "debug level instead of the app's log. It also prints a box of ModelScope download settings before the "
        "first model it loads, even from a local path where nothing downloads: the flag that says it was printed is "
        "set, so it never is (GhostEdit's own downloads announce themselves, downloads.py)"),
}


class DiffSynthVersionError(GhostEditError, RuntimeError):
    """The installed DiffSynth is not the version GhostEdit's patches were written for."""


def check_version() -> None:
    installed = package_version("diffsynth")
    if installed != WRITTEN_FOR:
        raise DiffSynthVersionError(
            f"GhostEdit changes DiffSynth {WRITTEN_FOR} in {len(PATCHES)} places ({', '.join(PATCHES)}); "
            f"DiffSynth {installed} is installed. Install diffsynth=={WRITTEN_FOR} (requirements.txt), or check "
            "each patch in ghostedit/diffsynth_patches.py against the new version first")


def quiet_loader() -> None:
    """DiffSynth's loader logs at debug level instead of printing, and prints no download box (see "quiet loader").
    Idempotent."""
    check_version()
    setattr(importlib.import_module(PATCHES["quiet loader"].module), "print", _log_loader_line)
    setattr(importlib.import_module(DOWNLOAD_TIPS_MODULE), "_download_tips_printed", True)


def _log_loader_line(*values, sep: str = " ", **_) -> None:
    logging.getLogger("ghostedit.diffsynth").debug(sep.join(str(value) for value in values))
