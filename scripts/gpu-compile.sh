#!/usr/bin/env bash
# The compile benchmark on the GPU machine, from the repository root, with the bundle of
# scripts/build-gpu-bundle.sh in .gpu/ (as gpu-check.sh):
#
#   bash scripts/gpu-compile.sh                        # every case, nuvec then PyTorch
#   GPU_COMPILE_ONLY=softmax bash scripts/gpu-compile.sh   # cases whose name contains it
#
#   1. .gpu/bench_compile > $OUT/bench_compile.tsv (table in $OUT/bench_compile.log): each
#      case eager, compiled (compile_flat) and a copy of its bytes, and the 32-layer decode step
#      eager, compiled and as a CUDA graph (decode32_*, no peers), at most
#      GPU_COMPILE_TIMEOUT (200) s;
#   2. python3 bench/compile_peers.py > $OUT/compile_peers.tsv (PyTorch eager and
#      torch.compile; progress in $OUT/compile_peers.log), with the library path PyTorch came
#      with, ending by the script's deadline (no torch.compile case starts in its last 60 s);
#   3. prints each case beside its peers (also to $OUT/summary.txt), in GB/s of the bytes the
#      function must move: nuvec compiled, nuvec eager, the compiled row's fraction of the copy
#      of the same bytes (ceil%), torch eager, torch.compile; then nu/tc = nuvec compiled /
#      torch.compile and cmp/eag = nuvec compiled / nuvec eager. As in gpu-quant.sh's summary,
#      the ratios are of rates (GB/s) over the same bytes, so they are inverse time ratios:
#      above 1, nuvec (compiled) takes less time.
# Environment: GPU_COMPILE_ONLY (--only for both), GPU_COMPILE_SECONDS (570: the whole script
# ends within it), GPU_COMPILE_TIMEOUT (200), GPU_COMPILE_SKIP_PEERS=1 (nuvec only), OUT
# (default target/gpu-compile). About 1 minute for nuvec, 2-4 for PyTorch (torch.compile
# compiles each case first). Exit status 0 when bench_compile measured every case it ran.
set -u
START=$(date +%s)
cd "$(dirname "$0")/.." || exit 1
ROOT=$PWD
OUT=${OUT:-$ROOT/target/gpu-compile}
mkdir -p "$OUT"
DEADLINE=$((START + ${GPU_COMPILE_SECONDS:-570}))
# shellcheck source=scripts/gpu-env.sh
. "$ROOT/scripts/gpu-env.sh"
gpu_unpack || exit 2
gpu_link_build_root
ONLY=${GPU_COMPILE_ONLY:-}
left() { echo $((DEADLINE - $(date +%s))); }

echo "== bench_compile ${ONLY}"
if [ ! -x .gpu/bench_compile ]; then
    echo "   .gpu/bench_compile missing (rebuild the bundle)"
    BENCH_RC=2
else
    budget=${GPU_COMPILE_TIMEOUT:-200}
    [ "$budget" -gt $(($(left) - 60)) ] && budget=$(($(left) - 60))
    timeout -k 10 "$budget" .gpu/bench_compile ${ONLY:+--only "$ONLY"} --out "$OUT/bench_compile.tsv" \
        >"$OUT/bench_compile.log" 2>&1
    BENCH_RC=$?
    echo "   rc $BENCH_RC"
    grep -E '^(# (GPU|NVRTC)|chain10|gelu|softmax|adam|decode32|ceiling|# .*(check|bit for bit))|FAILED|panicked|no usable' \
        "$OUT/bench_compile.log" | cut -c1-140
fi

: >"$OUT/compile_peers.tsv"
budget=$(($(left) - 5))
if [ "${GPU_COMPILE_SKIP_PEERS:-0}" = 1 ]; then
    echo "== compile_peers.py: skipped (GPU_COMPILE_SKIP_PEERS=1)"
elif [ "$budget" -lt 30 ]; then
    echo "== compile_peers.py: skipped, no time left"
else
    echo "== compile_peers.py ${ONLY} (timeout ${budget}s)"
    env LD_LIBRARY_PATH="$ORIG_LD_LIBRARY_PATH" timeout -k 10 "$budget" \
        python3 bench/compile_peers.py ${ONLY:+--only "$ONLY"} --deadline $((budget - 5)) \
        >"$OUT/compile_peers.tsv" 2>"$OUT/compile_peers.log"
    echo "   rc $?"
    grep -E '^# (torch|triton)' "$OUT/compile_peers.tsv" | cut -c1-140 | sed 's/^/   /'
    grep -E 'FAILED|Error|relative error' "$OUT/compile_peers.log" | cut -c1-140 | sed 's/^/   /'
fi

echo "== summary (GB/s; ratios of rates: >1 means nuvec compiled takes less time)"
python3 - "$OUT/bench_compile.tsv" "$OUT/compile_peers.tsv" <<'PY' | tee "$OUT/summary.txt"
import math, sys

sys.path.insert(0, "bench")
from bench_tsv import load

nu, peers = load(sys.argv[1]), load(sys.argv[2])

def get(rows, name):
    v = rows.get(name, (None, "", None))
    return v[0], v[2]

def fmt(v):
    return "-" if v is None or math.isnan(v) else f"{v:.1f}" if v >= 100 else f"{v:.3g}"

def ratio(a, b):
    return a / b if a is not None and b and not math.isnan(a) and not math.isnan(b) else None

# The cases: nuvec's compiled rows (neither _eager nor _copy), then any the peers alone have.
cases = [n for n in nu if not n.endswith(("_eager", "_copy")) and n != "ceiling_copy_memcpy"]
for n in peers:
    base = n.split(":", 1)[1] if ":" in n else n
    if ":" in n and not base.endswith("_copy") and base != "ceiling_copy_memcpy" and base not in cases:
        cases.append(base)
ceil_nu, ceil_t = get(nu, "ceiling_copy_memcpy")[0], get(peers, "torch_eager:ceiling_copy_memcpy")[0]
print(f"ceiling_copy_memcpy: nuvec {fmt(ceil_nu)} GB/s, torch {fmt(ceil_t)} GB/s")
print(f"{'case':<28} {'compiled':>9} {'eager':>9} {'ceil%':>6} {'copy':>9} {'t.eager':>9} {'t.compile':>9} "
      f"{'nu/tc':>6} {'cmp/eag':>7}")
for n in cases:
    c, frac = get(nu, n)
    e = get(nu, n + "_eager")[0]
    cp = get(nu, n + "_copy")[0]
    te = get(peers, "torch_eager:" + n)[0]
    tc = get(peers, "torch_compile:" + n)[0]
    pct = f"{100 * frac:.0f}%" if frac is not None else "-"
    print(f"{n:<28} {fmt(c):>9} {fmt(e):>9} {pct:>6} {fmt(cp):>9} {fmt(te):>9} {fmt(tc):>9} "
          f"{fmt(ratio(c, tc)):>6} {fmt(ratio(c, e)):>7}")
PY
echo "== done in $(($(date +%s) - START)) s; files in $OUT"
[ "$BENCH_RC" = 0 ] || exit 1
exit 0
