#!/usr/bin/env bash
# The training and loading benchmarks of nuvec-nn and nuvec-io on the GPU machine, from the
# repository root, with the bundle of scripts/build-gpu-bundle.sh in .gpu/ (as gpu-check.sh):
#
#   bash scripts/gpu-train.sh              # GPT-2 small step, PyTorch's, train_lm
#   GPU_TRAIN_LOAD=1 bash scripts/gpu-train.sh   # and the 8B-shaped checkpoint load
#
#   1. .gpu/bench_train --only gpt2 > $OUT/bench_train.tsv (one AdamW step of GPT-2 small,
#      bf16, batch 8 x 1024, against the matmul ceiling of the same run);
#   2. python3 bench/train_peers.py --only gpt2 > $OUT/train_peers.tsv (PyTorch eager, eager
#      with fused AdamW, torch.compile; GPU_TRAIN_IMPLS narrows them);
#   3. with GPU_TRAIN_LOAD=1: bench/load_checkpoint.py writes a Llama-3-8B-shaped checkpoint
#      (16 GB of random bf16) to $GPU_TRAIN_CKPT (/tmp/ckpt), measures the disk's cold and warm
#      reads and safetensors' torch loader, drops the page cache, then .gpu/bench_load loads it
#      onto the GPU; all into $OUT/load.tsv;
#   4. .gpu/train_lm --steps 300 (its text from .gpu/cache), log in $OUT/train_lm.log;
#   5. prints nuvec's step against each peer's.
# About 4 minutes with the load, 2.5 without (torch.compile's first step compiles ~30 s).
set -u
cd "$(dirname "$0")/.." || exit 1
ROOT=$PWD
OUT=${OUT:-$ROOT/target/gpu-train}
mkdir -p "$OUT"
# shellcheck source=scripts/gpu-env.sh
. "$ROOT/scripts/gpu-env.sh"
gpu_unpack || exit 2
gpu_link_build_root
PEERS_ENV=(env LD_LIBRARY_PATH="$ORIG_LD_LIBRARY_PATH")

echo "== bench_train gpt2"
timeout -k 10 120 .gpu/bench_train --only gpt2 --steps 10 --warmup 3 >"$OUT/bench_train.tsv" 2>"$OUT/bench_train.log"
grep -E '^gpt2:' "$OUT/bench_train.log"

echo "== train_peers.py gpt2"
"${PEERS_ENV[@]}" timeout -k 10 200 python3 bench/train_peers.py --only gpt2 --steps 10 \
    --impls "${GPU_TRAIN_IMPLS:-torch_eager,torch_eager_fused,torch_compile}" \
    --out "$OUT/train_peers.tsv" >"$OUT/train_peers.log" 2>&1
grep -E 'ms/step' "$OUT/train_peers.log"

if [ "${GPU_TRAIN_LOAD:-0}" = 1 ]; then
    CKPT=${GPU_TRAIN_CKPT:-/tmp/ckpt}
    echo "== 8B-shaped checkpoint load ($CKPT)"
    : >"$OUT/load.tsv"
    timeout -k 10 120 python3 bench/load_checkpoint.py write "$CKPT" | tail -1
    "${PEERS_ENV[@]}" timeout -k 10 120 python3 bench/load_checkpoint.py read "$CKPT" --out "$OUT/load.tsv" >/dev/null
    python3 bench/load_checkpoint.py drop "$CKPT" >/dev/null
    timeout -k 10 120 .gpu/bench_load "$CKPT/model.safetensors.index.json" >>"$OUT/load.tsv" 2>>"$OUT/bench_train.log"
    cat "$OUT/load.tsv"
    rm -rf "$CKPT"
fi

echo "== train_lm"
timeout -k 10 120 .gpu/train_lm --steps 300 --batch 16 --out "$OUT/train_lm" >"$OUT/train_lm.log" 2>&1
tail -4 "$OUT/train_lm.log" | cut -c1-160

echo "== summary"
python3 - "$OUT/bench_train.tsv" "$OUT/train_peers.tsv" <<'EOF'
import csv, sys
ours = {r["case"]: float(r["ms_per_step"]) for r in csv.DictReader(open(sys.argv[1]), delimiter="\t")}
peers = list(csv.DictReader(open(sys.argv[2]), delimiter="\t"))
for p in peers:
    mine = ours.get(p["model"])
    if mine:
        ms = float(p["ms_per_step"])
        print(f"{p['model']:<6} nuvec {mine:8.2f} ms  {p['impl']:<18} {ms:8.2f} ms  nuvec/peer speed {ms / mine:5.2f}")
EOF
