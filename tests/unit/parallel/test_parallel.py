"""One edit on several processes (ghostedit/parallel) on the tiny model, CPU and gloo, in float32: CFG parallel,
Ulysses and both give the single-process image (at most 1 level of 255 apart: the processes run one thread each,
which may round a few sums differently), and Ulysses' all-to-all gives plain attention on uneven shards."""
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
import torch.multiprocessing

from conftest import ASSETS, REPO
from gloo_runs import PROMPT, SIZE, free_port, parallel_request
from ghostedit import OptimizationConfig
from ghostedit.errors import InvalidRequestError
from ghostedit.parallel import mesh as meshes

# 35 output + 256 condition image tokens (the tiny model encodes its input at 256x256, as the real ones at 1024x1024):
# uneven shards
# FP8 weights, and the joint-layout path into the attention with (cos, sin) frequencies and fused projections
REWRITES = "fp8=storage,rewrites=real-rope+joint-layout+fused-qkv"
RUNS = [("cfg", "baseline"), ("ulysses", "baseline"), ("ulysses", REWRITES)]


@pytest.fixture(scope="module")
def single():
    """The single-process images, float32."""
    from ghostedit.engine import Engine
    engine = Engine("tiny", device="cpu", dtype="float32")
    return {config: np.asarray(engine.run(parallel_request(), OptimizationConfig.parse(config)).image, dtype=np.int16)
            for config in ("baseline", REWRITES)}


def _uneven_attention_matches(layout_rank: int, mesh) -> float:
    """Ulysses joint attention with 7 image tokens over 2 ranks (4 + 3) and 5 text tokens, against plain attention
    over the whole sequence; the largest difference on this rank's tokens."""
    from ghostedit.parallel import ulysses
    generator = torch.Generator().manual_seed(0)
    heads, dim, text_tokens, image_tokens = 4, 8, 5, 7
    text = [torch.randn(1, text_tokens, heads, dim, generator=generator) for _ in range(3)]
    image = [torch.randn(1, image_tokens, heads, dim, generator=generator) for _ in range(3)]
    joined = [torch.cat(pair, dim=1).transpose(1, 2) for pair in zip(text, image)]
    expected = torch.nn.functional.scaled_dot_product_attention(*joined).transpose(1, 2).flatten(2)
    split = ulysses.Ulysses.of(mesh, heads).over(image_tokens)
    assert split.rank == layout_rank
    own = slice(split.offset, split.offset + split.own_tokens)
    streams = (tuple(text), tuple(t[:, own] for t in image))

    def attend(local_streams):
        q, k, v = (torch.cat(parts, dim=1).transpose(1, 2) for parts in zip(*local_streams))
        return torch.nn.functional.scaled_dot_product_attention(q, k, v).transpose(1, 2)
    output = split.attention(streams, (False, True), attend).flatten(2)
    wanted = torch.cat([expected[:, :text_tokens], expected[:, text_tokens:][:, own]], dim=1)
    return float((output - wanted).abs().max())


def _worker(rank: int, world_size: int, port: int, out_dir: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank),
                      WORLD_SIZE=str(world_size))
    torch.set_num_threads(1)
    from ghostedit.engine import Engine
    from ghostedit.parallel import ulysses
    engine = Engine("tiny", device="cpu", dtype="float32")
    shards_seen = []
    attention = ulysses.Ulysses.attention

    def counting(split, streams, sharded, attend):  # records the shard sizes the attention ran on
        shards_seen.append(split.shards)
        return attention(split, streams, sharded, attend)
    ulysses.Ulysses.attention = counting
    try:
        for mode, config in RUNS:
            mesh = engine.mesh = meshes.setup(mode, True, "cpu")
            shards_seen.clear()
            result = engine.run(parallel_request(), OptimizationConfig.parse(config))
            if mode == "ulysses":
                assert set(shards_seen) == {(146, 145)}  # 291 image tokens: output 7 x 5, input 16 x 16
            else:
                assert not shards_seen
            np.save(f"{out_dir}/{mode}-{config}-rank{rank}.npy", np.asarray(result.image, dtype=np.int16))
            if mesh.is_writer:
                with open(f"{out_dir}/{mode}-{config}.txt", "w") as words:
                    words.write(result.telemetry.parallel)
        mesh = meshes.setup("ulysses", True, "cpu")
        np.save(f"{out_dir}/uneven-{rank}.npy", np.array(_uneven_attention_matches(rank, mesh)))
    finally:
        ulysses.Ulysses.attention = attention
        meshes.teardown()


def test_cfg_parallel_and_ulysses_on_two_processes_equal_one(single, tmp_path):
    torch.multiprocessing.spawn(_worker, args=(2, free_port(), str(tmp_path)), nprocs=2)
    for mode, config in RUNS:
        image, other_rank = (np.load(tmp_path / f"{mode}-{config}-rank{rank}.npy") for rank in (0, 1))
        assert np.array_equal(image, other_rank), (mode, config)  # every rank ends with the same latent
        assert np.abs(image - single[config]).max() <= 1, (mode, config)
    assert (tmp_path / "cfg-baseline.txt").read_text() == "2 ranks (gloo): CFG parallel 2 x Ulysses 1"
    assert (tmp_path / "ulysses-baseline.txt").read_text() == "2 ranks (gloo): CFG parallel 1 x Ulysses 2"
    for rank in (0, 1):
        assert float(np.load(tmp_path / f"uneven-{rank}.npy")) < 1e-5


def test_cfg_times_ulysses_on_four_processes_with_torchrun(single, tmp_path):
    """The command as a person runs it: torchrun, four gloo processes on a 2 x 2 mesh; rank 0 writes the image."""
    out = tmp_path / "both.png"
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "4", "--master-port",
               str(free_port()), "-m", "ghostedit", "edit", "--model", "tiny", "--device", "cpu", "--dtype",
               "float32", "--image", str(ASSETS / "house.png"), "--prompt", PROMPT, "--width", str(SIZE["width"]),
               "--height", str(SIZE["height"]), "--steps", str(SIZE["steps"]), "--cfg", str(SIZE["cfg_scale"]),
               "--seed", str(SIZE["seed"]), "--parallel", "cfg+ulysses", "--out", str(out)]
    environment = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    done = subprocess.run(command, cwd=REPO, env=environment, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "parallel: 4 ranks (gloo): CFG parallel 2 x Ulysses 2" in done.stdout
    assert done.stdout.count(f"saved {out}") == 1
    from PIL import Image
    image = np.asarray(Image.open(out), dtype=np.int16)
    assert np.abs(image - single["baseline"]).max() <= 1


@pytest.mark.parametrize("mode, world_size, true_cfg, expected", [
    ("auto", 2, True, (2, 1)), ("auto", 4, True, (2, 2)), ("auto", 2, False, (1, 2)), ("auto", 3, True, (1, 3)),
    ("ulysses", 8, True, (1, 8)), ("cfg+ulysses", 8, True, (2, 4)), ("cfg", 2, True, (2, 1))])
def test_degrees_from_mode_and_world_size(mode, world_size, true_cfg, expected):
    assert meshes.degrees(mode, world_size, true_cfg) == expected


@pytest.mark.parametrize("mode, world_size, true_cfg, reason", [
    ("cfg", 2, False, "needs true CFG"), ("cfg", 4, True, "runs on 2 ranks"), ("cfg+ulysses", 3, True, "even"),
    ("ring", 2, True, "unknown parallel mode")])
def test_splits_that_cannot_be_made_are_refused(mode, world_size, true_cfg, reason):
    with pytest.raises(InvalidRequestError, match=reason):
        meshes.degrees(mode, world_size, true_cfg)


def test_a_rank_out_of_memory_stops_instead_of_retrying_alone():
    """A rank that started the edit over alone would meet the others' collectives at another step, with tensors of
    the same shapes: under a mesh, running out of memory ends the edit with the reason."""
    import torch
    from ghostedit.engine.recovery import recovering_memory
    from ghostedit.errors import GpuOutOfMemoryError
    attempts, frees = [], []

    def attempt():
        attempts.append(1)
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
    with pytest.raises(GpuOutOfMemoryError, match="cannot try again alone"):
        recovering_memory(attempt, "running an edit", lambda: frees.append(1) or 0, "cuda", mesh=object())
    assert len(attempts) == 1
