#!/usr/bin/env python3
"""llama.cpp on the CPU (llama-cpp-python built from its 0.3.36 source package) on the same
GGUF and the same token ids as `nuvec bench`: prefill tokens/s (time to first token) and greedy
decode tokens/s with the threads given (default: every core).

Usage: python3 bench/lm_cpu_peers.py GGUF [--prompt-tokens 128] [--context 128] [--steps 32]
       [--threads N] [--repeats 3]
"""
import argparse
import os
import time

import llama_cpp

ap = argparse.ArgumentParser()
ap.add_argument("gguf")
ap.add_argument("--prompt-tokens", type=int, default=128)
ap.add_argument("--context", type=int, default=128)
ap.add_argument("--steps", type=int, default=32)
ap.add_argument("--threads", type=int, default=os.cpu_count())
ap.add_argument("--repeats", type=int, default=3)
a = ap.parse_args()

llm = llama_cpp.Llama(model_path=a.gguf, n_ctx=max(a.prompt_tokens, a.context) + a.steps + 8, n_threads=a.threads,
                      n_threads_batch=a.threads, n_batch=512, verbose=False, logits_all=False)
vocab = llm.n_vocab()
# The token sequence `nuvec bench` uses.
ids = lambda n: [(i * 2_654_435_761 + 7) % vocab for i in range(n)]


def prefill(n):
    llm.reset()
    t = time.perf_counter()
    llm.eval(ids(n))
    tok = int(llm.scores[llm.n_tokens - 1].argmax())
    return time.perf_counter() - t, tok


def decode(context, steps):
    _, tok = prefill(context)
    t = time.perf_counter()
    for _ in range(steps):
        llm.eval([tok])
        tok = int(llm.scores[llm.n_tokens - 1].argmax())
    return time.perf_counter() - t


best_p = min(prefill(a.prompt_tokens)[0] for _ in range(a.repeats))
best_d = min(decode(a.context, a.steps) for _ in range(a.repeats))
print(f"llama.cpp {llama_cpp.__version__}, {a.threads} threads, {os.path.basename(a.gguf)}")
print(f"prefill {a.prompt_tokens} tokens: {a.prompt_tokens / best_p:.1f} tok/s, TTFT {best_p * 1e3:.2f} ms")
print(f"decode after {a.context}: {a.steps / best_d:.1f} tok/s, {best_d / a.steps * 1e3:.3f} ms/step")
