"""`ghostedit bench --level 2.1`: Qwen-Image-2.1 (the full-size synthetic model on the GPU) under GhostEdit's
configurations against stock DiffSynth, its QwenImage21Pipeline and QwenImage21DiT with its prefix KV cache on,
on the same weights (stock's DiT is built over the base DiT's tensors), images, prompt and seed.

Each case (an output side, a number of reference images, steps; Turbo: its 8 fixed sigmas) runs on each pipeline
twice: a warm-up of two steps (the first fills the prefix cache, the second reads it: a compiled DiT compiles both
graphs there; with CUDA graphs the warm-up runs twice, the second capturing both forwards' graphs) and the timed
run. A row gives the end-to-end time of the pipeline call (its text and image encoding,
denoising and decoding, the GPU waited for), the first step (it fills the cache), the median cached step, the peak
memory and the tokens the first and a cached DiT forward computed. Stock resizes each reference to the output's
area (DiffSynth's rule; GhostEdit's is diffusers' 1024x1024), so its rows at 2048 compute more tokens: the token
columns say so. Where the base DiT lives in host memory (a small card: memory placement), stock, which would run
its DiT there, is left out and the rows have no speed-up.
"""
from __future__ import annotations

import copy
import statistics
import time
from dataclasses import dataclass, replace
from pathlib import Path

import torch
from PIL import Image

from ..device import empty_cache
from ..engine.runner import dit_run
from ..models.family import SYNTHETIC_21_TURBO, TINY_21_TURBO
from ..telemetry import RunRecorder

STOCK = "DiffSynth (stock)"
ASSETS = Path(__file__).resolve().parents[2] / "assets" / "examples"
REFERENCES = ("house.png", "portrait.png", "mountains.png", "house.png")
PROMPT = "put the people of the first image into the scene of the last one, at dusk"


@dataclass(frozen=True)
class Case:
    side: int
    references: int
    steps: int
    turbo: bool = False

    @property
    def words(self) -> str:
        what = f"{self.references} reference{'s' if self.references != 1 else ''}" if self.references else \
            "text-to-image"
        return f"{'Turbo ' if self.turbo else ''}{self.side}x{self.side}, {what}, {self.steps} steps"


CASES = {
    "1024-1ref": Case(1024, 1, 40),
    "turbo-1024-1ref": Case(1024, 1, 8, turbo=True),
    "2048-1ref": Case(2048, 1, 20),  # 20 steps: the whole table in one device call (the first step and the cached
    "2048-4ref": Case(2048, 4, 20),  # one are measured; N steps take about the first + (N - 1) cached ones)
    "t2i-1024": Case(1024, 0, 40),
}
COLUMNS = {"case": "case", "config": "configuration", "end_to_end_s": "end to end s", "first_step_s": "first step s",
           "cached_step_s": "cached step s", "before_steps_s": "before the steps s",
           "after_steps_s": "after the steps s", "speedup_cached": "cached step × stock",
           "speedup_end_to_end": "end to end × stock", "tokens_first": "tokens, first step",
           "tokens_cached": "tokens, cached step", "peak_gib": "peak GiB"}


def stock_pipeline(base):
    """DiffSynth's own QwenImage21Pipeline and QwenImage21DiT over the base pipeline's weights (no copy), text
    encoder, VAE and processor: what DiffSynth runs for 2.1, its prefix KV cache on."""
    from diffsynth.core.vram.initialization import skip_model_initialization
    from diffsynth.models.qwen_image_21_dit import QwenImage21DiT
    from diffsynth.pipelines.qwen_image_21 import QwenImage21Pipeline

    pipe = QwenImage21Pipeline(device=base.device, torch_dtype=base.torch_dtype)
    pipe.text_encoder, pipe.vae, pipe.processor = base.text_encoder, base.vae, base.processor
    with skip_model_initialization():
        dit = QwenImage21DiT(**base.dit.config)
    dit.load_state_dict(base.dit.state_dict(), assign=True)
    pipe.dit = dit.eval()
    return pipe


def run_bench(engine, configs, case_names: list[str], seed: int, on_row, mark, side: int | None = None) -> dict:
    """Every case on stock and on each configuration; rows in that order, each compared with stock's. `mark(words)`
    is called as each stage before a row begins (the process timeline's). `side`: every case at this side instead
    of its own (a rehearsal on a CPU)."""
    base = engine.load(configs[0])
    placement = engine.placement(configs[0])
    mark(f"weights built ({placement.chosen} placement)")
    stock = stock_pipeline(base) if placement.base_on_gpu else None
    stock_tokens = _stock_tokens(stock) if stock is not None else []
    prepared = []
    for config in configs:
        prepared.append((config, engine.prepare(config)[0]))
        mark(f"{config.label} prepared")
    turbo_family = TINY_21_TURBO if engine.spec.kind == "tiny" else SYNTHETIC_21_TURBO
    rows = []
    for name in case_names:
        case = replace(CASES[name], side=side) if side else CASES[name]
        images = [Image.open(ASSETS / file).convert("RGB") for file in REFERENCES[:case.references]]
        call = {"prompt": PROMPT, "edit_image": images or None, "height": case.side, "width": case.side,
                "seed": seed, "cfg_scale": 1.0, "sigmas": list(turbo_family.sample_sigmas) if case.turbo else None}
        stock_row = None
        if stock is not None:
            mark(f"{STOCK} at {name} begins")
            try:
                stock_row = _timed(stock, case, {**call, "num_inference_steps": case.steps}, engine.device,
                                   stock_tokens)
                rows.append(on_row({"case": name, "words": case.words, "config": STOCK, **stock_row}))
            except torch.OutOfMemoryError as error:  # DiffSynth's DiT at 2048 with 4 references on 80 GB: said, and
                refused = f"out of memory: {str(error).splitlines()[0]}"  # GhostEdit's pipelines still run the case
            else:
                refused = None
            if refused:  # freed here, once the error's traceback no longer holds the failed run's tensors
                empty_cache(engine.device)
                rows.append(on_row({"case": name, "words": case.words, "config": STOCK, "error": refused}))
        for config, ready in prepared:
            pipe = ready.pipe
            if case.turbo:  # the same DiT on Turbo's schedule (its sigmas as given)
                pipe = copy.copy(pipe)
                pipe.use_family(turbo_family)
            tokens: list[int] = []
            mark(f"GhostEdit {config.label} at {name} begins")
            with dit_run(ready, config, engine.device, (case.side // 16) ** 2, RunRecorder(engine.device)) as \
                    (options, _):
                arguments = {**call, "num_inference_steps": case.steps, "dit_options": options,
                             "prefix_cache": config.value("prefix-cache") == "on", "count_tokens": tokens.append}
                row = _timed(pipe, case, arguments, engine.device, tokens)
            rows.append(on_row({"case": name, "words": case.words, "config": f"GhostEdit {config.label}", **row,
                                **_speedups(row, stock_row)}))
    return {"rows": rows, "cases": {name: CASES[name].words for name in case_names}}


def _timed(pipe, case: Case, arguments: dict, device: str, tokens: list[int]) -> dict:
    """A two-step warm-up (twice where the forward is replayed from CUDA graphs: each forward's graph is captured at
    its second call), then the timed run: its end-to-end and step times, the peak memory, the tokens."""
    options = arguments.get("dit_options")
    for _ in range(2 if options is not None and options.graphs is not None else 1):
        pipe(**{**arguments, "num_inference_steps": 2, "sigmas": _two(arguments["sigmas"])},
             progress_bar_cmd=lambda timesteps: timesteps)
    tokens.clear()
    steps: list[float] = []
    if device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
    loop: dict[str, float] = {}
    start = _clock(device)
    pipe(**arguments, progress_bar_cmd=lambda timesteps: _timed_steps(timesteps, steps, device, loop))
    end = _clock(device)
    cuda = device.startswith("cuda")
    return {"end_to_end_s": end - start, "step_s": steps, "first_step_s": steps[0],
            "cached_step_s": statistics.median(steps[1:]) if len(steps) > 1 else None,
            "before_steps_s": loop["began"] - start, "after_steps_s": end - loop["ended"],
            "tokens_first": tokens[0] if tokens else None, "tokens_cached": tokens[-1] if len(tokens) > 1 else None,
            "peak_gib": torch.cuda.max_memory_allocated() / 1024**3 if cuda else None,
            "peak_reserved_gib": torch.cuda.max_memory_reserved() / 1024**3 if cuda else None}


def _two(sigmas):
    return None if sigmas is None else sigmas[:2]


def _timed_steps(timesteps, steps: list[float], device: str, loop: dict[str, float]):
    """Each step's seconds into `steps`; when the loop began and ended into `loop` (what comes before it: the
    prompt and the references encoded; after it: the latents decoded into the image)."""
    loop["began"] = last = _clock(device)
    for timestep in timesteps:
        yield timestep
        now = _clock(device)
        steps.append(now - last)
        last = now
    loop["ended"] = last


def _clock(device: str) -> float:
    """Seconds, once the GPU has done what was queued (every pipeline waits alike)."""
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    return time.perf_counter()


def _stock_tokens(stock) -> list[int]:
    """The tokens each of stock's DiT forwards computes (the joint sequence, or the target's alone from its
    cache), read from its inputs."""
    tokens: list[int] = []

    def count(module, args, kwargs):
        slots, cache = kwargs["img_mask"][0], kwargs.get("kv_cache")
        from_cache = cache is not None and len(cache[0]) > 0
        target = kwargs["img_shapes"][0][-1]
        tokens.append(target[1] * target[2] if from_cache else slots.numel() + 3 * int(slots.sum()))
    stock.dit.register_forward_pre_hook(count, with_kwargs=True)
    return tokens


def _speedups(row: dict, stock: dict | None) -> dict:
    if stock is None:
        return {"speedup_cached": None, "speedup_end_to_end": None}
    cached = stock["cached_step_s"] / row["cached_step_s"] if row["cached_step_s"] and stock["cached_step_s"] \
        else None
    return {"speedup_cached": cached, "speedup_end_to_end": stock["end_to_end_s"] / row["end_to_end_s"]}
