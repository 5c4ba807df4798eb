#!/usr/bin/env bash
# The compile head start's A/B (engine/head_start.py; docs/benchmarks.md, section 2): the best configuration's first
# use with the head start on and off, each variant in processes of its own on one machine: first a process that
# never compiled (compile caches emptied before each), then restarts alternating between the variants.
#   scripts/gpu/head_start_ab.sh [RESTARTS]    (default 3) results in $OUT/head-start/<variant>/, logs beside them
set -euo pipefail
cd "$(dirname "$0")/../.."
QUIET_SETUP=1 source scripts/gpu/setup.sh
export TORCHINDUCTOR_CACHE_DIR=${TORCHINDUCTOR_CACHE_DIR:-/tmp/ghostedit-bench-inductor-cache}
RESTARTS=${1:-3}
DEST=${OUT:-bench-results}/head-start
declare -A FLAGS=([on]="" [off]="--head-start-off")  # each variant's flags for profile_first_call.py

probe() {  # probe VARIANT LABEL: one process; its summary line printed
  mkdir -p "$DEST/$1"
  python3 scripts/gpu/profile_first_call.py "$2" ${FLAGS[$1]} --out "$DEST/$1" > "$DEST/$1-$2.log" 2>&1
  grep -m1 '^{"label"' "$DEST/$1-$2.log" | sed "s/^/$1 /"
}

for variant in off on; do
  rm -rf "$TORCHINDUCTOR_CACHE_DIR" "${TRITON_CACHE_DIR:-$HOME/.triton/cache}" "${GHOSTEDIT_HOME:?}/compiled"
  probe "$variant" cold
done
for round in $(seq "$RESTARTS"); do
  for variant in off on; do
    probe "$variant" "restart-$round"
  done
done
