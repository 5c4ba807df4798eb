"""Named configurations, written once: the fastest measured (BEST), the same with FlashAttention-3's FP8 attention
(BEST_FA3, where that kernel is installed) and the fastest with exact attention (EXACT); and the Lightning presets,
which run the lightx2v Lightning LoRA distilled for the model (4 or 8 steps, Qwen-Image-2.1's 4 only; CFG 1; its
own schedule). The bench, the scripts and the docs name them ("best", "best-fa3", "exact", "lightning-4",
"lightning-8"); OptimizationConfig.parse reads them."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..downloads import hub_snapshot
from ..models import EMBEDDED
from ..models.family import CONFIG_FILES, RELEASED, UnsupportedModel, detect

_DIT = ("fp8=torchao,compile=regional,rewrites=real-rope+joint-layout+fused-qkv+inductor-persistent-rows"
        "+fused-gelu-quant+carried-residual+cuda-graph")
_FP8_ATTENTION = "+fused-qk-norm-rope+fp8-attention-out,attention=cudnn-fp8"  # the FP8 attention and its two rewrites
# FlashAttention-3's FP8 kernel writes bf16, so the output rewrite goes; it needs a wheel the index lacks
# (scripts/gpu/build_fa3_wheel.sh). Measured faster than cuDNN's at an edit's prompt length, slower at 256 tokens
# (lab/LOG.md, section 6)
_FA3_FP8_ATTENTION = "+fused-qk-norm-rope,attention=fa3-fp8"
_ENCODERS = "vae=image-fused,text-encoder=graphed"  # lossless, measured faster (lab/results/run-toggles/)
EXACT = f"{_DIT},{_ENCODERS}"
BEST = f"{_DIT}{_FP8_ATTENTION},{_ENCODERS}"
BEST_FA3 = f"{_DIT}{_FA3_FP8_ATTENTION},{_ENCODERS}"
PRESETS = {"best": BEST, "exact": EXACT, "best-fa3": BEST_FA3}


@dataclass(frozen=True)
class LightningPreset:
    name: str
    steps: int
    cfg_scale: float = 1.0  # distilled without guidance: one DiT forward a step

    def lora_reference(self, family) -> str:
        """The LoRA distilled for `family` (models/family.py) as `owner/name:FILE` for downloads.lora_file; a step
        count lightx2v publishes none for is refused (PresetError)."""
        if self.steps not in family.lightning_steps:
            published = " or ".join(str(steps) for steps in family.lightning_steps)
            raise PresetError(f"{family.name}: lightx2v publishes its Lightning LoRA for {published} steps, "
                              f"not {self.steps}")
        repo, template = family.lightning
        return f"{repo}:{template.format(steps=self.steps)}"

    @property
    def words(self) -> str:
        return f"Lightning {self.steps} steps (CFG 1, Lightning schedule, lightx2v LoRA downloaded on first use)"


LIGHTNING = {preset.name: preset for preset in (LightningPreset("lightning-4", 4), LightningPreset("lightning-8", 8))}


class PresetError(ValueError):
    """A preset that cannot apply to this model."""


def model_family(source: str):
    """Which edit model `source` is, as its models/family.py entry: a released repo by its id, a folder (or another
    repo) by its own configs (family.detect). A model without a Lightning LoRA is refused."""
    if source in EMBEDDED:
        raise PresetError(f"the {source} model has random weights and no Lightning LoRA: Lightning presets need "
                          f"{', '.join(repo for repo, family in RELEASED.items() if family.lightning)} or a folder "
                          "of one")
    repo = source.removeprefix("modelscope:").removeprefix("hf:")
    family = RELEASED.get(repo)
    if family is None:
        folder = Path(source).expanduser()
        try:
            family = detect(folder if folder.is_dir() else _hub_configs(repo))
        except UnsupportedModel as error:
            raise PresetError(f"{error}: no Lightning LoRA is known for it") from error
    if family.lightning is None:
        raise PresetError(f"{source} is {family.name}: no Lightning LoRA is known for it")
    return family


def _hub_configs(repo: str) -> Path:
    return hub_snapshot(repo, CONFIG_FILES)
