"""Named configurations, written once: the fastest measured (BEST) and the fastest with exact attention (EXACT);
and the Lightning presets, which run the lightx2v Lightning LoRA distilled for the model (4 or 8 steps, CFG 1, its
own schedule). The bench, the scripts and the docs name them ("best", "exact", "lightning-4", "lightning-8");
OptimizationConfig.parse reads them."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

EXACT = "fp8=torchao,compile=regional,rewrites=real-rope+joint-layout+inductor-multi-kernel"
BEST = EXACT + ",attention=cudnn-fp8"
PRESETS = {"best": BEST, "exact": EXACT}

# lightx2v's Lightning LoRAs for each edit model (https://huggingface.co/lightx2v): the repo and file, by steps
LIGHTNING_LORAS = {
    "edit": ("lightx2v/Qwen-Image-Lightning", "Qwen-Image-Edit-Lightning-{steps}steps-V1.0-bf16.safetensors"),
    "2509": ("lightx2v/Qwen-Image-Lightning",
             "Qwen-Image-Edit-2509/Qwen-Image-Edit-2509-Lightning-{steps}steps-V1.0-bf16.safetensors"),
    "2511": ("lightx2v/Qwen-Image-Edit-2511-Lightning",
             "Qwen-Image-Edit-2511-Lightning-{steps}steps-V1.0-bf16.safetensors"),
}
# The released repos, by name (any other source is told apart by its own config files)
KNOWN_REPOS = {"Qwen/Qwen-Image-Edit": "edit", "Qwen/Qwen-Image-Edit-2509": "2509", "Qwen/Qwen-Image-Edit-2511": "2511"}
MODEL_WORDS = {"edit": "Qwen-Image-Edit", "2509": "Qwen-Image-Edit-2509", "2511": "Qwen-Image-Edit-2511"}


@dataclass(frozen=True)
class LightningPreset:
    name: str
    steps: int
    cfg_scale: float = 1.0  # distilled without guidance: one DiT forward a step

    def lora_reference(self, variant: str) -> str:
        """The LoRA as `owner/name:FILE` for downloads.lora_file."""
        repo, template = LIGHTNING_LORAS[variant]
        return f"{repo}:{template.format(steps=self.steps)}"

    @property
    def words(self) -> str:
        return f"Lightning {self.steps} steps (CFG 1, Lightning schedule, lightx2v LoRA downloaded on first use)"


LIGHTNING = {preset.name: preset for preset in (LightningPreset("lightning-4", 4), LightningPreset("lightning-8", 8))}


class PresetError(ValueError):
    """A preset that cannot apply to this model."""


def model_variant(source: str) -> str:
    """Which edit model `source` is ("edit", "2509" or "2511"): a released repo by its id, a folder (or another
    repo) by its own configs: model_index.json's pipeline class, and the 2511 transformer's `zero_cond_t`."""
    if source in ("tiny", "synthetic"):
        raise PresetError(f"the {source} model has random weights and no Lightning LoRA: Lightning presets need "
                          f"{', '.join(KNOWN_REPOS)} or a folder of one")
    repo = source.removeprefix("modelscope:").removeprefix("hf:")
    if repo in KNOWN_REPOS:
        return KNOWN_REPOS[repo]
    folder = Path(source).expanduser()
    if not folder.is_dir():
        folder = _hub_configs(repo)
    return _variant_from_configs(folder, source)


def _hub_configs(repo: str) -> Path:
    from ..downloads import hub_snapshot
    return hub_snapshot(repo, ("model_index.json", "transformer/config.json"))


def _variant_from_configs(folder: Path, source: str) -> str:
    try:
        pipeline = json.loads((folder / "model_index.json").read_text()).get("_class_name")
        transformer = json.loads((folder / "transformer" / "config.json").read_text())
    except (OSError, ValueError) as error:
        raise PresetError(f"{source}: cannot tell which Qwen-Image-Edit it is ({error})") from error
    if pipeline == "QwenImageEditPipeline":
        return "edit"
    if pipeline == "QwenImageEditPlusPipeline":
        return "2511" if transformer.get("zero_cond_t") else "2509"
    raise PresetError(f"{source} is a {pipeline}, not a Qwen-Image-Edit model: no Lightning LoRA is known for it")
