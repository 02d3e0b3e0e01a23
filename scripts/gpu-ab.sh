#!/usr/bin/env bash
# Before/after benchmarks on the GPU machine: two bundles of scripts/build-gpu-bundle.sh (the
# baseline in .gpu-base/, the change in .gpu/), each benchmark run alternately base, new, base,
# new in one call, so both see the same card, clocks and host. Here:
#
#   git worktree add /tmp/base <commit> && (cd /tmp/base && GPU_BUNDLE_TESTS=0 \
#       GPU_BUNDLE_KCACHE=0 bash scripts/build-gpu-bundle.sh) && cp -r /tmp/base/.gpu .gpu-base
#   GPU_BUNDLE_KCACHE=0 bash scripts/build-gpu-bundle.sh
#
# then on the GPU machine, with .gpu and .gpu-base carried along: bash scripts/gpu-ab.sh
# Environment: GPU_AB_BENCHES (default "bench_fast bench_gpu"), GPU_AB_ROUNDS (2),
# GPU_AB_ONLY (an --only filter for both benchmarks), GPU_AB_SECONDS (540, the whole script).
# Writes $OUT/ab.txt: per case the best of the rounds of each side and new/base (for GB/s;
# base/new for microseconds), flagged where the new side is slower than the base's spread
# across its own rounds; and $OUT/ab-runs.tar.gz, each run's TSV and log.
set -u
START=$(date +%s)
cd "$(dirname "$0")/.." || exit 1
OUT=${OUT:-$PWD/target/gpu-ab}
RUNS=$PWD/target/gpu-ab-runs
mkdir -p "$OUT" "$RUNS"
DEADLINE=$((START + ${GPU_AB_SECONDS:-540}))
export NUVEC_REQUIRE_GPU=1 PYTHONUNBUFFERED=1
[ -d /usr/local/cuda/lib64 ] && export LD_LIBRARY_PATH="/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
NVLIBS=$(python3 -c 'import glob, os, nvidia; print(":".join(d for r in nvidia.__path__ for d in sorted(glob.glob(os.path.join(r, "*", "lib")))))' 2>/dev/null)
[ -n "$NVLIBS" ] && export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$NVLIBS"
nvidia-smi -L 2>&1 | head -2
for side in .gpu-base .gpu; do
    [ -d "$side" ] || { echo "gpu-ab: no $side bundle"; exit 2; }
    for f in "$side"/*.xz; do
        [ -e "$f" ] || continue
        case "$f" in
            *kcache.tar.xz) xz -dc "$f" | tar -C "$side" -xf - ;;
            *) xz -dc "$f" >"${f%.xz}" && chmod +x "${f%.xz}" ;;
        esac
    done
    # Both sides share one cache: its file names hash the source, so neither reads the other's.
    mkdir -p .gpu-kcache
    [ -d "$side/kcache" ] && cp -n "$side"/kcache/* .gpu-kcache/ 2>/dev/null
    if [ -x "$side/precompile_kernels" ]; then
        NUVEC_KERNEL_CACHE=$PWD/.gpu-kcache timeout 300 "$side/precompile_kernels" "${GPU_ARCH:-sm_90a}" 2>&1 | tail -1
    fi
    sed 's/^/   '"$side"': /' "$side/build-info.txt" 2>/dev/null | grep COMMIT
done
export NUVEC_KERNEL_CACHE=$PWD/.gpu-kcache
ROUNDS=${GPU_AB_ROUNDS:-2}
ONLY=()
[ -n "${GPU_AB_ONLY:-}" ] && ONLY=(--only "$GPU_AB_ONLY")
for bench in ${GPU_AB_BENCHES:-bench_fast bench_gpu}; do
    for r in $(seq 1 "$ROUNDS"); do
        for side in base new; do
            dir=.gpu; [ "$side" = base ] && dir=.gpu-base
            left=$((DEADLINE - $(date +%s)))
            [ "$left" -lt 20 ] && { echo "gpu-ab: out of time before $bench $side$r"; continue; }
            echo "== $bench $side round $r ($left s left)"
            timeout "$left" "$dir/$bench" "${ONLY[@]}" --out "$RUNS/ab-$bench-$side$r.tsv" >"$RUNS/ab-$bench-$side$r.log" 2>&1
            echo "   rc=$? $(grep -c . "$RUNS/ab-$bench-$side$r.tsv" 2>/dev/null) lines"
        done
    done
done
python3 - "$RUNS" <<'PY' | tee "$OUT/ab.txt"
import glob, os, re, sys
sys.path.insert(0, "bench")
from bench_tsv import load
out = sys.argv[1]
for bench in sorted({re.sub(r"-(base|new)\d+\.tsv$", "", os.path.basename(p))[3:] for p in glob.glob(out + "/ab-*.tsv")}):
    sides = {s: [load(p) for p in sorted(glob.glob(f"{out}/ab-{bench}-{s}*.tsv"))] for s in ("base", "new")}
    names = sorted(set().union(*[r.keys() for rs in sides.values() for r in rs]))
    print(f"\n{bench}: best of {len(sides['base'])} base / {len(sides['new'])} new rounds")
    print(f"{'case':52} {'unit':5} {'base':>10} {'new':>10} {'new/base':>8} {'spread':>7}")
    slower = 0
    for n in names:
        vals = {s: [r[n][0] for r in rs if n in r and r[n][0] == r[n][0]] for s, rs in sides.items()}
        if not vals["base"] or not vals["new"]:
            continue
        unit = next(r[n][1] for rs in sides.values() for r in rs if n in r)
        lower_better = unit.split("/")[0] in ("us", "ms", "s")
        best = {s: (min(v) if lower_better else max(v)) for s, v in vals.items()}
        ratio = best["base"] / best["new"] if lower_better else best["new"] / best["base"]
        b = vals["base"]
        spread = (max(b) - min(b)) / max(abs(best["base"]), 1e-12)
        flag = ""
        if ratio < 1 - max(spread, 0.02):
            flag = "  SLOWER"
            slower += 1
        print(f"{n:52} {unit:5} {best['base']:10.4g} {best['new']:10.4g} {ratio:8.3f} {spread:7.3f}{flag}")
    print(f"{bench}: {slower} cases slower than base by more than max(base spread, 2%)")
PY
tar -C "$RUNS" -czf "$OUT/ab-runs.tar.gz" .
