"""Every execution plan cuDNN offers for the FP8 attention at the DiT's shape, timed: does a plan faster than the one
its heuristics pick (the engine runs the first that builds) exist?

On the GPU machine (after `source scripts/gpu/setup.sh`):  python3 scripts/gpu/attention_plans_probe.py [--out DIR]
A 1024x1024 edit: 24 heads of 128, 8192 image + 256 text tokens, q and k of unit RMS per head, v of unit variance,
each cast to FP8 with its own scale. For each heuristics mode and for two input layouts (the engine's
[batch, seq, heads, head_dim] and a contiguous [batch, heads, seq, head_dim]), every plan is built and timed
(median of CUDA-event timings after warm-up); its output is checked against float32 attention of the same FP8
inputs. The engine's own op is timed beside them. Writes attention-plans.json.
"""
from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import torch

from ghostedit.optimize import fp8_attention
from ghostedit.telemetry import median_ms

HEADS, HEAD_DIM, TOKENS = 24, 128, 8192 + 256
FLOPS = 4 * TOKENS * TOKENS * HEAD_DIM * HEADS


def fp8_inputs():
    generator = torch.Generator("cuda").manual_seed(0)
    tensors = [torch.randn(1, TOKENS, HEADS, HEAD_DIM, device="cuda", dtype=torch.bfloat16, generator=generator)
               for _ in range(3)]
    return [fp8_attention.to_fp8(t, t.abs().amax().float()) for t in tensors]  # (fp8, descale [1,1,1,1]) each


def reference(inputs) -> torch.Tensor:
    """float32 attention of the FP8 inputs' real values, [batch, heads, seq, head_dim]."""
    q, k, v = ((x.float() * descale).permute(0, 2, 1, 3) for x, descale in inputs)
    return torch.nn.functional.scaled_dot_product_attention(q, k, v)


def layouts(inputs):
    """The engine's layout (views of [batch, seq, heads, head_dim]) and contiguous [batch, heads, seq, head_dim]."""
    views = [x.permute(0, 2, 1, 3) for x, _ in inputs]
    yield "bshd (engine)", views, fp8_attention._bshd_output_stride(1, HEADS, TOKENS, HEAD_DIM)
    yield "bhsd", [v.contiguous() for v in views], (HEADS * TOKENS * HEAD_DIM, TOKENS * HEAD_DIM, HEAD_DIM, 1)


def plans(cudnn, handle, q, k, v, output_stride, mode):
    graph = fp8_attention.operation_graph(cudnn, handle, (1, HEADS, TOKENS, TOKENS, HEAD_DIM), q.stride(),
                                          k.stride(), v.stride(), output_stride)
    graph.create_execution_plans([mode])
    graph.check_support()
    graph.build_plans(cudnn.build_plan_policy.ALL)
    return graph


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=os.environ.get("OUT", "bench-results") + "/attention-plans")
    args = parser.parse_args()
    cudnn = fp8_attention.cudnn_frontend()
    handle = fp8_attention._handle(cudnn, torch.device("cuda"))
    inputs = fp8_inputs()
    expected = reference(inputs)
    (q8, qd), (k8, kd), (v8, vd) = inputs

    def error(output_bhsd):
        return float(((output_bhsd.float() * vd) - expected).norm() / expected.norm())

    engine_output = None

    def engine_op():
        nonlocal engine_output
        engine_output = fp8_attention.cudnn_fp8_attention([q8], [k8], [v8], qd, kd, vd)
    ms = median_ms(engine_op, "cuda", repeats=20, warmup=3)
    results = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "cudnn": torch.backends.cudnn.version(),
               "frontend": getattr(cudnn, "__version__", "?"),
               "shape": {"heads": HEADS, "head_dim": HEAD_DIM, "tokens": TOKENS},
               "engine_op": {"ms": ms, "tflops": FLOPS / ms / 1e9,
                             "rel_error": error(engine_output.permute(0, 2, 1, 3))}, "plans": []}
    print(f"engine op: {ms:.3f} ms {FLOPS / ms / 1e9:.0f} TFLOP/s error {results['engine_op']['rel_error']:.4f}",
          flush=True)
    for layout, (q, k, v), output_stride in layouts(inputs):
        for mode_name in ("A", "B", "FALLBACK"):
            mode = getattr(cudnn.heur_mode, mode_name)
            try:
                graph = plans(cudnn, handle, q, k, v, output_stride, mode)
            except Exception as failure:  # a mode that offers nothing for this graph
                results["plans"].append({"layout": layout, "mode": mode_name, "error": str(failure)[:300]})
                print(layout, mode_name, "no plans:", str(failure)[:200], flush=True)
                continue
            for index in range(graph.get_execution_plan_count()):
                row = {"layout": layout, "mode": mode_name, "index": index,
                       "name": graph.get_plan_name_at_index(index)}
                try:
                    workspace = torch.empty(max(graph.get_workspace_size_plan_at_index(index), 1), dtype=torch.uint8,
                                            device="cuda")
                    output = torch.empty_strided((1, HEADS, TOKENS, HEAD_DIM), output_stride, dtype=q.dtype,
                                                 device="cuda")
                    pack = fp8_attention.variant_pack(q, k, v, output, qd, kd, vd)
                    ms = median_ms(lambda: graph.execute_plan_at_index(pack, workspace, index, handle=handle), "cuda",
                                   repeats=20, warmup=3)
                    row.update(ms=ms, tflops=FLOPS / ms / 1e9, rel_error=error(output))
                except Exception as failure:  # a plan that did not build or run
                    row["error"] = str(failure)[:300]
                results["plans"].append(row)
                print(json.dumps(row), flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "attention-plans.json").write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
