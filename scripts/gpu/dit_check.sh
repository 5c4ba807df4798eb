#!/usr/bin/env bash
# Issue 40's GPU checks in ONE device call (one H100, at most 10 minutes), from the repository root:
#   1. the DiT forward of stock, exact and best at 512, 1024, 1328 and 1024 with three images, with the code before
#      the change (./old: main at ee1bb6e) and after it, in alternating processes (old, new, then again while the
#      budget lasts), each output kept on the same seeded inputs (scripts/gpu/dit_ab.py);
#   2. graph_check on the new code: the best forward replayed from CUDA graphs against the forward from Python,
#      bit for bit (tests/gpu/graph_check.py, the GPU tier's script);
#   3. the table: each version's ms per forward, new / old, and whether new's outputs equal old's bit for bit.
# Before the call (on this machine; ./old is untracked and not ignored, so it travels with the tree):
#   mkdir -p old && git archive ee1bb6e ghostedit | tar -x -C old
# The call (carry [".whl"] as scripts/gpu/README.md says):
#   mkdir -p /tmp/wheels && cp .whl/*.whl /tmp/wheels/ && scripts/gpu/dit_check.sh
# Results in $OUT/dit-check (the device tool's folder; else bench-results/dit-check). BUDGET (seconds, default 560)
# bounds the rounds after the first: none starts that would not finish in it. DIT_AB_ARGS passes options to
# dit_ab.py (e.g. "--shapes 1024 --repeats 6" for a shorter call). Delete ./old afterwards.
set -euo pipefail
cd "$(dirname "$0")/../.."
QUIET_SETUP=1 source scripts/gpu/setup.sh
[ -d old/ghostedit ] || { echo "no ./old/ghostedit: mkdir -p old && git archive ee1bb6e ghostedit | tar -x -C old"; exit 1; }
DIR=${OUT:-bench-results}/dit-check
mkdir -p "$DIR"
start=$(date +%s)
budget=${BUDGET:-560}
export TORCHINDUCTOR_CACHE_DIR=${TORCHINDUCTOR_CACHE_DIR:-/tmp/ghostedit-dit-check-inductor}
left() { echo $(( budget - ($(date +%s) - start) )); }

run_version() {  # run_version VERSION ROUND: one process of dit_ab.py with that version first on the path
  local path=$PYTHONPATH began=$(date +%s)
  [ "$1" = old ] && path=$PWD/old:$PYTHONPATH
  PYTHONPATH=$path python3 scripts/gpu/dit_ab.py --name "$1-$2" --out "$DIR" ${DIT_AB_ARGS:-} > "$DIR/$1-$2.log" 2>&1 ||
    tail -n 30 "$DIR/$1-$2.log"
  grep " ms (first call" "$DIR/$1-$2.log" || true
  last=$(( $(date +%s) - began ))
  echo "== $1-$2: $last s, $(left) s left"
  python3 scripts/gpu/dit_ab.py --compare "$DIR" > "$DIR/table.md"  # kept current: a call cut short keeps it
}

run_version old 1
run_version new 1
began=$(date +%s)
python3 tests/gpu/graph_check.py --out "$DIR" > "$DIR/graph-check.log" 2>&1 || tail -n 30 "$DIR/graph-check.log"
grep "zero_cond_t" "$DIR/graph-check.log" || true
echo "== graph_check: $(( $(date +%s) - began )) s, $(left) s left"
round=2
while [ "$(left)" -gt $(( 2 * last + 20 )) ]; do   # another old and new process fit
  run_version old $round
  run_version new $round
  round=$((round + 1))
done
cat "$DIR/table.md"
