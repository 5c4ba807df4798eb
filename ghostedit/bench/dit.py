"""The DiT-level bench: one forward of the DiT exactly as DiffSynth's edit pipeline calls it (its `model_fn` with the
edit latents appended), at a real edit shape, for each configuration, through the engine: the same prepared
pipelines, the same run-time contexts and the same forward function as an edit (engine/runner.py).

Per configuration: preparation and the first call (compile warm-up) timed apart; then the median of `repeats`
forwards timed with CUDA events after two warm-up calls; the DiT output's relative error against the first
(baseline) configuration's output on the same inputs, whole and for one block; memory: the prepared DiT's weights
and the activation peak of a forward. One lossless idea is measured on the block loop of the fastest
configuration: the conditional and unconditional branches batched into one forward.
"""
from __future__ import annotations

import contextlib
import time

import torch

from ..config import OptimizationConfig
from ..device import synchronize
from ..engine.runner import dit_run, forward, package_compiled_code
from ..models.qwen_image import dit as qwen_image
from ..tensors import storage_bytes
from ..telemetry import GIB, ClockSampler, RunRecorder, median_ms

COLUMNS = {
    "config": "configuration",
    "shape": "shape",
    "ms_per_forward": "ms / forward",
    "speedup": "speedup",
    "first_call_s": "first call s",
    "prepare_s": "prepare s",
    "weights_gib": "weights GiB",
    "activation_peak_gib": "activations GiB",
    "dit_alone_gib": "DiT alone GiB",
    "rel_error": "rel. error (output)",
    "block_rel_error": "rel. error (one block)",
    "attention_ran": "attention",
}


def dit_inputs(dit, width: int, height: int, text_tokens: int, device: str, dtype, seed: int = 0,
               edit_images: int = 1) -> dict:
    """The inputs DiffSynth's model_fn gets for an edit of `edit_images` images at the output's size: noisy
    latents, each edit image's latents (as many tokens again each) and the encoded prompt."""
    generator = torch.Generator(device).manual_seed(seed)
    latent = (1, 16, height // 8, width // 8)
    edit = [torch.randn(latent, generator=generator, device=device, dtype=dtype) for _ in range(edit_images)]
    return {
        "latents": torch.randn(latent, generator=generator, device=device, dtype=dtype),
        "edit_latents": edit[0] if edit_images == 1 else edit,
        "prompt_emb": torch.randn((1, text_tokens, dit.txt_in.in_features), generator=generator, device=device,
                                  dtype=dtype),
        "prompt_emb_mask": torch.ones((1, text_tokens), dtype=torch.long, device=device),
        "timestep": torch.tensor([500.0], device=device, dtype=dtype),
        "height": height, "width": width,
    }


def sequence_length(inputs: dict) -> int:
    edits = inputs["edit_latents"]
    images = 1 + (len(edits) if isinstance(edits, list) else 1)
    return images * (inputs["height"] // 16) * (inputs["width"] // 16) + inputs["prompt_emb"].shape[1]


def shape_label(side: int, edit_images: int) -> str:
    return f"{side}x{side}" + (f", {edit_images} images" if edit_images > 1 else "")


def relative_error(output: torch.Tensor, reference: torch.Tensor) -> float:
    return float((output.float() - reference.float()).norm() / reference.float().norm())


@contextlib.contextmanager
def running(prepared, config: OptimizationConfig, inputs: dict, device: str, recorder: RunRecorder, mesh=None):
    """A forward function for this prepared DiT inside its run-time contexts, and what the contexts resolved;
    `mesh`: the process mesh of a parallel forward (None in one process)."""
    with torch.no_grad(), dit_run(prepared, config, device, sequence_length(inputs), recorder, mesh) as (options, ran):
        arguments = {**inputs, "dit": prepared.dit, "options": options}
        yield (lambda: forward(prepared.pipe.model_fn, arguments)), ran


def bench_configuration(engine, config: OptimizationConfig, inputs: dict, repeats: int, reference, block_reference):
    """Returns (row, output, prepared). Without references (the baseline) the errors are 0 by definition. The
    configuration is prepared on its first shape; later shapes find it prepared (dynamic shapes: no recompile)."""
    device = engine.device
    recorder = RunRecorder(device)
    prepared, hit = engine.prepare(config, recorder)
    on_gpu = device.startswith("cuda")
    with running(prepared, config, inputs, device, recorder) as (call, ran):
        allocated_before = torch.cuda.memory_allocated() if on_gpu else 0
        if on_gpu:
            torch.cuda.reset_peak_memory_stats()
        synchronize(device)
        start = time.perf_counter()
        output = call()
        synchronize(device)
        first_call_s = time.perf_counter() - start
        package_compiled_code(prepared, device)
        prepared.warmed_shapes.add(("dit bench", sequence_length(inputs)))
        with ClockSampler(device) as clock:
            ms = median_ms(call, device, repeats, warmup=2)
        peak_gib = (torch.cuda.max_memory_allocated() - allocated_before) / GIB if on_gpu else None
        block_error = 0.0
        if block_reference is not None:
            block_error = relative_error(middle_block_output(prepared.dit, block_reference[0], call), block_reference[1])
    weights_gib = storage_bytes(prepared.dit) / GIB
    row = {
        "config": config.label,
        "text": config.text,
        "ms_per_forward": ms,
        "gpu_clock": clock.summary(),
        "prepare_s": 0.0 if hit else sum(recorder.telemetry.prepare_steps.values()),
        "prepare_steps_s": {} if hit else dict(recorder.telemetry.prepare_steps),
        "first_call_s": first_call_s,
        "weights_gib": weights_gib,
        "activation_peak_gib": peak_gib,
        "dit_alone_gib": weights_gib + peak_gib if peak_gib is not None else None,
        "device_peak_gib": torch.cuda.max_memory_allocated() / GIB if on_gpu else None,
        "rel_error": relative_error(output, reference) if reference is not None else 0.0,
        "block_rel_error": block_error,
        "finite": bool(torch.isfinite(output).all()),
        "attention_ran": ran.get("attention", "diffsynth"),
        "report": {**prepared.report, **ran.get("words", {})},  # as an edit's result reports it (engine/runner.py)
    }
    return row, output, prepared


def block_inputs(dit, call, index: int) -> dict:
    """What transformer block `index` receives, captured from a real forward (`call`)."""
    captured = {}

    def grab(module, args, kwargs):
        captured.update(kwargs)
        raise _Captured
    handle = dit.blocks[index].register_forward_pre_hook(grab, with_kwargs=True)
    try:
        call()
    except _Captured:
        pass
    finally:
        handle.remove()
    if captured.get("pending") is not None:  # carried-residual: the block before left its last addition to this one
        captured["image"], captured["text"] = qwen_image.finish(captured["image"], captured["text"],
                                                                captured["pending"])
    return {name: captured[name] for name in ("image", "text", "temb", "image_rotary_emb", "modulate_index",
                                              "options")}


class _Captured(Exception):
    pass


def run_blocks(dit, captured: dict, blocks: slice = slice(None)):
    """The blocks alone on captured inputs (inside the configuration's run-time contexts)."""
    inputs = {name: value for name, value in captured.items() if name not in ("image", "text")}
    text, image = qwen_image.run_blocks(dit.blocks[blocks], captured["image"], captured["text"], inputs,
                                        captured["options"])
    return image


def middle_block(dit) -> int:
    return len(dit.blocks) // 2


def middle_block_reference(dit, call) -> tuple[dict, torch.Tensor]:
    """The middle block's input and output on the baseline: FP8's error is measured where it arises, before 60
    random blocks amplify it (on random weights even a lossless reordering of bf16 sums moves the output)."""
    captured = block_inputs(dit, call, middle_block(dit))
    return captured, middle_block_output(dit, captured, call)


def middle_block_output(dit, captured: dict, call) -> torch.Tensor:
    index = middle_block(dit)
    return run_blocks(dit, captured, slice(index, index + 1))


def without_cuda_graph(config: OptimizationConfig) -> OptimizationConfig:
    """The configuration with its block loop run from Python, where the bench reads what a block receives."""
    return config.replace(rewrites=tuple(flag for flag in config.flags("rewrites") if flag != "cuda-graph"))


def lossless_batching_experiments(prepared, config, inputs: dict, device: str, repeats: int) -> dict:
    """The block loop timed three ways, and the whole forward beside it: what is left is the DiT's work outside
    the blocks (embeddings, output layer, uncompiled) and the forward's start, before its first kernel. The loop
    runs from Python: a configuration with cuda-graph runs here without it (its row times the graph)."""
    config = without_cuda_graph(config)
    with running(prepared, config, inputs, device, RunRecorder(device)) as (call, _):
        dit = prepared.dit
        single = block_inputs(dit, call, 0)
        doubled = {name: (torch.cat([value, value]) if isinstance(value, torch.Tensor) else value)
                   for name, value in single.items()}
        whole = median_ms(call, device, repeats, warmup=2)
        blocks = median_ms(lambda: run_blocks(dit, single), device, repeats, warmup=2)
        two_forwards = median_ms(lambda: (run_blocks(dit, single), run_blocks(dit, single)), device, repeats, warmup=2)
        batched = median_ms(lambda: run_blocks(dit, doubled), device, repeats, warmup=2)
        result = {"config": config.label, "text": config.text, "forward_ms": whole, "block_loop_ms": blocks,
                  "cfg_two_forwards_ms": two_forwards, "cfg_batched_ms": batched,
                  "cfg_batching_gain": two_forwards / batched}
    return result


def run_dit_bench(engine, configs: list[OptimizationConfig], shapes: list[tuple[int, int]], text_tokens: int,
                  seed: int, repeats: int, experiments: bool, on_row=None,
                  experiment_shape: tuple[int, int] | None = None) -> dict:
    """Every configuration in turn (each one's pipeline freed before the next is prepared), at every shape (side,
    edit images); errors and speedups against the first configuration at the same shape. The experiments run on
    the fastest configuration at `experiment_shape` (default the first shape)."""
    experiment_shape = experiment_shape or shapes[0]
    base = engine.load(configs[0])
    inputs = {shape: dit_inputs(base.dit, shape[0], shape[0], text_tokens, engine.device, engine.torch_dtype, seed,
                                shape[1]) for shape in shapes}
    results = {"rows": [], "experiments": None, "size": [shapes[0][0]] * 2, "shapes": [list(s) for s in shapes],
               "text_tokens": text_tokens, "repeats": repeats,
               "image_tokens": sequence_length(inputs[shapes[0]]) - text_tokens}
    references: dict = {}
    fastest = None
    for config in configs:
        engine.free()
        for shape in shapes:
            reference, block_reference = references.get(shape, (None, None))
            row, output, prepared = bench_configuration(engine, config, inputs[shape], repeats, reference,
                                                        block_reference)
            if reference is None:  # a block's inputs are caught in the act, so the loop runs from Python here
                with running(prepared, without_cuda_graph(config), inputs[shape], engine.device,
                             RunRecorder(engine.device)) as (call, _):
                    references[shape] = (output.float(), middle_block_reference(prepared.dit, call))
            row.update(shape=shape_label(*shape), sequence=sequence_length(inputs[shape]))
            baseline = next(r for r in results["rows"] + [row] if r["shape"] == row["shape"])
            row["speedup"] = baseline["ms_per_forward"] / row["ms_per_forward"]
            results["rows"].append(row)
            if shape == experiment_shape and (fastest is None or row["ms_per_forward"] < fastest[0]):
                fastest = (row["ms_per_forward"], config)
            if on_row:
                on_row(row, results)
            del output
        del prepared
    if experiments:
        engine.free()
        prepared, _ = engine.prepare(fastest[1])
        results["experiments"] = {"shape": shape_label(*experiment_shape),
                                  **lossless_batching_experiments(prepared, fastest[1], inputs[experiment_shape],
                                                                  engine.device, repeats)}
    return results
