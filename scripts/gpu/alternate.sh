#!/usr/bin/env bash
# An A/B of two configurations' DiT forward at 1024x1024, each measured in a process of its own, alternating
# A, B, A, B: configurations prepared one after another in one process measured slower the later they came
# (docs/benchmarks.md, section 6), so an A/B inside one process favours whichever runs first.
#   scripts/gpu/alternate.sh NAME CONFIG_A CONFIG_B [ROUNDS]     (default 2 rounds; the first of each compiles)
# Results: $RESULTS/NAME/<round>-<a|b>/results.json; with $OUT set (the device tool's folder), $OUT/NAME.tar.gz.
set -euo pipefail
cd "$(dirname "$0")/../.."
QUIET_SETUP=1 source scripts/gpu/setup.sh
RESULTS=${RESULTS:-bench-results}
name=$1 rounds=${4:-2}
declare -A config=([a]=$2 [b]=$3)
for round in $(seq "$rounds"); do
  for side in a b; do
    mkdir -p "$RESULTS/$name/$round-$side"
    python3 -m ghostedit bench --model synthetic --level dit --skip-teardown --width 1024 --text-tokens 256 \
      --repeats 10 --out-dir "$RESULTS/$name/$round-$side" --configs "${config[$side]}" \
      > "$RESULTS/$name/$round-$side/bench.log" 2>&1 || tail -n 30 "$RESULTS/$name/$round-$side/bench.log"
    grep "ms/forward" "$RESULTS/$name/$round-$side/bench.log" || true
  done
done
[ -z "${OUT:-}" ] || tar czf "$OUT/$name.tar.gz" -C "$RESULTS" "$name"
