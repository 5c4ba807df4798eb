"""What the whole-edit probes share (profile_edit.py): their options (where results go, the configuration, the edit's
steps, CFG and size: the full-size synthetic model on the GPU; `--model tiny --device cpu` rehearses) and the engine
and edit those options make."""
from __future__ import annotations

import os

from PIL import Image

from ghostedit.arguments import DEFAULT_PROMPT
from ghostedit.bench.pipeline import DEFAULT_IMAGE
from ghostedit.config import EditRequest
from ghostedit.engine import Engine


def add_edit_probe_arguments(parser, config: str = "best") -> None:
    parser.add_argument("--out", default=os.environ.get("OUT", "bench-results"))
    parser.add_argument("--config", default=config)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--cfg", type=float, default=1.0)
    parser.add_argument("--side", type=int, default=1024)
    parser.add_argument("--model", default="synthetic", help="tiny with --device cpu rehearses the script")
    parser.add_argument("--device", default="cuda")


def edit_probe(args) -> tuple[Engine, EditRequest]:
    """The probe's engine (its --model on its --device) and the bench's edit (its image and default prompt) at the
    probe's size, steps and CFG."""
    request = EditRequest(images=[Image.open(DEFAULT_IMAGE).convert("RGB")], prompt=DEFAULT_PROMPT, width=args.side,
                          height=args.side, steps=args.steps, cfg_scale=args.cfg, seed=0)
    return Engine(args.model, device=args.device), request
