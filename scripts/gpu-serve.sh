#!/usr/bin/env bash
# `nuvec serve` under load on the GPU machine, from the repository root, with the bundle of
# scripts/build-gpu-bundle.sh in .gpu/ (as gpu-check.sh):
#
#   bash scripts/gpu-serve.sh
#
# The model: Llama-3-8B's shapes (bench/configs/llama-3-8b.json) with random weights in
# bfloat16 and Llama 3's real tokenizer (the bundle's .gpu/cache/tokenizer-llama3-3.7.2).
#   1. `nuvec generate` of GPU_SERVE_TOKENS tokens: the single-request decode rate to match;
#   2. for each --kv-block-size in GPU_SERVE_KV ("16 0": the paged pool, then caches of each
#      request's own), `nuvec serve --max-batch GPU_SERVE_BATCH` on loopback, then
#      scripts/serve-load.py at GPU_SERVE_CONCURRENCY concurrent streaming requests of
#      GPU_SERVE_TOKENS greedy tokens: output tokens/s, time to first token and inter-token
#      latency, p50 and p99; the server's /metrics after the load.
# Outputs in $OUT (default target/gpu-serve): generate.txt, load.txt, serve-kv<N>.log,
# metrics-kv<N>.txt. Environment: GPU_SERVE_KV ("16 0"), GPU_SERVE_CONCURRENCY (1,8,64,256),
# GPU_SERVE_TOKENS (128), GPU_SERVE_BATCH (256), GPU_SERVE_ROUNDS (2), GPU_SERVE_SECONDS (400:
# each load ends within it), GPU_SERVE_ARGS (more `nuvec serve` arguments, e.g. "--prefill-rows 1"),
# GPU_SERVE_SKIP_GENERATE (1: no step 1).
set -u
cd "$(dirname "$0")/.." || exit 1
ROOT=$PWD
. scripts/gpu-env.sh
gpu_unpack >/dev/null 2>&1
gpu_link_build_root
OUT=${OUT:-target/gpu-serve}
mkdir -p "$OUT"
TOKENS=${GPU_SERVE_TOKENS:-128}
MODEL=$(mktemp -d)
cp bench/configs/llama-3-8b.json "$MODEL/config.json"
cp .gpu/cache/tokenizer-llama3-3.7.2/tokenizer.json .gpu/cache/tokenizer-llama3-3.7.2/tokenizer_config.json "$MODEL/" \
    || { echo "no Llama 3 tokenizer in the bundle (scripts/build-gpu-bundle.sh fetches it)"; exit 2; }
LOAD=(--model "$MODEL" --random-weights --dtype bfloat16)

if [ "${GPU_SERVE_SKIP_GENERATE:-0}" != 1 ]; then
    echo "== nuvec generate, $TOKENS tokens"
    timeout 120 .gpu/nuvec generate "${LOAD[@]}" --max-tokens "$TOKENS" --prompt "Tell me story number 0 about a cat." \
        >"$OUT/generate.txt" 2>&1
    grep -iE 'tokens-per-sec|tok/s|error' "$OUT/generate.txt" | head -4
fi

PORT=8089
for KV in ${GPU_SERVE_KV:-16 0}; do
    .gpu/nuvec serve "${LOAD[@]}" --port "$PORT" --max-batch "${GPU_SERVE_BATCH:-256}" --max-tokens "$TOKENS" \
        --kv-block-size "$KV" ${GPU_SERVE_ARGS:-} >"$OUT/serve-kv$KV.log" 2>&1 &
    SERVER=$!
    for _ in $(seq 120); do
        curl -sf "http://127.0.0.1:$PORT/health" >/dev/null 2>&1 && break
        sleep 1
    done
    echo "== --kv-block-size $KV ${GPU_SERVE_ARGS:-}: serve-load.py at ${GPU_SERVE_CONCURRENCY:-1,8,64,256} concurrent requests, $TOKENS tokens each"
    timeout "${GPU_SERVE_SECONDS:-400}" python3 scripts/serve-load.py --url "http://127.0.0.1:$PORT" \
        --concurrency "${GPU_SERVE_CONCURRENCY:-1,8,64,256}" --tokens "$TOKENS" --rounds "${GPU_SERVE_ROUNDS:-2}" \
        2>&1 | tee -a "$OUT/load.txt"
    curl -sf "http://127.0.0.1:$PORT/metrics" >"$OUT/metrics-kv$KV.txt"
    grep -E '^nuvec_(kv|preempt)' "$OUT/metrics-kv$KV.txt"
    kill "$SERVER"
    wait "$SERVER" 2>/dev/null
    tail -3 "$OUT/serve-kv$KV.log"
done
rm -rf "$MODEL"
