"""Where the weights live, decided from the card's size: the full-size model on 141, 80, 48 and 24 GB cards."""
import pytest

from ghostedit.config import OptimizationConfig
from ghostedit.engine import placement
from ghostedit.models import resolve
from ghostedit.models.dtypes import component_dtypes
from ghostedit.telemetry import GIB

FULL = resolve("synthetic").nominal_sizes(component_dtypes("cuda"))
BEST = OptimizationConfig.parse("best")
STOCK = OptimizationConfig()


# what torch reports of an H200, an H100 80GB, and 48 and 24 GB cards emulated as the bench does (--gpu-memory)
@pytest.mark.parametrize("card_gib, chosen", [(139.8, "gpu"), (79.1, "balanced"), (48, "balanced"), (24, "low")])
def test_auto_picks_the_placement_that_fits_the_card(card_gib, chosen):
    found = placement.plan("auto", int(card_gib * GIB), FULL)
    assert found.chosen == chosen
    assert placement.fits(found, FULL, BEST).ok, "the best configuration runs on every card"
    described = found.describe()
    assert set(described) == {"dit", "text_encoder", "vae"} and all(item["why"] for item in described.values())


def test_what_does_not_fit_is_refused_with_what_it_needs():
    on_24 = placement.plan("auto", int(24 * GIB), FULL)
    refused = placement.fits(on_24, FULL, STOCK)
    assert not refused.ok and "GiB of GPU memory" in refused.reason and "memory=low" in refused.reason
    on_80 = placement.plan("auto", int(79.1 * GIB), FULL)
    assert placement.fits(on_80, FULL, STOCK).ok  # the bf16 DiT, built from the base in host memory
    assert on_80.where == {"dit": "host", "text_encoder": "gpu", "vae": "gpu"}


def test_without_a_gpu_everything_is_in_host_memory():
    found = placement.decide("auto", "cpu", FULL)
    assert found.chosen == "cpu" and set(found.where.values()) == {"cpu"}
