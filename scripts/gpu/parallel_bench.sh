#!/usr/bin/env bash
# Issue 18: one edit on one GPU and on two (ghostedit/parallel), for docs/benchmarks.md. On a 2-GPU machine
# (nvidia-h100-x2 or nvidia-h200-x2), after the wheels are carried there as for scripts/gpu/bench.sh. Each phase is
# one process group and fits one device call (each compiles the configuration, unless the machine kept
# $TORCHINDUCTOR_CACHE_DIR):
#   scripts/gpu/parallel_bench.sh one       the best configuration in one process on one GPU (label 1gpu)
#   scripts/gpu/parallel_bench.sh cfg       torchrun on 2 GPUs, CFG parallel: one pass of each step per GPU
#   scripts/gpu/parallel_bench.sh ulysses   torchrun on 2 GPUs, Ulysses: each pass's tokens split over the GPUs
#   scripts/gpu/parallel_bench.sh both      torchrun on $NPROC (4 or 8) GPUs, CFG 2 x Ulysses $NPROC/2
#   scripts/gpu/parallel_bench.sh link      the GPUs' topology and the cost of Ulysses's all-to-alls on their link
#   scripts/gpu/parallel_bench.sh both-busy the single-GPU edit on each of two GPUs at once, with nvidia-smi's clocks,
#                                           power and clock reasons every 2 s: does a GPU slow when its neighbour works
#   scripts/gpu/parallel_bench.sh table     table.md from the phases run so far (rows against 1gpu)
#   scripts/gpu/parallel_bench.sh all       one, cfg, ulysses, link (not in a DRY_RUN), table
#   scripts/gpu/parallel_bench.sh nccl-graph  torchrun on 2 GPUs: the Ulysses split's NCCL all-to-alls captured in a
#                                           CUDA graph and replayed, alone, in seconds (scripts/gpu/nccl_graph_check.py)
#   scripts/gpu/parallel_bench.sh split     nccl-graph first (if it fails, the configurations without cuda-graph
#                                           and the script ends with an error), then torchrun on 2 GPUs, the
#                                           DiT forward alone: one GPU against the Ulysses
#                                           split, bit for bit and timed, for best and exact
#                                           (scripts/gpu/split_check.py)
#   scripts/gpu/parallel_bench.sh smoke     on ONE GPU, before a 2-GPU machine is lent: the cfg and ulysses
#                                           code paths with $CONFIG through a fake process group
#                                           (tests/gpu/parallel_smoke.py; its image is garbage)
# The edit: ${SIDE}x${SIDE} (1024), $STEPS steps (40), CFG $CFG (4), configuration $CONFIG (best), model $MODEL
# (synthetic: the real architecture with random weights); a 2-step edit first (load, prepare, compile), then
# $REPEATS timed edits. Results in $RESULTS/parallel (default ./bench-results); with $OUT set (the device tool's
# folder) also packed as $OUT/parallel-<phase>.tar.gz: unpack them into one folder and run the table phase there
# (RESULTS=that-folder DRY_RUN=1 scripts/gpu/parallel_bench.sh table works on any machine).
# DRY_RUN=1 rehearses on a CPU: the tiny model, 128 px, 3 steps, float32, two gloo processes.
# Qwen-Image-2.1 (MODEL=synthetic-2.1, or tiny-2.1 in a DRY_RUN): the same phases on a 2.1 edit with one reference,
# CFG $CFG with the negative prompt $NEGATIVE (CFG parallel needs true CFG; 2.1 guides only with one), the fastest
# lossless 2.1 configuration (bench.sh's QWEN21_FAST; a DRY_RUN: FP8 stored, no CUDA graph), two warm-up edits (a
# graphed 2.1 edit captures its cache-filling forward's graph in the second), results in $RESULTS/parallel-2.1
# ($OUT/parallel-2.1-<phase>.tar.gz). One device call on nvidia-h100-x2:
#   mkdir -p /tmp/wheels && cp .whl/*.whl /tmp/wheels/ && OUT=$OUT MODEL=synthetic-2.1 scripts/gpu/parallel_bench.sh all
set -euo pipefail
cd "$(dirname "$0")/../.."
[ -n "${DRY_RUN:-}" ] || QUIET_SETUP=1 source scripts/gpu/setup.sh
RESULTS=${RESULTS:-bench-results}
PYTHON=${PYTHON:-python3}
NAME=parallel   # the results' folder (and the packed phase's name)
WARMUP_EDITS=1
case ${MODEL:-} in
  *-2.1*)
    NAME=parallel-2.1 WARMUP_EDITS=2 NEGATIVE=${NEGATIVE-blurry, low quality}
    if [ -n "${DRY_RUN:-}" ]; then
      CONFIG=${CONFIG:-fp8=storage,compile=regional,rewrites=real-rope+fused-qkv} SIDE=${SIDE:-64}
    fi
    CONFIG=${CONFIG:-fp8=torchao,compile=regional,rewrites=cuda-graph+real-rope+fused-qkv} ;;
esac
if [ -n "${DRY_RUN:-}" ]; then
  MODEL=${MODEL:-tiny} SIDE=${SIDE:-128} STEPS=${STEPS:-3} CONFIG=${CONFIG:-baseline} DEVICE=${DEVICE:-cpu}
  DTYPE=${DTYPE:-float32}
  export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
fi
MODEL=${MODEL:-synthetic}
NEGATIVE=${NEGATIVE:-}
SPLIT_CONFIGS=(best exact)  # the split phase's; a DRY_RUN's: what a CPU runs
[ -z "${DRY_RUN:-}" ] || SPLIT_CONFIGS=(baseline fp8=storage)
SIDE=${SIDE:-1024}
STEPS=${STEPS:-40}
CFG=${CFG:-4}
CONFIG=${CONFIG:-best}    # ghostedit/optimize/presets.py
REPEATS=${REPEATS:-1}
DEVICE=${DEVICE:-cuda}
DTYPE=${DTYPE:-}
NPROC=${NPROC:-4}
export TORCHINDUCTOR_CACHE_DIR=${TORCHINDUCTOR_CACHE_DIR:-/tmp/ghostedit-parallel-inductor-cache}
DIR=$RESULTS/$NAME
mkdir -p "$DIR"

edit() {  # edit LABEL PROCESSES MODE: one timed configuration; its log kept beside its results
  local label=$1 processes=$2 mode=$3 begin
  begin=$(date +%s)
  "$PYTHON" -m torch.distributed.run --standalone --nproc-per-node "$processes" \
    scripts/gpu/parallel_bench.py run --label "$label" --parallel "$mode" --model "$MODEL" --device "$DEVICE" \
    ${DTYPE:+--dtype "$DTYPE"} --config "$CONFIG" --side "$SIDE" --steps "$STEPS" --cfg "$CFG" \
    --repeats "$REPEATS" --warmup-edits "$WARMUP_EDITS" --negative-prompt "$NEGATIVE" --out-dir "$DIR" 2>&1 |
    { grep --line-buffered -v "^Loading\|^Loaded\|^Using\|^No \|register_constant\|Configuration class" || true; } |
    tee "$DIR/$label.log"
  echo "== $label: $processes process(es), wall $(( $(date +%s) - begin )) s" | tee -a "$DIR/$label.log"
}

link() {  # the GPUs' topology and what one block's Ulysses all-to-alls cost on it (NCCL, 2 GPUs)
  nvidia-smi topo -m | tee "$DIR/topology.txt"
  "$PYTHON" -m torch.distributed.run --standalone --nproc-per-node 2 scripts/gpu/parallel_bench.py link \
    --side "$SIDE" --out-dir "$DIR" 2>&1 | { grep --line-buffered -v "^\*\|OMP_NUM_THREADS" || true; } | tee "$DIR/link.log"
}

both_busy() {  # two single-GPU edits at once, one process per GPU, no process group between them
  if [ -n "${DRY_RUN:-}" ]; then  # its point is two GPUs and nvidia-smi; `one` rehearses the edit itself
    echo "both-busy needs a 2-GPU machine: no DRY_RUN" >&2
    return 2
  fi
  local dir=$DIR/both-busy gpu edits=()
  mkdir -p "$dir"
  nvidia-smi --query-gpu=timestamp,index,clocks.sm,clocks.mem,power.draw,power.limit,temperature.gpu,clocks_throttle_reasons.active \
    --format=csv -l 2 > "$dir/gpu-clocks.csv" &
  local clocks=$!
  for gpu in 0 1; do  # two timed edits each, so that the timed parts of the two overlap
    CUDA_VISIBLE_DEVICES=$gpu "$PYTHON" -m torch.distributed.run --standalone --nproc-per-node 1 \
      scripts/gpu/parallel_bench.py run --label "1gpu-on-gpu$gpu-both-busy" --parallel auto --model "$MODEL" \
      --device "$DEVICE" --config "$CONFIG" --side "$SIDE" --steps "$STEPS" --cfg "$CFG" --repeats 2 \
      --out-dir "$dir" > "$dir/gpu$gpu.log" 2>&1 &
    edits+=($!)
  done
  wait "${edits[@]}"
  kill "$clocks"
  rm -f "$dir"/*.png  # the edited images (random weights)
}

table() {
  "$PYTHON" scripts/gpu/parallel_bench.py table --out-dir "$DIR"
}

nccl_graph() {  # the split's NCCL collectives inside a CUDA graph, alone, in seconds (before the split phase)
  rm -f "$DIR/nccl-graph-check.json"
  "$PYTHON" -m torch.distributed.run --standalone --nproc-per-node 2 scripts/gpu/nccl_graph_check.py --out "$DIR" \
    --device "$DEVICE" 2>&1 | { grep --line-buffered -v "^\*\|OMP_NUM_THREADS" || true; } | tee "$DIR/nccl-graph.log"
  grep -q '"equal_on_every_rank": true' "$DIR/nccl-graph-check.json" ||
    { echo "nccl-graph: the split's collectives did not replay from a CUDA graph (nccl-graph.log)" >&2; return 1; }
}

case ${1:-} in
  one) edit 1gpu 1 auto ;;
  cfg) edit 2gpu-cfg 2 cfg ;;
  ulysses) edit 2gpu-ulysses 2 ulysses ;;
  both) edit "${NPROC}gpu-cfg-ulysses" "$NPROC" cfg+ulysses ;;
  link) link ;;
  both-busy) both_busy ;;
  table) table ;;
  nccl-graph) nccl_graph || failed=nccl-graph ;;
  split) without=()  # where the split's collectives do not replay from a CUDA graph: the split without graphs
         nccl_graph || { failed=nccl-graph; without=(--without cuda-graph); }
         "$PYTHON" -m torch.distributed.run --standalone --nproc-per-node 2 scripts/gpu/split_check.py --out "$DIR" \
           --model "$MODEL" --device "$DEVICE" --configs "${SPLIT_CONFIGS[@]}" "${without[@]}" 2>&1 |
           { grep --line-buffered -v "^\*\|OMP_NUM_THREADS" || true; } | tee "$DIR/split.log" ;;
  smoke) "$PYTHON" tests/gpu/parallel_smoke.py --model "$MODEL" --device "$DEVICE" ${DTYPE:+--dtype "$DTYPE"} \
           --config "$CONFIG" --side "$SIDE" 2>&1 | tee "$DIR/smoke.log" ;;
  all) edit 1gpu 1 auto; edit 2gpu-cfg 2 cfg; edit 2gpu-ulysses 2 ulysses; [ -n "${DRY_RUN:-}" ] || link; table ;;
  *) echo "usage: scripts/gpu/parallel_bench.sh one|cfg|ulysses|both|link|both-busy|table|all|nccl-graph|split|smoke" >&2
     exit 2 ;;
esac
if [ -n "${OUT:-}" ]; then
  tar czf "$OUT/$NAME-$1.tar.gz" -C "$RESULTS" "$NAME"
fi
[ -z "${failed:-}" ]  # a failed check ends the script with an error, once its results are packed
