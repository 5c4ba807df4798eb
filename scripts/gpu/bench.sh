#!/usr/bin/env bash
# The GPU measurements behind docs/benchmarks.md: three runs of under 10 minutes each (one device call each) on the
# GPU machine, every figure written by `ghostedit bench` (scripts/gpu/README.md says how to carry the wheels there).
#   scripts/gpu/bench.sh speed     issue 17's table (or one part of it: dit, ready, e2e), with an empty compile
#             cache at the start:
#     dit     one DiT forward: stock and the best configuration at 512, 768, 1024 and 1328 px and a 3-image edit,
#             plus EXACT, with CFG batching measured on the fastest at $SIDE (its block loop run from Python)
#     ready   the best configuration's first use: a process that never compiled it (empty compile cache, no
#             compiled package), one with its compiled package only (exported and installed with `ghostedit
#             compiled`, as a new machine gets it), and a restart (the compile cache on disk)
#     e2e     whole edits at 1024x1024: e2e-4, 4 steps CFG 1 (stock, best, best + the Lightning schedule, a fused
#             LoRA costing no time per step), then e2e-40, 40 steps CFG 4 (stock, best, best + $STEP_CACHE); stock
#             in one process, best in another, which ends with e2e-4-mask: best's e2e-4 edit with $MASK (the
#             masked row: compare with e2e-4's best). The compiled text encoder was measured once (lab/LOG.md,
#             section 3), not in every run
#   scripts/gpu/bench.sh mask      issue 42: e2e-4's best edit, then the same with $MASK, in one process
#   scripts/gpu/bench.sh cold      the never-compiled first use of ready again in five new processes one after
#             another (COLD_PROCESSES), each with every compile cache emptied: how far it moves on one machine
#   scripts/gpu/bench.sh cards     issue 16: the best configuration on 24 and 48 GB cards, emulated (--gpu-memory)
#   scripts/gpu/bench.sh qwen21    issue 41: Qwen-Image-2.1 (synthetic) against stock DiffSynth, and on a 24 GB card
#             (or one part: qwen21-1024, qwen21-2048 with the 24 GB card, qwen21-card-24 alone)
#   scripts/gpu/bench.sh all       issue 16: card-full then lora-switch (either alone too):
#     card-full    every configuration the page offers, one after another in one process on the whole card
#     lora-switch  fused LoRA switches on the best configuration (rank 32, 840 layers) and a runtime LoRA's scale
#   scripts/gpu/bench.sh latency   issue 44: what a person waits for, through the real app and gradio_client
#             (ghostedit/bench/latency.py): on a machine that never compiled best, its first edit after start,
#             then best and stock at 4 steps CFG 1, fused LoRA switches on best, best at 40 steps CFG 4; then the
#             next start on the same machine (what the first left: packages, compile caches). Needs gradio: its wheels
#             (../shared/tools/device-wheels --dest .whl-ui --preset ui) copied into /tmp/wheels by a call of their
#             own before this one (they and the engine's wheels do not fit one call's 64 MiB)
# Results go to $RESULTS/<phase>/ (results.json, table.md, chart.png, <phase>.log; default ./bench-results), and with
# $OUT set (the device tool's folder, which takes few files) each process's into $OUT/<process>.tar.gz as it ends.
# DRY_RUN=1 MODEL=tiny SIDE=128 rehearses on a CPU with configurations a CPU can run.
set -euo pipefail
cd "$(dirname "$0")/../.."
[ -n "${DRY_RUN:-}" ] || QUIET_SETUP=1 source scripts/gpu/setup.sh
RESULTS=${RESULTS:-bench-results}
MODEL=${MODEL:-synthetic}
SIDE=${SIDE:-1024}
PYTHON=${PYTHON:-python3}
BEST=${BEST:-best}    # ghostedit/optimize/presets.py
EXACT=${EXACT:-exact}
STEP_CACHE=${STEP_CACHE-step-cache=fbcache-0.08}  # the 40-step run adds best + it ("" leaves it out)
MASK=${MASK:-assets/examples/house-mask.png}       # e2e-4-mask's mask, for the bench's image (house.png)
# random weights never skip a step at the offered thresholds: the cache runs at this one instead, so that the cost
# and gain of a served step are measured (bench --help, --step-cache-threshold; "" runs the offered threshold)
STEP_CACHE_THRESHOLD=${STEP_CACHE_THRESHOLD-0.95}
export TORCHINDUCTOR_CACHE_DIR=${TORCHINDUCTOR_CACHE_DIR:-/tmp/ghostedit-bench-inductor-cache}
# GhostEdit's own Triton kernels: where the package keeps them by default (ghostedit/__init__.py), named here so
# that the phases which empty every compile cache find it
export TRITON_CACHE_DIR=${TRITON_CACHE_DIR:-${GHOSTEDIT_HOME:-$HOME/.cache/ghostedit}/triton-cache}
START=$(date +%s)

bench() {  # bench PHASE ARGS...: one process, its log kept beside its results (in PHASE's folder: the first run's
  local phase=$1; shift   # where ARGS chain more runs with --then, each with its own --out-dir under $RESULTS)
  mkdir -p "$RESULTS/$phase"
  local begin=$(date +%s)
  "$PYTHON" -m ghostedit bench --model "$MODEL" --skip-teardown --out-dir "$RESULTS/$phase" "$@" 2>&1 |
    { grep --line-buffered -v "^Loading\|^Loaded\|^Using\|^No \|^    \|^}\|^{\|register_constant\|│\|┌\|└\|Configuration class" || true; } |
    tee "$RESULTS/$phase/$phase.log"
  echo "== $phase: process wall $(( $(date +%s) - begin )) s, run so far $(( $(date +%s) - START )) s" |
    tee -a "$RESULTS/$phase/$phase.log"
  local parts=("$phase") previous=
  for arg in "$@"; do  # the chained runs' folders
    [ "$previous" = --out-dir ] && parts+=("$(basename "$arg")")
    previous=$arg
  done
  if [ -n "${OUT:-}" ]; then  # each process's results come back on their own: a run cut short keeps what it did
    for part in "${parts[@]}"; do
      # without the edited images (2 MB each, random weights; they stay for a later process to compare with) and
      # the random LoRAs (1.2 GB)
      tar czf "$OUT/$part.tar.gz" --exclude=loras --exclude='output-*.png' -C "$RESULTS" "$part"
    done
  fi
}

dit() {
  rm -rf "$TORCHINDUCTOR_CACHE_DIR" "${GHOSTEDIT_HOME:?}/compiled"
  local shapes=(512 768 "$SIDE" 1328 "$SIDE:3")
  [ -z "${DRY_RUN:-}" ] || shapes=(64 "$SIDE" "$SIDE:3")
  bench dit --level dit --shapes "${shapes[@]}" --text-tokens 256 --repeats 6 --experiments --experiment-shape "$SIDE" \
    --configs baseline "$BEST" "$EXACT"
}

first_use() {  # first_use PHASE: the best configuration's first use in a new process, timed by the bench
  bench "$1" --level dit --width "$SIDE" --text-tokens 256 --repeats 3 --configs "$BEST"
}

never_compiled() {  # never_compiled PHASE: first_use with every compile cache emptied, Inductor's, GhostEdit's
  # packages and Triton's own kernels (which a machine kept warm between device calls still has)
  rm -rf "$TORCHINDUCTOR_CACHE_DIR" "${GHOSTEDIT_HOME:?}/compiled" "$TRITON_CACHE_DIR"
  first_use "$1"
}

ready() {
  never_compiled ready-never-compiled
  # a new machine given the package the first run made, exported and installed
  local shipped=/tmp/ghostedit-shipped-packages
  rm -rf "$TORCHINDUCTOR_CACHE_DIR" "$shipped"
  "$PYTHON" -m ghostedit compiled export "$shipped"
  rm -rf "$GHOSTEDIT_HOME/compiled"
  "$PYTHON" -m ghostedit compiled install "$shipped"
  first_use ready-package-only
  first_use ready-restart
}

cold() {  # the never-compiled first use again in $COLD_PROCESSES new processes (cold-1, ...): its spread on one machine
  for run in $(seq "${COLD_PROCESSES:-5}"); do
    never_compiled "cold-$run"
  done
}

# Stock and best each in a process of their own (configurations measured one after another in one process measured
# slower the later they came: lab/LOG.md, section 3), each process running e2e-4 and then e2e-40 (the
# weights built once: the process-time block of lab/LOG.md says what a process costs). Best's process reads
# stock's rows and images as every row's reference (--baseline-from).
E2E_4=(--steps 4 --cfg 1 --repeats 6)
E2E_40=(--steps 40 --cfg 4 --repeats 0 ${STEP_CACHE_THRESHOLD:+--step-cache-threshold "$STEP_CACHE_THRESHOLD"})
e2e() {
  bench e2e-4-stock --width "$SIDE" --height "$SIDE" "${E2E_4[@]}" --configs baseline \
    --then --out-dir "$RESULTS/e2e-40-stock" "${E2E_40[@]}"
  bench e2e-4 --width "$SIDE" --height "$SIDE" --one-at-a-time "${E2E_4[@]}" \
    --baseline-from "$RESULTS/e2e-4-stock" --configs "$BEST" "$BEST,scheduler=lightning" \
    --then --out-dir "$RESULTS/e2e-40" "${E2E_40[@]}" --baseline-from "$RESULTS/e2e-40-stock" \
    --configs "$BEST" ${STEP_CACHE:+"$BEST,$STEP_CACHE"} \
    --then --out-dir "$RESULTS/e2e-4-mask" "${E2E_4[@]}" --baseline-from "" --mask "$MASK" --configs "$BEST"
}

# The masked row alone (issue 42): best's e2e-4 edit, then the same edit with $MASK in the same process (its
# preparation and compile times show that a masked edit of the same size recompiles nothing)
mask() {
  bench e2e-4-plain --width "$SIDE" --height "$SIDE" "${E2E_4[@]}" --configs "$BEST" \
    --then --out-dir "$RESULTS/e2e-4-mask" "${E2E_4[@]}" --baseline-from "" --mask "$MASK" --configs "$BEST"
}

speed() { dit; ready; e2e; }

cards() {
  for card in 24 48; do
    bench "card-$card" --gpu-memory "$card" --width "$SIDE" --height "$SIDE" --steps 4 --cfg 1 --repeats 0 \
      --configs "$BEST"
  done
}

card-full() {
  local all=(baseline attention=auto fp8=storage fp8=torchao compile=regional "fp8=torchao,compile=regional"
             "$EXACT" "$BEST")
  [ -z "${DRY_RUN:-}" ] || all=(baseline fp8=storage compile=regional)
  bench card-full --width "$SIDE" --height "$SIDE" --steps 2 --cfg 4 --repeats 0 --configs "${all[@]}"
}

lora-switch() {
  bench lora-switch --level lora-switch --width "$SIDE" --height "$SIDE" --cfg 1 --lora-rank 32 --configs "$BEST"
  rm -rf "$RESULTS/lora-switch/loras"  # 1.2 GB of random LoRAs
}

all() { card-full; lora-switch; }

# Issue 41: Qwen-Image-2.1, the full-size synthetic model, against stock DiffSynth's QwenImage21Pipeline (its
# QwenImage21DiT, its KV cache on) on the same weights: end to end, first step and cached step for 1024x1024 with one
# reference (40 steps), Turbo (8 steps), 2048x2048 with one and four references (20 steps), text-to-image (40 steps);
# then the 24 GB card, emulated, at 1024x1024 (stock, whose DiT would stay in host memory there, left out). Two parts,
# qwen21-1024 and qwen21-2048 (with the 24 GB card), a device call each (bench --level 2.1 says what a row holds).
# The lossless rewrites ported to 2.1 (real-rope, fused-qkv, cuda-graph) on top of FP8 and compile, each step
# measured (the fastest also with the text encoder graphed and the VAE's norms fused), then the fastest with cuDNN's
# FP8 attention (lossy: the cached steps wholly in FP8, the cache-filling step's causal text spans exact) and the
# rewrites that go with it (carried-residual; fused-qk-norm-rope and fp8-attention-out at the cached steps); at 2048
# the fastest two only (the phase's time and memory).
QWEN21_REWRITES="cuda-graph+real-rope+fused-qkv"
QWEN21_FAST="fp8=torchao,compile=regional,rewrites=$QWEN21_REWRITES,text-encoder=graphed,vae=image-fused"
QWEN21_FP8_REWRITES="$QWEN21_REWRITES+carried-residual+fused-qk-norm-rope+fp8-attention-out"
QWEN21_FP8_ATTENTION="attention=cudnn-fp8,${QWEN21_FAST/rewrites=$QWEN21_REWRITES/rewrites=$QWEN21_FP8_REWRITES}"
# and with the glue around its FP8 GEMMs made lighter: reductions over a row in registers (lossless; the profile in
# lab/LOG.md, section 9, where fused-swiglu-quant was slower than the persistent reduction Inductor makes)
QWEN21_FASTEST="${QWEN21_FP8_ATTENTION/rewrites=/rewrites=inductor-persistent-rows+}"
QWEN21_CONFIGS=(baseline "fp8=torchao,compile=regional" "fp8=torchao,compile=regional,rewrites=real-rope+fused-qkv"
                "$QWEN21_FAST" "$QWEN21_FP8_ATTENTION" "$QWEN21_FASTEST")
QWEN21_2048_CONFIGS=(baseline "fp8=torchao,compile=regional" "$QWEN21_FAST" "$QWEN21_FP8_ATTENTION")
qwen21() { qwen21-1024; qwen21-2048; }  # both parts, each about five minutes: one device call each where they
                                        # would not fit one call's ten minutes together
qwen21_model() {  # sets model, configs, configs_2048 and sized for the 2.1 phases
  model=synthetic-2.1 configs=("${QWEN21_CONFIGS[@]}") configs_2048=("${QWEN21_2048_CONFIGS[@]}") sized=()
  if [ -n "${DRY_RUN:-}" ]; then  # the tiny 2.1 at 64 px, as a CPU runs the rows: FP8 stored, no CUDA graph, an
    model=tiny-2.1 sized=(--width 64)  # exact attention named in place of the FP8 one (its row's path, not its kernel),
    # without the rewrites that need the FP8 attention and torchao's GEMMs (CUDA's), the text encoder compiled
    # instead of graphed, the VAE as released (its fused norms are Triton's)
    configs=("${configs[@]//+fused-qk-norm-rope+fp8-attention-out/}")
    configs_2048=("${configs_2048[@]//+fused-qk-norm-rope+fp8-attention-out/}")
    configs=("${configs[@]//fp8=torchao/fp8=storage}") configs_2048=("${configs_2048[@]//fp8=torchao/fp8=storage}")
    configs=("${configs[@]//cuda-graph+/}") configs_2048=("${configs_2048[@]//cuda-graph+/}")
    configs=("${configs[@]//attention=cudnn-fp8/attention=sdpa-math}")
    configs_2048=("${configs_2048[@]//attention=cudnn-fp8/attention=sdpa-math}")
    configs=("${configs[@]//text-encoder=graphed/text-encoder=compiled}") configs=("${configs[@]//,vae=image-fused/}")
    configs_2048=("${configs_2048[@]//text-encoder=graphed/text-encoder=compiled}")
    configs_2048=("${configs_2048[@]//,vae=image-fused/}")
  fi
}

qwen21-1024() {
  local model configs configs_2048 sized
  qwen21_model
  bench qwen21 --model "$model" --level 2.1 --cases turbo-1024-1ref 1024-1ref --configs "${configs[@]}" "${sized[@]}"
}

qwen21-2048() {
  local model configs configs_2048 sized card_80=()
  qwen21_model
  # a process of its own: DiffSynth's pipeline ran out of the H100's 80 GB at 2048-4ref (docs/benchmarks.md, 9);
  # on a larger GPU (an H200's 141 GB) the 80 GB card is emulated (79.2 GiB, what an H100 80GB gives PyTorch)
  [ -n "${DRY_RUN:-}" ] || card_80=(--gpu-memory 79.2)
  bench qwen21-2048 --model "$model" --level 2.1 --cases 2048-1ref t2i-1024 \
    --configs "${configs_2048[@]}" "${sized[@]}" "${card_80[@]}"
  # four references at 2048 with one GhostEdit configuration beside stock (which shares its weights), as a person runs
  # it: the bench keeps every configuration it measures prepared at once, and four FP8 copies of the DiT with their
  # graphs' memory ran a case that one configuration runs out of the 80 GB
  bench qwen21-2048-4ref --model "$model" --level 2.1 --cases 2048-4ref \
    --configs baseline "${configs_2048[-1]}" "${sized[@]}" "${card_80[@]}"
  [ -n "${DRY_RUN:-}" ] || qwen21-card-24
}

qwen21-card-24() {  # the 24 GB card, emulated (a device call of its own too)
  local model configs configs_2048 sized
  qwen21_model
  bench qwen21-card-24 --model "$model" --level 2.1 --gpu-memory 24 --cases 1024-1ref \
    --configs "fp8=torchao,compile=regional"
}

ui_wheels() {  # gradio for the app and gradio_client: setup.sh installs .whl-ui's wheels with the engine's
  # The app's start as on a machine that pip installed (which compiles every package's bytecode): setup.sh installs
  # with --no-compile, and every process here compiled what it imported from source again (each app.log shows the
  # compiler's same SyntaxWarnings; this workplace sets PYTHONDONTWRITEBYTECODE; the app's start timeline counts
  # them: page_start.bytecode). Bytecode is written from here on, and this import writes what the app imports
  # before its page answers, so that its first start finds it
  unset PYTHONDONTWRITEBYTECODE
  "$PYTHON" -c "import gradio, gradio_client" 2>/dev/null ||
    { echo "latency: gradio is missing: copy .whl-ui/*.whl into /tmp/wheels in a call before this one" >&2; exit 2; }
  "$PYTHON" -c "import ghostedit.ui.layout, ghostedit.engine.runner"
}

latency() {
  ui_wheels
  local best=$BEST repeats=5
  [ -z "${DRY_RUN:-}" ] || { best=${DRY_BEST:-compile=regional}; repeats=2; }
  local edit=(--level latency --width "$SIDE" --height "$SIDE" --warm-up "$best")
  rm -rf "$TORCHINDUCTOR_CACHE_DIR" "${GHOSTEDIT_HOME:?}/compiled" "$TRITON_CACHE_DIR"
  bench latency-4 "${edit[@]}" --steps 4 --cfg 1 --repeats "$repeats" --configs "$best" baseline \
    --lora-switch "$repeats" --browser-calls 1 \
    --then --out-dir "$RESULTS/latency-40" --steps 40 --cfg 4 --repeats 2 --configs "$best" --lora-switch 0 \
    --browser-calls 0
  # the next start, as `python app.py` again on this machine: it finds what the first start kept (the compiled
  # packages in $GHOSTEDIT_HOME, Inductor's cache, the Triton kernels'), and Python's bytecode
  bench latency-restart "${edit[@]}" --steps 4 --cfg 1 --repeats 2 --configs "$best"
}

case ${1:-} in
  speed|dit|ready|cold|e2e|mask|cards|all|card-full|lora-switch|qwen21|qwen21-1024|qwen21-2048|qwen21-card-24|latency) "$1" ;;
  *) echo "usage: scripts/gpu/bench.sh speed|dit|ready|cold|e2e|mask|cards|all|card-full|lora-switch|qwen21|qwen21-1024|qwen21-2048|qwen21-card-24|latency" >&2
     exit 2 ;;
esac
