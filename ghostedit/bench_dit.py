"""DiT-level benchmark: one forward of the DiT exactly as DiffSynth's edit pipeline calls it (its `model_fn` with the
edit latents appended), at a real edit shape, for each configuration.

Per configuration: preparation and the first call (compile warm-up) timed apart; then the median of `repeats`
forwards timed with CUDA events after two warm-up calls; the DiT output's relative error against the first
(baseline, bf16 eager) configuration's output on the same inputs; memory: the prepared DiT's weights and the
activation peak of a forward, whose sum is what the DiT needs on its own.
Two lossless ideas are measured on the block loop of the fastest configuration, each alone: the conditional and
unconditional branches batched into one forward, and the whole loop captured as one CUDA graph.
"""
from __future__ import annotations

import gc
import time

import torch

from .config import OptimizationConfig
from .device import empty_cache, synchronize
from .models import load_base_dit
from .optimize import attention, fp8
from .recipe import prepare_dit
from .telemetry import GIB, RunRecorder, median_ms
from .tensors import storage_bytes


def dit_inputs(dit, width: int, height: int, text_tokens: int, device: str, dtype, seed: int = 0) -> dict:
    """The inputs DiffSynth's model_fn gets for a one-image edit: noisy latents, the edit image's latents (as many
    tokens again) and the encoded prompt."""
    generator = torch.Generator(device).manual_seed(seed)
    latent = (1, 16, height // 8, width // 8)
    return {
        "latents": torch.randn(latent, generator=generator, device=device, dtype=dtype),
        "edit_latents": torch.randn(latent, generator=generator, device=device, dtype=dtype),
        "prompt_emb": torch.randn((1, text_tokens, dit.txt_in.in_features), generator=generator, device=device,
                                  dtype=dtype),
        "prompt_emb_mask": torch.ones((1, text_tokens), dtype=torch.long, device=device),
        "timestep": torch.tensor([500.0], device=device, dtype=dtype),
        "height": height, "width": width,
    }


def image_tokens(inputs: dict) -> int:
    return 2 * (inputs["height"] // 16) * (inputs["width"] // 16)


def forward(dit, inputs: dict, config: OptimizationConfig, backend: str) -> torch.Tensor:
    from diffsynth.pipelines.qwen_image import model_fn_qwen_image
    with torch.no_grad(), attention.active(backend), fp8.forward_context(dit, config.fp8):
        return model_fn_qwen_image(dit=dit, **inputs)


def relative_error(output: torch.Tensor, reference: torch.Tensor) -> float:
    return float((output.float() - reference.float()).norm() / reference.float().norm())


def resolve_backend(config: OptimizationConfig, dit, inputs: dict, device: str) -> tuple[str, str]:
    """The backend that runs, and the words that say so ("auto" with what it timed)."""
    return attention.resolve(config.attention, dit, image_tokens(inputs) + inputs["prompt_emb"].shape[1], device)


def bench_dit_configuration(base_dit, config: OptimizationConfig, inputs: dict, device: str, repeats: int,
                            reference: torch.Tensor | None, block_reference: tuple[dict, torch.Tensor] | None):
    """Returns (row, output, prepared DiT). Without references (the baseline) the errors are 0 by definition."""
    recorder = RunRecorder(device)
    dit, report = prepare_dit(base_dit, config, recorder, device)
    backend, report["attention"] = resolve_backend(config, dit, inputs, device)
    allocated_before = torch.cuda.memory_allocated() if device.startswith("cuda") else 0
    if device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
    synchronize(device)
    start = time.perf_counter()
    output = forward(dit, inputs, config, backend)
    synchronize(device)
    first_call_s = time.perf_counter() - start
    ms = median_ms(lambda: forward(dit, inputs, config, backend), device, repeats, warmup=2)
    on_gpu = device.startswith("cuda")
    peak_gib = (torch.cuda.max_memory_allocated() - allocated_before) / GIB if on_gpu else None
    weights_gib = storage_bytes(dit) / GIB
    row = {
        "config": config.label,
        "ms_per_forward": ms,
        "prepare_s": sum(recorder.telemetry.prepare_steps.values()),
        "first_call_s": first_call_s,
        "weights_gib": weights_gib,
        "activation_peak_gib": peak_gib,
        "dit_alone_gib": weights_gib + peak_gib if peak_gib is not None else None,
        # everything on the device at the peak: the DiT alone when the base lives in host memory
        "device_peak_gib": torch.cuda.max_memory_allocated() / GIB if on_gpu else None,
        "rel_error": relative_error(output, reference) if reference is not None else 0.0,
        "block_rel_error": block_error(dit, config, backend, block_reference) if block_reference else 0.0,
        "finite": bool(torch.isfinite(output).all()),
        "attention_ran": backend,
        "report": report,
    }
    return row, output, dit


def block_inputs(dit, inputs: dict, config: OptimizationConfig, backend: str, index: int = 0) -> dict:
    """What transformer block `index` receives, captured from a real forward."""
    captured = {}

    def grab(module, args, kwargs):
        captured.update(kwargs)
        raise _Captured
    handle = dit.transformer_blocks[index].register_forward_pre_hook(grab, with_kwargs=True)
    try:
        forward(dit, inputs, config, backend)
    except _Captured:
        pass
    finally:
        handle.remove()
    return {name: captured[name] for name in ("image", "text", "temb", "image_rotary_emb")}


class _Captured(Exception):
    pass


def run_blocks(dit, captured: dict, config: OptimizationConfig, backend: str, blocks: slice = slice(None)):
    image, text = captured["image"], captured["text"]
    with torch.no_grad(), attention.active(backend), fp8.forward_context(dit, config.fp8):
        for block in dit.transformer_blocks[blocks]:
            text, image = block(image=image, text=text, temb=captured["temb"],
                                image_rotary_emb=captured["image_rotary_emb"])
    return image


def middle_block(dit) -> int:
    return len(dit.transformer_blocks) // 2


def block_error(dit, config: OptimizationConfig, backend: str, reference: tuple[dict, torch.Tensor]) -> float:
    """Relative error of one block (the middle one) on the baseline's own input to it: FP8's error where it
    arises, before 60 random blocks amplify it (on random weights even a lossless reordering of bf16 sums
    moves the final output by a few percent)."""
    captured, expected = reference
    return relative_error(middle_block_output(dit, captured, config, backend), expected)


def middle_block_output(dit, captured: dict, config: OptimizationConfig, backend: str) -> torch.Tensor:
    index = middle_block(dit)
    return run_blocks(dit, captured, config, backend, slice(index, index + 1))


def lossless_batching_experiments(dit, inputs: dict, config: OptimizationConfig, device: str, repeats: int) -> dict:
    """The block loop (all of the DiT's cost but the tiny embedding and output layers) timed three ways."""
    backend, _ = resolve_backend(config, dit, inputs, device)
    single = block_inputs(dit, inputs, config, backend)
    doubled = {name: (torch.cat([value, value]) if name != "image_rotary_emb" else value)
               for name, value in single.items()}
    two_forwards = median_ms(lambda: (run_blocks(dit, single, config, backend),
                                      run_blocks(dit, single, config, backend)), device, repeats, warmup=2)
    batched = median_ms(lambda: run_blocks(dit, doubled, config, backend), device, repeats, warmup=2)
    result = {"config": config.label, "cfg_two_forwards_ms": two_forwards, "cfg_batched_ms": batched,
              "cfg_batching_gain": two_forwards / batched}
    if device.startswith("cuda"):
        result.update(_cuda_graph_experiment(dit, single, config, backend, repeats))
    return result


def _cuda_graph_experiment(dit, block_inputs, config, backend, repeats) -> dict:
    eager = median_ms(lambda: run_blocks(dit, block_inputs, config, backend), "cuda", repeats)
    try:
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(2):
                run_blocks(dit, block_inputs, config, backend)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            run_blocks(dit, block_inputs, config, backend)
        replay = median_ms(graph.replay, "cuda", repeats)
    except Exception as error:  # capture refused (a sync or a kernel that cannot be captured): report why
        return {"cuda_graph_loop_ms": None, "cuda_graph_error": f"{type(error).__name__}: {error}"[:300]}
    return {"block_loop_ms": eager, "cuda_graph_loop_ms": replay, "cuda_graph_gain": eager / replay}


DIT_COLUMNS = {
    "config": "configuration",
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


def cmd_bench_dit(args, engine, configs: list[OptimizationConfig]) -> int:
    import json
    from pathlib import Path

    from .bench import environment, markdown_table, write_bar_charts

    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    base_dit = load_base_dit(engine.spec, engine.device, engine.dtypes)
    width, height = args.width or 1024, args.height or 1024
    inputs = dit_inputs(base_dit, width, height, args.text_tokens, engine.device, engine.torch_dtype, args.seed)
    context = {"model": engine.spec.source, "device": engine.device, "size": [width, height],
               "image_tokens": image_tokens(inputs), "text_tokens": args.text_tokens, "repeats": args.repeats,
               "environment": environment(), "rows": [], "experiments": None}
    reference, block_reference, dit = None, None, None
    for config in configs:
        # Free the previous configuration's DiT before building the next: a compiled block and its compiled code
        # reference each other, so only the cycle collector frees them.
        del dit
        gc.collect()
        empty_cache(engine.device)
        row, output, dit = bench_dit_configuration(base_dit, config, inputs, engine.device, args.repeats, reference,
                                                   block_reference)
        if reference is None:
            reference = output.float()
            captured = block_inputs(dit, inputs, config, row["attention_ran"], middle_block(dit))
            block_reference = (captured, middle_block_output(dit, captured, config, row["attention_ran"]))
        row["speedup"] = context["rows"][0]["ms_per_forward"] / row["ms_per_forward"] if context["rows"] else 1.0
        context["rows"].append(row)
        (out_dir / "results.json").write_text(json.dumps(context, indent=2))  # kept even if a later one fails
        print(f"{row['config']}: {row['ms_per_forward']:.1f} ms/forward, first call {row['first_call_s']:.1f} s, "
              f"rel. error {row['rel_error']:.4f}, block {row['block_rel_error']:.4f}", flush=True)
    if args.experiments:
        fastest = configs[min(range(len(configs)), key=lambda i: context["rows"][i]["ms_per_forward"])]
        if fastest is not configs[-1]:
            del dit
            gc.collect()
            dit, _ = prepare_dit(base_dit, fastest, RunRecorder(engine.device), engine.device)
        context["experiments"] = lossless_batching_experiments(dit, inputs, fastest, engine.device, args.repeats)
        print(json.dumps(context["experiments"], indent=2), flush=True)
    (out_dir / "results.json").write_text(json.dumps(context, indent=2))
    (out_dir / "table.md").write_text(markdown_table(context["rows"], DIT_COLUMNS) + "\n")
    rows = context["rows"]
    write_bar_charts(out_dir / "chart.png",
                     args.title or f"GhostEdit DiT forward, {width}x{height} edit: {engine.spec.source} on {engine.device}",
                     [row["config"] for row in rows], [row["ms_per_forward"] for row in rows],
                     "ms per DiT forward (lower is better)", [row["dit_alone_gib"] or 0 for row in rows],
                     "DiT alone: weights + activation peak, GiB")
    print(markdown_table(context["rows"], DIT_COLUMNS))
    return 0
