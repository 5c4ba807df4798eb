"""An offline Qwen2.5-VL tokenizer + processor, built deterministically for GhostEdit's synthetic models.

The real Qwen tokenizer (151k tokens) cannot be downloaded here, so we train a small byte-level BPE with
Qwen2Tokenizer's own normalizer and pre-tokenizer on a fixed English corpus, append Qwen2.5-VL's special
tokens in Qwen's order, and save the files in the layout of a Qwen checkpoint's ``processor/`` folder:
vocab.json, merges.txt, tokenizer_config.json (special tokens in ``added_tokens_decoder``),
preprocessor_config.json and video_preprocessor_config.json. ``Qwen2Tokenizer.from_pretrained`` and
``Qwen2VLProcessor.from_pretrained`` load that folder with no download.
"""

import json
from pathlib import Path

from tokenizers import Regex, Tokenizer, models, normalizers, pre_tokenizers, trainers
from transformers import Qwen2Tokenizer, Qwen2VLImageProcessor, Qwen2VLProcessor
from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX
from transformers.models.qwen2_vl.video_processing_qwen2_vl import Qwen2VLVideoProcessor

# Qwen2-VL's own pixel limits (its image processor defaults to 28*28*1280; the released checkpoints use these).
QWEN_MIN_PIXELS = 56 * 56
QWEN_MAX_PIXELS = 28 * 28 * 16384

BPE_VOCAB_SIZE = 512  # 256 byte symbols + 256 merges

# Qwen2.5-VL's added tokens, in Qwen's id order (151643...151664 in the real tokenizer).
QWEN_ADDED_TOKENS = (
    "<|endoftext|>", "<|im_start|>", "<|im_end|>",
    "<|object_ref_start|>", "<|object_ref_end|>", "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>",
    "<|vision_start|>", "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>",
    "<tool_call>", "</tool_call>",
    "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>",
)
NOT_SPECIAL = {"<tool_call>", "</tool_call>"}  # Qwen marks these two as plain added tokens

# Qwen's templates and typical edit instructions, so that frequent words become single tokens.
CORPUS = """\
system
user
assistant
Describe the key features of the input image (color, shape, size, texture, objects, background), then explain how the user's text instruction should alter or modify the image.
Generate a new image that meets the user's requirements while maintaining consistency with the original input where appropriate.
Describe the image by detailing the color, shape, size, texture, quantity, text, spatial relationships of the objects and background:
Picture 1: the first image. Picture 2: the second image. Picture 3: the third image.
Make the sky blue and add a few white clouds above the mountains.
Replace the background with a sandy beach at sunset, keep the person unchanged.
Change the color of the car from red to green and make the wheels black.
Remove the person on the left and fill the area with grass and trees.
Add a red hat to the cat sitting on the wooden table near the window.
Turn the photo into a watercolor painting with soft edges and bright colors.
Put the dog from picture 2 next to the woman in picture 1, on the right side.
Make it look like a winter night with snow falling on the street and warm lights.
Write the text "OPEN" in large yellow letters on the sign above the door.
Change the style to an oil painting, with thick brush strokes and a dark background.
Make the man smile and give him glasses, keep his face and clothes the same.
Place the product from the second picture on the marble counter of the first one.
Brighten the image, increase the contrast and make the shadows less dark.
Replace the old wooden door with a modern glass door and a metal handle.
The small orange fish swims between green plants in a round glass bowl.
A tall building with many windows stands behind a quiet park with a lake.
Two children play with a ball on the grass while their parents watch from a bench.
The old book lies open on the desk, next to a cup of hot coffee and a lamp.
Keep the composition, the lighting and the perspective of the original photo.
Make the water clear and blue, and add a small boat with a white sail.
Convert the picture to black and white, but keep the flowers in bright pink.
Move the chair to the corner of the room and paint the walls light gray.
Add a rainbow over the hills and make the field full of yellow flowers.
Change the season from summer to autumn: the leaves should turn orange and brown.
"""


def train_bpe() -> Tokenizer:
    """A byte-level BPE with Qwen2Tokenizer's normalizer and pre-tokenizer, trained on CORPUS."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.normalizer = normalizers.NFC()
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    trainer = trainers.BpeTrainer(
        vocab_size=BPE_VOCAB_SIZE, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    tokenizer.train_from_iterator(CORPUS.splitlines(), trainer)
    return tokenizer


def tokenizer_config(first_added_id: int) -> dict:
    """tokenizer_config.json as Qwen2.5-VL ships it, with our ids."""
    added_tokens_decoder = {
        str(first_added_id + i): {
            "content": token, "lstrip": False, "normalized": False, "rstrip": False, "single_word": False,
            "special": token not in NOT_SPECIAL,
        }
        for i, token in enumerate(QWEN_ADDED_TOKENS)
    }
    return {
        "add_prefix_space": False,
        "added_tokens_decoder": added_tokens_decoder,
        "additional_special_tokens": list(QWEN_ADDED_TOKENS[1:14]),  # <|im_start|> ... <|video_pad|>
        "bos_token": None,
        "clean_up_tokenization_spaces": False,
        "eos_token": "<|im_end|>",
        "errors": "replace",
        "model_max_length": 131072,
        "pad_token": "<|endoftext|>",
        "split_special_tokens": False,
        "tokenizer_class": "Qwen2Tokenizer",
        "unk_token": None,
    }


def write_processor(folder: Path, min_pixels: int, max_pixels: int) -> None:
    """Write the tokenizer, image processor and video processor configs that Qwen2VLProcessor loads."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    bpe = train_bpe()
    bpe.model.save(str(folder))  # vocab.json + merges.txt
    config = tokenizer_config(first_added_id=bpe.get_vocab_size())
    (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    Qwen2VLImageProcessor(min_pixels=min_pixels, max_pixels=max_pixels).save_pretrained(folder)
    # As in Qwen's checkpoints; without it transformers 5 derives the video processor from the image config.
    Qwen2VLVideoProcessor().save_pretrained(folder)


def special_token_ids(folder_or_processor) -> dict:
    """Token ids a Qwen2.5-VL config needs, from a processor folder, a processor or a tokenizer.

    bos/eos follow Qwen2.5-VL's model config (bos = <|endoftext|>, eos = <|im_end|>), not the tokenizer's
    bos_token, which Qwen leaves unset.
    """
    if isinstance(folder_or_processor, (str, Path)):
        tokenizer = Qwen2Tokenizer.from_pretrained(str(folder_or_processor))
    else:
        tokenizer = getattr(folder_or_processor, "tokenizer", folder_or_processor)
    token_id = tokenizer.convert_tokens_to_ids
    return {
        "bos_token_id": token_id("<|endoftext|>"),
        "eos_token_id": token_id("<|im_end|>"),
        "pad_token_id": token_id("<|endoftext|>"),
        "vision_start_token_id": token_id("<|vision_start|>"),
        "vision_end_token_id": token_id("<|vision_end|>"),
        "vision_token_id": token_id("<|vision_pad|>"),
        "image_token_id": token_id("<|image_pad|>"),
        "video_token_id": token_id("<|video_pad|>"),
        "vocab_size": len(tokenizer),
    }


def load_processor(folder: Path) -> Qwen2VLProcessor:
    """The processor written by write_processor, loaded the way DiffSynth loads Qwen's."""
    return Qwen2VLProcessor.from_pretrained(str(folder))
