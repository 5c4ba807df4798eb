"""Whether the text encoder's layers replayed from CUDA graphs (`text-encoder=graphed`) give the prompt embedding run
from Python bit for bit, on the GPU, for both families' text encoders: the tiny Qwen-Image-2.1's Qwen3-VL (its vision
blocks handed the images' boundaries on the host, its decoder layers called without the key/value cache) and the tiny
Edit model's Qwen2.5-VL (its vision windows joined, as graphed joins them). Each model encodes three prompts (one
reference image, two of different sizes, none) from Python, then twice through the toggle's run context: the first
pass warms and captures each shape, the second replays it; every embedding is compared with torch.equal.

On the GPU machine (after `source scripts/gpu/setup.sh`):  python3 tests/gpu/text_encoder_graph_check.py [--out DIR]
Writes text-encoder-graph-check.json.
"""
from __future__ import annotations

import contextlib
import json
from pathlib import Path
from types import SimpleNamespace

import torch
from PIL import Image

from ghostedit.engine import Engine
from ghostedit.optimize import registry, vision_windows
from ghostedit.optimize.toggles import text_encoder as text_encoder_toggle
from ghostedit.telemetry import RunRecorder
from gpu_scripts import output_folder

HOUSE = Path(__file__).resolve().parents[2] / "assets" / "examples" / "house.png"
MODELS = ("tiny-2.1", "tiny")


def embed(pipe, prompt: str, images) -> torch.Tensor:
    """The prompt embedding as the model's pipeline computes it (its own prompt-embedding unit)."""
    unit = next(unit for unit in pipe.units if type(unit).__name__.endswith("PromptEmbedder"))
    with torch.no_grad():
        out = unit.process(pipe, prompt, edit_image=images)
    return (out.get("prompt_embeds") if "prompt_embeds" in out else out["prompt_emb"]).clone()


def check(model: str) -> dict:
    pipe = Engine(model, device="cuda").load()
    house = Image.open(HOUSE).convert("RGB")
    cases = [("make it a haunted house", [house]), ("make it night", [house, house.resize((96, 64))]),
             ("a cat on a roof", None if model == "tiny-2.1" else [house.resize((64, 96))])]
    windows = vision_windows.has_windows(pipe.text_encoder)
    with vision_windows.joined_windows(pipe.text_encoder) if windows else contextlib.nullcontext():
        expected = [embed(pipe, prompt, images) for prompt, images in cases]
    passes = []
    for _ in range(2):   # the first pass captures each shape right after its warm-up, the second replays it
        context = registry.RunContext(prepared=SimpleNamespace(pipe=pipe), config=None, device="cuda",
                                      sequence_length=0, recorder=RunRecorder("cuda"))
        with text_encoder_toggle._text_encoder(context, "graphed"):
            got = [embed(pipe, prompt, images) for prompt, images in cases]
        passes.append({"bitwise_equal": [bool(torch.equal(a, b)) for a, b in zip(got, expected)],
                       "words": context.ran.get("words", {}).get("text-encoder", "")})
    return {"vision_windows_joined": windows, "passes": passes}


def main() -> None:
    out = output_folder(__doc__.splitlines()[0], "text-encoder-graph-check")
    report = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "models": {}}
    for model in MODELS:
        report["models"][model] = check(model)
        print(model, json.dumps(report["models"][model]), flush=True)
        (out / "text-encoder-graph-check.json").write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
