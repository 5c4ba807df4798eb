"""An offline Qwen3-VL processor (tokenizer, image and video processors, chat template) for GhostEdit's own 2.1
models (the tiny and the synthetic one) and for the tiny checkpoints the tests build in the released layout.

Qwen-Image-2.1's text encoder is Qwen3-VL: its processor cuts images into 16-pixel patches merged 2x2 (one image
token per 32x32 pixels, which is four of the DiT's latent tokens: the VAE compresses 16x), and its template is
rendered by the processor's chat template, whose system turn sets how many leading tokens the pipelines drop. The
tokenizer is processor.py's small byte-level BPE with Qwen's special tokens (the real vocabulary of 151k tokens
cannot be downloaded here). Files are written in the layout transformers 4.x saves (preprocessor_config.json,
video_preprocessor_config.json, chat_template.json beside the tokenizer's), which the released repos carry.
"""
from __future__ import annotations

import json
from pathlib import Path

from transformers import AutoProcessor, Qwen2VLImageProcessor
from transformers.models.qwen3_vl.video_processing_qwen3_vl import Qwen3VLVideoProcessor

from ..processor import write_processor as write_tokenizer

PATCH_SIZE = 16   # the vision tower's patches, merged MERGE_SIZE x MERGE_SIZE into one image token
MERGE_SIZE = 2
# Qwen3-VL's pixel limits (its preprocessor_config.json: 256x256 to 4096x4096)
QWEN3_VL_MIN_PIXELS = 256 * 256
QWEN3_VL_MAX_PIXELS = 4096 * 4096

# Qwen3-VL's chat template for the messages the pipelines render (system, user and assistant turns of text, images
# and videos): each turn "<|im_start|>{role}\n{content}<|im_end|>\n", an image as its vision placeholder
CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' -}}"
    "{%- if message['content'] is string -%}{{- message['content'] -}}"
    "{%- else -%}{%- for content in message['content'] -%}"
    "{%- if content['type'] == 'image' or 'image' in content -%}"
    "{{- '<|vision_start|><|image_pad|><|vision_end|>' -}}"
    "{%- elif content['type'] == 'video' or 'video' in content -%}"
    "{{- '<|vision_start|><|video_pad|><|vision_end|>' -}}"
    "{%- elif 'text' in content -%}{{- content['text'] -}}{%- endif -%}"
    "{%- endfor -%}{%- endif -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)


def write_processor(folder: Path, min_pixels: int = QWEN3_VL_MIN_PIXELS, max_pixels: int = QWEN3_VL_MAX_PIXELS):
    """A Qwen3-VL processor folder that `AutoProcessor.from_pretrained` loads with no download."""
    folder = Path(folder)
    write_tokenizer(folder, min_pixels, max_pixels)  # the tokenizer's files; its Qwen2-VL image configs replaced below
    image_processor = Qwen2VLImageProcessor(patch_size=PATCH_SIZE, merge_size=MERGE_SIZE, temporal_patch_size=2,
                                            min_pixels=min_pixels, max_pixels=max_pixels,
                                            image_mean=[0.5, 0.5, 0.5], image_std=[0.5, 0.5, 0.5])
    image_processor.save_pretrained(folder)
    Qwen3VLVideoProcessor().save_pretrained(folder)
    for name in ("preprocessor_config.json", "video_preprocessor_config.json"):
        config = json.loads((folder / name).read_text())
        config["processor_class"] = "Qwen3VLProcessor"
        (folder / name).write_text(json.dumps(config, indent=2) + "\n")
    (folder / "chat_template.json").write_text(json.dumps({"chat_template": CHAT_TEMPLATE}, indent=2) + "\n")


def load_processor(folder: Path):
    """The processor of a folder written by write_processor (or a released one), as DiffSynth loads it."""
    return AutoProcessor.from_pretrained(str(folder))
