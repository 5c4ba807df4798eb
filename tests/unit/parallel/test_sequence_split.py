"""The sequence split (Ulysses, parallel/ulysses.py) gives the one-process output bit for bit, on the CPU: two gloo
processes, one thread each, each computing the tiny DiT's forward alone and split over both, for every configuration
of toggles that runs on a CPU, and the best configuration's GPU paths with its FP8 kernels emulated (tests/cpu_fp8.py:
the fused q/k kernel writes FP8 on each rank's tokens, v is cast at the whole sequence's scale); then whole edits, one
process against Ulysses and against CFG parallel, image for image. Uneven shards throughout (45 and 105 image
tokens over two ranks; 291 in the edits)."""
import os

import pytest
import torch
import torch.multiprocessing

from gloo_runs import free_port, parallel_request

# every configuration of toggles that changes the DiT's forward and runs on a CPU (and each alone)
CPU_CONFIGS = ["baseline", "rewrites=real-rope", "rewrites=joint-layout", "rewrites=fused-qkv",
               "rewrites=carried-residual", "attention=sdpa-math", "attention=sdpa-flash,rewrites=joint-layout",
               "fp8=storage,rewrites=real-rope+joint-layout+fused-qkv+carried-residual",
               "compile=regional,rewrites=real-rope+joint-layout+fused-qkv+carried-residual"]
# best without compile and CUDA graphs (the GPU's): its FP8 paths in bf16
BEST_PATHS = ("fp8=torchao,attention=cudnn-fp8,rewrites=real-rope+joint-layout+fused-qkv+fused-gelu-quant"
              "+carried-residual+fused-qk-norm-rope+fp8-attention-out")
EDIT_CONFIGS = ["baseline", "rewrites=real-rope+joint-layout+fused-qkv+carried-residual"]


def _worker(rank: int, world_size: int, port: int, out_dir: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank),
                      WORLD_SIZE=str(world_size))
    torch.set_num_threads(1)
    from cpu_fp8 import gpu_paths_on_the_cpu
    from ghostedit import OptimizationConfig
    from ghostedit.bench.dit import dit_inputs, running
    from ghostedit.engine import Engine
    from ghostedit.parallel import mesh as meshes, ulysses as split
    from ghostedit.telemetry import RunRecorder
    results = {}
    seen = []  # what each split attention was handed: its shard sizes and q's dtype
    attention = split.Ulysses.attention

    def recording(self, streams, sharded, attend):
        seen.append((self.shards, streams[0][0].dtype))
        return attention(self, streams, sharded, attend)
    split.Ulysses.attention = recording
    try:
        ulysses = meshes.setup("ulysses", True, "cpu")
        for dtype, configs in (("float32", CPU_CONFIGS), ("bfloat16", [BEST_PATHS])):
            engine = Engine("tiny", device="cpu", dtype=dtype, dit_only=True)
            for zero_cond_t, (width, height) in ((False, (80, 48)), (True, (112, 80))):
                inputs = {**dit_inputs(engine.load().dit, width, height, 8, "cpu", engine.torch_dtype, edit_images=2),
                          "zero_cond_t": zero_cond_t}
                for text in configs:
                    with gpu_paths_on_the_cpu() if text == BEST_PATHS else torch.no_grad():
                        config = OptimizationConfig.parse(text)
                        prepared, _ = engine.prepare(config)
                        outputs = []
                        for mesh in (None, ulysses):
                            seen.clear()
                            with running(prepared, config, inputs, "cpu", RunRecorder("cpu"), mesh) as (call, _):
                                outputs.append(call())
                    results[f"dit {text}, zero_cond_t={zero_cond_t}"] = torch.equal(*outputs)
                    results[f"split {text}, zero_cond_t={zero_cond_t}"] = sorted(set(seen), key=str)
        engine = Engine("tiny", device="cpu", dtype="float32")
        cfg = meshes.setup("cfg", True, "cpu")
        for text in EDIT_CONFIGS:
            images = []
            for mesh in (None, ulysses, cfg):
                engine.mesh = mesh
                images.append(engine.run(parallel_request(), OptimizationConfig.parse(text)).image.tobytes())
            results[f"edit {text}, Ulysses"] = images[1] == images[0]
            results[f"edit {text}, CFG parallel"] = images[2] == images[0]
    finally:
        split.Ulysses.attention = attention
        meshes.teardown()
    torch.save(results, f"{out_dir}/rank{rank}.pt")


@pytest.fixture(scope="module")
def split_results(tmp_path_factory):
    out = tmp_path_factory.mktemp("split")
    os.environ["TRITON_INTERPRET"] = "1"  # the spawned ranks run GhostEdit's Triton kernels in the interpreter
    try:
        torch.multiprocessing.spawn(_worker, args=(2, free_port(), str(out)), nprocs=2)
    finally:
        del os.environ["TRITON_INTERPRET"]
    return [torch.load(out / f"rank{rank}.pt") for rank in range(2)]


@pytest.mark.parametrize("config", CPU_CONFIGS + [BEST_PATHS])
@pytest.mark.parametrize("zero_cond_t", [False, True])
def test_the_split_dit_forward_is_the_one_process_forward_bit_for_bit(split_results, config, zero_cond_t):
    shards = (23, 22) if not zero_cond_t else (53, 52)   # 3 images of 5 x 3 and of 7 x 5 tokens: uneven
    q_dtype = torch.float8_e4m3fn if config == BEST_PATHS else torch.float32  # best: q and k sent in FP8
    for rank, results in enumerate(split_results):
        if "compile" not in config:  # compiled blocks call the split's Python only while Dynamo traces them
            assert results[f"split {config}, zero_cond_t={zero_cond_t}"] == [(shards, q_dtype)], rank
        assert results[f"dit {config}, zero_cond_t={zero_cond_t}"], rank


@pytest.mark.parametrize("config", EDIT_CONFIGS)
@pytest.mark.parametrize("mode", ["Ulysses", "CFG parallel"])
def test_a_split_edit_is_the_one_process_edit_image_for_image(split_results, config, mode):
    for rank, results in enumerate(split_results):
        assert results[f"edit {config}, {mode}"], rank
