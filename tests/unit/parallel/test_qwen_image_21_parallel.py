"""Qwen-Image-2.1 on several processes (ghostedit/parallel) on the tiny 2.1, CPU and gloo, float32, one thread a
process: CFG parallel (each rank encodes and runs one CFG branch with its own prefix cache, the predictions
gathered and combined linearly as 2.1's reference does), Ulysses (the prefix's tokens and the target's each split
over the ranks, heads traded around the block-causal attention, each rank's prefix cache holding its heads of every
prefix token) and both on four processes give the one-process image bit for bit: text-to-image and 1 and 3
references, prefix cache on and off, CFG 1 and CFG 4 with a negative prompt. The prefixes have odd lengths:
uneven shards (a target's count is a multiple of 4: sides in multiples of 32)."""
import os

import pytest
import torch
import torch.multiprocessing
from PIL import Image

from conftest import ASSETS
from gloo_runs import free_port
from ghostedit import EditRequest, OptimizationConfig
from ghostedit.engine import Engine
from ghostedit.parallel import mesh as meshes, ulysses

REFERENCES = ("house.png", "mountains.png", "portrait.png")
CASES = [(references, cache, cfg) for references in (0, 1, 3) for cache in ("on", "off") for cfg in (1.0, 4.0)]
FOUR_RANK_CASES = [(references, cache, 4.0) for references in (1, 3) for cache in ("on", "off")]
TARGET_TOKENS = 24   # 96 x 64 pixels: 6 x 4 latent tokens, 12 on each of two ranks


def _request(references: int, cfg: float) -> EditRequest:
    images = [Image.open(ASSETS / name).convert("RGB") for name in REFERENCES[:references]]
    return EditRequest(images=images, prompt="a ghost in the window", negative_prompt="blurry, daylight", width=96,
                       height=64, steps=3, cfg_scale=cfg, seed=5)


def _case_name(references: int, cache: str, cfg: float) -> str:
    return f"{references} references, prefix cache {cache}, CFG {cfg:g}"


def _halves(tokens: int) -> tuple[int, int]:
    """Two ranks' shards of `tokens` (the first one longer)."""
    return tokens - tokens // 2, tokens // 2


def _worker(rank: int, world_size: int, port: int, out_dir: str, modes: tuple[str, ...], cases: list) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank),
                      WORLD_SIZE=str(world_size))
    torch.set_num_threads(1)
    results = {}
    seen = []  # the shards of every stream each split attention gathered
    attention = ulysses.Ulysses.attention

    def recording(self, streams, sharded, attend):
        seen.append(tuple(self.shards if split is True else split.shards for split in sharded if split))
        return attention(self, streams, sharded, attend)
    ulysses.Ulysses.attention = recording
    try:
        engine = Engine("tiny-2.1", device="cpu", dtype="float32")
        meshes_by_mode = {mode: meshes.setup(mode, True, "cpu") for mode in modes}
        for references, cache, cfg in cases:
            config = OptimizationConfig(**{"prefix-cache": cache})
            engine.mesh = None
            single = engine.run(_request(references, cfg), config)
            for mode, mesh in meshes_by_mode.items():
                if mesh.cfg_degree > 1 and cfg == 1.0:
                    continue  # CFG parallel needs true CFG (refused: test_parallel.py)
                engine.mesh = mesh
                seen.clear()
                split = engine.run(_request(references, cfg), config)
                name = f"{_case_name(references, cache, cfg)}, {mode}"
                results[name] = {"same image": split.image.tobytes() == single.image.tobytes(),
                                 "shards": sorted(set(seen)), "tokens": split.telemetry.dit_tokens,
                                 "single tokens": single.telemetry.dit_tokens,
                                 "parallel": split.telemetry.parallel, "cfg rank": mesh.cfg_rank}
    finally:
        ulysses.Ulysses.attention = attention
        meshes.teardown()
    torch.save(results, f"{out_dir}/rank{rank}.pt")


def _spawned(tmp_path_factory, world_size: int, modes: tuple[str, ...], cases: list) -> list[dict]:
    out = tmp_path_factory.mktemp(f"q21-parallel-{world_size}")
    torch.multiprocessing.spawn(_worker, args=(world_size, free_port(), str(out), modes, cases), nprocs=world_size)
    return [torch.load(out / f"rank{rank}.pt") for rank in range(world_size)]


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    return _spawned(tmp_path_factory, 2, ("ulysses", "cfg"), CASES)


@pytest.fixture(scope="module")
def four_ranks(tmp_path_factory):
    return _spawned(tmp_path_factory, 4, ("cfg+ulysses",), FOUR_RANK_CASES)


@pytest.mark.parametrize("references, cache, cfg", CASES, ids=[_case_name(*case) for case in CASES])
def test_under_ulysses_a_2_1_edit_is_the_one_process_edit_bit_for_bit(two_ranks, references, cache, cfg):
    for rank, results in enumerate(two_ranks):
        found = results[f"{_case_name(references, cache, cfg)}, ulysses"]
        assert found["same image"], rank
        assert found["parallel"] == "2 ranks (gloo): CFG parallel 1 x Ulysses 2"
        assert found["tokens"] == found["single tokens"], "the same forwards, each over the same tokens"
        assert (found["tokens"][-1] == TARGET_TOKENS) == (cache == "on")
        # a forward over every token gathers the prefix's shards and the target's apart (each CFG branch's prompt
        # has its own length), a forward from the cache the target's alone
        whole = {(_halves(tokens - TARGET_TOKENS), (12, 12)) for tokens in found["tokens"] if tokens > TARGET_TOKENS}
        assert found["shards"] == sorted(whole | ({((12, 12),)} if cache == "on" else set())), found


def test_some_prefixes_split_unevenly(two_ranks):
    prefixes = {shards[0] for found in two_ranks[0].values() for shards in found["shards"] if len(shards) == 2}
    assert any(first != second for first, second in prefixes), prefixes


@pytest.mark.parametrize("references, cache, cfg", [case for case in CASES if case[2] > 1],
                         ids=[_case_name(*case) for case in CASES if case[2] > 1])
def test_under_cfg_parallel_a_2_1_edit_is_the_one_process_edit_bit_for_bit(two_ranks, references, cache, cfg):
    for rank, results in enumerate(two_ranks):
        found = results[f"{_case_name(references, cache, cfg)}, cfg"]
        assert found["same image"], rank
        assert found["parallel"] == "2 ranks (gloo): CFG parallel 2 x Ulysses 1"
        assert not found["shards"]
        # each rank runs its branch's forward of every step (the one process's conditional and unconditional
        # forwards take turns), its cache filled once
        assert found["tokens"] == found["single tokens"][found["cfg rank"]::2], found


@pytest.mark.parametrize("references, cache, cfg", FOUR_RANK_CASES, ids=[_case_name(*case) for case in FOUR_RANK_CASES])
def test_under_cfg_parallel_and_ulysses_a_2_1_edit_is_the_one_process_edit_bit_for_bit(four_ranks, references, cache,
                                                                                       cfg):
    for rank, results in enumerate(four_ranks):
        found = results[f"{_case_name(references, cache, cfg)}, cfg+ulysses"]
        assert found["same image"], rank
        assert found["parallel"] == "4 ranks (gloo): CFG parallel 2 x Ulysses 2"
        assert found["tokens"] == found["single tokens"][found["cfg rank"]::2], found
        assert found["shards"], "the split attention ran"
