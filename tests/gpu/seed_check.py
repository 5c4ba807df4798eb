"""Do the synthetic model's text encoder and VAE get the same weights whatever the process did before? (The 2-GPU run
of lab/LOG.md section 8 found they did not: only the DiT was seeded.) On one GPU, after setup.sh:
    for mode in seeded unseeded; do for history in plain disturbed; do
      python3 tests/gpu/seed_check.py $mode $history; done; done
seeded: the code as it is; unseeded: each component's seed taken away (the code before the fix). disturbed: the
process first draws random numbers on the GPU and the CPU and opens an NCCL group with a device mesh, as a torchrun
rank does. Prints each component's weight fingerprint (the DiT is a stand-in: it was always seeded); the seeded
lines must agree. The run of 2026-11-24 is in lab/results/parallel/seed-check.txt."""
import contextlib
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts" / "gpu"))
from parallel_bench import weights_fingerprint  # noqa: E402

from ghostedit.models import synthetic  # noqa: E402


def disturb() -> None:
    """What a torchrun rank does before it builds the model: random draws, an NCCL group and a device mesh."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    torch.randn(1000, device="cuda")
    torch.randn(1000)
    dist.init_process_group("nccl", rank=0, world_size=1, init_method="tcp://127.0.0.1:29511")
    init_device_mesh("cuda", (1, 1), mesh_dim_names=("cfg", "ulysses"))


def main() -> None:
    mode, history = sys.argv[1:3]
    synthetic.build_synthetic_dit = lambda device, dtype, in_host_memory=False: torch.nn.Linear(2, 2)  # stand-in
    if mode == "unseeded":
        synthetic._seeded = lambda device, seed: contextlib.nullcontext()  # the code before the fix
    if history == "disturbed":
        disturb()
    pipe = synthetic.build_synthetic_pipeline("cuda", torch.bfloat16)
    print("RESULT", mode, history, json.dumps(weights_fingerprint(pipe)), flush=True)


if __name__ == "__main__":
    main()
