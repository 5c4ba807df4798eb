"""The embedded tiny Qwen-Image-Edit: deterministic files, DiffSynth's real loader and edit pipeline (with GhostEdit's
DiT forward and units, as the engine runs it), LoRAs."""

import hashlib
import socket
import time

import numpy as np
import pytest
import torch
from PIL import Image
from safetensors import safe_open
from safetensors.torch import load_file
from transformers import Qwen2VLProcessor

from ghostedit.models import tiny
from ghostedit.models.family import TINY, exact_pipeline
from ghostedit.models.dtypes import apply_component_dtypes, component_dtypes
from ghostedit.models.processor import special_token_ids

EDIT_DROP_IDX = 64  # DiffSynth drops this many leading tokens of the edit template (QwenImageUnit_PromptEmbedder)
DEFAULT_EDIT = dict(
    prompt="Make the sky blue and add a red hat", height=256, width=256, num_inference_steps=4, cfg_scale=4,
    seed=0, edit_image_auto_resize=False, progress_bar_cmd=lambda steps: steps,
)


@pytest.fixture(scope="session")
def ghostedit_home():
    """The session's home (conftest.py): the tiny model is generated there once."""
    from ghostedit.paths import ghostedit_home
    return ghostedit_home()


def _refuse_network(*args, **kwargs):
    raise AssertionError(f"the tiny model must load offline, but a connection was attempted: {args}")


@pytest.fixture(scope="module")
def pipe(ghostedit_home):
    """DiffSynth's pipeline as the engine runs it on a CPU: loaded in bf16, the text encoder and VAE then in float32
    (models/dtypes.py: the VAE's 3-D convolutions have no fast bf16 path on a CPU)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(socket.socket, "connect", _refuse_network)
        pipe = exact_pipeline(tiny.load_tiny_pipeline("cpu", torch.bfloat16), TINY)
    apply_component_dtypes(pipe, component_dtypes("cpu"))
    return pipe


def _image(width=256, height=256, seed=0) -> Image.Image:
    pixels = np.random.default_rng(seed).integers(0, 256, (height // 16, width // 16, 3), dtype=np.uint8)
    return Image.fromarray(pixels).resize((width, height), Image.BILINEAR)


def _edit(pipe, **overrides) -> np.ndarray:
    result = pipe(**{**DEFAULT_EDIT, "edit_image": [_image()], **overrides})
    assert result.size == (256, 256)
    return np.asarray(result, dtype=np.float32)


def _timed_edit(pipe) -> tuple[np.ndarray, float]:
    start = time.perf_counter()
    image = _edit(pipe)
    return image, time.perf_counter() - start


def _file_hashes(folder):
    return {p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def test_generation_is_deterministic_and_reused(tmp_path):
    first = tiny.ensure_tiny_model(tmp_path / "first")
    second = tiny.ensure_tiny_model(tmp_path / "second")
    assert set(_file_hashes(first)) >= {"dit.safetensors", "text_encoder.safetensors", "vae.safetensors",
                                        "processor/vocab.json", "processor/merges.txt",
                                        "processor/tokenizer_config.json", "processor/preprocessor_config.json",
                                        "processor/video_preprocessor_config.json"}
    assert _file_hashes(first) == _file_hashes(second)
    mtime = (first / "dit.safetensors").stat().st_mtime_ns
    assert tiny.ensure_tiny_model(first) == first
    assert (first / "dit.safetensors").stat().st_mtime_ns == mtime
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no staging dir left


def test_sizes_match_the_documented_constants(ghostedit_home):
    folder = tiny.ensure_tiny_model()
    assert folder == ghostedit_home / tiny.TINY_MODEL_NAME
    for component, name in tiny.FILES.items():
        with safe_open(folder / name, framework="pt") as weights:
            assert all(weights.get_slice(k).get_dtype() == "BF16" for k in weights.keys())
            params = sum(int(np.prod(weights.get_slice(k).get_shape())) for k in weights.keys())
        assert params == tiny.TINY_PARAM_COUNTS[component]
        assert (folder / name).stat().st_size == tiny.TINY_FILE_BYTES[component]
    processor_bytes = sum(p.stat().st_size for p in (folder / tiny.PROCESSOR_DIR).iterdir())
    assert processor_bytes == tiny.TINY_FILE_BYTES["processor"]


def test_from_pretrained_loads_the_tiny_models(pipe):
    assert type(pipe.dit) is tiny.TinyQwenImageDiT
    assert type(pipe.text_encoder) is tiny.TinyQwenImageTextEncoder
    assert sum(p.numel() for p in pipe.vae.parameters()) == tiny.TINY_PARAM_COUNTS["vae"]
    assert isinstance(pipe.processor, Qwen2VLProcessor)
    assert pipe.processor.image_processor.size.longest_edge == tiny.TINY_MAX_PIXELS
    ids = special_token_ids(pipe.processor)
    config = pipe.text_encoder.config
    assert config.image_token_id == ids["image_token_id"]
    assert config.vision_start_token_id == ids["vision_start_token_id"]
    assert config.text_config.vocab_size == ids["vocab_size"]
    assert pipe.dit.img_in.weight.dtype == torch.bfloat16


def test_registration_is_idempotent(pipe):
    from diffsynth.configs import MODEL_CONFIGS
    from diffsynth.core.loader import hash_model_file

    folder = tiny.ensure_tiny_model()
    tiny.register_tiny_models(folder)
    tiny.register_tiny_models(folder)
    hashes = [hash_model_file(str(folder / name)) for name in tiny.FILES.values()]
    assert [sum(c["model_hash"] == h for c in MODEL_CONFIGS) for h in hashes] == [1, 1, 1]


def test_default_edit_is_seeded(pipe):
    first, first_seconds = _timed_edit(pipe)
    again, again_seconds = _timed_edit(pipe)
    print(f"\ntiny edit 256x256, 4 steps, CFG 4, CPU dtypes: first {first_seconds:.2f} s, then {again_seconds:.2f} s")
    assert np.array_equal(first, again)
    assert 10 < first.std() < 100  # neither flat nor saturated
    assert np.abs(first - _edit(pipe, seed=1)).mean() > 5


def test_output_follows_prompt_and_edit_image(pipe):
    base = _edit(pipe)
    assert np.abs(base - _edit(pipe, prompt="Turn it into a watercolor painting")).mean() > 0.5
    assert np.abs(base - _edit(pipe, edit_image=[_image(seed=1)])).mean() > 0.5


@pytest.mark.parametrize("sizes", [[(256, 256)], [(256, 256), (128, 192)], [(256, 256), (192, 128), (128, 128)]])
def test_one_to_three_edit_images(pipe, sizes):
    images = [_image(w, h, seed=i) for i, (w, h) in enumerate(sizes)]
    assert _edit(pipe, edit_image=images).shape == (256, 256, 3)


def test_edit_system_prompt_outlasts_the_dropped_tokens(pipe):
    from diffsynth.pipelines.qwen_image import QwenImageUnit_PromptEmbedder

    processor, calls = pipe.processor, []

    class RecordingProcessor:
        def __call__(self, text, **kwargs):
            calls.append((text[0], processor(text=text, **kwargs)))
            return calls[-1][1]

    pipe.processor = RecordingProcessor()
    try:
        (embedding,) = QwenImageUnit_PromptEmbedder().encode_prompt_edit_multi(pipe, ["Make it red"], [_image()])
    finally:
        pipe.processor = processor
    [(text, inputs)] = calls
    template_prefix = text.split("Picture 1:")[0]  # system prompt + "<|im_start|>user\n"
    assert len(processor.tokenizer(template_prefix).input_ids) > EDIT_DROP_IDX
    assert embedding.shape[0] == inputs.input_ids.shape[1] - EDIT_DROP_IDX


def _peft_deltas(path):
    weights = load_file(path)
    return {key.removesuffix(".lora_B.weight"): weights[key].float() @ weights[key.replace("lora_B", "lora_A")].float()
            for key in weights if key.endswith(".lora_B.weight")}


def _kohya_deltas(path):
    weights = load_file(path)
    deltas = {}
    for key in weights:
        if key.endswith(".lora_up.weight"):
            module = key.removesuffix(".lora_up.weight")
            down, up = weights[f"{module}.lora_down.weight"].float(), weights[key].float()
            deltas[module] = weights[f"{module}.alpha"].float() / down.shape[0] * (up @ down)
    return deltas


def test_peft_and_kohya_loras_encode_the_same_deltas(ghostedit_home):
    peft = _peft_deltas(tiny.ensure_tiny_lora("peft"))
    kohya_path = tiny.ensure_tiny_lora("kohya")
    kohya = _kohya_deltas(kohya_path)
    alphas = [w for k, w in load_file(kohya_path).items() if k.endswith(".alpha")]
    assert alphas and all(w.ndim == 0 and w.item() == tiny.LORA_RANK / 2 for w in alphas)
    assert len(peft) == tiny.DIT_LAYERS * len(tiny.LORA_TARGETS)
    assert "transformer_blocks.0.attn.to_q" in peft and "lora_unet_transformer_blocks_0_attn_to_q" in kohya
    assert {"lora_unet_" + name.replace(".", "_") for name in peft} == set(kohya)
    for name, delta in peft.items():
        assert torch.equal(delta, kohya["lora_unet_" + name.replace(".", "_")])
    with pytest.raises(ValueError):
        tiny.ensure_tiny_lora("lycoris")


@pytest.mark.filterwarnings("ignore:Alpha detected in the LoRA file")
def test_lora_changes_the_edit_visibly(pipe):
    from diffsynth.utils.lora.general import GeneralLoRALoader

    lora = load_file(tiny.ensure_tiny_lora("peft"))
    dit_modules = dict(pipe.dit.named_modules())
    assert all(key.rsplit(".lora_", 1)[0] in dit_modules for key in lora)
    base = _edit(pipe)
    original = {k: v.clone() for k, v in pipe.dit.state_dict().items()}
    try:
        pipe.load_lora(pipe.dit, state_dict=lora, alpha=1)
        with_lora = _edit(pipe)
    finally:
        pipe.dit.load_state_dict(original)
    assert 3 < np.abs(with_lora - base).mean() < 30
    assert 10 < with_lora.std() < 100

    foreign = GeneralLoRALoader().convert_state_dict(load_file(tiny.ensure_foreign_lora()))
    assert foreign and not {key.rsplit(".lora_", 1)[0] for key in foreign} & set(dit_modules)
