"""Model sources: a local folder in Qwen-Image-Edit-2509's layout loads through the same code as downloaded weights."""
import shutil

import numpy as np
import pytest
from ghostedit import EditRequest
from ghostedit.engine import Engine
from ghostedit.models import resolve
from ghostedit.models.tiny import FILES, PROCESSOR_DIR, ensure_tiny_model, register_tiny_models

# Where Qwen's repos keep each part, as ghostedit.models.hub expects them
REPO_LAYOUT = {"dit": "transformer/diffusion_pytorch_model.safetensors", "text_encoder": "text_encoder/model.safetensors",
               "vae": "vae/diffusion_pytorch_model.safetensors"}


def make_local_folder(tmp_path):
    tiny = ensure_tiny_model()
    register_tiny_models(tiny)  # real weights are in DiffSynth's table already; the tiny classes are not
    for part, relative in REPO_LAYOUT.items():
        (tmp_path / relative).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(tiny / FILES[part], tmp_path / relative)
    for folder in ("processor", "tokenizer"):
        shutil.copytree(tiny / PROCESSOR_DIR, tmp_path / folder)
    return tmp_path


def test_local_folder_edits_like_the_same_weights_from_the_tiny_source(tmp_path, house, engine):
    folder = make_local_folder(tmp_path)
    local = Engine(str(folder), device="cpu")
    assert local.spec.kind == "local"
    request = EditRequest(images=[house], prompt="make it night", width=128, height=128, steps=2, seed=3)
    from_folder = local.run(request)
    from_tiny = engine.run(request)
    assert from_folder.image.size == (128, 128)
    assert np.array_equal(np.asarray(from_folder.image), np.asarray(from_tiny.image))


def test_local_folder_without_the_layout_is_refused_clearly(tmp_path, house):
    (tmp_path / "transformer").mkdir()
    local = Engine(str(tmp_path), device="cpu")
    with pytest.raises(FileNotFoundError, match=r"transformer/diffusion_pytorch_model.*layout"):
        local.run(EditRequest(images=[house], prompt="make it night", width=64, height=64, steps=1))


def test_sources_resolve_to_their_kind(tmp_path):
    assert resolve("tiny").kind == "tiny"
    assert resolve("synthetic").kind == "synthetic"
    assert resolve(str(tmp_path)).kind == "local"
    assert resolve("Qwen/Qwen-Image-Edit-2509").kind == "hub"
    assert resolve("modelscope:Qwen/Qwen-Image-Edit-2509").kind == "hub"
