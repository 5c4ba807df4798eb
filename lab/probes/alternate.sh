#!/usr/bin/env bash
# An A/B of two configurations' DiT forward at 1024x1024, each measured in a process of its own, alternating
# A, B, A, B: configurations prepared one after another in one process measured slower the later they came
# (lab/LOG.md, section 6), so an A/B inside one process favours whichever runs first.
#   lab/probes/alternate.sh NAME CONFIG_A CONFIG_B [ROUNDS]     (default 2 rounds; the first of each compiles)
# TEXT_TOKENS (default 256) sets the prompt's length: 214 is an edit's. LEVEL=e2e measures whole edits instead, as
# `bench.sh e2e` does: e2e-4 then e2e-40 (in <round>-<a|b>-40/) in each process, at the edit's own prompt length.
# Results: $RESULTS/NAME/<round>-<a|b>/results.json; with $OUT set (the device tool's folder), $OUT/NAME.tar.gz.
set -euo pipefail
cd "$(dirname "$0")/../.."
QUIET_SETUP=1 source scripts/gpu/setup.sh
RESULTS=${RESULTS:-bench-results}
name=$1 rounds=${4:-2}
declare -A config=([a]=$2 [b]=$3)
for round in $(seq "$rounds"); do
  for side in a b; do
    dir=$RESULTS/$name/$round-$side
    mkdir -p "$dir"
    if [ "${LEVEL:-dit}" = e2e ]; then
      run=(--width 1024 --height 1024 --steps 4 --cfg 1 --repeats 6 --out-dir "$dir" --configs "${config[$side]}"
           --then --out-dir "$dir-40" --steps 40 --cfg 4 --repeats 0 --configs "${config[$side]}")
    else
      run=(--level dit --width 1024 --text-tokens "${TEXT_TOKENS:-256}" --repeats 10 --out-dir "$dir"
           --configs "${config[$side]}")
    fi
    python3 -m ghostedit bench --model synthetic --skip-teardown "${run[@]}" > "$dir/bench.log" 2>&1 ||
      tail -n 30 "$dir/bench.log"
    grep "ms/forward\|end to end" "$dir/bench.log" || true
  done
done
[ -z "${OUT:-}" ] || tar czf "$OUT/$name.tar.gz" -C "$RESULTS" "$name"
