"""What the tests of runs over several gloo processes share: a free port for the rendezvous, and the edit they run
(the tiny model's house, at a size whose tokens shard unevenly)."""
from PIL import Image

from conftest import ASSETS
from ghostedit import EditRequest
from ghostedit.bench.latency import free_port  # noqa: F401 - the tests take it from here

SIZE = dict(width=112, height=80, steps=3, cfg_scale=4.0, seed=3)
PROMPT = "make it a haunted house"


def parallel_request() -> EditRequest:
    return EditRequest(images=[Image.open(ASSETS / "house.png").convert("RGB")], prompt=PROMPT, **SIZE)
