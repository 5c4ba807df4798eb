#!/usr/bin/env bash
# An A/B of cuDNN's version under the same code and torch: the version torch pins against a newer one unpacked in a
# folder of its own, SITE (holding nvidia/cudnn/lib). torch loads cuDNN from the first nvidia/cudnn/lib on sys.path
# at import (its RPATH outranks LD_LIBRARY_PATH), so SITE goes first on PYTHONPATH; the cuDNN frontend reads
# LD_LIBRARY_PATH first, so SITE's lib goes there. Each variant's loaded version is checked before anything is timed.
#   scripts/gpu/library_ab.sh NAME SITE [ROUNDS]        (default 2 rounds; the first process compiles)
# SITE must not be /tmp/site (setup.sh's, first on PYTHONPATH for both variants). docs/benchmarks/cudnn-version/ was
# made so: here, `pip download --no-deps nvidia-cudnn-cu13==9.28.1.4`, its nvidia/cudnn/lib tarred through xz and
# split into 45 MiB parts, one folder each (.cudnn-partN, carried one per device call, back to back, into
# /tmp/cparts); there, `cat /tmp/cparts/* | xz -d | tar x -C /tmp/cudnn928` and SITE=/tmp/cudnn928.
# Per variant ("pinned", "newer"): cuDNN's FP8 attention plans at the bench's and an edit's prompt length
# (attention_plans_probe.py --text-tokens 256 214), then one DiT forward of $CONFIG (default best) at 1024x1024 in
# processes of their own, alternating pinned, newer, ... Results: $RESULTS/NAME/attention-<variant>/ and
# $RESULTS/NAME/dit/<round>-<variant>/results.json (each records the cuDNN it loaded); with $OUT, $OUT/NAME.tar.gz.
set -euo pipefail
cd "$(dirname "$0")/../.."
QUIET_SETUP=1 source scripts/gpu/setup.sh
RESULTS=${RESULTS:-bench-results}
CONFIG=${CONFIG:-best}
name=$1 site=$2 rounds=${3:-2}
[ -d "$site/nvidia/cudnn/lib" ] || { echo "no $site/nvidia/cudnn/lib" >&2; exit 2; }
in_variant() {  # in_variant VARIANT COMMAND...: the command with that variant's cuDNN
  if [ "$1" = newer ]; then
    shift; PYTHONPATH=$site:$PYTHONPATH LD_LIBRARY_PATH=$site/nvidia/cudnn/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} "$@"
  else
    shift; "$@"
  fi
}
loaded() { in_variant "$1" python3 -c "import torch, cudnn; print(torch.backends.cudnn.version(), cudnn.backend_version())"; }
pinned=$(loaded pinned) newer=$(loaded newer)  # each a process importing torch: asked once
echo "cuDNN loaded (torch, frontend): pinned $pinned, newer $newer"
[ "$pinned" != "$newer" ] || { echo "the newer variant loaded the pinned cuDNN" >&2; exit 1; }
for variant in pinned newer; do
  in_variant $variant python3 scripts/gpu/attention_plans_probe.py \
    --out "$RESULTS/$name/attention-$variant" --text-tokens 256 214 2>&1 | grep "engine op" || true
done
for round in $(seq "$rounds"); do
  for variant in pinned newer; do
    out=$RESULTS/$name/dit/$round-$variant
    mkdir -p "$out"
    in_variant $variant python3 -m ghostedit bench --model synthetic --level dit \
      --skip-teardown --width 1024 --text-tokens 256 --repeats 10 --out-dir "$out" --configs "$CONFIG" \
      > "$out/bench.log" 2>&1 || tail -n 30 "$out/bench.log"
    echo "$round-$variant: $(grep -h "ms/forward" "$out/bench.log" || true)"
  done
done
[ -z "${OUT:-}" ] || tar czf "$OUT/$name.tar.gz" -C "$RESULTS" "$name"
