# Sourced by scripts/gpu-check.sh and scripts/gpu-ops.sh on the GPU machine, from the
# repository root with ROOT set: the environment the bundle's binaries run in (the toolkit's
# libraries first, NVIDIA's wheels as a fallback; PyTorch later gets ORIG_LD_LIBRARY_PATH, the
# path it came with), and gpu_unpack.

ORIG_LD_LIBRARY_PATH=${LD_LIBRARY_PATH-}
export NUVEC_REQUIRE_GPU=1
export NUVEC_KERNEL_CACHE=$ROOT/.gpu/kcache
export PYTHONUNBUFFERED=1
if [ -d /usr/local/cuda/lib64 ]; then
    export LD_LIBRARY_PATH="/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
# NVIDIA's wheels (PyTorch's NVRTC and cuBLASLt) as a fallback after the toolkit.
NVLIBS=$(python3 - 2>/dev/null <<'EOF'
import glob, os
try:
    import nvidia
    roots = list(nvidia.__path__)
except Exception:
    roots = []
dirs = []
for r in roots:
    for d in sorted(glob.glob(os.path.join(r, "cu13", "lib")) + glob.glob(os.path.join(r, "*", "lib"))):
        if d not in dirs and glob.glob(os.path.join(d, "lib*.so*")):
            dirs.append(d)
print(":".join(dirs))
EOF
)
[ -n "$NVLIBS" ] && export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$NVLIBS"
# NCCL's wheel holds libnccl.so.2 and cudarc opens libnccl.so: a linked folder (as
# distributed::launch makes for its ranks); the NCCL tests then must not skip.
NCCL_SO=$(IFS=:; for d in $LD_LIBRARY_PATH; do [ -e "$d/libnccl.so.2" ] && echo "$d/libnccl.so.2" && break; done)
if [ -n "$NCCL_SO" ]; then
    mkdir -p /tmp/nuvec-nccl && ln -sf "$NCCL_SO" /tmp/nuvec-nccl/libnccl.so
    export LD_LIBRARY_PATH="/tmp/nuvec-nccl:$LD_LIBRARY_PATH" NUVEC_REQUIRE_NCCL=1
fi
export NCCL_NVLS_ENABLE=0

unxz_to() { # unxz_to SRC DEST
    if command -v xz >/dev/null 2>&1; then
        xz -dc "$1" >"$2"
    else
        python3 -c 'import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], "wb"))' "$1" "$2"
    fi
}

# Unpacks .gpu/*.xz (binaries and the kernel cache) and, for a GPU_BUNDLE_KCACHE=0 bundle,
# compiles the kernel cache here; status 2 without a bundle.
gpu_unpack() {
    if [ ! -d .gpu ]; then
        echo "no .gpu bundle: build it with scripts/build-gpu-bundle.sh and carry .gpu"
        return 2
    fi
    for f in .gpu/*.xz; do
        [ -e "$f" ] || continue
        case "$f" in
            .gpu/kcache.tar.xz)
                rm -rf .gpu/kcache
                if command -v xz >/dev/null 2>&1; then
                    xz -dc "$f" | tar -C .gpu -xf -
                else
                    python3 -c 'import tarfile, sys; tarfile.open(sys.argv[1]).extractall(".gpu")' "$f"
                fi ;;
            *)
                unxz_to "$f" "${f%.xz}" && chmod +x "${f%.xz}" ;;
        esac
    done
    # Data the examples would fetch (train_lm's text): the device machine has no network.
    for f in .gpu/cache/*/*.xz; do
        [ -e "$f" ] && unxz_to "$f" "${f%.xz}"
    done
    [ -d .gpu/cache ] && export NUVEC_CACHE=$ROOT/.gpu/cache
    if [ ! -d .gpu/kcache ] && [ -x .gpu/precompile_kernels ]; then
        # A bundle built with GPU_BUNDLE_KCACHE=0: compile the modules here, on every core.
        timeout 300 .gpu/precompile_kernels "${GPU_ARCH:-sm_90a}" 2>&1 | tail -2
    fi
}

# Tests may name files by the absolute path of the build machine's checkout (env!
# CARGO_MANIFEST_DIR): points that path here when it does not exist.
gpu_link_build_root() {
    local b
    b=$(sed -n 's/^BUILD_ROOT=//p' .gpu/build-info.txt 2>/dev/null)
    if [ -n "$b" ] && [ "$b" != "$ROOT" ] && [ ! -e "$b" ]; then
        mkdir -p "$(dirname "$b")" && ln -s "$ROOT" "$b" && echo "   linked $b -> $ROOT"
    fi
}
