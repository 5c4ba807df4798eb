"""Model sources: each kind resolves to its kind; a local folder is recognised from its own configs (released layout,
see reference_checkpoints.py) and one without that layout is refused, naming what is missing, before anything loads.
Editing from such folders is held against diffusers in test_reference.py."""
import pytest
from ghostedit.models import resolve
from ghostedit.models.family import UnsupportedModel

from reference_checkpoints import build


def test_sources_resolve_to_their_kind(tmp_path):
    assert resolve("tiny").kind == "tiny"
    assert resolve("synthetic").kind == "synthetic"
    assert resolve(str(build(tmp_path, "Qwen-Image-Edit-2509"))).kind == "local"
    assert resolve("Qwen/Qwen-Image-Edit-2509").kind == "hub"
    assert resolve("modelscope:Qwen/Qwen-Image-Edit-2509").kind == "hub"


def test_local_folder_without_the_layout_is_refused_clearly(tmp_path):
    (tmp_path / "transformer").mkdir()
    with pytest.raises(UnsupportedModel, match=r"not a Qwen-Image model folder: it has no model_index.json"):
        resolve(str(tmp_path))
