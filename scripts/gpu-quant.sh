#!/usr/bin/env bash
# The quantized-product and paged-attention benchmark on the GPU machine, from the repository root, with the bundle
# of scripts/build-gpu-bundle.sh in .gpu/ (as gpu-check.sh):
#
#   bash scripts/gpu-quant.sh                 # every case, nuvec then PyTorch
#   GPU_QUANT_ONLY=qmv_ bash scripts/gpu-quant.sh   # cases whose name contains it
#
#   1. .gpu/bench_quant > $OUT/bench_quant.tsv (table in $OUT/bench_quant.log);
#   2. python3 bench/quant_peers.py > $OUT/quant_peers.tsv (bf16 cuBLAS, tinygemm's int4);
#   3. prints each case beside its peers.
# About 3 minutes for every case.
set -u
cd "$(dirname "$0")/.." || exit 1
ROOT=$PWD
OUT=${OUT:-$ROOT/target/gpu-quant}
mkdir -p "$OUT"
# shellcheck source=scripts/gpu-env.sh
. "$ROOT/scripts/gpu-env.sh"
gpu_unpack || exit 2
gpu_link_build_root
ONLY=${GPU_QUANT_ONLY:-}

echo "== bench_quant ${ONLY}"
timeout -k 10 "${GPU_QUANT_TIMEOUT:-240}" .gpu/bench_quant ${ONLY:+--only "$ONLY"} --out "$OUT/bench_quant.tsv" \
    >"$OUT/bench_quant.log" 2>&1
grep -E '^(qmv|qmm|gemv|mm|ceiling|decode|paged)' "$OUT/bench_quant.log" | cut -c1-100

echo "== quant_peers.py ${ONLY}"
env LD_LIBRARY_PATH="$ORIG_LD_LIBRARY_PATH" timeout -k 10 "${GPU_QUANT_PEERS_TIMEOUT:-200}" \
    python3 bench/quant_peers.py ${ONLY:+--only "$ONLY"} >"$OUT/quant_peers.tsv" 2>"$OUT/quant_peers.log"
tail -3 "$OUT/quant_peers.log"

echo "== summary (nuvec, then each peer: value and nuvec/peer)"
python3 - "$OUT/bench_quant.tsv" "$OUT/quant_peers.tsv" <<'PY'
import sys
ours = {}
for line in open(sys.argv[1]):
    f = line.rstrip("\n").split("\t")
    if len(f) >= 4:
        ours[f[0]] = (float(f[1]), f[2], f[3])
peers = {}
for line in open(sys.argv[2]):
    f = line.rstrip("\n").split("\t")
    if len(f) >= 4:
        peers.setdefault(f[0], []).append((f[3], float(f[1])))
for name, (v, unit, frac) in ours.items():
    cells = "  ".join(f"{impl} {pv:9.2f} ({v / pv:5.2f})" for impl, pv in peers.get(name, []))
    print(f"{name:<36} {v:9.2f} {unit:<8} frac {frac:>6}  {cells}")
PY
