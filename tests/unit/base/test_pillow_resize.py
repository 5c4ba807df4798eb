"""GhostEdit's LANCZOS resize on the device (ghostedit/pillow_resize.py), run here on the CPU, against Pillow's own,
which the reference (diffusers' VaeImageProcessor) calls: equal bit for bit, up and down, in either direction alone
and both, on random images and on a photo (the example house). On a CPU device the engine calls Pillow itself."""
import numpy as np
import pytest
import torch
from PIL import Image

from ghostedit import pillow_resize
from conftest import ASSETS

SIZES = [((512, 512), (1024, 1024)), ((640, 480), (1184, 896)), ((1024, 768), (384, 288)), ((333, 517), (96, 160)),
         ((300, 200), (300, 416)), ((300, 200), (544, 200)), ((37, 53), (1024, 32)), ((2048, 1536), (1024, 768))]


@pytest.mark.parametrize("source, size", SIZES)
def test_equals_pillows_lanczos_bit_for_bit(source, size):
    generator = np.random.default_rng(sum(source) + sum(size))
    image = Image.fromarray(generator.integers(0, 256, (source[1], source[0], 3), dtype=np.uint8))
    expected = np.asarray(image.resize(size, Image.LANCZOS))
    assert np.array_equal(pillow_resize.resampled(torch.from_numpy(np.array(image)), size).numpy(), expected)


def test_equals_pillow_on_a_photo_and_leaves_its_size_alone():
    house = Image.open(ASSETS / "house.png").convert("RGB")
    pixels = torch.from_numpy(np.array(house))
    for size in [(1024, 1024), (1184, 880), (256, 256)]:
        expected = np.asarray(house.resize(size, Image.LANCZOS))
        assert np.array_equal(pillow_resize.resampled(pixels, size).numpy(), expected)
        assert np.array_equal(pillow_resize.resize(house, size, "cpu").numpy(), expected)
    for same in (pillow_resize.resampled(pixels, house.size), pillow_resize.resize(house, house.size, "cpu")):
        assert same.dtype == torch.uint8 and np.array_equal(same.numpy(), np.asarray(house))
