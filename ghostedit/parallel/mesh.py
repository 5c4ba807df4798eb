"""The process mesh of one edit on several processes: read from the torchrun environment (WORLD_SIZE, RANK,
LOCAL_RANK), a torch.distributed process group (NCCL on GPUs, gloo on the CPU) and a 2-D device mesh
("cfg", "ulysses"): the CFG dimension splits the conditional and unconditional passes, the Ulysses dimension splits
each pass's token sequence. The process makes its mesh once at start and hands it to its engine (Engine(mesh=...)),
which hands it down to each edit; in a single process there is none."""
from __future__ import annotations

import datetime
import gc
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from ..errors import InvalidRequestError

# What --parallel (or GHOSTEDIT_PARALLEL) takes: how the processes split the work
MODES = ("auto", "cfg", "ulysses", "cfg+ulysses")
MODE_HELP = ("how the torchrun processes share one edit: cfg: the conditional and unconditional passes on two "
             "ranks; ulysses: each pass's token sequence split over all ranks (all-to-all around attention); "
             "cfg+ulysses: both, CFG 2 x Ulysses N/2; auto: cfg+ulysses for true CFG on an even number of "
             "ranks, else ulysses (default auto; a single process ignores it)")


@dataclass(frozen=True)
class ParallelMesh:
    world_size: int
    rank: int
    cfg_degree: int           # 1 or 2
    ulysses_degree: int
    backend: str              # "nccl" or "gloo"
    device_mesh: DeviceMesh

    @property
    def cfg_rank(self) -> int:
        """0: this rank runs the conditional pass; 1: the unconditional one."""
        return self.device_mesh.get_local_rank("cfg")

    @property
    def ulysses_rank(self) -> int:
        return self.device_mesh.get_local_rank("ulysses")

    def group(self, dimension: str):
        return self.device_mesh.get_group(dimension)

    @property
    def is_writer(self) -> bool:
        """The rank that writes the image and prints the telemetry (every rank holds the same final latent)."""
        return self.rank == 0

    def describe(self) -> str:
        return (f"{self.world_size} ranks ({self.backend}): CFG parallel {self.cfg_degree} x "
                f"Ulysses {self.ulysses_degree}")


def world_size_from_environment() -> int:
    return int(os.environ.get("WORLD_SIZE", "1"))


def degrees(mode: str, world_size: int, true_cfg: bool) -> tuple[int, int]:
    """(CFG degree, Ulysses degree) for this mode on `world_size` ranks; a split that cannot be made is refused
    with the reason."""
    if mode not in MODES:
        raise InvalidRequestError(f"unknown parallel mode {mode!r}: use one of {', '.join(MODES)}")
    if mode == "auto":
        mode = "cfg+ulysses" if true_cfg and world_size % 2 == 0 else "ulysses"
    if mode == "ulysses":
        return 1, world_size
    if not true_cfg:
        raise InvalidRequestError("CFG parallel needs true CFG (cfg > 1): with cfg 1 there is one pass per step; "
                                  "use --parallel ulysses")
    if mode == "cfg" and world_size != 2:
        raise InvalidRequestError(f"CFG parallel alone runs on 2 ranks, not {world_size}: use cfg+ulysses")
    if world_size % 2:
        raise InvalidRequestError(f"cfg+ulysses needs an even number of ranks, not {world_size}")
    return 2, world_size // 2


def setup(mode: str, true_cfg: bool, device: str, collective_timeout_s: float | None = None) -> ParallelMesh:
    """The process group (created once, from the torchrun environment) and this process's mesh for `mode`. Called
    again (a test's second mode), it builds a new mesh on the same group. `collective_timeout_s`: how long a rank
    waits in a collective before the group fails with an error (None: torch's default, ten minutes for NCCL),
    for a check that must end within its time limit rather than hang."""
    world_size = world_size_from_environment()
    cfg_degree, ulysses_degree = degrees(mode, world_size, true_cfg)
    on_gpu = device.startswith("cuda")
    if not dist.is_initialized():
        if on_gpu:
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        timeout = {"timeout": datetime.timedelta(seconds=collective_timeout_s)} if collective_timeout_s else {}
        dist.init_process_group("nccl" if on_gpu else "gloo", **timeout)
    device_mesh = init_device_mesh("cuda" if on_gpu else "cpu", (cfg_degree, ulysses_degree),
                                   mesh_dim_names=("cfg", "ulysses"))
    return ParallelMesh(world_size, dist.get_rank(), cfg_degree, ulysses_degree, dist.get_backend(), device_mesh)


def teardown(engine=None) -> None:
    """Closes the process group (at the end of a torchrun process), after `engine`'s prepared pipelines are dropped
    (Engine.free). A CUDA graph that captured the group's collectives (a Ulysses forward under cuda-graph) must be
    gone first: NCCL's destroy waits on it for ever (pytorch/pytorch#115388; seen on two H200s). The collection ends
    graphs that reference cycles still hold."""
    if engine is not None:
        engine.free()
    if dist.is_initialized():
        gc.collect()
        dist.destroy_process_group()
