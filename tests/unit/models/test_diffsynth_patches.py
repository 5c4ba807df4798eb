"""GhostEdit's changes inside DiffSynth are listed in one module and hold only for the DiffSynth they were written
for: another version stops at start with an error that names them. The DiT's forward is GhostEdit's own: nothing of
DiffSynth's DiT module is replaced."""
import pytest

from ghostedit import diffsynth_patches
from ghostedit.engine import Engine


def test_what_is_left_is_what_diffsynths_pipeline_and_loader_need():
    assert len(diffsynth_patches.PATCHES) <= 4
    for name, patch in diffsynth_patches.PATCHES.items():
        assert patch.module.startswith("diffsynth.") and patch.attribute and patch.why, name
        assert patch.module != "diffsynth.models.qwen_image_dit", name


def test_diffsynths_dit_module_is_left_as_released(engine):
    """Loading and running an edit replaces nothing in DiffSynth's DiT module."""
    from diffsynth.models import qwen_image_dit
    before = dict(vars(qwen_image_dit))
    engine.load()
    assert dict(vars(qwen_image_dit)) == before
    from ghostedit.models.qwen_image.dit import QwenImageDiT
    assert isinstance(engine.load().dit, QwenImageDiT)


def test_another_diffsynth_version_is_refused_at_start(monkeypatch):
    monkeypatch.setattr(diffsynth_patches, "package_version", lambda name: "2.2.0")
    with pytest.raises(diffsynth_patches.DiffSynthVersionError,
                       match=rf"changes DiffSynth 2\.1\.12 in {len(diffsynth_patches.PATCHES)} places "
                             r"\(model table, .*2\.2\.0 is installed"):
        Engine("tiny", device="cpu")
