#!/usr/bin/env bash
# The per-primitive benchmark on the GPU machine, from the repository root: nuvec's bench_ops
# (crates/nuvec/examples/bench_ops.rs) and its PyTorch eager peers (bench/gpu_ops_peers.py),
# side by side. First, on the build machine:
#
#   bash scripts/build-gpu-bundle.sh          # fills .gpu/ (GPU_BUNDLE_TESTS=0 for no tests)
#
# then on the GPU machine, with .gpu/ carried along (git ignores it):
#
#   bash scripts/gpu-ops.sh                   # every case (~3-4 min each side)
#   GPU_OPS_ONLY=_bf16_ bash scripts/gpu-ops.sh   # cases whose name contains "_bf16_"
#
# It unpacks .gpu/bench_ops(.xz) and the kernel cache (.gpu/kcache or .gpu/kcache.tar.xz; with a
# GPU_BUNDLE_KCACHE=0 bundle, .gpu/precompile_kernels compiles it here), then
#   1. runs .gpu/bench_ops --out $OUT/bench_ops.tsv (its table and stderr to $OUT/ops-run.log),
#      at most GPU_OPS_BENCH_TIMEOUT (300) s and leaving 60 s to step 2;
#   2. runs python3 bench/gpu_ops_peers.py > $OUT/gpu_ops_peers.tsv (PyTorch eager; progress to
#      ops-run.log) with the library path it came with, starting no case after the deadline;
#   3. prints the side-by-side table of bench/ops_table.py (case, nuvec GB/s and fraction of the
#      copy ceiling, torch GB/s and fraction, nuvec/torch, flags <85% and <torch) to stdout and
#      $OUT/ops-table.txt.
#   4. with GPU_OPS_COMPOSITIONS=1, the fast ops' compositions (bench_fast, NUVEC_FUSED=0)
#      against PyTorch eager's (bench/gpu_fast_peers.py --modes eager,composition), to
#      $OUT/compositions-table.txt.
# Environment: GPU_OPS_ONLY (--only for both), GPU_OPS_SECONDS (570: the whole script ends
# within it), GPU_OPS_BENCH_TIMEOUT (300), GPU_OPS_SKIP_PEERS=1 (nuvec only), OUT (default
# target/gpu-ops). The whole list may not fit in one 600 s call on a slow start: split it with
# GPU_OPS_ONLY (a dtype: _f32_, _bf16_, _f16_) and keep the TSVs of each call.
# Exit status 0 when bench_ops measured every case it ran.
set -u
START=$(date +%s)
cd "$(dirname "$0")/.." || exit 1
ROOT=$PWD
OUT=${OUT:-$ROOT/target/gpu-ops}
mkdir -p "$OUT"
DEADLINE=$((START + ${GPU_OPS_SECONDS:-570}))
RUNLOG=$OUT/ops-run.log
: >"$RUNLOG"
now() { date +%s; }
left() { echo $((DEADLINE - $(now))); }
min() { if [ "$1" -lt "$2" ]; then echo "$1"; else echo "$2"; fi; }
ONLY=()
[ -n "${GPU_OPS_ONLY:-}" ] && ONLY=(--only "$GPU_OPS_ONLY")

# shellcheck source=scripts/gpu-env.sh
. "$ROOT/scripts/gpu-env.sh"

echo "== gpu-ops $(date -u +%Y-%m-%dT%H:%M:%SZ) in $ROOT${GPU_OPS_ONLY:+ (only $GPU_OPS_ONLY)}"
nvidia-smi -L 2>&1 | head -2
[ -f .gpu/build-info.txt ] && sed 's/^/   bundle: /' .gpu/build-info.txt | tr '\n' ' ' && echo

# --- unpack ------------------------------------------------------------------------------
gpu_unpack || exit 2
echo "   kernel cache: $(ls .gpu/kcache 2>/dev/null | wc -l) cubins"

# --- nuvec -------------------------------------------------------------------------------
BENCH_RC=-
if [ -x .gpu/bench_ops ]; then
    budget=$(min $(($(left) - 60)) "${GPU_OPS_BENCH_TIMEOUT:-300}")
    [ "$budget" -lt 30 ] && budget=30
    echo "== bench_ops (timeout ${budget}s)"
    t1=$(now)
    echo "### bench_ops ${ONLY[*]}" >>"$RUNLOG"
    timeout -k 10 "$budget" .gpu/bench_ops "${ONLY[@]}" --out "$OUT/bench_ops.tsv" >>"$RUNLOG" 2>&1
    BENCH_RC=$?
    n=$(grep -c . "$OUT/bench_ops.tsv" 2>/dev/null)
    echo "   rc $BENCH_RC in $(($(now) - t1)) s; ${n:-0} results"
    grep -E '^# (GPU|NVRTC|total)|FAILED|panicked|no usable' "$RUNLOG" | head -10 | cut -c1-160 | sed 's/^/   /'
    want=$(sed -n 's/^NVRTC=//p' .gpu/build-info.txt 2>/dev/null)
    got=$(sed -n 's/^# NVRTC \([0-9.]*\);.*/\1/p' "$RUNLOG" | head -1)
    if [ -n "$want" ] && [ -n "$got" ] && [ "$want" != "$got" ]; then
        echo "   WARNING: NVRTC $got here, the kernel cache is for $want: kernels compiled at run time"
    fi
else
    echo "== bench_ops: .gpu/bench_ops missing (rebuild the bundle with scripts/build-gpu-bundle.sh)"
    : >"$OUT/bench_ops.tsv"
fi

# --- PyTorch eager -----------------------------------------------------------------------
budget=$(($(left) - 10))
if [ "${GPU_OPS_SKIP_PEERS:-0}" = 1 ]; then
    echo "== gpu_ops_peers.py: skipped (GPU_OPS_SKIP_PEERS=1)"
    : >"$OUT/gpu_ops_peers.tsv"
elif [ "$budget" -ge 30 ]; then
    echo "== gpu_ops_peers.py (timeout ${budget}s)"
    t1=$(now)
    echo "### gpu_ops_peers.py ${ONLY[*]}" >>"$RUNLOG"
    # PyTorch with the library path it came with (its own CUDA libraries).
    LD_LIBRARY_PATH=$ORIG_LD_LIBRARY_PATH timeout -k 10 "$budget" python3 bench/gpu_ops_peers.py "${ONLY[@]}" \
        --deadline $((budget - 10)) >"$OUT/gpu_ops_peers.tsv" 2>>"$RUNLOG"
    rc=$?
    n=$(grep -vc '^#' "$OUT/gpu_ops_peers.tsv" 2>/dev/null)
    echo "   rc $rc in $(($(now) - t1)) s; ${n:-0} results"
    grep -E '^# (torch |.*skipped)' "$OUT/gpu_ops_peers.tsv" | head -3 | cut -c1-160 | sed 's/^/   /'
    sed -n '/^### gpu_ops_peers.py/,$p' "$RUNLOG" | grep -E 'FAILED|Error' | head -8 | cut -c1-160 | sed 's/^/   /'
else
    echo "== gpu_ops_peers.py skipped: no time left"
    : >"$OUT/gpu_ops_peers.tsv"
fi

# --- table -------------------------------------------------------------------------------
echo
python3 bench/ops_table.py "$OUT/bench_ops.tsv" "$OUT/gpu_ops_peers.tsv" | tee "$OUT/ops-table.txt"

# --- fast ops as their compositions against PyTorch eager's ------------------------------
# GPU_OPS_COMPOSITIONS=1: bench_fast with NUVEC_FUSED=0 (each fast op as the ordinary ops of
# its composition) and gpu_fast_peers.py's eager mode (the same composition in PyTorch), on
# the cases whose name contains GPU_OPS_COMPOSITIONS_ONLY (default _bf16_). Their `<torch`
# flag is the target here; `<85%` does not apply to a composition.
if [ "${GPU_OPS_COMPOSITIONS:-0}" = 1 ] && [ -x .gpu/bench_fast ]; then
    only=${GPU_OPS_COMPOSITIONS_ONLY:-_bf16_}
    budget=$(($(left) / 2))
    echo "== compositions: bench_fast NUVEC_FUSED=0 --only $only (timeout ${budget}s)"
    echo "### bench_fast NUVEC_FUSED=0 --only $only" >>"$RUNLOG"
    NUVEC_FUSED=0 timeout -k 10 "$budget" .gpu/bench_fast --only "$only" --out "$OUT/compositions.tsv" \
        >>"$RUNLOG" 2>&1
    budget=$(($(left) - 10))
    echo "== compositions: gpu_fast_peers.py --modes eager,composition --only $only (timeout ${budget}s)"
    echo "### gpu_fast_peers.py --modes eager,composition --only $only" >>"$RUNLOG"
    LD_LIBRARY_PATH=$ORIG_LD_LIBRARY_PATH timeout -k 10 "$budget" python3 bench/gpu_fast_peers.py \
        --modes eager,composition --only "$only" --deadline $((budget - 10)) \
        --batch-ms "${NUVEC_BENCH_BATCH_MS:-100}" --batches "${NUVEC_BENCH_BATCHES:-5}" \
        >"$OUT/compositions_peers.tsv" 2>>"$RUNLOG"
    echo
    python3 bench/ops_table.py "$OUT/compositions.tsv" "$OUT/compositions_peers.tsv" |
        tee "$OUT/compositions-table.txt"
    # Against PyTorch running nuvec's composition op for op, where the eager mode differs.
    grep -E '^(torch_composition:|torch_eager:ceiling)' "$OUT/compositions_peers.tsv" |
        sed 's/^torch_composition:/torch_eager:/' >"$OUT/compositions_same.tsv"
    echo "== against PyTorch running the same composition (torch_composition)" | tee -a "$OUT/compositions-table.txt"
    python3 bench/ops_table.py "$OUT/compositions.tsv" "$OUT/compositions_same.tsv" |
        tee -a "$OUT/compositions-table.txt"
fi
echo "== done in $(($(now) - START)) s; files in $OUT: $(cd "$OUT" && ls | tr '\n' ' ')"
if [ "$BENCH_RC" != 0 ]; then
    exit 1
fi
exit 0
