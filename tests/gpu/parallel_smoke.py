"""The code paths of ghostedit/parallel on ONE device, before a multi-GPU machine is at hand: rank 0 of a 2-rank
"fake" process group (PyTorch's test backend: its collectives move no data, so the image is garbage and nothing is
compared), through CFG parallel and Ulysses in turn, with a configuration's toggles. It shows that the all-to-alls
trace and compile inside the compiled blocks, that the attention backends (the FP8 one and its fused q/k kernel
included) take the redistributed heads, and how long a step takes on half of the work (a bound, not a measurement of
a real mesh). The fake group is not NCCL: a configuration's cuda-graph says it is not applied (over NCCL the
collectives are captured with the forward: scripts/gpu/parallel_bench.sh on two GPUs).

  python tests/gpu/parallel_smoke.py --model synthetic --device cuda --config best --side 1024 --steps 3
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="synthetic")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default=None)
    parser.add_argument("--config", default="best")
    parser.add_argument("--side", type=int, default=1024)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--modes", nargs="+", default=["ulysses", "cfg"])
    args = parser.parse_args()

    import torch.distributed as dist
    from PIL import Image
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from ghostedit import EditRequest, OptimizationConfig, parallel
    from ghostedit.bench.pipeline import DEFAULT_IMAGE
    from ghostedit.engine import Engine
    os.environ["WORLD_SIZE"] = "2"  # what parallel.setup reads from torchrun's environment
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=2)
    engine = Engine(args.model, device=args.device, dtype=args.dtype)
    image = Image.open(DEFAULT_IMAGE).convert("RGB")
    request = EditRequest(images=[image], prompt="ghostly", width=args.side, height=args.side, steps=args.steps,
                          cfg_scale=4.0)
    for mode in args.modes:
        engine.mesh = parallel.setup(mode, True, args.device)
        for run in ("first", "again"):
            result = engine.run(request, OptimizationConfig.parse(args.config))
            summary = result.telemetry.summary()
            print(f"{mode} ({run}): {summary['parallel']}, attention {result.attention_backend}, "
                  f"compile warm-up {summary['stages_s'].get('compile warm-up', 0):.1f} s, "
                  f"{summary['denoise_s_per_step']:.3f} s/step, notes {summary['notes']}", flush=True)
    parallel.teardown()


if __name__ == "__main__":
    main()
