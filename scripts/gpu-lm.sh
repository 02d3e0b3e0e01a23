#!/usr/bin/env bash
# The LLM engine on the GPU machine, from the repository root, with the bundle of
# scripts/build-gpu-bundle.sh in .gpu/ (as gpu-check.sh):
#
#   bash scripts/gpu-lm.sh
#
#   1. nuvec-lm's model tests (transformers' tiny models) with NUVEC_REQUIRE_GPU=1;
#   2. `nuvec bench` on random weights of Llama-3-8B's shapes (bench/configs/llama-3-8b.json):
#      bf16 prefill (time to first token) at GPU_LM_PROMPTS and decode at GPU_LM_BATCHES, then
#      batch-1 decode op by op (--no-graph), and the same decode with 4-bit weights (MLX affine,
#      groups of 64);
#   3. python3 bench/lm_peers.py: the copy ceiling, PyTorch eager and CUDA-graph decode, and
#      PyTorch's prefill, in the same run;
#   4. a summary: nuvec's rates beside the peers' and the ceiling.
# Outputs in $OUT (default target/gpu-lm): summary.txt, lm.log, nuvec_bf16.json, nuvec_q4.json,
# peers.json. Environment: GPU_LM_PROMPTS (2048,32768), GPU_LM_BATCHES (1,32,64),
# GPU_LM_SECONDS (570: the script ends within it), GPU_LM_SKIP_PEERS=1.
#
# GPU_LM_MODEL=qwen3-next: Qwen3-Next-80B-A3B's shapes in 12 layers instead
# (bench/configs/qwen3-next-12l.json; prompts 4096,16384 and batch 1 unless set), prefill also
# without the chunked gated delta kernels (NUVEC_GDN_CHUNKED=0), no 4-bit run, and
# bench/qwen3_next_peers.py (PyTorch + flash-linear-attention from .gpu/wheels, routed experts
# by gather and by grouped GEMM) as the peer.
set -u
START=$(date +%s)
cd "$(dirname "$0")/.." || exit 1
ROOT=$PWD
OUT=${OUT:-$ROOT/target/gpu-lm}
mkdir -p "$OUT"
DEADLINE=$((START + ${GPU_LM_SECONDS:-570}))
# shellcheck source=scripts/gpu-env.sh
. "$ROOT/scripts/gpu-env.sh"
gpu_unpack || exit 2
gpu_link_build_root
left() { echo $((DEADLINE - $(date +%s))); }
LOG=$OUT/lm.log
: >"$LOG"
MODEL=${GPU_LM_MODEL:-llama}
if [ "$MODEL" = qwen3-next ]; then
    CONFIG=bench/configs/qwen3-next-12l.json
    PROMPTS=${GPU_LM_PROMPTS:-4096,16384}
    BATCHES=${GPU_LM_BATCHES:-1}
else
    CONFIG=bench/configs/llama-3-8b.json
    PROMPTS=${GPU_LM_PROMPTS:-2048,32768}
    BATCHES=${GPU_LM_BATCHES:-1,32,64}
fi
RC=0

echo "== nuvec-lm model tests (NUVEC_REQUIRE_GPU=1)" | tee -a "$LOG"
if [ -x .gpu/test-nuvec-lm-models ]; then
    (cd crates/nuvec-lm && NUVEC_REQUIRE_GPU=1 timeout -k 5 120 "$ROOT/.gpu/test-nuvec-lm-models" --test-threads=4) \
        >>"$LOG" 2>&1 || RC=1
    grep -E '^test result|FAILED|panicked' "$LOG" | tail -5
else
    echo "   .gpu/test-nuvec-lm-models missing" | tee -a "$LOG"; RC=1
fi

bench() { # bench NAME ARGS...: nuvec bench on the random model, JSON to $OUT/NAME.json
    local name=$1; shift
    echo "== nuvec bench $name $*" | tee -a "$LOG"
    timeout -k 5 "$(( $(left) - 150 ))" .gpu/nuvec bench --random "$CONFIG" --json "$OUT/$name.json" "$@" \
        >>"$LOG" 2>&1 || { echo "   failed (rc $?)" | tee -a "$LOG"; RC=1; }
    sed -n '/^== nuvec bench '"$name"'/,$p' "$LOG" | tail -n +2 | grep -vE '^\s*$' | cut -c1-120
}
bench nuvec_bf16 --dtype bfloat16 --prompt-tokens "$PROMPTS" --batch "$BATCHES" --context 512 --steps 64 --repeats 2
bench nuvec_bf16_nograph --dtype bfloat16 --no-graph --prompt-tokens 128 --batch 1 --context 512 --steps 64 --repeats 2
if [ "$MODEL" = qwen3-next ]; then
    NUVEC_GDN_CHUNKED=0 bench nuvec_bf16_recurrent --dtype bfloat16 --prompt-tokens "$PROMPTS" --batch 1 --context 512 \
        --steps 16 --repeats 2
else
    bench nuvec_q4 --dtype bfloat16 --quantize 4,64 --prompt-tokens 2048 --batch 1,32 --context 512 --steps 64 --repeats 2
fi

if [ "${GPU_LM_SKIP_PEERS:-0}" = 1 ] || [ "$(left)" -lt 60 ]; then
    echo "== lm_peers.py: skipped" | tee -a "$LOG"
else
    echo "== PyTorch peers" | tee -a "$LOG"
    if [ "$MODEL" = qwen3-next ]; then
        # flash-linear-attention from .gpu/wheels, into a folder of its own (no network there).
        SITE=$(mktemp -d)
        python3 -m pip install -q --no-deps --no-index --no-compile --disable-pip-version-check --target "$SITE" \
            .gpu/wheels/*.whl >>"$LOG" 2>&1 || echo "   pip install of .gpu/wheels failed" | tee -a "$LOG"
        PYTHONPATH=$SITE${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 timeout -k 5 "$(( $(left) - 10 ))" \
            python3 bench/qwen3_next_peers.py --config "$CONFIG" --batches "$BATCHES" --context 512 --steps 64 \
            --moe gather,grouped_mm --json "$OUT/peers.json" >>"$LOG" 2>&1 || { echo "   failed (rc $?)" | tee -a "$LOG"; RC=1; }
    else
        PYTHONUNBUFFERED=1 timeout -k 5 "$(( $(left) - 10 ))" python3 bench/lm_peers.py --config "$CONFIG" \
            --batches "$BATCHES" --context 512 --steps 64 --prefill "$PROMPTS" --json "$OUT/peers.json" >>"$LOG" 2>&1 \
            || { echo "   failed (rc $?)" | tee -a "$LOG"; RC=1; }
    fi
    sed -n '/^== PyTorch peers/,$p' "$LOG" | tail -n +2 | cut -c1-140 | tail -40
fi

python3 - "$OUT" "$CONFIG" >"$OUT/summary.txt" <<'PY'
import json, os, sys
out = sys.argv[1]
def load(n):
    try:
        return json.load(open(os.path.join(out, n)))
    except (OSError, ValueError):
        return None
bf, q4, peers = load("nuvec_bf16.json"), load("nuvec_q4.json"), load("peers.json")
print(f"decode tokens/s, {os.path.basename(sys.argv[2])} shapes, random weights")
ceiling = None
if peers:
    ceiling = peers.get("ceiling_tokens_per_s")
    print(f"  copy ceiling (batch 1): {ceiling}")
rows = {}
for doc, col in [(bf, "nuvec_bf16"), (q4, "nuvec_q4")]:
    for r in (doc or {}).get("decode", []):
        rows.setdefault(r["batch"], {})[col] = r["decode_tokens_per_s"]
for r in (peers or {}).get("decode", []):
    # Qwen3-Next's peer measures each way of running the experts: the best counts.
    row = rows.setdefault(r.get("batch"), {})
    for key, col in [("eager_tokens_per_s", "torch_eager"), ("graph_tokens_per_s", "torch_graph")]:
        v = r.get(key)
        if isinstance(v, (int, float)) and v > (row.get(col) or 0):
            row[col] = v
cols = ["nuvec_bf16", "nuvec_q4", "torch_eager", "torch_graph"]
print("  batch " + " ".join(f"{c:>12}" for c in cols) + "   bf16/graph  bf16/ceiling  q4/bf16")
for b in sorted(k for k in rows if k is not None):
    r = rows[b]
    f = lambda v: f"{v:12.1f}" if isinstance(v, (int, float)) else f"{'-':>12}"
    ratio = lambda a, c: f"{a / c:10.2f}" if isinstance(a, (int, float)) and isinstance(c, (int, float)) and c else f"{'-':>10}"
    print(f"  {b:5} " + " ".join(f(r.get(c)) for c in cols) + "  " + ratio(r.get("nuvec_bf16"), r.get("torch_graph"))
          + "  " + (ratio(r.get("nuvec_bf16"), ceiling) if b == 1 else f"{'-':>10}") + "  " + ratio(r.get("nuvec_q4"), r.get("nuvec_bf16")))
print("time to first token, ms (batch 1)")
tt = {}
for r in (bf or {}).get("prefill", []):
    tt.setdefault(r["prompt_tokens"], {})["nuvec"] = r["ttft_s"] * 1e3
for r in (peers or {}).get("prefill", []):
    tt.setdefault(r.get("prompt_tokens"), {})["torch"] = r.get("ttft_ms")
for n in sorted(k for k in tt if k is not None):
    a, b = tt[n].get("nuvec"), tt[n].get("torch")
    print(f"  {n:6} nuvec {a if a is None else round(a, 1)}  torch {b if b is None else round(b, 1)}"
          + (f"  torch/nuvec {b / a:.2f}" if a and b else ""))
PY
cat "$OUT/summary.txt"
exit $RC
