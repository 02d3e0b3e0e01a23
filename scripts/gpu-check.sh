#!/usr/bin/env bash
# The one GPU check, run on the GPU machine from the repository root. First, on the build
# machine (no GPU needed):
#
#   bash scripts/build-gpu-bundle.sh          # fills .gpu/
#
# then, on the GPU machine, in a copy of the checkout that includes .gpu/ (git ignores it, so
# copy it along explicitly); each command ends within 600 s:
#
#   bash scripts/gpu-check.sh                 # tests, bench_gpu and its PyTorch peers
#   GPU_CHECK_SKIP_TESTS=1 GPU_CHECK_SKIP_CORE_BENCH=1 GPU_CHECK_FAST=1 \
#       bash scripts/gpu-check.sh             # the fused-op benchmark alone
#
# Expects the bundle of scripts/build-gpu-bundle.sh in .gpu/ (stripped binaries .gpu/test-*,
# .gpu/bench_gpu and .gpu/bench_fast, plain or .xz; the kernel cache .gpu/kcache or
# .gpu/kcache.tar.xz; optional Python wheels in .gpu/wheels, Liger Kernel's and
# flash-linear-attention's for the fused-op peers). It
#   1. prints the date and `nvidia-smi -L`, unpacks the bundle;
#   2. runs every .gpu/test-* binary (--test-threads=8 and the manifest's filters, in its
#      crate's folder, as cargo does),
#      one log each in $OUT/<name>.log, pass/fail counts in $OUT/summary.txt, going on after
#      failures (GPU_CHECK_SKIP_TESTS=1 skips this step);
#   3. runs .gpu/bench_gpu --out $OUT/bench_gpu.tsv (its table goes to $OUT/run.log);
#   4. runs python3 bench/gpu_peers.py > $OUT/gpu_peers.tsv (PyTorch eager and torch.compile)
#      (GPU_CHECK_SKIP_CORE_BENCH=1 skips steps 3 and 4);
#   5. the fused-op step: runs .gpu/bench_fast --out $OUT/bench_fast.tsv (table to run.log), then
#      installs .gpu/wheels/*.whl into a temporary folder on PYTHONPATH (pip --no-index: the
#      device machine has no network) and runs python3 bench/gpu_fast_peers.py >
#      $OUT/gpu_fast_peers.tsv (PyTorch eager, torch.compile, F.rms_norm, Liger Kernel, and
#      flash-linear-attention for the gated delta rule).
#      GPU_CHECK_FAST=1 runs it with GPU_CHECK_FAST_SECONDS (270) kept for it, the earlier steps
#      fitting in the rest; GPU_CHECK_FAST=0 never runs it; unset, it runs when the bundle has
#      bench_fast, on the time the earlier steps leave (all of it when they are skipped);
#   6. prints a compact summary: tests, then nuvec against torch case by case with the targets,
#      then the fused ops against torch and Liger, so the last ~12 KB of output are the useful
#      part (also appended to summary.txt).
# Every step has a timeout; the whole script ends within GPU_CHECK_SECONDS (default 530 s):
# tests until GPU_CHECK_TEST_SECONDS (230) after the start, each at most GPU_CHECK_TEST_TIMEOUT
# (220); bench_gpu at most GPU_CHECK_BENCH_TIMEOUT (170) and 150 s before the end of the time
# of steps 2-4; the PyTorch peers get the rest of it and start no torch.compile case in their
# last 60 s; bench_fast at most GPU_CHECK_FAST_BENCH_TIMEOUT (150) and leaves 90 s to its peers,
# which start no torch.compile case in their last 60 s. All of steps 2-5 do not fit in one
# 600 s call: give the fused-op step a call of its own with the two SKIP variables above.
# Exit status 0 when every test binary that ran passed and bench_gpu and bench_fast, where
# they ran, measured every case.
# $OUT holds at most 8 files (what comes back from the device machine): summary.txt, run.log,
# bench_gpu.tsv and gpu_peers.tsv (step 3-4), bench_fast.tsv and gpu_fast_peers.tsv (step 5),
# and one log per test binary in the slots left (with more binaries, the last slot's log,
# tests-rest.log, holds the rest).
set -u
START=$(date +%s)
cd "$(dirname "$0")/.." || exit 1
ROOT=$PWD
OUT=${OUT:-$ROOT/target/gpu-check}
mkdir -p "$OUT"
DEADLINE=$((START + ${GPU_CHECK_SECONDS:-530}))
TESTS_END=$((START + ${GPU_CHECK_TEST_SECONDS:-230}))
RUNLOG=$OUT/run.log
SUMMARY=$OUT/summary.txt
: >"$RUNLOG"
: >"$SUMMARY"
now() { date +%s; }
left() { echo $((DEADLINE - $(now))); }
min() { if [ "$1" -lt "$2" ]; then echo "$1"; else echo "$2"; fi; }

# Which steps run, and the time kept for the fused-op step (5) at the end.
SKIP_TESTS=${GPU_CHECK_SKIP_TESTS:-0}
CORE=1
[ "${GPU_CHECK_SKIP_CORE_BENCH:-0}" = 1 ] && CORE=0
FAST=0
case "${GPU_CHECK_FAST-}" in
    1) FAST=1 ;;
    0) ;;
    *) { [ -e .gpu/bench_fast ] || [ -e .gpu/bench_fast.xz ]; } && FAST=1 ;;
esac
FAST_RESERVE=0
if [ "${GPU_CHECK_FAST-}" = 1 ] && { [ "$SKIP_TESTS" != 1 ] || [ "$CORE" = 1 ]; }; then
    FAST_RESERVE=${GPU_CHECK_FAST_SECONDS:-270}
fi
# Steps 2-4 end by PRE_DEADLINE; the tests leave 150 s of it to the core benchmark.
PRE_DEADLINE=$((DEADLINE - FAST_RESERVE))
if [ "$CORE" = 1 ]; then
    TESTS_END=$(min "$TESTS_END" $((PRE_DEADLINE - 150)))
else
    TESTS_END=$(min "$TESTS_END" "$PRE_DEADLINE")
fi
left_pre() { echo $((PRE_DEADLINE - $(now))); }
# $OUT files back from the device machine: 8, less summary.txt, run.log and the TSVs.
LOG_SLOTS=$((8 - 2 - 2 * CORE - 2 * FAST))

# shellcheck source=scripts/gpu-env.sh
. "$ROOT/scripts/gpu-env.sh"

echo "== gpu-check $(date -u +%Y-%m-%dT%H:%M:%SZ) in $ROOT"
nvidia-smi -L 2>&1 | head -8
[ -f .gpu/build-info.txt ] && sed 's/^/   bundle: /' .gpu/build-info.txt | tr '\n' ' ' && echo
echo "   LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}"

# --- unpack ------------------------------------------------------------------------------
gpu_unpack || exit 2
echo "   kernel cache: $(ls .gpu/kcache 2>/dev/null | wc -l) cubins"
gpu_link_build_root

# --- tests -------------------------------------------------------------------------------
TESTS=()
for f in .gpu/test-*; do
    case "$f" in *.xz) continue ;; esac
    [ -f "$f" ] && [ -x "$f" ] && TESTS+=("$f")
done
if [ "$SKIP_TESTS" = 1 ]; then
    echo "== tests: skipped (GPU_CHECK_SKIP_TESTS=1; ${#TESTS[@]} binaries in the bundle)"
    TESTS=()
else
    echo "== tests: ${#TESTS[@]} binaries (until +$((TESTS_END - START)) s)"
fi
T_PASS=0; T_FAIL=0; T_IGN=0; BAD=0; i=0; TEST_TABLE=
printf '%-40s %6s %6s %6s %6s %7s  %s\n' binary passed failed ignor rc secs status >>"$SUMMARY"
for t in "${TESTS[@]}"; do
    i=$((i + 1))
    name=$(basename "$t")
    if [ "${#TESTS[@]}" -le "$LOG_SLOTS" ] || [ "$i" -lt "$LOG_SLOTS" ]; then
        log=$OUT/$name.log; : >"$log"
    else
        log=$OUT/tests-rest.log
    fi
    dir=$(awk -F'\t' -v n="$name" '$1 == n { print $2 }' .gpu/manifest.tsv 2>/dev/null)
    read -r -a args < <(awk -F'\t' -v n="$name" '$1 == n { print $3 }' .gpu/manifest.tsv 2>/dev/null)
    [ -n "$dir" ] && [ -d "$dir" ] || dir=.
    budget=$(min $((TESTS_END - $(now))) "${GPU_CHECK_TEST_TIMEOUT:-220}")
    if [ "$budget" -lt 10 ]; then
        line=$(printf '%-40s %6s %6s %6s %6s %7s  %s' "$name" - - - - 0 "SKIPPED (time)")
        TEST_TABLE+="$line"$'\n'
        echo "$line" | tee -a "$SUMMARY"
        BAD=$((BAD + 1))
        continue
    fi
    t1=$(now)
    tmp=$(mktemp)
    echo "### $name ${args[*]} (cwd $dir, timeout ${budget}s)" >"$tmp"
    (cd "$dir" && timeout -k 10 "$budget" "$ROOT/$t" --test-threads="${GPU_CHECK_TEST_THREADS:-8}" "${args[@]}") >>"$tmp" 2>&1
    rc=$?
    secs=$(($(now) - t1))
    cat "$tmp" >>"$log"
    read -r p f g < <(awk '/^test result:/ { for (i = 1; i <= NF; i++) { if ($(i+1) ~ /^passed/) p += $i; if ($(i+1) ~ /^failed/) f += $i; if ($(i+1) ~ /^ignored/) g += $i } } END { print p + 0, f + 0, g + 0 }' "$tmp")
    T_PASS=$((T_PASS + p)); T_FAIL=$((T_FAIL + f)); T_IGN=$((T_IGN + g))
    case $rc in
        0) status=ok ;;
        124|137) status=TIMEOUT; BAD=$((BAD + 1)) ;;
        *) status=FAILED; BAD=$((BAD + 1)) ;;
    esac
    line=$(printf '%-40s %6s %6s %6s %6s %7s  %s' "$name" "$p" "$f" "$g" "$rc" "$secs" "$status")
    TEST_TABLE+="$line"$'\n'
    echo "$line" | tee -a "$SUMMARY"
    if [ "$status" != ok ]; then
        { grep -E '^test .* FAILED$' "$tmp" | head -4; grep -A1 -m2 'panicked at' "$tmp" | grep -v '^--$'; grep '^test result:' "$tmp"; } \
            | cut -c1-160 | sed 's/^/      /' | tee -a "$SUMMARY"
    fi
    rm -f "$tmp"
done
TEST_LINE="tests: $T_PASS passed, $T_FAIL failed, $T_IGN ignored; $BAD of ${#TESTS[@]} binaries not ok"
[ "$SKIP_TESTS" = 1 ] && TEST_LINE="tests: skipped (GPU_CHECK_SKIP_TESTS=1)"
echo "$TEST_LINE" | tee -a "$SUMMARY"

# --- nuvec benchmark ---------------------------------------------------------------------
BENCH_RC=-
if [ "$CORE" = 0 ]; then
    echo "== bench_gpu and gpu_peers.py: skipped (GPU_CHECK_SKIP_CORE_BENCH=1)"
elif [ -x .gpu/bench_gpu ]; then
    budget=$(min $(($(left_pre) - 150)) "${GPU_CHECK_BENCH_TIMEOUT:-170}")
    [ "$budget" -lt 30 ] && budget=30
    echo "== bench_gpu (timeout ${budget}s)"
    t1=$(now)
    echo "### bench_gpu" >>"$RUNLOG"
    timeout -k 10 "$budget" .gpu/bench_gpu --out "$OUT/bench_gpu.tsv" >>"$RUNLOG" 2>&1
    BENCH_RC=$?
    n=$(grep -c . "$OUT/bench_gpu.tsv" 2>/dev/null)
    echo "   rc $BENCH_RC in $(($(now) - t1)) s; ${n:-0} results"
    grep -E '^# (GPU|NVRTC|libraries)|FAILED|panicked|no usable' "$RUNLOG" | head -8 | sed 's/^/   /'
    want=$(sed -n 's/^NVRTC=//p' .gpu/build-info.txt 2>/dev/null)
    got=$(sed -n 's/^# NVRTC \([0-9.]*\);.*/\1/p' "$RUNLOG" | head -1)
    if [ -n "$want" ] && [ -n "$got" ] && [ "$want" != "$got" ]; then
        echo "   WARNING: NVRTC $got here, the kernel cache is for $want: kernels compiled at run time"
    fi
else
    echo "== bench_gpu: .gpu/bench_gpu missing"
fi

# --- PyTorch peers -----------------------------------------------------------------------
budget=$(($(left_pre) - 15))
if [ "$CORE" = 0 ]; then
    :
elif [ "$budget" -ge 30 ]; then
    echo "== gpu_peers.py (timeout ${budget}s)"
    t1=$(now)
    echo "### gpu_peers.py" >>"$RUNLOG"
    # PyTorch with the library path it came with (its own cuBLAS and NVRTC).
    LD_LIBRARY_PATH=$ORIG_LD_LIBRARY_PATH timeout -k 10 "$budget" python3 bench/gpu_peers.py \
        --budget $((budget - 60)) >"$OUT/gpu_peers.tsv" 2>>"$RUNLOG"
    PEERS_RC=$?
    n=$(grep -vc '^#' "$OUT/gpu_peers.tsv" 2>/dev/null)
    echo "   rc $PEERS_RC in $(($(now) - t1)) s; ${n:-0} results"
    grep -E '^# torch ' "$OUT/gpu_peers.tsv" | head -2 | sed 's/^/   /'
    sed -n '/^### gpu_peers.py/,$p' "$RUNLOG" | grep -E 'FAILED|Error' | head -5 | sed 's/^/   /'
else
    echo "== gpu_peers.py skipped: no time left"
fi

# --- fused-op benchmark and its peers ----------------------------------------------------
FAST_RC=-
SITE=
if [ "$FAST" = 1 ]; then
    room=$(($(left) - 10))
    if [ ! -x .gpu/bench_fast ]; then
        echo "== bench_fast: .gpu/bench_fast missing (rebuild the bundle)"
    elif [ "$room" -lt 60 ]; then
        echo "== bench_fast skipped: no time left"
    else
        budget=$(min $((room - 90)) "${GPU_CHECK_FAST_BENCH_TIMEOUT:-150}")
        [ "$budget" -lt 30 ] && budget=30
        echo "== bench_fast (timeout ${budget}s)"
        t1=$(now)
        echo "### bench_fast" >>"$RUNLOG"
        timeout -k 10 "$budget" .gpu/bench_fast --out "$OUT/bench_fast.tsv" >>"$RUNLOG" 2>&1
        FAST_RC=$?
        n=$(grep -c . "$OUT/bench_fast.tsv" 2>/dev/null)
        echo "   rc $FAST_RC in $(($(now) - t1)) s; ${n:-0} results"
        sed -n '/^### bench_fast/,$p' "$RUNLOG" | grep -E 'FAILED|panicked|no usable' | head -6 | cut -c1-160 \
            | sed 's/^/   /'
    fi
    if [ "$(left)" -ge 70 ]; then
        echo "== gpu_fast_peers.py"
        PEERS_PATH=${PYTHONPATH-}
        WHEELS=()
        for w in .gpu/wheels/*.whl; do [ -f "$w" ] && WHEELS+=("$w"); done
        if [ "${#WHEELS[@]}" -gt 0 ]; then
            # Into a folder of its own: the device machine has no network (--no-index), and its
            # Python environment stays as it was.
            SITE=$(mktemp -d)
            echo "### pip install ${WHEELS[*]}" >>"$RUNLOG"
            if timeout 60 python3 -m pip install -q --no-deps --no-index --no-compile --disable-pip-version-check \
                --target "$SITE" "${WHEELS[@]}" >>"$RUNLOG" 2>&1; then
                PEERS_PATH=$SITE${PEERS_PATH:+:$PEERS_PATH}
                echo "   wheels installed: $(basename -a "${WHEELS[@]}" | tr '\n' ' ')"
            else
                echo "   wheels: pip install failed (run.log); the Liger and FLA modes will be skipped"
            fi
        else
            echo "   no .gpu/wheels/*.whl: the Liger and FLA modes will be skipped"
        fi
        budget=$(($(left) - 10))
        t1=$(now)
        echo "   timeout ${budget}s"
        echo "### gpu_fast_peers.py" >>"$RUNLOG"
        # PyTorch with the library path it came with, as for gpu_peers.py.
        LD_LIBRARY_PATH=$ORIG_LD_LIBRARY_PATH PYTHONPATH=$PEERS_PATH timeout -k 10 "$budget" \
            python3 bench/gpu_fast_peers.py --deadline $((budget - 5)) >"$OUT/gpu_fast_peers.tsv" 2>>"$RUNLOG"
        rc=$?
        n=$(grep -vc '^#' "$OUT/gpu_fast_peers.tsv" 2>/dev/null)
        echo "   rc $rc in $(($(now) - t1)) s; ${n:-0} results"
        grep -E '^# (torch|triton|liger|fla)' "$OUT/gpu_fast_peers.tsv" | head -4 | cut -c1-160 | sed 's/^/   /'
        sed -n '/^### gpu_fast_peers.py/,$p' "$RUNLOG" | grep -E 'FAILED|Error' | head -5 | cut -c1-160 | sed 's/^/   /'
    else
        echo "== gpu_fast_peers.py skipped: no time left"
    fi
    [ -n "$SITE" ] && rm -rf "$SITE"
fi

# --- summary -----------------------------------------------------------------------------
echo
echo "== summary"
printf '%-40s %6s %6s %6s %6s %7s  %s\n' binary passed failed ignor rc secs status
printf '%s' "$TEST_TABLE"
echo "$TEST_LINE"
[ "$CORE" = 1 ] && python3 - "$OUT/bench_gpu.tsv" "$OUT/gpu_peers.tsv" <<'EOF' | tee -a "$SUMMARY"
import math, sys

sys.path.insert(0, "bench")
from bench_tsv import load

nu, peers = load(sys.argv[1]), load(sys.argv[2])
names = list(nu) + [n.split(":", 1)[1] for n in peers if ":" in n and n.split(":", 1)[1] not in nu]
seen = set()

def fmt(v):
    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.1f}" if v >= 100 else f"{v:.3g}"

def target(name, value, frac, best_torch):
    if value is None or math.isnan(value):
        return "FAILED"
    if name.startswith(("add_", "mul_")):
        goal, got = 0.90, frac
    elif "_rows_" in name:
        goal, got = 0.85, frac
    elif name.startswith("gemv_"):
        goal, got = 0.85, frac
    elif name.startswith("matmul_"):
        goal, got = 0.95, (value / best_torch if best_torch else None)
        if got is None:
            return "no torch"
        return f"{'ok' if got >= goal else 'MISS'} (>=95% torch)"
    elif name.startswith("overhead_record_eval"):
        return f"{'ok' if value <= 10 else 'MISS'} (<=10us)"
    else:
        return ""
    if got is None:
        return "?"
    return f"{'ok' if got >= goal else 'MISS'} (>={goal:.0%})"

print()
print(f"{'case':<32} {'nuvec':>9} {'unit':<7} {'ceil%':>6} {'eager':>9} {'compile':>9} {'nu/torch':>8}  target")
for n in names:
    if n in seen:
        continue
    seen.add(n)
    v, unit, frac = nu.get(n, (None, "", None))
    e = peers.get("torch_eager:" + n, (None, "", None))[0]
    c = peers.get("torch_compile:" + n, (None, "", None))[0]
    unit = unit or peers.get("torch_eager:" + n, (None, "", None))[1] or peers.get("torch_compile:" + n, (None, "", None))[1]
    finite = [x for x in (e, c) if x is not None and not math.isnan(x)]
    if unit == "us/op":
        best = min(finite) if finite else None
        ratio = (best / v) if (best and v) else None  # >1: nuvec faster
    else:
        best = max(finite) if finite else None
        ratio = (v / best) if (best and v is not None and not math.isnan(v)) else None
    pct = f"{100 * frac:.0f}%" if frac is not None else "-"
    print(f"{n:<32} {fmt(v):>9} {unit:<7} {pct:>6} {fmt(e):>9} {fmt(c):>9} {fmt(ratio):>8}  {target(n, v, frac, best)}")
EOF
[ "$FAST" = 1 ] && python3 - "$OUT/bench_fast.tsv" "$OUT/gpu_fast_peers.tsv" <<'EOF' | tee -a "$SUMMARY"
import math, re, sys

sys.path.insert(0, "bench")
from bench_tsv import load

nu, peers = load(sys.argv[1]), load(sys.argv[2])
MODES = (("torch_eager", "eager"), ("torch_compile", "compile"), ("torch_F_rms_norm", "F.rms"), ("liger", "liger"),
         ("fla_recurrent", "fla_rec"), ("fla_chunk", "fla_chk"))
names = list(nu)
for n in peers:
    if ":" in n and n.split(":", 1)[1] not in names:
        names.append(n.split(":", 1)[1])

def fmt(v):
    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.1f}" if v >= 100 else f"{v:.3g}"

def main_bytes(name):
    """Bytes of the case's main tensor (bf16), from the shape in its name."""
    for field in name.split("_"):
        if re.fullmatch(r"\d+(x\d+)+", field):
            return 2 * math.prod(int(d) for d in field.split("x"))
    return 0

def goal(name, unit):
    """bench_fast's targets: 85% of copy forward, 75% backward, where the main tensor has 64 MiB."""
    if unit != "GB/s" or main_bytes(name) < 64 << 20:
        return None
    if "_fwd_" in name:
        return 0.85
    if "_bwd_" in name or "_fwdbwd_" in name:
        return 0.75
    return None

print()
print(f"{'fused op':<38} {'nuvec':>8} {'unit':<5} {'ceil%':>6} " + " ".join(f"{label:>8}" for _, label in MODES)
      + f" {'nu/best':>7}  target")
ok = miss = failed = faster = compared = 0
for n in names:
    v, unit, frac = nu.get(n, (None, "", None))
    got = {label: peers.get(f"{mode}:{n}", (None, "", None)) for mode, label in MODES}
    unit = unit or next((u for _, u, _ in got.values() if u), "")
    finite = [x for x, _, _ in got.values() if x is not None and not math.isnan(x)]
    have = v is not None and not math.isnan(v)
    if unit == "us":
        best = min(finite) if finite else None
        ratio = best / v if (best and have and v > 0) else None  # >1: nuvec faster
    else:
        best = max(finite) if finite else None
        ratio = v / best if (best and have) else None
    if ratio is not None and n != "ceiling_copy_memcpy":
        compared += 1
        faster += ratio >= 1
    g = goal(n, unit)
    if v is None:
        status = "no nuvec"
    elif not have:
        status, failed = "FAILED", failed + 1
    elif g is None:
        status = ""
    elif frac is None:
        status = "?"
    elif frac >= g:
        status, ok = f"ok (>={g:.0%})", ok + 1
    else:
        status, miss = f"MISS (>={g:.0%})", miss + 1
    pct = f"{100 * frac:.0f}%" if frac is not None else "-"
    cols = " ".join(f"{fmt(got[label][0]):>8}" for _, label in MODES)
    print(f"{n:<38} {fmt(v):>8} {unit:<5} {pct:>6} {cols} {fmt(ratio):>7}  {status}")
print(f"fused ops: targets {ok} ok, {miss} MISS; {failed} failed; nuvec at least as fast as the best peer "
      f"in {faster} of {compared} cases")
EOF
echo "== done in $(($(now) - START)) s; logs in $OUT ($(ls "$OUT" | wc -l) files)"
if [ "$BAD" -gt 0 ] || [ "$T_FAIL" -gt 0 ] || { [ "$BENCH_RC" != 0 ] && [ "$BENCH_RC" != - ]; } ||
    { [ "$FAST_RC" != 0 ] && [ "$FAST_RC" != - ]; }; then
    exit 1
fi
exit 0
