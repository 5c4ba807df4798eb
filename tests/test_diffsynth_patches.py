"""GhostEdit's changes inside DiffSynth are listed in one module and hold only for the DiffSynth they were written
for: another version stops at start with an error that names them."""
import pytest

from ghostedit import diffsynth_patches
from ghostedit.engine import Engine


def test_every_patch_names_what_it_changes_and_the_replacements_are_in_place():
    from diffsynth.models import qwen_image_dit

    from ghostedit.optimize import attention, rewrites
    attention.install()
    rewrites.install()
    assert qwen_image_dit.qwen_image_flash_attention is attention._dispatching_attention
    assert qwen_image_dit.apply_rotary_emb_qwen is rewrites._rotary
    for name, patch in diffsynth_patches.PATCHES.items():
        assert patch.module.startswith("diffsynth.") and patch.attribute and patch.why, name


def test_another_diffsynth_version_is_refused_at_start(monkeypatch):
    monkeypatch.setattr(diffsynth_patches, "package_version", lambda name: "2.2.0")
    with pytest.raises(diffsynth_patches.DiffSynthVersionError,
                       match=r"changes DiffSynth 2\.1\.12 in 6 places \(attention dispatcher, .*2\.2\.0 is installed"):
        Engine("tiny", device="cpu")
