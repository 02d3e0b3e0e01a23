#!/usr/bin/env bash
# nuvec-lm's model tests in a loop on the GPU machine, from the repository root, with the bundle
# of scripts/build-gpu-bundle.sh in .gpu/ (as gpu-check.sh):
#
#   bash scripts/gpu-lm-stress.sh
#
# Runs .gpu/test-nuvec-lm-models at 16 test threads, GPU_STRESS_PROCS (4) processes side by
# side, until GPU_STRESS_SECONDS (200) have passed, with NUVEC_REQUIRE_GPU=1 and NUVEC_LM_LOG=1.
# Concurrent tests record decode graphs while others evaluate: the loop is how a generation
# race shows (one failing run in about fifty before the fix of 2026-12-05). Prints runs and
# failures per process and the count of decode steps not updated in place; each failing run's
# log goes to $OUT (default target/gpu-lm-stress)/fail-<proc>-<run>.txt.
set -u
cd "$(dirname "$0")/.." || exit 1
ROOT=$PWD
. scripts/gpu-env.sh
gpu_unpack >/dev/null 2>&1
gpu_link_build_root
export NUVEC_REQUIRE_GPU=1 NUVEC_LM_LOG=1
OUT=${OUT:-target/gpu-lm-stress}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
bin=$(pwd)/.gpu/test-nuvec-lm-models
end=$(($(date +%s) + ${GPU_STRESS_SECONDS:-200}))
cd crates/nuvec-lm || exit 1
for p in $(seq "${GPU_STRESS_PROCS:-4}"); do
  (
    runs=0 fails=0 moved=0
    while [ "$(date +%s)" -lt "$end" ]; do
      runs=$((runs + 1))
      log=$OUT/run-$p.txt
      timeout 60 "$bin" --test-threads=16 >"$log" 2>&1 || { fails=$((fails + 1)); cp "$log" "$OUT/fail-$p-$runs.txt"; }
      moved=$((moved + $(grep -c "not updated in place" "$log")))
    done
    echo "process $p: $runs runs, $fails failed, $moved steps not updated in place"
  ) &
done
wait
for f in "$OUT"/fail-*.txt; do
  [ -f "$f" ] || continue
  echo "== $f"
  grep -E "left|right|panicked|not updated" "$f" | head -8
done
