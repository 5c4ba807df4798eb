"""Every change GhostEdit makes inside DiffSynth, listed here once: what it replaces and why. Each replacement is made
once, through `replace`, and only on the DiffSynth version it was written for; any other version stops with an error
that names the patches to check, rather than running code written against another DiffSynth.

Module-level functions are replaced here. What changes a loaded model or pipeline object instead (GhostEdit's own
attention layers and pipeline instrumentation) is listed too, as it relies on DiffSynth's attribute names."""
from __future__ import annotations

import importlib
import logging
from dataclasses import dataclass

from .device import package_version
from .errors import GhostEditError

WRITTEN_FOR = "2.1.12"


@dataclass(frozen=True)
class Patch:
    module: str          # the DiffSynth module changed
    attribute: str       # what in it
    why: str


PATCHES = {
    "attention dispatcher": Patch(
        "diffsynth.models.qwen_image_dit", "qwen_image_flash_attention",
        "the DiT's blocks call this module-level function for joint attention: GhostEdit's dispatcher runs the "
        "attention backend the configuration chose (optimize/attention.py)"),
    "real-valued rotary embedding": Patch(
        "diffsynth.models.qwen_image_dit", "apply_rotary_emb_qwen",
        "takes (cos, sin) pairs as well as complex frequencies, for the real-rope rewrite (optimize/rewrites.py)"),
    "tiny model table": Patch(
        "diffsynth.configs", "MODEL_CONFIGS",
        "the embedded tiny model's classes are added to DiffSynth's table of checkpoints by file hash, so that "
        "DiffSynth's own loader loads them (models/tiny.py)"),
    "joint attention layers": Patch(
        "diffsynth.models.qwen_image_dit", "QwenDoubleStreamAttention",
        "the joint-layout rewrite turns its instances into GhostEdit's JointAttention, which reads its projection "
        "and norm attributes (optimize/rewrites.py)"),
    "DiT block forward": Patch(
        "diffsynth.models.qwen_image_dit", "QwenImageTransformerBlock.forward (replaced on each block object)",
        "the carried-residual rewrite gives each block a forward that adds the residual the block before left "
        "undone and leaves its own last one to the next block; it reads the block's modulation, norm, attention "
        "and feed-forward attributes (optimize/carried_residual.py)"),
    "DiT MLP activation": Patch(
        "diffsynth.models.qwen_image_dit", "ApproximateGELU",
        "DiffSynth computes x * sigmoid(1.702 x); Qwen-Image's MLP is GELU with the tanh approximation (diffusers' "
        "reference): the class is replaced before any DiT is built (models/exact.py)"),
    "VAE RMS norm": Patch(
        "diffsynth.models.qwen_image_vae", "QwenImageRMS_norm",
        "DiffSynth normalizes in the input's dtype; the reference normalizes bf16 input in float32 (models/exact.py)"),
    "VAE latent normalization": Patch(
        "diffsynth.models.qwen_image_vae", "QwenImageVAE",
        "DiffSynth multiplies by 1 / std kept from float32; the reference divides by the std in the VAE's dtype "
        "(differs in bf16): the class DiffSynth's loader imports is replaced by a subclass (models/exact.py)"),
    "model table": Patch(
        "diffsynth.configs", "MODEL_CONFIGS",
        "a Qwen-Image-Edit folder's DiT, text encoder and VAE are entered by DiffSynth's file hash with classes "
        "built from the folder's own configs, so that DiffSynth's loader loads any size (models/checkpoint.py)"),
    "exact edit pipeline": Patch(
        "diffsynth.pipelines.qwen_image", "QwenImagePipeline (subclassed: units, cfg_guided_model_fn, "
        "vae_output_to_image)",
        "a loaded pipeline becomes models/exact.py's ExactPipeline: the family's image resizing and prompt template "
        "with mm_token_type_ids, true CFG rescaled to the conditional norm, rounded 8-bit output"),
    "quiet loader": Patch(
        "diffsynth.models.model_loader", "print",
        "DiffSynth's loader prints each model it loads or finds, and each it does not ('No ... models available. "
        "This is not an error.'): a module-level `print` sends those lines to the 'ghostedit.diffsynth' logger at "
        "debug level instead of the app's log"),
    "quiet download tips": Patch(
        "diffsynth.core.loader.config", "_download_tips_printed",
        "DiffSynth prints a box of ModelScope download settings before the first model it loads, even from a local "
        "path where nothing downloads: the flag that says it was printed is set, so it never is (GhostEdit's own "
        "downloads announce themselves, downloads.py)"),
    "capture-time torch": Patch(
        "diffsynth.pipelines.qwen_image", "torch (the module's global, for the length of a CUDA graph capture)",
        "model_fn builds zero_cond_t's modulation index with torch.tensor(..., device=...), a copy a capture refuses: "
        "while cuda-graph captures a forward, the module's `torch` is optimize/cuda_graphs.py's HostConstants, "
        "which makes such tensors from pinned memory kept with the graph"),
    "pipeline instrumentation": Patch(
        "diffsynth.pipelines.qwen_image", "QwenImagePipeline.unit_runner, QwenImagePipeline.model_fn",
        "swapped on a pipeline object for the length of a run, to time its units and route DiT calls through "
        "the engine (engine/runner.py)"),
}

_originals: dict[str, object] = {}


class DiffSynthVersionError(GhostEditError, RuntimeError):
    """The installed DiffSynth is not the version GhostEdit's patches were written for."""


def check_version() -> None:
    installed = package_version("diffsynth")
    if installed != WRITTEN_FOR:
        raise DiffSynthVersionError(
            f"GhostEdit changes DiffSynth {WRITTEN_FOR} in {len(PATCHES)} places ({', '.join(PATCHES)}); "
            f"DiffSynth {installed} is installed. Install diffsynth=={WRITTEN_FOR} (requirements.txt), or check "
            "each patch in ghostedit/diffsynth_patches.py against the new version first")


def replace(name: str, replacement):
    """Puts `replacement` in place of the patch's module-level attribute, once; returns DiffSynth's original."""
    if name not in _originals:
        check_version()
        patch = PATCHES[name]
        module = importlib.import_module(patch.module)
        _originals[name] = getattr(module, patch.attribute, None)  # None: a builtin the module uses (print)
        setattr(module, patch.attribute, replacement)
    return _originals[name]


def quiet_loader() -> None:
    """DiffSynth's loader logs at debug level instead of printing (see "quiet loader"), and prints no download box
    ("quiet download tips")."""
    replace("quiet loader", _log_loader_line)
    replace("quiet download tips", True)


def _log_loader_line(*values, sep: str = " ", **_) -> None:
    logging.getLogger("ghostedit.diffsynth").debug(sep.join(str(value) for value in values))
