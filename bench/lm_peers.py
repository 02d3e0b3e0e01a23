#!/usr/bin/env python3
"""PyTorch peer of nuvec's LLM decode benchmark (`nuvec bench --random CONFIG`, run beside it by
scripts/gpu-lm.sh): a Llama decoder written by hand in PyTorch with random bf16 weights, on GPU 0.

What it measures, all in one run:

  1. Copy ceiling: `dst.copy_(src)` of a 4 GiB bf16 buffer, median of 10 copies timed with CUDA
     events. Reported two ways: traffic (bytes read + written) / time, the convention of
     bench/gpu_peers.py and nuvec's bench_harness::copy_bandwidth, and bytes copied (= read) /
     time, which is half of it. `bytes_per_token` is what one decode step at batch 1 must read:
     the layers' weights, the final norm, lm_head, one embedding row and the KV cache at
     `--context`. The ceiling tokens/s at batch 1 is bandwidth / bytes_per_token, with the
     traffic bandwidth: a decode step only reads, and HBM sustains about the same total bytes/s
     for reads alone as for a copy's reads + writes, so the copied-bytes rate would put the
     ceiling at half what is reachable. The copied-bytes ceiling is printed and saved too.
  2. Eager decode tokens/s per batch size: after a warm-up, `--steps` steps from `--context`,
     timed with CUDA events; tokens/s = batch * steps / time, median of 3 runs.
  3. The same step captured once in a CUDA graph (torch.cuda.CUDAGraph) and replayed `--steps`
     times; tokens/s as above.
  4. Time to first token at batch 1 for each `--prefill` length: the eager forward of the whole
     prompt (SDPA, is_causal=True, writing the cache) and the argmax of its last position,
     median of 3 after a warm-up, in ms. A length whose cache and activations do not fit in
     free memory is skipped with a note.

The model: token embedding; per layer RMSNorm (F.rms_norm), a fused QKV weight
[(Hq + 2 Hkv) * D, H], RoPE on the two halves (HF's rotate_half, base rope_theta; no
rope_scaling: it changes no cost), a static KV cache [B, Hkv, S, D] written with index_copy_ at
the step's positions, attention through F.scaled_dot_product_attention, the output projection,
RMSNorm, a fused gate/up weight [2 I, H], SiLU(gate) * up, down projection; final RMSNorm and an
untied lm_head [V, H]. Norm weights are ones (HF's initialisation), the other weights N(0, 0.02).

Decode attention: every step attends over the whole static cache, [B, Hkv, S, D] with S =
context + steps rounded up to 64, under an additive mask [1, 1, 1, S] (0 up to the current
position, -inf beyond) that the step itself opens at its position before attending. The
position is a device tensor the step advances in place and the next token is written into the
static input ids, so the step has no host input or sync and one captured graph replays for
every position; eager and graphed steps run the same kernels over the same S. Grouped-query
heads: for one new token the G = Hq / Hkv query heads that share a KV head are passed as G
query rows of that head, q [B, Hkv, G, D] against the cache [B, Hkv, S, D], which is exactly
GQA (HF's repeat_kv maps query head h to KV head h // G) without repeating K/V and lets SDPA use
a fused kernel with a mask. Prefill uses SDPA's enable_gqa with is_causal=True on the prompt's
own K/V (the cache is empty before it), and writes the cache.

A correctness check runs first: the logits of token n + 1 from a 17-token prefill against those
of a 16-token prefill plus one masked decode step (relative max difference, bf16 tolerance), and
for each batch the graph's first next-token ids against the eager step's.

Usage (from the repository root; needs only torch with CUDA):

  python3 bench/lm_peers.py [--config bench/configs/llama-3-8b.json] [--batches 1,32,64]
      [--context 512] [--steps 64] [--prefill 2048,32768] [--json OUT.json]
"""
import argparse
import gc
import json
import os
import statistics

import torch
import torch.nn.functional as F

DEV, DT = "cuda", torch.bfloat16
REPS = 3  # timed runs per measurement; the median is reported


def ints(s):
    return [int(x) for x in s.split(",") if x.strip()]


def round_up(n, m):
    return (n + m - 1) // m * m


def free_memory():
    gc.collect()
    torch.cuda.empty_cache()


def gpu_ms(fn):
    """Milliseconds fn's GPU work takes, by CUDA events; the queue is drained first so that the
    host's launch time of fn's kernels counts (it does for a user waiting on a token)."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end)


def rotate(x, cos, sin):
    """RoPE with HF's rotate_half: (x1, x2) -> x * cos + (-x2, x1) * sin."""
    x1, x2 = x.chunk(2, -1)
    return x * cos + torch.cat([-x2, x1], -1) * sin


class Llama:
    def __init__(self, cfg):
        self.H, self.I = cfg["hidden_size"], cfg["intermediate_size"]
        self.L, self.V = cfg["num_hidden_layers"], cfg["vocab_size"]
        self.HQ = cfg["num_attention_heads"]
        self.HKV = cfg.get("num_key_value_heads") or self.HQ
        self.D = cfg.get("head_dim") or self.H // self.HQ
        self.G = self.HQ // self.HKV
        self.eps = cfg.get("rms_norm_eps", 1e-5)
        theta = cfg.get("rope_theta", 10000.0)
        H, I, D = self.H, self.I, self.D

        # normal_ in place: no second copy of each weight while it is made.
        def w(*shape):
            return torch.empty(*shape, device=DEV, dtype=DT).normal_(0.0, 0.02)

        def ones():
            return torch.ones(H, device=DEV, dtype=DT)

        self.layers = [dict(n1=ones(), qkv=w((self.HQ + 2 * self.HKV) * D, H), o=w(H, self.HQ * D),
                            n2=ones(), gu=w(2 * I, H), down=w(H, I)) for _ in range(self.L)]
        self.emb, self.norm, self.head = w(self.V, H), ones(), w(self.V, H)
        self.inv_freq = 1.0 / theta ** (torch.arange(0, D, 2, device=DEV, dtype=torch.float32) / D)

    def weight_bytes_per_token(self):
        """Bytes of weights one decode step reads: all layers, the final norm, lm_head, and one
        embedding row (not the whole table)."""
        layers = sum(t.nbytes for l in self.layers for t in l.values())
        return layers + self.norm.nbytes + self.head.nbytes + self.H * self.emb.element_size()

    def kv_bytes(self, batch, positions):
        return 2 * self.L * batch * self.HKV * positions * self.D * torch.finfo(DT).bits // 8

    def new_caches(self, batch, size):
        # zeros, not empty: masked positions are still multiplied in, and garbage NaN/inf there
        # would turn the softmax into NaN.
        return [(torch.zeros(batch, self.HKV, size, self.D, device=DEV, dtype=DT),
                 torch.zeros(batch, self.HKV, size, self.D, device=DEV, dtype=DT)) for _ in range(self.L)]

    def logits(self, ids, pos, caches, mask=None):
        """Logits [B, V] of the last of ids [B, T] at positions pos [T] (a long device tensor).

        mask None: prefill from position 0: causal attention among the T tokens, K/V written
        to the caches at pos. mask [1, 1, 1, S]: one decode step (T == 1) attending over the
        whole caches [B, Hkv, S, D] with the additive mask."""
        B, T = ids.shape
        HQ, HKV, D, G, H = self.HQ, self.HKV, self.D, self.G, self.H
        x = F.embedding(ids, self.emb)
        # cos/sin in float32 then bf16, once per forward, as HF's rotary embedding.
        f = pos.to(torch.float32)[:, None] * self.inv_freq[None, :]
        e = torch.cat([f, f], -1)
        cos, sin = e.cos().to(DT), e.sin().to(DT)
        for l, (kc, vc) in zip(self.layers, caches):
            h = F.rms_norm(x, (H,), l["n1"], self.eps)
            q, k, v = F.linear(h, l["qkv"]).split([HQ * D, HKV * D, HKV * D], -1)
            if mask is None:
                q = rotate(q.reshape(B, T, HQ, D).transpose(1, 2), cos, sin)
                k = rotate(k.reshape(B, T, HKV, D).transpose(1, 2), cos, sin)
                v = v.reshape(B, T, HKV, D).transpose(1, 2)
                kc.index_copy_(2, pos, k)
                vc.index_copy_(2, pos, v)
                o = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=G > 1)
                o = o.transpose(1, 2).reshape(B, T, HQ * D)
            else:
                # One token: query heads kv*G .. kv*G+G-1 become G query rows of KV head kv
                # (see the module docstring); cos/sin [1, D] broadcast over them.
                q = rotate(q.reshape(B, HKV, G, D), cos, sin)
                k = rotate(k.reshape(B, HKV, 1, D), cos, sin)
                kc.index_copy_(2, pos, k)
                vc.index_copy_(2, pos, v.reshape(B, HKV, 1, D))
                o = F.scaled_dot_product_attention(q, kc, vc, attn_mask=mask)
                o = o.reshape(B, 1, HQ * D)
            x = x + F.linear(o, l["o"])
            g, u = F.linear(F.rms_norm(x, (H,), l["n2"], self.eps), l["gu"]).chunk(2, -1)
            x = x + F.linear(F.silu(g) * u, l["down"])
        return F.linear(F.rms_norm(x[:, -1], (H,), self.norm, self.eps), self.head)


def copy_bandwidth(nbytes=4 << 30, reps=10):
    """(bytes copied, median seconds) of dst.copy_(src) over nbytes of bf16."""
    n = nbytes // 2
    src = torch.empty(n, device=DEV, dtype=DT).normal_()  # not zeros: no compressible memory
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    ms = statistics.median(gpu_ms(lambda: dst.copy_(src)) for _ in range(reps))
    del src, dst
    free_memory()
    return n * 2, ms / 1e3


def self_check(m, n=16):
    """Relative max |logit| difference: a prefill of n + 1 tokens against a prefill of n and
    one masked decode step of the last token (checks the cache, RoPE positions, the mask and the
    grouped-head mapping of the decode path)."""
    S = round_up(n + 1, 64)
    ids = torch.randint(0, m.V, (1, n + 1), device=DEV)
    full = m.logits(ids, torch.arange(n + 1, device=DEV), m.new_caches(1, S)).float()
    caches = m.new_caches(1, S)
    m.logits(ids[:, :n], torch.arange(n, device=DEV), caches)
    mask = torch.full((1, 1, 1, S), float("-inf"), device=DEV, dtype=DT)
    mask[..., : n + 1] = 0
    one = m.logits(ids[:, n:], torch.tensor([n], device=DEV), caches, mask).float()
    err = ((full - one).abs().max() / full.abs().max()).item()
    del full, one, caches
    free_memory()
    return err


def capture(step, warmup=3):
    """step captured in a CUDA graph; warmed up on a side stream first, as torch requires (the
    allocator and the libraries' plans settle before capture)."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(warmup):
            step()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        step()
    return g


def decode(m, b, context, steps):
    """Eager and CUDA-graph decode at batch b: dict of tokens/s, ms per step and notes."""
    S = round_up(context + steps, 64)  # 64: aligned mask rows, no padding copy in SDPA
    caches = m.new_caches(b, S)
    # The context's K/V: random values, as a prefill would leave (their values change no cost).
    for kc, vc in caches:
        kc[:, :, :context].normal_()
        vc[:, :, :context].normal_()
    ids0 = torch.randint(0, m.V, (b, 1), device=DEV)
    ids = ids0.clone()
    pos = torch.full((1,), context, device=DEV, dtype=torch.long)
    mask = torch.full((1, 1, 1, S), float("-inf"), device=DEV, dtype=DT)

    def reset():  # back to the first decode position; not timed
        pos.fill_(context)
        mask.fill_(float("-inf"))
        mask[..., :context] = 0
        ids.copy_(ids0)

    def step():  # everything on the device: open the position, attend, write the token, advance
        mask.index_fill_(3, pos, 0.0)
        ids.copy_(m.logits(ids, pos, caches, mask).argmax(-1).view(b, 1))
        pos.add_(1)

    def timed(fn):
        out = []
        for _ in range(REPS):
            reset()
            out.append(gpu_ms(lambda: [fn() for _ in range(steps)]))
        return out

    r = {"batch": b, "context": context, "steps": steps, "cache_len": S}
    reset()
    for _ in range(3):
        step()
    eager = timed(step)
    reset()
    step()
    eager_ids = ids.clone()
    r["eager_ms_reps"] = eager
    r["eager_ms_per_step"] = statistics.median(eager) / steps
    r["eager_tokens_per_s"] = b * steps / (statistics.median(eager) / 1e3)

    g = None
    try:
        reset()
        g = capture(step)
    except RuntimeError as e:  # a backend that will not capture: retry without cuDNN attention
        r["graph_note"] = f"capture failed ({str(e).splitlines()[0][:200]}); retried with flash/efficient/math SDPA"
        g = None
    if g is None:
        from torch.nn.attention import SDPBackend, sdpa_kernel
        try:
            with sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]):
                reset()
                g = capture(step)
        except RuntimeError as e:
            r["graph_note"] = f"capture failed: {str(e).splitlines()[0][:200]}"
            g = None
    if g is not None:
        graph = timed(g.replay)
        reset()
        g.replay()
        # The same state and kernels: the first tokens should agree (fraction of rows that do).
        r["graph_matches_eager"] = (ids == eager_ids).float().mean().item()
        r["graph_ms_reps"] = graph
        r["graph_ms_per_step"] = statistics.median(graph) / steps
        r["graph_tokens_per_s"] = b * steps / (statistics.median(graph) / 1e3)
    else:
        r["graph_tokens_per_s"] = None
    del g, caches, mask, ids, ids0, pos
    free_memory()
    return r


def prefill_bytes(m, n):
    """Rough peak bytes of a prefill of n tokens beyond the weights: the cache plus the largest
    live activations of one layer (x, the norm, qkv, gate/up and its products), generously."""
    act = n * 2 * (6 * m.H + 2 * (m.HQ + 2 * m.HKV) * m.D + 6 * m.I)
    return m.kv_bytes(1, round_up(n, 64)) + act


def ttft(m, n):
    """Median ms of the whole prompt's forward + argmax of its last position, batch 1."""
    caches = m.new_caches(1, round_up(n, 64))
    ids, pos = torch.randint(0, m.V, (1, n), device=DEV), torch.arange(n, device=DEV)

    def once():
        m.logits(ids, pos, caches).argmax(-1)

    once()
    ms = [gpu_ms(once) for _ in range(REPS)]
    del caches, ids, pos
    free_memory()
    return ms


def save(path, out):
    """Write out to path (when given) after every result, so a run cut short by a timeout still
    leaves what it measured."""
    if path:
        with open(path, "w") as f:
            json.dump(out, f, indent=1)
    return bool(path)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", default="bench/configs/llama-3-8b.json", help="HF-style Llama config.json")
    ap.add_argument("--batches", default="1,32,64", help="decode batch sizes, comma-separated")
    ap.add_argument("--context", type=int, default=512, help="tokens in the KV cache when decode is timed")
    ap.add_argument("--steps", type=int, default=64, help="decode steps timed")
    ap.add_argument("--prefill", default="2048,32768", help="prompt lengths for time to first token")
    ap.add_argument("--json", help="write every number here")
    a = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("lm_peers.py: no CUDA device")
    with open(a.config) as f:
        cfg = json.load(f)
    name = os.path.splitext(os.path.basename(a.config))[0]
    torch.manual_seed(0)
    out = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "config": a.config,
           "config_name": name, "args": vars(a), "decode": [], "prefill": [], "skipped": []}

    with torch.inference_mode():
        # The copy first, before the weights take memory.
        copied, sec = copy_bandwidth()
        traffic_gbs, read_gbs = 2 * copied / sec / 1e9, copied / sec / 1e9
        m = Llama(cfg)
        wbytes = m.weight_bytes_per_token()
        kvbytes = m.kv_bytes(1, a.context)
        per_token = wbytes + kvbytes
        ceiling = traffic_gbs * 1e9 / per_token
        ceiling_read = read_gbs * 1e9 / per_token
        out.update({"shapes": {"hidden": m.H, "intermediate": m.I, "layers": m.L, "heads": m.HQ,
                               "kv_heads": m.HKV, "head_dim": m.D, "vocab": m.V},
                    "copy_bytes": copied, "copy_traffic_gbs": traffic_gbs, "copy_read_gbs": read_gbs,
                    "weight_bytes_per_token": wbytes, "kv_bytes_per_token": kvbytes,
                    "bytes_per_token": per_token, "ceiling_tokens_per_s": ceiling,
                    "ceiling_tokens_per_s_read_bw": ceiling_read,
                    "attention": "decode: whole static cache (context + steps, rounded up to 64) under an "
                                 "additive mask [1,1,1,S] opened in place; GQA as G query rows per KV head. "
                                 "prefill: SDPA is_causal=True, enable_gqa."})
        print(f"{out['device']}, torch {torch.__version__}, config {name} ({a.config}): "
              f"H {m.H}, I {m.I}, layers {m.L}, heads {m.HQ}/{m.HKV}x{m.D}, vocab {m.V}")
        print(f"copy ceiling: {traffic_gbs:.0f} GB/s read + written ({read_gbs:.0f} GB/s copied), "
              f"{copied / 2**30:.0f} GiB bf16, median of 10")
        print(f"bytes_per_token at batch 1, context {a.context}: {per_token / 1e9:.3f} GB "
              f"(weights {wbytes / 1e9:.3f} + KV {kvbytes / 1e9:.3f}); ceiling {ceiling:.1f} tok/s "
              f"({ceiling_read:.1f} at the copied-bytes rate)")

        save(a.json, out)
        err = self_check(m)
        out["check_rel_logit_diff"] = err
        print(f"check: prefill vs prefill + decode step, max |dlogit| / max |logit| = {err:.2e} "
              f"({'ok' if err < 5e-2 else 'MISMATCH'})")

        print(f"\ndecode, context {a.context}, {a.steps} steps, median of {REPS}")
        print(f"{'batch':>6} {'eager tok/s':>12} {'graph tok/s':>12} {'ceiling tok/s':>14} "
              f"{'eager/ceil':>11} {'graph/ceil':>11} {'graph ms/step':>14}")
        for b in ints(a.batches):
            r = None
            try:
                r = decode(m, b, a.context, a.steps)
            except torch.cuda.OutOfMemoryError:
                note = f"decode batch {b}: out of memory, skipped"
            free_memory()  # after the except block, so the traceback's tensors are gone
            if r is None:
                print(note)
                out["skipped"].append(note)
                continue
            e, g = r["eager_tokens_per_s"], r["graph_tokens_per_s"]
            if b == 1:
                r.update(ceiling_tokens_per_s=ceiling, eager_fraction=e / ceiling,
                         graph_fraction=g / ceiling if g else None)
            fmt = lambda v, spec: format(v, spec) if v is not None else "-"
            print(f"{b:>6} {e:12.1f} {fmt(g, '12.1f'):>12} {fmt(r.get('ceiling_tokens_per_s'), '14.1f'):>14} "
                  f"{fmt(r.get('eager_fraction'), '11.3f'):>11} {fmt(r.get('graph_fraction'), '11.3f'):>11} "
                  f"{fmt(r.get('graph_ms_per_step'), '14.3f'):>14}")
            if "graph_note" in r:
                print(f"       {r['graph_note']}")
            if r.get("graph_matches_eager", 1.0) < 1.0:
                print(f"       graph's first tokens match eager's in {r['graph_matches_eager']:.0%} of rows")
            out["decode"].append(r)
            save(a.json, out)

        print(f"\ntime to first token, batch 1, median of {REPS}")
        print(f"{'prompt':>8} {'TTFT ms':>10} {'prefill tok/s':>14}")
        for n in ints(a.prefill):
            need = prefill_bytes(m, n)
            free = torch.cuda.mem_get_info()[0] + torch.cuda.memory_reserved() - torch.cuda.memory_allocated()
            ms = None
            if need > 0.9 * free:
                note = f"prefill {n}: needs ~{need / 1e9:.1f} GB, {free / 1e9:.1f} GB free, skipped"
            else:
                try:
                    ms = ttft(m, n)
                except torch.cuda.OutOfMemoryError:
                    note = f"prefill {n}: out of memory, skipped"
            free_memory()
            if ms is None:
                print(note)
                out["skipped"].append(note)
                continue
            t = statistics.median(ms)
            print(f"{n:>8} {t:10.1f} {n / t * 1e3:14.0f}")
            out["prefill"].append({"prompt_tokens": n, "ttft_ms": t, "ttft_ms_reps": ms,
                                   "prefill_tokens_per_s": n / t * 1e3})
            save(a.json, out)
        out["peak_memory_bytes"] = torch.cuda.max_memory_allocated()

    if save(a.json, out):
        print(f"\nwrote {a.json}")


if __name__ == "__main__":
    main()
