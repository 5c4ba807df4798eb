"""The embedded tiny Qwen-Image-Edit: DiffSynth's own model classes at miniature size, random but deterministic.

It lets GhostEdit (tests, CI, CPU-only machines) run the real DiffSynth edit pipeline end to end with no
download: the files are generated on first use, registered in DiffSynth's model table by the hash DiffSynth
computes (with GhostEdit's DiT and VAE classes, as real weights are), and loaded through
``QwenImagePipeline.from_pretrained`` exactly as real weights are.
"""

from pathlib import Path

import torch
from diffsynth.core.loader import ModelConfig, hash_model_file
from diffsynth.models.qwen_image_dit import QwenImageDiT as DiffSynthDiT
from diffsynth.models.qwen_image_text_encoder import QwenImageTextEncoder
from diffsynth.models.qwen_image_vae import QwenImageVAE
from diffsynth.pipelines.qwen_image import QwenImagePipeline
from safetensors.torch import save_file
from transformers import Qwen2_5_VLConfig

from ..diffsynth_patches import check_version
from ..paths import generated_once, ghostedit_home, write_atomically  # ghostedit_home: $GHOSTEDIT_HOME or ~/.cache/ghostedit
from .checkpoint import ConfiguredTextEncoder, enter_model
from .exact import ReferenceScaledVAE
from .processor import special_token_ids, write_processor
from .qwen_image.dit import QwenImageDiT

TINY_MODEL_NAME = "tiny-v2"  # bump whenever the generated files change: caches keep old versions
SEED = 20260101

# DiT: 64 wide, 2 heads x 32, 2 blocks; rope axes are even and sum to the head dim.
DIT_HEADS = 2
DIT_HEAD_DIM = 32
DIT_LAYERS = 2
DIT_ROPE_AXES = [8, 12, 12]
DIT_INIT_STD = 0.1
# Random q/k are near-orthogonal: with unit qk-norm gains attention is almost uniform over all tokens and
# the output barely depends on the prompt or edit image. Gain 3 makes it peaked, as in a trained model.
DIT_QK_NORM_GAIN = 3.0

# Text encoder: Qwen2.5-VL with a 2-layer LM (hidden = DiT text dim) and a 2-block vision tower.
TEXT_HIDDEN = 64
TEXT_LAYERS = 2
TEXT_HEADS = 2  # head dim 32; mrope_section sums to half of it
TEXT_MROPE_SECTION = [4, 6, 6]
VISION_DIM = 32
VISION_DEPTH = 2

# The VAE dominates a tiny edit (its full-resolution stage); base width 8 halves the edit time of width 16.
VAE_KWARGS = {"base_dim": 8, "z_dim": 16, "num_res_blocks": 1}

# The text encoder's vision tower sees at most 8x8 patches of 14 px (16 tokens after the 2x2 merge).
TINY_MIN_PIXELS = 56 * 56
TINY_MAX_PIXELS = 112 * 112

FILES = {"dit": "dit.safetensors", "text_encoder": "text_encoder.safetensors", "vae": "vae.safetensors"}
PROCESSOR_DIR = "processor"

# What the generated files hold (checked by tests/unit/models/test_tiny_model.py).
TINY_PARAM_COUNTS = {"dit": 340_480, "text_encoder": 226_272, "vae": 668_043}
TINY_FILE_BYTES = {"dit": 688_864, "text_encoder": 458_744, "vae": 1_351_638, "processor": 12_137}

LORA_RANK = 4
LORA_ALPHA = LORA_RANK / 2  # kohya files carry it; the delta is scaled by alpha / rank
LORA_STD = 0.25  # an edit with the LoRA at scale 1 moves pixels by ~8 levels on average
LORA_TARGETS = (
    "attn.to_q", "attn.to_k", "attn.to_v", "attn.to_out.0",
    "attn.add_q_proj", "attn.add_k_proj", "attn.add_v_proj", "attn.to_add_out",
    "img_mlp.net.0.proj", "img_mlp.net.2", "txt_mlp.net.0.proj", "txt_mlp.net.2",
)


class TinyQwenImageDiT(QwenImageDiT):
    """GhostEdit's QwenImageDiT at width 64, computing as the released model does."""

    def __init__(self):
        super().__init__(num_layers=DIT_LAYERS, num_attention_heads=DIT_HEADS, attention_head_dim=DIT_HEAD_DIM,
                         joint_attention_dim=TEXT_HIDDEN, axes_dims_rope=DIT_ROPE_AXES)


class TinyQwenImageTextEncoder(ConfiguredTextEncoder):
    """QwenImageTextEncoder on a tiny Qwen2.5-VL whose token ids are those of the tiny tokenizer."""

    def __init__(self, token_ids: dict):
        super().__init__(tiny_text_encoder_config(token_ids))


def tiny_text_encoder_config(token_ids: dict) -> Qwen2_5_VLConfig:
    ids = {k: v for k, v in token_ids.items() if k != "vocab_size"}
    return Qwen2_5_VLConfig(
        text_config={
            "hidden_size": TEXT_HIDDEN, "intermediate_size": 2 * TEXT_HIDDEN, "num_hidden_layers": TEXT_LAYERS,
            "num_attention_heads": TEXT_HEADS, "num_key_value_heads": 1, "rms_norm_eps": 1e-6,
            "max_position_embeddings": 4096, "rope_theta": 1000000.0,
            "rope_scaling": {"mrope_section": TEXT_MROPE_SECTION, "rope_type": "default"},
            "vocab_size": token_ids["vocab_size"], **ids,
        },
        vision_config={
            "depth": VISION_DEPTH, "hidden_size": VISION_DIM, "intermediate_size": 2 * VISION_DIM,
            "num_heads": 2, "out_hidden_size": TEXT_HIDDEN, "fullatt_block_indexes": [VISION_DEPTH - 1],
            "patch_size": 14, "spatial_merge_size": 2, "temporal_patch_size": 2, "window_size": 112,
        },
        **ids,
    )


def _atomic_save_file(tensors: dict, path: Path) -> None:
    write_atomically(path, lambda temporary: save_file({k: v.contiguous() for k, v in tensors.items()}, temporary))


def _bf16_state_dict(module: torch.nn.Module) -> dict:
    return {k: v.detach().to(torch.bfloat16) for k, v in module.state_dict().items()}


def build_tiny_dit() -> TinyQwenImageDiT:
    dit = TinyQwenImageDiT()
    # Every Linear (weights and biases) normal: biases make the modulation (scale/shift/gate) non-trivial.
    generator = torch.Generator().manual_seed(SEED)
    with torch.no_grad():
        for module in dit.modules():
            if isinstance(module, torch.nn.Linear):
                for param in (module.weight, module.bias):
                    param.copy_(torch.randn(param.shape, generator=generator) * DIT_INIT_STD)
        for block in dit.transformer_blocks:
            for norm in (block.attn.norm_q, block.attn.norm_k, block.attn.norm_added_q, block.attn.norm_added_k):
                norm.weight.fill_(DIT_QK_NORM_GAIN)
    return dit


def build_tiny_text_encoder(token_ids: dict) -> TinyQwenImageTextEncoder:
    with torch.random.fork_rng(devices=[]):  # seed the default init without touching the caller's RNG
        torch.manual_seed(SEED + 1)
        return TinyQwenImageTextEncoder(token_ids)  # transformers' init: normal(0, 0.02)


def build_tiny_vae() -> QwenImageVAE:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(SEED + 2)
        return QwenImageVAE(**VAE_KWARGS)  # PyTorch's default (fan-in scaled) init


def generate_tiny_model(folder: Path) -> None:
    folder = Path(folder)
    write_processor(folder / PROCESSOR_DIR, TINY_MIN_PIXELS, TINY_MAX_PIXELS)
    token_ids = special_token_ids(folder / PROCESSOR_DIR)
    save_file(_bf16_state_dict(build_tiny_dit()), folder / FILES["dit"])
    save_file(_bf16_state_dict(build_tiny_text_encoder(token_ids)), folder / FILES["text_encoder"])
    save_file(_bf16_state_dict(build_tiny_vae()), folder / FILES["vae"])


def ensure_tiny_model(folder: Path | None = None) -> Path:
    """Generate the tiny model on first use (once, safely: paths.generated_once) and return its folder."""
    return generated_once(Path(folder) if folder is not None else ghostedit_home() / TINY_MODEL_NAME,
                          generate_tiny_model)


def register_tiny_models(folder: Path) -> None:
    """Add the tiny classes to DiffSynth's model table, keyed by the hash DiffSynth computes for each file (the
    "model table" patch of ghostedit/diffsynth_patches.py; checkpoint.enter_model). Idempotent."""
    check_version()
    folder = Path(folder)
    entries = {
        "dit": ("qwen_image_dit", TinyQwenImageDiT, DiffSynthDiT, {}),
        "text_encoder": ("qwen_image_text_encoder", TinyQwenImageTextEncoder, QwenImageTextEncoder,
                         {"token_ids": special_token_ids(folder / PROCESSOR_DIR)}),
        "vae": ("qwen_image_vae", ReferenceScaledVAE, QwenImageVAE, VAE_KWARGS),
    }
    for component, (model_name, tiny_class, real_class, extra_kwargs) in entries.items():
        enter_model(hash_model_file(str(folder / FILES[component])), model_name, tiny_class, real_class,
                    extra_kwargs)


def tiny_model_configs(folder: Path, **options) -> list[ModelConfig]:
    """ModelConfigs for the three tiny files; options (offload, quantize...) go to each."""
    return [ModelConfig(path=str(Path(folder) / name), **options) for name in FILES.values()]


def load_tiny_pipeline(device: str, torch_dtype: torch.dtype):
    """The tiny model through DiffSynth's real loader; path= configs never download."""
    folder = ensure_tiny_model()
    register_tiny_models(folder)
    processor_config = ModelConfig(path=str(folder / PROCESSOR_DIR))
    return QwenImagePipeline.from_pretrained(
        torch_dtype=torch_dtype, device=device, model_configs=tiny_model_configs(folder),
        tokenizer_config=processor_config, processor_config=processor_config,
    )


def tiny_lora_deltas() -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """The tiny LoRA as {DiT module name: (A [rank, in], B [out, rank])}: delta W = B @ A."""
    modules = dict(TinyQwenImageDiT().named_modules())
    generator = torch.Generator().manual_seed(SEED + 3)
    deltas = {}
    for block in range(DIT_LAYERS):
        for target in LORA_TARGETS:
            name = f"transformer_blocks.{block}.{target}"
            out_features, in_features = modules[name].weight.shape
            down = torch.randn(LORA_RANK, in_features, generator=generator) * LORA_STD
            up = torch.randn(out_features, LORA_RANK, generator=generator) * LORA_STD
            deltas[name] = (down, up)
    return deltas


def _check_lora_style(style: str) -> None:
    if style not in ("peft", "kohya"):
        raise ValueError(f"unknown LoRA style {style!r}: expected 'peft' or 'kohya'")


def tiny_lora_state_dict(style: str) -> dict[str, torch.Tensor]:
    """The tiny LoRA keyed like real Qwen-Image LoRAs; both styles encode the same delta W.

    "peft": DiffSynth/PEFT names without a prefix, ``transformer_blocks.0.attn.to_q.lora_A.weight`` (A) and
    ``.lora_B.weight`` (B); delta W = B @ A (what ``pipe.load_lora`` fuses as is).
    "kohya": ``lora_unet_transformer_blocks_0_attn_to_q.lora_down.weight`` (down), ``.lora_up.weight`` (up)
    and ``.alpha`` (a scalar, rank / 2); delta W = (alpha / rank) * up @ down. So down = A and
    up = (rank / alpha) * B, exact in bf16 because rank / alpha is a power of two.
    """
    _check_lora_style(style)
    state_dict = {}
    for name, (down, up) in tiny_lora_deltas().items():
        if style == "peft":
            state_dict[f"{name}.lora_A.weight"] = down
            state_dict[f"{name}.lora_B.weight"] = up
        else:
            key = "lora_unet_" + name.replace(".", "_")
            state_dict[f"{key}.lora_down.weight"] = down
            state_dict[f"{key}.lora_up.weight"] = up * (LORA_RANK / LORA_ALPHA)
            state_dict[f"{key}.alpha"] = torch.tensor(LORA_ALPHA)
    return {k: v.to(torch.bfloat16) for k, v in state_dict.items()}


def ensure_tiny_lora(style: str, folder: Path | None = None) -> Path:
    """A rank-4 LoRA for the tiny DiT (attention projections and MLPs of every block), generated once."""
    _check_lora_style(style)  # before any path is made from it
    path = Path(folder or ghostedit_home() / f"{TINY_MODEL_NAME}-loras") / f"tiny_lora_{style}.safetensors"
    if not path.is_file():
        _atomic_save_file(tiny_lora_state_dict(style), path)
    return path


def ensure_foreign_lora(folder: Path | None = None) -> Path:
    """An SDXL-keyed LoRA (UNet and text-encoder layers) that matches no layer of the tiny DiT."""
    path = Path(folder or ghostedit_home() / f"{TINY_MODEL_NAME}-loras") / "foreign_lora_sdxl.safetensors"
    if path.is_file():
        return path
    generator = torch.Generator().manual_seed(SEED + 4)
    layers = {
        "lora_unet_down_blocks_1_attentions_0_transformer_blocks_0_attn1_to_q": (640, 640),
        "lora_unet_down_blocks_1_attentions_0_transformer_blocks_0_attn2_to_k": (640, 2048),
        "lora_unet_mid_block_attentions_0_transformer_blocks_0_ff_net_2": (1280, 5120),
        "lora_te1_text_model_encoder_layers_0_self_attn_q_proj": (768, 768),
    }
    state_dict = {}
    for key, (out_features, in_features) in layers.items():
        state_dict[f"{key}.lora_down.weight"] = torch.randn(LORA_RANK, in_features, generator=generator) * 0.01
        state_dict[f"{key}.lora_up.weight"] = torch.randn(out_features, LORA_RANK, generator=generator) * 0.01
        state_dict[f"{key}.alpha"] = torch.tensor(LORA_ALPHA)
    _atomic_save_file({k: v.to(torch.bfloat16) for k, v in state_dict.items()}, path)
    return path
