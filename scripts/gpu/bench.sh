#!/usr/bin/env bash
# The GPU measurements behind docs/benchmarks.md, in one run of under 10 minutes on the GPU machine
# (it sources scripts/gpu/setup.sh; the wheels: ../shared/tools/device-wheels --preset engine, --preset fa4, and
# --dest .whl-cudnn nvidia-cudnn-frontend==1.32.0 for the cuDNN FP8 attention):
#   scripts/gpu/bench.sh        all four phases, in this order, with one compile cache, empty at the start:
#     dit        one DiT forward at a 1024x1024 edit: stock, the best combination, each toggle alone, and the
#                lossless experiments (CFG batching, CUDA graph) on the fastest. The best configuration comes
#                right after stock: the first compile of a fresh process with an empty cache, a cold start.
#     restart    the best configuration in a new process that finds the compile cache the dit phase wrote
#     e2e        40-step edits end to end, stock against best
#     memory     the whole pipeline in FP8, the base DiT and the text encoder in host memory
#   scripts/gpu/bench.sh PHASE  one phase; `te` measures Transformer Engine (installed by
#                               scripts/gpu/install_te.sh) against torchao FP8; `attention` times every
#                               attention backend alone at the DiT's shape; `first-call` profiles the best
#                               configuration's first call on an empty compile cache, then in a restarted process
# Results go to $OUT/<phase>/ (results.json, table.md, chart.png, <phase>.log) or ./bench-results/<phase>/.
# BEST and EXACT override those configurations; DRY_RUN=1 MODEL=tiny SIDE=128 rehearses on a CPU (with a BEST and
# an EXACT that the CPU can run).
set -euo pipefail
cd "$(dirname "$0")/.."
[ -n "${DRY_RUN:-}" ] || QUIET_SETUP=1 source scripts/gpu/setup.sh
OUT=${OUT:-bench-results}
# the fastest with exact attention, and the best: the same with FP8 attention
EXACT=${EXACT:-exact}  # ghostedit/optimize/presets.py
BEST=${BEST:-best}
MODEL=${MODEL:-synthetic}
SIZE=(--width "${SIDE:-1024}" --height "${SIDE:-1024}")
PYTHON=${PYTHON:-python3}
export TORCHINDUCTOR_CACHE_DIR=${TORCHINDUCTOR_CACHE_DIR:-/tmp/ghostedit-bench-inductor-cache}
START=$(date +%s)

bench() {  # bench PHASE ARGS...: one process; its log kept beside its results
  local phase=$1; shift
  mkdir -p "$OUT/$phase"
  local begin=$(date +%s)
  "$PYTHON" -m ghostedit bench --model "$MODEL" --out-dir "$OUT/$phase" "$@" 2>&1 |
    { grep -v "^Loading\|^Loaded\|^Using\|^No \|^    \|^}\|^{\|register_constant\|│\|┌\|└" || true; } |
    tee "$OUT/$phase/$phase.log"
  echo "== $phase: process wall $(( $(date +%s) - begin )) s, run so far $(( $(date +%s) - START )) s" |
    tee -a "$OUT/$phase/$phase.log"
}

phase() {
  case $1 in
    dit)
      rm -rf "$TORCHINDUCTOR_CACHE_DIR"
      # the lossless rewrites one at a time on FP8 + compile, up to EXACT; then BEST without multi-kernel and
      # BEST with fused-qkv
      bench dit --level dit "${SIZE[@]}" --text-tokens 256 --repeats 6 --experiments --configs baseline "$BEST" \
        attention=auto attention=fa4 attention=sdpa-flash attention=cudnn-fp8 fp8=storage fp8=torchao \
        compile=regional fp8=torchao,compile=regional fp8=torchao,compile=regional,rewrites=real-rope \
        fp8=torchao,compile=regional,rewrites=real-rope+joint-layout "$EXACT" \
        fp8=torchao,compile=regional,rewrites=real-rope,attention=cudnn-fp8 \
        fp8=torchao,compile=regional,rewrites=real-rope+inductor-multi-kernel+fused-qkv,attention=cudnn-fp8 ;;
    restart)
      bench restart --level dit "${SIZE[@]}" --text-tokens 256 --repeats 3 --configs "$BEST" ;;
    e2e)
      bench e2e "${SIZE[@]}" --steps 40 --repeats 0 --one-at-a-time --configs baseline "$BEST" ;;
    memory)
      bench memory "${SIZE[@]}" --steps 4 --repeats 0 --memory low --configs "$BEST" ;;
    attention)
      "$PYTHON" scripts/gpu/attention_probe.py --out "$OUT/attention" ;;
    first-call)
      local cache=/tmp/ghostedit-first-call-cache
      rm -rf "$cache"
      for label in cold restart; do
        TORCHINDUCTOR_CACHE_DIR=$cache "$PYTHON" scripts/gpu/profile_first_call.py "$label" "$BEST" --out "$OUT/first-call" \
          $([ "$label" = restart ] && echo --cprofile) 2>&1 | grep -v "^Loading\|^Loaded\|SyntaxWarning\|^  \"\"\"" || true
      done ;;
    te)
      for probe in "" "with-te raw" "with-te"; do
        { "$PYTHON" scripts/gpu/te_probe.py $probe 2>&1 || true; } | { grep -v "arn\|Jax" || true; }
      done
      bench te --level dit "${SIZE[@]}" --text-tokens 256 --repeats 8 \
        --configs baseline fp8=torchao fp8=torchao,compile=regional fp8=te fp8=te-delayed fp8=te,compile=regional ;;
    *) echo "unknown phase $1" >&2; exit 2 ;;
  esac
}

if [ $# -eq 0 ]; then
  for name in dit restart e2e memory; do phase $name; done
else
  phase "$1"
fi
