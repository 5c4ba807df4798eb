"""What the GPU tier's tests share: each runs its script beside it (graph_check.py, parallel_smoke.py, seed_check.py,
qwen21_fp8_attention.py, qwen21_graphs.py, qwen21_swiglu_quant.py, text_encoder_graph_check.py) in a process of its
own, as on the GPU machine, where they run from the repository root after `source scripts/gpu/setup.sh`:
python -m pytest -m gpu tests/gpu
One script at a time, whatever pytest-xdist does: each builds the full-size synthetic model on the one GPU. And the
random inputs of Qwen-Image-2.1's DiT at each step (qwen21_fp8_attention.py, qwen21_swiglu_quant.py,
lab/probes/profile_dit_21.py)."""
import fcntl
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
SCRIPT_LIMIT_S = 480   # a device call is at most ten minutes
LOCK = Path(tempfile.gettempdir()) / "ghostedit-gpu-tests.lock"


def run_script(script: str, *args: str) -> str:
    """Runs tests/gpu/<script> with its arguments (its main) from the repository root; returns what it printed, or
    fails with the end of its output."""
    with open(LOCK, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        ran = subprocess.run([sys.executable, str(HERE / script), *args], cwd=HERE.parents[1], capture_output=True,
                             text=True, timeout=SCRIPT_LIMIT_S)
    output = ran.stdout + ran.stderr
    assert ran.returncode == 0, f"{script} {' '.join(args)} exited {ran.returncode}:\n{output[-4000:]}"
    return ran.stdout


def output_folder(description: str, name: str) -> Path:
    """A GPU script's folder for its report: `name` under --out (default $OUT, else bench-results), created."""
    import argparse
    import os
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--out", default=os.environ.get("OUT", "bench-results"))
    folder = Path(parser.parse_args().out) / name
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def dit_21_inputs(dit, side_tokens: int, references: int, text_before: int, text_after: int, steps: int, device: str,
                  seed: int = 0) -> dict:
    """What Qwen-Image-2.1's DiT gets at each step of an edit with `references` reference images (0: text-to-image),
    all at `side_tokens` x `side_tokens` latent tokens as the target: the text encoder's sequence with each
    reference's slots (one slot: 2x2 latent tokens) after `text_before` prompt tokens, `text_after` more after them,
    and each step's latents (the references' fixed, the target's new at each step); random, from `seed`."""
    generator = torch.Generator(device).manual_seed(seed)
    tokens, image_slots = side_tokens * side_tokens, side_tokens * side_tokens // 4
    slots = torch.zeros(1, text_before + references * image_slots + text_after, dtype=torch.bool, device=device)
    slots[0, text_before:text_before + references * image_slots] = True
    image_mask = torch.cat([slots, torch.ones(1, image_slots, dtype=torch.bool, device=device)], 1)

    def randn(*shape):
        return torch.randn(*shape, generator=generator, device=device, dtype=torch.bfloat16)
    fixed = randn(1, references * tokens, dit.img_in.in_features)
    return {"image_mask": image_mask, "shapes": [(1, side_tokens, side_tokens)] * (references + 1),
            "prompt": randn(1, slots.shape[1], dit.txt_in.in_layer.in_features),
            "latents": [torch.cat([fixed, randn(1, tokens, dit.img_in.in_features)], 1) for _ in range(steps)]}
