#!/usr/bin/env bash
# The GPU measurements behind docs/benchmarks.md, by phase (each fits one 10-minute device call):
#   scripts/gpu_bench.sh dit        DiT forward at a 1024x1024 edit: stock, each toggle alone, combinations (+ lossless
#                                   experiments: CFG batching, CUDA graph)
#   scripts/gpu_bench.sh coldstart  preparing the best configuration in a fresh process, cold compile cache then warm
#   scripts/gpu_bench.sh e2e        40-step edits end to end, stock against best, in one run
#   scripts/gpu_bench.sh memory     the whole pipeline in FP8 with DiT base and text encoder in host memory
#   scripts/gpu_bench.sh te         what importing Transformer Engine changes (scripts/te_probe.py), then TE FP8
#                                   against torchao FP8 (TE is installed by scripts/install_te_on_gpu.sh)
# Results go to $OUT/<phase>/ (results.json, table.md, chart.png) or ./bench-results/<phase>/.
# BEST overrides the configuration measured as best.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -n "${DRY_RUN:-}" ] || source scripts/gpu_setup.sh > /dev/null  # DRY_RUN=1 MODEL=tiny SIDE=128: a CPU rehearsal
OUT=${OUT:-bench-results}
BEST=${BEST:-fp8=torchao,compile=regional,rewrites=real-rope}
MODEL=${MODEL:-synthetic}
SIZE=(--width "${SIDE:-1024}" --height "${SIDE:-1024}")
PYTHON=${PYTHON:-python3}
bench() {
  "$PYTHON" -m ghostedit bench --model "$MODEL" "$@" 2>&1 |
    { grep -v "^Loading\|^Loaded\|^Using\|^No \|^    \|^}\|^{\|register_constant\|│\|┌\|└" || true; }
}

case ${1:?phase} in
  dit)
    bench --level dit "${SIZE[@]}" --text-tokens 256 --repeats 8 --experiments --host-memory text-encoder \
      --out-dir "$OUT/dit" --configs baseline attention=sdpa-cudnn attention=fa4 attention=sdpa-flash attention=auto \
      fp8=storage compile=regional compile=regional,rewrites=real-rope fp8=torchao fp8=torchao,compile=regional \
      fp8=torchao,compile=regional,rewrites=real-rope+fused-qkv "$BEST,attention=fa4" "$BEST" ;;
  coldstart)
    export TORCHINDUCTOR_CACHE_DIR=/tmp/coldstart-inductor-cache
    rm -rf "$TORCHINDUCTOR_CACHE_DIR"
    for phase in cold warm; do
      start=$(date +%s%N)
      bench --level dit "${SIZE[@]}" --repeats 6 --host-memory text-encoder --out-dir "$OUT/coldstart-$phase" \
        --configs "$BEST" $([ $phase = warm ] && echo --experiments)
      echo "$phase process wall: $(( ($(date +%s%N) - start) / 1000000 )) ms"
    done ;;
  e2e)
    bench "${SIZE[@]}" --steps 40 --repeats 1 --one-at-a-time --host-memory base-dit --out-dir "$OUT/e2e" \
      --configs baseline "$BEST" ;;
  memory)
    bench "${SIZE[@]}" --steps 4 --repeats 1 --host-memory base-dit text-encoder --out-dir "$OUT/memory" \
      --configs "$BEST" ;;
  te)
    for probe in "" "with-te raw" "with-te"; do
      { "$PYTHON" scripts/te_probe.py $probe 2>&1 || true; } | { grep -v "arn\|Jax" || true; }
    done
    bench --level dit "${SIZE[@]}" --text-tokens 256 --repeats 8 --host-memory text-encoder --out-dir "$OUT/te" \
      --configs baseline fp8=torchao fp8=torchao,compile=regional fp8=te fp8=te-delayed fp8=te,compile=regional ;;
  *) echo "unknown phase $1" >&2; exit 2 ;;
esac
