#!/usr/bin/env bash
# Several GPUs of one host (issue 29), from the repository root with the bundle of
# scripts/build-gpu-bundle.sh in .gpu/ (bench_allreduce and nuvec among its binaries):
#
#   bash scripts/gpu-multi.sh
#
#   1. the NCCL tests (nuvec-distributed's, and nuvec-lm's tensor-parallel model over two GPUs)
#      with NUVEC_REQUIRE_GPU=1 and NUVEC_REQUIRE_NCCL=1;
#   2. all-reduce bus bandwidth, 1 MiB to 1 GiB: bench_allreduce beside PyTorch's
#      (bench/allreduce_peers.py) on the same GPUs;
#   3. Llama-3-70B's shapes (bench/configs/llama-3-70b.json, random bf16 weights) decoding at
#      batch 1 over 2, 4 and 8 GPUs as there are (`nuvec bench --tensor-parallel N`), and the
#      copy ceiling of each GPU (bench/lm_peers.py's), for tokens/s against the per-token bytes
#      over the summed copy ceilings.
# Outputs in $OUT (default target/gpu-multi). Skips what the machine's GPUs cannot do.
set -u
cd "$(dirname "$0")/.." || exit 1
ROOT=$PWD
OUT=${OUT:-$ROOT/target/gpu-multi}
mkdir -p "$OUT"
# shellcheck source=scripts/gpu-env.sh
. "$ROOT/scripts/gpu-env.sh"
gpu_unpack || exit 2
gpu_link_build_root
GPUS=$(nvidia-smi -L | wc -l)
echo "== $GPUS GPUs"
for t in .gpu/test-nuvec-distributed-nccl .gpu/test-nuvec-lm-models; do
    [ -x "$t" ] || continue
    dir=crates/nuvec-distributed; case "$t" in *lm*) dir=crates/nuvec-lm ;; esac
    (cd "$dir" && "$ROOT/$t" --test-threads 1 --nocapture nccl 2>&1) | tee -a "$OUT/tests.log" | grep -E "^test |SKIPPED|result"
done
echo "== all-reduce bus bandwidth (GB/s)"
[ -x .gpu/bench_allreduce ] && timeout 200 .gpu/bench_allreduce | tee "$OUT/allreduce.tsv"
LD_LIBRARY_PATH=$ORIG_LD_LIBRARY_PATH timeout 200 python3 bench/allreduce_peers.py | tee "$OUT/allreduce_peers.tsv"
echo "== Llama-3-70B shapes, bf16, batch 1"
for n in 2 4 8; do
    [ "$n" -le "$GPUS" ] || continue
    timeout 400 .gpu/nuvec bench --random bench/configs/llama-3-70b.json --dtype bfloat16 --tensor-parallel "$n" \
        --prompt-tokens 128 --context 512 --steps 32 --repeats 2 --json "$OUT/tp$n.json" 2>&1 | tee -a "$OUT/tp.log"
done
