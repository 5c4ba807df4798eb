"""Regional compile traces the DiT's block once: no restarted trace, no second compile for the second block. The
text encoder's layers compiled for a run give the eager run's image, compile once, and are plain again after it. A
multi-kernel's pick is kept for a restarted process."""
import subprocess
import sys
import textwrap
import threading
from types import SimpleNamespace

import pytest
import torch
from torch._dynamo.utils import compile_times, counters

from dit_helpers import dit_engine, dit_output, inputs_for
from ghostedit import EditRequest
from ghostedit.config import OptimizationConfig
from ghostedit.device import UnavailableOptionError
from ghostedit.engine import Engine
from ghostedit.metrics import compare_images
from ghostedit.optimize import compile as compile_blocks, text_encoder_graphs
from ghostedit.optimize.toggles import text_encoder as text_encoder_toggle


def test_compiled_blocks_are_traced_and_compiled_once():
    """Before the fixes in optimize/compile.py, Dynamo restarted its trace over DiffSynth's float attributes
    ("compile_attempt_1") and compiled the block a second time because only the first block's inputs are views
    (2 frames); on the full-size model they cost 8 of a 28 s first call. Only the token dimensions are dynamic,
    so another output size and prompt length, and the carried residual's parts, run the same compiled code."""
    torch._dynamo.reset()
    counters.clear()
    config = OptimizationConfig(compile="regional", rewrites=("real-rope", "carried-residual"))
    engine = dit_engine()
    inputs = inputs_for(engine)
    first = dit_output(engine, config, inputs)
    again = dit_output(engine, config, inputs)
    assert torch.equal(first, again)
    dit_output(engine, config, inputs_for(engine, side=96, text_tokens=13))
    assert len(engine.load().dit.transformer_blocks) > 1
    assert counters["frames"]["total"] == 1, dict(counters["frames"])
    assert counters["stats"]["unique_graphs"] == 1, dict(counters["stats"])
    assert "compile_attempt_1" not in compile_times(repr="str", aggregate=True)


def test_a_blocks_token_dimensions_are_found_in_every_input():
    """What compile_over_tokens marks dynamic (and the Space's export too): the image's and the text's token
    dimension wherever it runs, and nothing else; a gate of one row, the widths and the batch stay static."""
    batch, image, text, width = 1, 48, 12, 64
    inputs = {"image": torch.zeros(batch, image, width), "text": torch.zeros(batch, text, width),
              "temb": torch.zeros(2 * batch, width),
              "image_rotary_emb": ((torch.zeros(image, 32), torch.zeros(image, 32)),
                                   (torch.zeros(text, 32), torch.zeros(text, 32))),
              "modulate_index": torch.zeros(batch, image, dtype=torch.long),
              "pending": (torch.zeros(batch, 1, width), torch.zeros(batch, image, width),
                          torch.zeros(batch, 1, width), torch.zeros(batch, text, width)),
              "attention_mask": None, "enable_fp8_attention": False}
    found = [(tuple(tensor.shape), dims) for tensor, dims in compile_blocks.token_dims(inputs)]
    assert found == [((1, 48, 64), {1: "image"}), ((1, 12, 64), {1: "text"}), ((2, 64), {}),
                     ((48, 32), {0: "image"}), ((48, 32), {0: "image"}), ((12, 32), {0: "text"}),
                     ((12, 32), {0: "text"}), ((1, 48), {1: "image"}), ((1, 1, 64), {}), ((1, 48, 64), {1: "image"}),
                     ((1, 1, 64), {}), ((1, 12, 64), {1: "text"})]


def test_the_compile_cache_keys_are_hashed_on_a_thread_of_their_own_as_preparation_begins(monkeypatch):
    """The hashes of torch's and Triton's files that every compile cache key includes are made while the DiT is
    prepared, not in the first forward."""
    hashed_in, hashed = [], threading.Event()
    hash_keys = compile_blocks._compile_keys
    monkeypatch.setattr(compile_blocks, "_compile_keys",
                        lambda: (hash_keys(), hashed_in.append(threading.current_thread().name), hashed.set()))
    dit_engine().prepare(OptimizationConfig(compile="regional"))
    assert hashed.wait(timeout=60)
    assert hashed_in == ["ghostedit-compile-keys"]
    from torch._inductor.codecache import CacheBase
    assert CacheBase.get_system.cache_info().currsize == 1


def test_a_compiled_text_encoder_gives_the_eager_image_and_compiles_once(house):
    engine = Engine("tiny", device="cpu")
    request = EditRequest(images=[house], prompt="make it night", width=128, height=128, steps=2, cfg_scale=4.0)
    eager = engine.run(request, OptimizationConfig())
    compiled = OptimizationConfig.parse("text-encoder=compiled")
    first = engine.run(request, compiled)
    assert any("text encoder compiled on this run" in note for note in first.telemetry.notes)
    frames = counters["frames"]["total"]
    again = engine.run(request, compiled)
    assert counters["frames"]["total"] == frames  # nothing compiled a second time
    assert not any("text encoder compiled" in note for note in again.telemetry.notes)
    # the compiled layers differ from eager by float32 rounding only; 2 steps of the random tiny DiT at CFG 4 turn
    # that into a level or two on some pixels (measured: 8% of them one level, one pixel two)
    versus = compare_images(again.image, eager.image)
    assert versus["max_abs"] <= 3 and versus["psnr_db"] > 45, versus
    text_encoder = engine.load().text_encoder
    layers = text_encoder_graphs.regions(text_encoder)
    assert layers and all(layer._compiled_call_impl is None for layer in layers)  # plain for the next configuration
    language_model = text_encoder.model.language_model
    ids = torch.randint(0, language_model.embed_tokens.num_embeddings, (1, 40),
                        generator=torch.Generator().manual_seed(0))
    context = SimpleNamespace(prepared=SimpleNamespace(pipe=SimpleNamespace(text_encoder=text_encoder)),
                              device="cpu", recorder=None)  # compiled once already: no note
    with torch.no_grad():
        eager_hidden = language_model(input_ids=ids).last_hidden_state
        with text_encoder_toggle._text_encoder(context, "compiled"):
            compiled_hidden = language_model(input_ids=ids).last_hidden_state
    assert float((compiled_hidden - eager_hidden).norm() / eager_hidden.norm()) < 1e-5


def test_joined_vision_windows_attend_as_the_per_window_calls_in_one_call_per_block(monkeypatch):
    """text-encoder=joined-windows: the vision tower's output as transformers' per-window SDPA gives it, with one
    attention call per block instead of one per window."""
    text_encoder = Engine("tiny", device="cpu").load().text_encoder
    visual = text_encoder.model.visual
    context = SimpleNamespace(prepared=SimpleNamespace(pipe=SimpleNamespace(text_encoder=text_encoder)),
                              device="cpu", recorder=None)
    grid = torch.tensor([[1, 16, 16]])  # 256 patches: windows of 8x8 patches in the windowed blocks
    pixels = torch.randn(256, visual.patch_embed.proj.weight[0].numel(), generator=torch.Generator().manual_seed(0))
    calls = []
    sdpa = torch.nn.functional.scaled_dot_product_attention
    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention",
                        lambda *args, **kwargs: calls.append(1) or sdpa(*args, **kwargs))
    with torch.no_grad():
        per_window = visual(pixels, grid_thw=grid).pooler_output
        per_window_calls = len(calls)
        calls.clear()
        with text_encoder_toggle._text_encoder(context, "joined-windows"):
            joined = visual(pixels, grid_thw=grid).pooler_output
    assert len(calls) == len(visual.blocks) < per_window_calls
    assert float((joined - per_window).norm() / per_window.norm()) < 1e-5
    assert visual.config._attn_implementation == "sdpa"  # put back after the run


def test_a_streamed_text_encoder_is_not_compiled_and_says_why():
    text_encoder = Engine("tiny", device="cpu").load().text_encoder  # on the CPU: as a streamed one on a GPU machine
    context = SimpleNamespace(prepared=SimpleNamespace(pipe=SimpleNamespace(text_encoder=text_encoder)),
                              device="cuda", recorder=None)
    with pytest.raises(UnavailableOptionError, match="streamed from host memory"):
        with text_encoder_toggle._text_encoder(context, "compiled"):
            pass


class _Variant:
    """Stands in for one compiled variant of an Inductor multi-kernel (a CachingAutotuner): Inductor names its source
    file by the hash of its code."""

    def __init__(self, source_hash: str, ran: list):
        self.kernel_hash, self.size_hints, self.triton_meta = source_hash, {"x": 8}, {"device": "stand-in"}
        self.inductor_meta = {"kernel_name": f"variant_{source_hash or 'unnamed'}"}
        self.ran = ran

    def run(self, *args, **kwargs):
        self.ran.append(self.kernel_hash)


def test_a_multi_kernel_pick_is_kept_for_a_restarted_process(tmp_path, monkeypatch):
    """torch 2.11 names a kept pick from the variants' Triton functions, which a process that loads compiled code
    from the cache has not rebuilt yet; GhostEdit names it from their source files and reads it on the first run. A
    new multi-kernel over the same variants (a restarted process) runs the kept pick without timing them."""
    from torch._inductor.codegen.multi_kernel import MultiKernelCall
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("TORCHINDUCTOR_DISABLE_MULTI_KERNEL_CACHE", raising=False)
    compile_blocks.keep_multi_kernel_picks()
    timings_taken = []

    def multi_kernel(source_hashes, timings):
        ran = []
        call = MultiKernelCall("multi_kernel_0", [_Variant(h, ran) for h in source_hashes],
                               [[slice(0, 1)]] * len(source_hashes))
        monkeypatch.setattr(call, "benchmark_sub_kernels", lambda *args, **kwargs: timings_taken.append(timings)
                            or timings)
        return call, ran

    first, ran = multi_kernel(["aa11", "bb22"], [2.0, 1.0])
    first.run("input")
    assert ran == ["bb22"] and len(timings_taken) == 1
    restarted, ran = multi_kernel(["aa11", "bb22"], [1.0, 2.0])  # timed again, it would pick the other variant
    restarted.run("input")
    restarted.run("input")
    assert ran == ["bb22", "bb22"] and len(timings_taken) == 1
    other_code, ran = multi_kernel(["aa11", "cc33"], [1.0, 2.0])
    other_code.run("input")
    assert ran == ["aa11"] and len(timings_taken) == 2
    for _ in range(2):  # a variant without a source file: timed in every process, its pick kept nowhere
        unnamed, ran = multi_kernel(["", "bb22"], [1.0, 2.0])
        unnamed.run("input")
        assert ran == [""]
    assert len(timings_taken) == 4


def test_persistent_rows_are_decided_by_the_compile_at_hand_in_any_thread():
    """Inductor makes its heuristics object once per thread, on first use. GhostEdit's, which every thread that
    compiles blocks runs, asks the options of the compile at hand: a configuration with inductor-persistent-rows keeps
    the DiT's rows of 3072 in registers (multi-kernel's limit), one without loops over them as Inductor does, whichever
    came first."""
    import threading

    import sympy
    from torch._inductor import config as inductor_config
    from torch._inductor.ir import ReductionHint
    from torch._inductor.sizevars import SizeVarAllocator
    from torch._inductor.virtualized import V

    from ghostedit.optimize import registry
    with_rows = OptimizationConfig.parse("compile=regional,rewrites=inductor-persistent-rows")
    options, _ = registry.compile_options(with_rows)
    decided = []

    def persistent(values: int, hint=ReductionHint.INNER) -> bool:
        features = SimpleNamespace(get_reduction_hint=lambda: hint, reduction_numel=sympy.Integer(values))
        return V.choices.should_use_persistent_reduction(features, False)

    def compile_in_a_new_thread():
        V.choices  # Inductor's own heuristics, made by a compile before any of GhostEdit's
        compile_blocks.configure_dynamo()
        with V.set_graph_handler(SimpleNamespace(sizevars=SizeVarAllocator())):
            with inductor_config.patch(options):
                decided.extend([persistent(3072), persistent(4 * 16384),
                                persistent(3072, ReductionHint.OUTER)])
            decided.append(persistent(3072))

    thread = threading.Thread(target=compile_in_a_new_thread)
    thread.start()
    thread.join()
    assert decided == [True, False, False, False]


def test_traces_in_threads_one_after_another_do_not_crash_a_process_without_a_gpu():
    """torch 2.11 without a GPU: a trace in a thread that starts after another trace's thread ended read a freed
    CUDA device guard and crashed the process (compile._keep_the_no_op_cuda_guard); the page runs each edit in a
    thread of its own. In a process of its own, with the smallest traces that crashed."""
    script = textwrap.dedent("""
        import threading, torch
        from ghostedit.optimize import compile as compile_blocks
        compile_blocks.configure_dynamo()
        def trace():
            torch._dynamo.reset()
            torch.compile(lambda x: x * 2 + 1, backend="eager", dynamic=True)(torch.randn(4))
        for _ in range(3):
            thread = threading.Thread(target=trace)
            thread.start()
            thread.join()
        print("traced in 3 threads")
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and "traced in 3 threads" in done.stdout, (done.returncode, done.stderr[-2000:])
