"""What the tests of runs over several gloo processes share: a free port for the rendezvous, and the edit they run
(the tiny model's house, at a size whose tokens shard unevenly)."""
import socket

from PIL import Image

from conftest import ASSETS
from ghostedit import EditRequest

SIZE = dict(width=112, height=80, steps=3, cfg_scale=4.0, seed=3)
PROMPT = "make it a haunted house"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def parallel_request() -> EditRequest:
    return EditRequest(images=[Image.open(ASSETS / "house.png").convert("RGB")], prompt=PROMPT, **SIZE)
