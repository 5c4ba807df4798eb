"""The LoRA file formats people share for Qwen-Image, recognized from their keys: each key of a file becomes (the
layer it changes, which part it is), or is reported as not applied with the reason. Nothing is skipped silently.

One small function per format names a key's layer; the part (A/B, alpha, full delta, LoKr or LoHa factors) is read
from the key's ending, which the formats share. The conventions followed are diffusers' `load_lora_weights` for
the formats it reads and ComfyUI's loader for the rest (`.lora.down`/`.lora.up`, `.diff`/`.diff_b`, LoKr, LoHa):
delta W = alpha / rank * up @ down, with alpha from the file's `.alpha` keys or, for diffusers/PEFT files, from
the `lora_adapter_metadata` that diffusers writes into the safetensors header (`lora_alpha`, `alpha_pattern`).
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

import torch

# Endings shared by every format: (regex on the key's tail, part)
_PARTS = (
    (r"\.lora_A(?:\.default)?\.weight", "down"), (r"\.lora_B(?:\.default)?\.weight", "up"),
    (r"\.lora_down\.weight", "down"), (r"\.lora_up\.weight", "up"),
    (r"\.lora\.down\.weight", "down"), (r"\.lora\.up\.weight", "up"),
    (r"\.alpha", "alpha"), (r"\.diff", "diff"), (r"\.diff_b", "diff_b"),
    (r"\.(lokr_w[12](?:_[ab])?|lokr_t2)", None), (r"\.(hada_w[12]_[ab]|hada_t[12])", None),
    (r"\.(dora_scale|lora_magnitude_vector(?:\.default)?(?:\.weight)?)", "dora"),
)
_PART = re.compile(r"^(?P<layer>.+?)(?P<ending>" + "|".join(f"(?:{ending})" for ending, _ in _PARTS) + r")$")
_TEXT_ENCODER_PREFIXES = ("lora_te_", "lora_te1_", "lora_te2_", "text_encoder.", "text_encoders.", "te.",
                          "text_model.", "lora_te_text_model")
TEXT_ENCODER_REASON = ("text-encoder key: not applied, GhostEdit applies LoRAs to the DiT only (the text "
                       "encoder is shared by every configuration and keeps its own weights)")


@dataclass
class ParsedLora:
    """A file's keys sorted out: {layer: {part: tensor}}, the formats seen, and each key not used with why.
    Kohya-style layer names (underscores for dots) are marked, to be resolved against the model's own names."""
    layers: dict[str, dict[str, torch.Tensor]] = field(default_factory=dict)
    underscored: set[str] = field(default_factory=set)
    formats: set[str] = field(default_factory=set)
    not_applied: dict[str, str] = field(default_factory=dict)   # key -> reason
    alphas: dict[str, float] = field(default_factory=dict)      # layer -> alpha from the header's metadata
    keys: dict[str, list[str]] = field(default_factory=dict)    # layer -> the file's keys for it


# ---- one function per format: the layer a key names, or None if the key is not of that format ----

def _diffusers(key: str) -> str | None:
    """diffusers/PEFT: transformer.<layer>.lora_A.weight / .lora_B.weight."""
    return key.removeprefix("transformer.") if key.startswith("transformer.") else None


def _ai_toolkit(key: str) -> str | None:
    """AI Toolkit (and ComfyUI's own saves): diffusion_model.<layer>.lora_A.weight / .lora_B.weight."""
    return key.removeprefix("diffusion_model.") if key.startswith("diffusion_model.") else None


def _kohya(key: str) -> str | None:
    """kohya sd-scripts and musubi-tuner: lora_unet_<layer with underscores>.lora_down.weight, .alpha."""
    for prefix in ("lora_unet_", "lora_transformer_"):
        if key.startswith(prefix):
            return key.removeprefix(prefix)
    return None


def _bare(key: str) -> str | None:
    """No prefix: DiffSynth (.lora_A.default.weight), the Lightning LoRAs (.lora_down/.lora_up with .alpha),
    plain PEFT saves, and `.lora.down`/`.diff` files keyed by the model's own names."""
    return key


_FORMATS = (("diffusers/PEFT", _diffusers), ("AI Toolkit", _ai_toolkit), ("kohya/musubi-tuner", _kohya),
            ("bare", _bare))


def _style(part: str, ending: str, prefixed: bool) -> str:
    """The format's name as reported, refined by the key's ending."""
    if ".lora_A.default" in ending or ".lora_B.default" in ending:
        return "DiffSynth"
    if ending.startswith((".lora.down", ".lora.up")):
        return ".lora.down/.lora.up"
    if part in ("diff", "diff_b"):
        return "full-weight delta (.diff/.diff_b)"
    if part == "lokr":
        return "LoKr"
    if part == "loha":
        return "LoHa"
    if ending.startswith((".lora_down", ".lora_up")) and not prefixed:
        return "Lightning (.lora_down/.lora_up, .alpha)"
    return ""


@dataclass(frozen=True)
class KeyRole:
    layer: str          # the layer's name in the file, its format's prefix removed
    part: str           # down, up, alpha, diff, diff_b, dora, or a LoKr/LoHa factor (lokr_w1, hada_w1_a...)
    format: str
    underscored: bool   # kohya: dots written as underscores


def key_role(key: str) -> KeyRole | str:
    """What a key of a LoRA file is, or the reason it is not applied."""
    if key.startswith(_TEXT_ENCODER_PREFIXES):
        return TEXT_ENCODER_REASON
    found = _PART.match(key)
    if found is None:
        return ("not a LoRA key GhostEdit knows (no lora_A/lora_B, lora_down/lora_up, alpha, diff, LoKr or LoHa "
                "ending)")
    ending = found["ending"]
    part = next(name for pattern, name in _PARTS if re.fullmatch(pattern, ending)) or ending[1:]
    if part == "dora":
        return "DoRA magnitude: DoRA is not supported (its update is not a weight delta)"
    kind = "lokr" if part.startswith("lokr_") else "loha" if part.startswith("hada_") else part
    name, layer = next((name, layer) for name, function in _FORMATS if (layer := function(found["layer"])))
    return KeyRole(layer, part, _style(kind, ending, name != "bare") or name, name == "kohya/musubi-tuner")


def parse_lora(state_dict: dict[str, torch.Tensor], metadata: dict[str, str] | None = None) -> ParsedLora:
    """Sorts every key of a LoRA file into a layer's part, or into not_applied with the reason."""
    parsed = ParsedLora()
    for key, tensor in state_dict.items():
        role = key_role(key)
        if isinstance(role, str):
            parsed.not_applied[key] = role
            continue
        if role.part != "alpha":  # an alpha says nothing of the format
            parsed.formats.add(role.format)
        if role.underscored:
            parsed.underscored.add(role.layer)
        parsed.layers.setdefault(role.layer, {})[role.part] = tensor
        parsed.keys.setdefault(role.layer, []).append(key)
    if "bare" in parsed.formats:
        parsed.formats.discard("bare")
        parsed.formats.add("PEFT (no prefix)")
    parsed.alphas = _metadata_alphas(parsed, metadata or {})
    return parsed


def _metadata_alphas(parsed: ParsedLora, metadata: dict[str, str]) -> dict[str, float]:
    """diffusers writes the PEFT LoraConfig of each component into the header as JSON (keys prefixed
    "transformer."): lora_alpha for every layer, alpha_pattern for some, and r / rank_pattern for their ranks.
    The factor that diffusers then applies is alpha / r, which is returned here as an alpha for the layer's rank."""
    raw = metadata.get("lora_adapter_metadata")
    if not raw:
        return {}
    try:
        config = json.loads(raw)
    except json.JSONDecodeError:
        return {}
    config = {key.removeprefix("transformer."): value for key, value in config.items()}
    if "lora_alpha" not in config:
        return {}
    alphas = {}
    for layer, parts in parsed.layers.items():
        if "down" not in parts or "alpha" in parts:
            continue
        alpha = _pattern_value(layer, config.get("alpha_pattern") or {}, config["lora_alpha"])
        rank = _pattern_value(layer, config.get("rank_pattern") or {}, config.get("r", parts["down"].shape[0]))
        alphas[layer] = float(alpha) / float(rank) * parts["down"].shape[0]
    return alphas


def _pattern_value(layer: str, patterns: dict, default):
    """PEFT's rule: a pattern applies to a module whose name is the pattern or ends with "." + the pattern."""
    for pattern, value in patterns.items():
        if re.fullmatch(rf"(.*\.)?(?:{pattern.lstrip('^')})", layer):
            return value
    return default


def kronecker_delta(parts: dict[str, torch.Tensor], alpha: float | None, device) -> torch.Tensor:
    """LoKr (LyCORIS, as ComfyUI applies it): kron(w1, w2), each factor whole or as a @ b; alpha / rank scales it
    when a factor is decomposed."""
    def factor(name):
        if name in parts:
            return parts[name].to(device, torch.float32)
        return parts[f"{name}_a"].to(device, torch.float32) @ parts[f"{name}_b"].to(device, torch.float32)
    if "lokr_t2" in parts:
        raise ValueError("LoKr with a Tucker core (lokr_t2) is for convolutions, not linear layers")
    rank = parts["lokr_w2_b"].shape[0] if "lokr_w2_b" in parts else \
        parts["lokr_w1_b"].shape[0] if "lokr_w1_b" in parts else None
    scale = alpha / rank if alpha is not None and rank else 1.0
    return torch.kron(factor("lokr_w1"), factor("lokr_w2")) * scale


def hadamard_delta(parts: dict[str, torch.Tensor], alpha: float | None, device) -> torch.Tensor:
    """LoHa (LyCORIS, as ComfyUI applies it): (w1a @ w1b) * (w2a @ w2b), times alpha / rank."""
    if "hada_t1" in parts or "hada_t2" in parts:
        raise ValueError("LoHa with Tucker cores (hada_t1/hada_t2) is for convolutions, not linear layers")
    w = {name: parts[name].to(device, torch.float32) for name in ("hada_w1_a", "hada_w1_b", "hada_w2_a", "hada_w2_b")}
    rank = w["hada_w1_b"].shape[0]
    scale = alpha / rank if alpha is not None else 1.0
    return (w["hada_w1_a"] @ w["hada_w1_b"]) * (w["hada_w2_a"] @ w["hada_w2_b"]) * scale
