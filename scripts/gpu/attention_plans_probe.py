"""Every execution plan cuDNN offers for the FP8 attention at the DiT's shapes, timed: does a plan faster than the
one its heuristics pick (the engine runs the first that builds) exist, and does the prompt's length change the
answer?

On the GPU machine (after `source scripts/gpu/setup.sh`):
    python3 scripts/gpu/attention_plans_probe.py [--out DIR] [--text-tokens N ...]
A 1024x1024 edit: 24 heads of 128, 8192 image tokens and each given number of text tokens (a real prompt's length
is rarely a multiple of a tile), q and k of unit RMS per head, v of unit variance, each cast to FP8 with its own
scale. At the first length, every plan of each heuristics mode for two input layouts (the engine's
[batch, seq, heads, head_dim] and a contiguous [batch, heads, seq, head_dim]); at the others, mode A's plans in the
engine's layout. Each plan is timed (median of CUDA-event timings after warm-up, and per call over calls back to
back) and its output checked against float32 attention of the same FP8 inputs; the engine's own op is timed beside
them, and again with the queries padded with rows of zeros to a multiple of 128 (the keys and values as they are),
and mode A's plans with q, k and v padded to that multiple under cuDNN's padding mask. Writes attention-plans.json.
"""
from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import torch

from ghostedit.optimize import fp8_attention
from ghostedit.telemetry import back_to_back_ms, median_ms

HEADS, HEAD_DIM, IMAGE_TOKENS = 24, 128, 8192
QUERY_MULTIPLE = 128  # cuDNN masks every tile of an FP8 attention whose query length is not a multiple of this


def sustained_ms(fn, calls: int = 240) -> float:
    """Milliseconds per call over `calls` calls back to back (the GPU busy throughout, as in a DiT forward, where the
    power limit holds the clocks back), after as many untimed."""
    return back_to_back_ms(fn, calls, warmup=calls)


def flops(tokens: int) -> int:
    return 4 * tokens * tokens * HEAD_DIM * HEADS


def fp8_inputs(tokens: int):
    generator = torch.Generator("cuda").manual_seed(0)
    tensors = [torch.randn(1, tokens, HEADS, HEAD_DIM, device="cuda", dtype=torch.bfloat16, generator=generator)
               for _ in range(3)]
    return [fp8_attention.to_fp8(t, t.abs().amax().float()) for t in tensors]  # (fp8, descale [1,1,1,1]) each


def reference(inputs) -> torch.Tensor:
    """float32 attention of the FP8 inputs' real values, [batch, heads, seq, head_dim]."""
    q, k, v = ((x.float() * descale).permute(0, 2, 1, 3) for x, descale in inputs)
    return torch.nn.functional.scaled_dot_product_attention(q, k, v)


def layouts(inputs, tokens: int, every: bool):
    """The engine's layout (views of [batch, seq, heads, head_dim]) and, if `every`, contiguous
    [batch, heads, seq, head_dim]."""
    views = [x.permute(0, 2, 1, 3) for x, _ in inputs]
    yield "bshd (engine)", views, fp8_attention._bshd_output_stride(1, HEADS, tokens, HEAD_DIM)
    if every:
        yield "bhsd", [v.contiguous() for v in views], (HEADS * tokens * HEAD_DIM, tokens * HEAD_DIM, HEAD_DIM, 1)


def plans(cudnn, handle, q, k, v, output_stride, mode, tokens: int, padding_mask: bool = False):
    graph = fp8_attention.operation_graph(cudnn, handle, (1, HEADS, tokens, tokens, HEAD_DIM), q.stride(),
                                          k.stride(), v.stride(), output_stride, padding_mask=padding_mask)
    graph.create_execution_plans([mode])
    graph.check_support()
    graph.build_plans(cudnn.build_plan_policy.ALL)
    return graph


def timed_plan(graph, handle, index: int, tokens: int, row: dict, bind) -> dict:
    """Execution plan `index` of a built graph in `row`: its name, its time (median of CUDA-event timings after
    warm-up, and per call over calls back to back) and its output's error. `bind()` gives the plan's variant pack
    and a function that reads its output's error; a plan that does not build or run gives its error instead."""
    row.update(index=index, name=graph.get_plan_name_at_index(index))
    try:
        workspace = torch.empty(max(graph.get_workspace_size_plan_at_index(index), 1), dtype=torch.uint8,
                                device="cuda")
        pack, output_error = bind()

        def run():
            graph.execute_plan_at_index(pack, workspace, index, handle=handle)
        ms = median_ms(run, "cuda", repeats=20, warmup=3)
        row.update(ms=ms, tflops=flops(tokens) / ms / 1e9, rel_error=output_error(), sustained_ms=sustained_ms(run))
    except Exception as failure:  # a plan that did not build or run
        row["error"] = str(failure)[:300]
    return row


def padding_mask_plans(cudnn, handle, inputs, tokens: int, padded: int, error) -> list[dict]:
    """q, k and v padded with rows of zeros to `padded` tokens, cuDNN told the real length (its padding mask) of
    both or of the keys alone (the padded queries' rows are computed and dropped): mode A's plans, each timed, the
    real rows' output checked."""
    q, k, v = (torch.cat([x.view(torch.uint8), x.new_zeros((1, padded - tokens, HEADS, HEAD_DIM)).view(torch.uint8)],
                         dim=1).view(x.dtype).permute(0, 2, 1, 3) for x, _ in inputs)
    output_stride = fp8_attention._bshd_output_stride(1, HEADS, padded, HEAD_DIM)
    try:
        graph = plans(cudnn, handle, q, k, v, output_stride, cudnn.heur_mode.A, padded, padding_mask=True)
    except Exception as failure:  # cuDNN refuses a padding mask on this graph
        print("padding mask: no plans:", str(failure)[:300], flush=True)
        return [{"error": str(failure)[:300]}]
    (_, qd), (_, kd), (_, vd) = inputs
    length, whole = (torch.full((1, 1, 1, 1), n, dtype=torch.int32, device="cuda") for n in (tokens, padded))
    rows = []
    for index in range(graph.get_execution_plan_count()):
        for queries in ("real", "padded"):
            def bind():
                output = torch.zeros((1, padded, HEADS, HEAD_DIM), dtype=q.dtype, device="cuda")
                pack = fp8_attention.variant_pack(q, k, v, output.permute(0, 2, 1, 3), qd, kd, vd)
                pack.update({fp8_attention._SEQ_LEN_Q: length if queries == "real" else whole,
                             fp8_attention._SEQ_LEN_KV: length})
                return pack, lambda: error(output[:, :tokens].permute(0, 2, 1, 3))
            rows.append(timed_plan(graph, handle, index, tokens, {"padded_to": padded, "query_length": queries},
                                   bind))
            print("padding mask:", json.dumps(rows[-1]), flush=True)
    return rows


def probe_length(cudnn, handle, text_tokens: int, every: bool) -> dict:
    tokens = IMAGE_TOKENS + text_tokens
    inputs = fp8_inputs(tokens)
    expected = reference(inputs)
    (q8, qd), (k8, kd), (v8, vd) = inputs

    def error(output_bhsd):
        return float(((output_bhsd.float() * vd) - expected).norm() / expected.norm())

    engine_output = None

    def engine_op():
        nonlocal engine_output
        engine_output = fp8_attention.cudnn_fp8_attention([q8], [k8], [v8], qd, kd, vd)
    ms = median_ms(engine_op, "cuda", repeats=20, warmup=3)
    found = {"text_tokens": text_tokens, "tokens": tokens,
             "engine_op": {"ms": ms, "tflops": flops(tokens) / ms / 1e9,
                           "rel_error": error(engine_output.permute(0, 2, 1, 3))}, "plans": []}
    print(f"{tokens} tokens: engine op {ms:.3f} ms {flops(tokens) / ms / 1e9:.0f} TFLOP/s "
          f"error {found['engine_op']['rel_error']:.4f}", flush=True)
    padding = -tokens % QUERY_MULTIPLE
    if padding:  # the queries padded with rows of zeros, their outputs dropped
        rows = torch.zeros((1, padding, HEADS, HEAD_DIM), dtype=q8.dtype, device="cuda")

        def padded_op():
            nonlocal engine_output
            engine_output = fp8_attention.cudnn_fp8_attention([q8, rows], [k8], [v8], qd, kd, vd)
        ms = median_ms(padded_op, "cuda", repeats=20, warmup=3)
        found["queries_padded"] = {"to": tokens + padding, "ms": ms, "tflops": flops(tokens) / ms / 1e9,
                                   "rel_error": error(engine_output[:, :tokens].permute(0, 2, 1, 3))}
        print(f"{tokens} tokens, queries padded to {tokens + padding}: {ms:.3f} ms "
              f"error {found['queries_padded']['rel_error']:.4f}", flush=True)
    if padding:
        found["padding_mask"] = padding_mask_plans(cudnn, handle, inputs, tokens, tokens + padding, error)
    for layout, (q, k, v), output_stride in layouts(inputs, tokens, every):
        for mode_name in ("A", "B", "FALLBACK") if every else ("A",):
            mode = getattr(cudnn.heur_mode, mode_name)
            try:
                graph = plans(cudnn, handle, q, k, v, output_stride, mode, tokens)
            except Exception as failure:  # a mode that offers nothing for this graph
                found["plans"].append({"layout": layout, "mode": mode_name, "error": str(failure)[:300]})
                print(layout, mode_name, "no plans:", str(failure)[:200], flush=True)
                continue
            for index in range(graph.get_execution_plan_count()):
                def bind():
                    output = torch.empty_strided((1, HEADS, tokens, HEAD_DIM), output_stride, dtype=q.dtype,
                                                 device="cuda")
                    return fp8_attention.variant_pack(q, k, v, output, qd, kd, vd), lambda: error(output)
                found["plans"].append(timed_plan(graph, handle, index, tokens, {"layout": layout, "mode": mode_name},
                                                 bind))
                print(json.dumps(found["plans"][-1]), flush=True)
    return found


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=os.environ.get("OUT", "bench-results") + "/attention-plans")
    parser.add_argument("--text-tokens", type=int, nargs="+", default=[256])
    args = parser.parse_args()
    cudnn = fp8_attention.cudnn_frontend()
    handle = fp8_attention._handle(cudnn, torch.device("cuda"))
    results = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "cudnn": torch.backends.cudnn.version(),
               "cudnn_of_the_frontend": cudnn.backend_version(), "frontend": getattr(cudnn, "__version__", "?"),
               "shape": {"heads": HEADS, "head_dim": HEAD_DIM, "image_tokens": IMAGE_TOKENS},
               "lengths": [probe_length(cudnn, handle, text_tokens, every=index == 0)
                           for index, text_tokens in enumerate(args.text_tokens)]}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "attention-plans.json").write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
