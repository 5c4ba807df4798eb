"""Toggle `memory`: where the model's weights live (ghostedit/engine/placement.py decides and explains). Applied by
the model store, not by a preparation step: changing it moves the components and drops the prepared pipelines."""
from ...device import Availability, needs_cuda
from ..registry import PLACEMENT, Choice, Toggle, register


def _availability(mode: str, device: str) -> Availability:
    return Availability.yes() if mode == "auto" else needs_cuda(device, f"memory={mode}")


register(Toggle(
    name="memory", label="Memory placement",
    help="where the base DiT, the text encoder and the VAE live: decided from the card's size (auto) or forced",
    choices=(
        Choice("auto", "auto (from the card's size)"),
        Choice("gpu", "gpu (everything on the GPU)"),
        Choice("balanced", "balanced (base DiT in pinned host memory)"),
        Choice("low", "low (base DiT and text encoder in host memory)"),
    ),
    default="auto", changes=PLACEMENT, order=100, availability=_availability, families={},
))
