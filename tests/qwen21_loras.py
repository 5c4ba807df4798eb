"""LoRAs for the tiny Qwen-Image-2.1 in each key format published for 2.1 (diffusers/PEFT, DiffSynth, ComfyUI)."""
import torch
from safetensors.torch import save_file

from ghostedit.models.qwen_image_21 import tiny
from ghostedit.models.qwen_image_21.dit import QwenImage21DiT

LORA_TARGETS = ("attn.to_q", "attn.to_k", "attn.to_v", "attn.to_out.0", "img_mlp.proj", "img_mlp.gate_layer",
                "img_mlp.out")


def qwen21_lora_file(folder, style: str):
    """A rank-4 LoRA on every block's attention and feed-forward of the tiny 2.1, keyed as `style` publishes it:
    diffusers/PEFT (`transformer.` prefix), DiffSynth (no prefix) or ComfyUI (`diffusion_model.` with
    lora_down/lora_up and alpha)."""
    modules = dict(QwenImage21DiT(**tiny.TRANSFORMER).named_modules())
    generator = torch.Generator().manual_seed(11)
    tensors = {}
    for block in range(tiny.TRANSFORMER["num_layers"]):
        for target in LORA_TARGETS:
            name = f"transformer_blocks.{block}.{target}"
            out_features, in_features = modules[name].weight.shape
            down = torch.randn(4, in_features, generator=generator) * 0.3
            up = torch.randn(out_features, 4, generator=generator) * 0.3
            if style == "comfyui":
                tensors[f"diffusion_model.{name}.lora_down.weight"] = down
                tensors[f"diffusion_model.{name}.lora_up.weight"] = up
                tensors[f"diffusion_model.{name}.alpha"] = torch.tensor(4.0)
            else:
                prefix = "transformer." if style == "diffusers" else ""
                tensors[f"{prefix}{name}.lora_A.weight"] = down
                tensors[f"{prefix}{name}.lora_B.weight"] = up
    path = folder / f"lora-2.1-{style}.safetensors"
    save_file({key: value.to(torch.bfloat16) for key, value in tensors.items()}, str(path))
    return path
