#!/usr/bin/env python3
"""PyTorch's decode and prefill of a Llama model with random bf16 weights, the peer of
`nuvec bench --random CONFIG` (scripts/gpu-lm.sh runs both in one call):

  - the copy ceiling: torch's `y.copy_(x)` (bytes read + written, as bench/gpu_peers.py), and
    the tokens/s it allows at batch 1: ceiling / bytes read per token (the weights of the
    layers, the final norm and lm_head, one embedding row, the KV cache at the context);
  - decode tokens/s per batch size, eager and with the step captured in a CUDA graph;
  - time to first token: the whole prompt's forward and the argmax of its last position.

The model is written out by hand, as the issue's reference numbers were measured: fused QKV
and gate/up weights, RMSNorm (F.rms_norm), RoPE on the two halves, a static KV cache per
layer written with index_copy_, SDPA with grouped query heads (enable_gqa). A decode step
attends over the whole static cache with an additive mask that the step itself opens at its
position, so eager and graphed steps do the same work and the graph replays without host
input: the step also writes its token and advances its position on the device.

Usage: python3 bench/lm_peers.py [--config bench/configs/llama-3-8b.json] [--batches 1,32,64]
       [--context 512] [--steps 64] [--prefill 2048,32768] [--json OUT]
"""
import argparse
import json
import time

import torch
import torch.nn.functional as F

ap = argparse.ArgumentParser()
ap.add_argument("--config", default="bench/configs/llama-3-8b.json")
ap.add_argument("--batches", default="1,32,64")
ap.add_argument("--context", type=int, default=512)
ap.add_argument("--steps", type=int, default=64)
ap.add_argument("--prefill", default="2048,32768")
ap.add_argument("--json")
a = ap.parse_args()

cfg = json.load(open(a.config))
H, I, L = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_hidden_layers"]
HQ, HKV, V = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["vocab_size"]
D, EPS, THETA = H // HQ, cfg.get("rms_norm_eps", 1e-5), cfg.get("rope_theta", 10000.0)
DEV, DT = "cuda", torch.bfloat16
torch.manual_seed(0)


def w(*shape):
    return torch.randn(*shape, device=DEV, dtype=DT) * 0.02


layers = [dict(n1=torch.ones(H, device=DEV, dtype=DT), qkv=w((HQ + 2 * HKV) * D, H), o=w(H, HQ * D),
               n2=torch.ones(H, device=DEV, dtype=DT), gu=w(2 * I, H), down=w(H, I)) for _ in range(L)]
emb, norm, head = w(V, H), torch.ones(H, device=DEV, dtype=DT), w(V, H)
inv_freq = 1.0 / (THETA ** (torch.arange(0, D, 2, device=DEV, dtype=torch.float32) / D))
weight_bytes = sum(t.numel() * t.element_size() for l in layers for t in l.values()) + 2 * norm.numel() + \
    head.numel() * 2 + H * 2


def rope(x, pos):
    f = pos[:, None].float() * inv_freq[None]
    cos, sin = torch.cat([f.cos(), f.cos()], -1).to(DT), torch.cat([f.sin(), f.sin()], -1).to(DT)
    x1, x2 = x[..., : D // 2], x[..., D // 2:]
    return x * cos + torch.cat([-x2, x1], -1) * sin


def forward(ids, pos, caches, mask=None):
    """Next tokens [B] after ids [B, T] at positions pos [T]; mask None: causal from 0."""
    b, t = ids.shape
    x = emb[ids]
    for l, (kc, vc) in zip(layers, caches):
        h = F.rms_norm(x, (H,), l["n1"], EPS)
        q, k, v = (h @ l["qkv"].T).split([HQ * D, HKV * D, HKV * D], -1)
        q = rope(q.view(b, t, HQ, D).transpose(1, 2), pos)
        k = rope(k.view(b, t, HKV, D).transpose(1, 2), pos)
        kc.index_copy_(2, pos, k)
        vc.index_copy_(2, pos, v.view(b, t, HKV, D).transpose(1, 2))
        if mask is None:
            o = F.scaled_dot_product_attention(q, k, v.view(b, t, HKV, D).transpose(1, 2), is_causal=True,
                                               enable_gqa=True)
        else:
            o = F.scaled_dot_product_attention(q, kc, vc, attn_mask=mask, enable_gqa=True)
        x = x + o.transpose(1, 2).reshape(b, t, HQ * D) @ l["o"].T
        g, u = (F.rms_norm(x, (H,), l["n2"], EPS) @ l["gu"].T).chunk(2, -1)
        x = x + (F.silu(g) * u) @ l["down"].T
    return (F.rms_norm(x[:, -1], (H,), norm, EPS) @ head.T).argmax(-1)


def caches(b, n):
    return [(torch.zeros(b, HKV, n, D, device=DEV, dtype=DT), torch.zeros(b, HKV, n, D, device=DEV, dtype=DT))
            for _ in range(L)]


def cuda_time(fn, reps=3):
    best = float("inf")
    for _ in range(reps):
        torch.cuda.synchronize()
        t = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        best = min(best, time.perf_counter() - t)
    return best


def copy_gbs():
    n = 1 << 29
    src = torch.empty(n, device=DEV, dtype=torch.float32).normal_()
    dst = torch.empty_like(src)
    dst.copy_(src)
    s = cuda_time(lambda: [dst.copy_(src) for _ in range(10)]) / 10
    del src, dst
    torch.cuda.empty_cache()
    return 2 * 4 * n / s / 1e9


def decode(b):
    n = a.context + a.steps + 8
    cs = caches(b, n)
    prompt = torch.randint(0, V, (b, a.context), device=DEV)
    first = forward(prompt, torch.arange(a.context, device=DEV), cs)
    ids, pos = first.view(b, 1).clone(), torch.tensor([a.context], device=DEV)
    mask = torch.full((1, 1, 1, n), float("-inf"), device=DEV, dtype=DT)
    mask[..., : a.context] = 0

    def step():
        mask.index_fill_(3, pos, 0.0)
        ids.copy_(forward(ids, pos, cs, mask).view(b, 1))
        pos.add_(1)

    def reset():
        pos.fill_(a.context)
        mask[..., a.context:] = float("-inf")

    step()
    reset()
    eager = cuda_time(lambda: (reset(), [step() for _ in range(a.steps)]))
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            step()
    torch.cuda.current_stream().wait_stream(s)
    reset()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        step()
    graph = cuda_time(lambda: (reset(), [g.replay() for _ in range(a.steps)]))
    del cs, g
    torch.cuda.empty_cache()
    return b * a.steps / eager, b * a.steps / graph


def ttft(n):
    cs = caches(1, n)
    ids, pos = torch.randint(0, V, (1, n), device=DEV), torch.arange(n, device=DEV)
    forward(ids, pos, cs)
    t = cuda_time(lambda: forward(ids, pos, cs).item())
    del cs
    torch.cuda.empty_cache()
    return t


with torch.inference_mode():
    bw = copy_gbs()
    per_token = weight_bytes + 2 * L * HKV * D * 2 * a.context
    ceiling = bw * 1e9 / per_token
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, {a.config}")
    print(f"copy {bw:.0f} GB/s; {per_token / 1e9:.2f} GB read per token at context {a.context}: "
          f"ceiling {ceiling:.1f} tokens/s at batch 1")
    out = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "copy_gbs": bw,
           "bytes_per_token": per_token, "ceiling_tokens_per_s": ceiling, "decode": [], "prefill": []}
    print(f"{'batch':>6} {'eager tok/s':>12} {'graph tok/s':>12} {'graph/ceiling':>14}")
    for b in [int(x) for x in a.batches.split(",")]:
        e, g = decode(b)
        print(f"{b:>6} {e:12.1f} {g:12.1f} {g / ceiling if b == 1 else float('nan'):14.2f}")
        out["decode"].append({"batch": b, "eager_tokens_per_s": e, "graph_tokens_per_s": g})
    for n in [int(x) for x in a.prefill.split(",")]:
        try:
            t = ttft(n)
        except torch.OutOfMemoryError:
            print(f"prefill {n}: out of memory, skipped")
            continue
        print(f"prefill {n:6}: TTFT {t * 1e3:.1f} ms, {n / t:.0f} tokens/s")
        out["prefill"].append({"prompt_tokens": n, "ttft_ms": t * 1e3})
    if a.json:
        json.dump(out, open(a.json, "w"), indent=1)
