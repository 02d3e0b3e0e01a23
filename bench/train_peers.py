#!/usr/bin/env python3
"""PyTorch peers of nuvec's training-step benchmark (bench_train).

Times one full training step -- zero_grad(set_to_none=True), forward, cross-entropy loss,
backward, AdamW step -- of three models, defined here in plain torch.nn so that the Rust side
can build exactly the same thing (no transformers, no network):

* ``gpt2``: GPT-2 small (vocab 50304, context 1024, 12 layers, 12 heads, d 768, MLP 3072,
  tanh GELU, pre-LayerNorm, biased Linears, learned positions, head tied to wte), batch 8 x
  1024 tokens, everything in bfloat16 (pure bf16: no autocast, no fp32 master weights), on
  CUDA. AdamW(6e-4, betas (0.9, 0.95), eps 1e-8, weight_decay 0.1) over all parameters.
* ``lm``: the same architecture at vocab 256, context 128, 4 layers, 4 heads, d 256, MLP
  1024, batch 8 x 128, float32, on the CPU; same optimizer.
* ``mlp``: 784 -> 1024 -> 1024 -> 10 with ReLU, batch 256, float32, on the CPU;
  AdamW(1e-3, betas (0.9, 0.999), eps 1e-8, weight_decay 0.01).

Implementations (columns): ``torch_eager`` (default AdamW, which is foreach on CUDA),
``torch_eager_fused`` (AdamW(fused=True), CUDA only) and ``torch_compile`` (torch.compile of
the model, default mode; fused AdamW on CUDA, default AdamW on the CPU). An implementation
that fails (torch.compile without a C compiler, out of memory, ...) prints one line and is
skipped; the others still run.

Method: ``warmup`` steps (at least 3 for torch.compile, whose first step compiles; that
first step's time is printed separately, and is much shorter on a rerun, when inductor's
on-disk cache already holds the kernels), then ``steps`` steps timed together with
time.perf_counter, bracketed by torch.cuda.synchronize() on the GPU. Reported: mean ms per
step and tokens/s = batch * sequence / step time (samples/s for mlp).

    python3 bench/train_peers.py                          # gpt2 on cuda, lm and mlp on cpu
    python3 bench/train_peers.py --only lm,mlp --steps 3 --threads 2
    python3 bench/train_peers.py --only gpt2 --out bench/results/train_peers.tsv

TSV (``--out``): a header line, then ``model<TAB>impl<TAB>ms_per_step<TAB>tokens_per_s<TAB>device``.
"""

import argparse
import gc
import platform
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

MODELS = {
    "gpt2": dict(kind="gpt", vocab=50304, ctx=1024, layers=12, heads=12, d=768, hidden=3072,
                 batch=8, seq=1024, dtype=torch.bfloat16,
                 adamw=dict(lr=6e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)),
    "lm": dict(kind="gpt", vocab=256, ctx=128, layers=4, heads=4, d=256, hidden=1024,
               batch=8, seq=128, dtype=torch.float32,
               adamw=dict(lr=6e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)),
    "mlp": dict(kind="mlp", sizes=(784, 1024, 1024, 10), batch=256, dtype=torch.float32,
                adamw=dict(lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)),
}
IMPLS = ("torch_eager", "torch_eager_fused", "torch_compile")


class Block(nn.Module):
    """Pre-LayerNorm GPT-2 block; the names follow GPT-2's checkpoints (c_attn, c_fc, ...)."""

    def __init__(self, d, heads, hidden):
        super().__init__()
        self.heads = heads
        self.ln_1 = nn.LayerNorm(d, eps=1e-5)
        self.c_attn = nn.Linear(d, 3 * d)
        self.c_proj = nn.Linear(d, d)
        self.ln_2 = nn.LayerNorm(d, eps=1e-5)
        self.c_fc = nn.Linear(d, hidden)
        self.mlp_c_proj = nn.Linear(hidden, d)

    def forward(self, x):
        b, l, d = x.shape
        h = self.heads
        q, k, v = self.c_attn(self.ln_1(x)).split(d, dim=2)
        # SDPA wants [B, H, L, head_dim]; it picks flash attention on the GPU for bf16.
        q, k, v = (t.view(b, l, h, d // h).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.c_proj(y.transpose(1, 2).reshape(b, l, d))
        return x + self.mlp_c_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class GPT(nn.Module):
    """GPT-2 whose forward returns the loss, so that torch.compile may fuse the logits with the
    cross-entropy (as nanoGPT does); eager computes exactly the same thing."""

    def __init__(self, c):
        super().__init__()
        self.wte = nn.Embedding(c["vocab"], c["d"])
        self.wpe = nn.Embedding(c["ctx"], c["d"])
        self.h = nn.ModuleList(Block(c["d"], c["heads"], c["hidden"]) for _ in range(c["layers"]))
        self.ln_f = nn.LayerNorm(c["d"], eps=1e-5)

    def forward(self, idx, targets):
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        for block in self.h:
            x = block(x)
        # Tied head: no separate lm_head parameter, no bias.
        logits = F.linear(self.ln_f(x), self.wte.weight)
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1))


class MLP(nn.Module):
    def __init__(self, c):
        super().__init__()
        s = c["sizes"]
        self.net = nn.Sequential(nn.Linear(s[0], s[1]), nn.ReLU(), nn.Linear(s[1], s[2]),
                                 nn.ReLU(), nn.Linear(s[2], s[3]))

    def forward(self, x, labels):
        return F.cross_entropy(self.net(x), labels)


def init_weights(m):
    # Values do not matter for speed; this only keeps the bf16 model numerically tame.
    if isinstance(m, (nn.Linear, nn.Embedding)):
        nn.init.normal_(m.weight, 0.0, 0.02)
    if isinstance(m, nn.Linear) and m.bias is not None:
        nn.init.zeros_(m.bias)
    if isinstance(m, nn.LayerNorm):
        nn.init.ones_(m.weight)
        nn.init.zeros_(m.bias)


def build(name, device):
    """(model, inputs, items per step): seeded so that every implementation sees the same data."""
    c = MODELS[name]
    torch.manual_seed(0)
    model = GPT(c) if c["kind"] == "gpt" else MLP(c)
    model.apply(init_weights)
    model = model.to(device=device, dtype=c["dtype"])
    # Data made on the CPU so it is the same whatever the device.
    if c["kind"] == "gpt":
        x = torch.randint(0, c["vocab"], (c["batch"], c["seq"]))
        y = torch.randint(0, c["vocab"], (c["batch"], c["seq"]))
        items = c["batch"] * c["seq"]
    else:
        x = torch.randn(c["batch"], c["sizes"][0]).to(c["dtype"])
        y = torch.randint(0, c["sizes"][-1], (c["batch"],))
        items = c["batch"]
    return model, (x.to(device), y.to(device)), items


def n_params(model):
    # parameters() yields each tensor once, so the tied wte counts once (GPT-2 small ~124M).
    return sum(p.numel() for p in model.parameters())


def sync(device):
    if device == "cuda":
        torch.cuda.synchronize()


def free(device):
    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()


def run_impl(name, impl, device, steps, warmup):
    """Mean seconds per step of one implementation, or None when it could not run."""
    model = opt = None
    try:
        model, (x, y), _ = build(name, device)
        fused = impl == "torch_eager_fused" or (impl == "torch_compile" and device == "cuda")
        # fused=None (not False) leaves torch's own default: foreach on CUDA, a loop on the CPU.
        opt = torch.optim.AdamW(model.parameters(), fused=True if fused else None,
                                **MODELS[name]["adamw"])
        if impl == "torch_compile":
            model = torch.compile(model)
            warmup = max(warmup, 3)

        def step():
            opt.zero_grad(set_to_none=True)
            loss = model(x, y)
            loss.backward()
            opt.step()
            return loss

        for i in range(warmup):
            t0 = time.perf_counter()
            loss = step()
            sync(device)
            if i == 0 and impl == "torch_compile":
                print(f"  {name}/{impl}: first step {time.perf_counter() - t0:.1f} s "
                      f"(includes compilation)", flush=True)
        if not torch.isfinite(loss.detach().float()).item():
            print(f"  {name}/{impl}: warning: loss is {loss.item()}", flush=True)
        if device == "cuda":
            torch.cuda.reset_peak_memory_stats()
        sync(device)
        t0 = time.perf_counter()
        for _ in range(steps):
            step()
        sync(device)
        dt = (time.perf_counter() - t0) / steps
        if device == "cuda":
            print(f"  {name}/{impl}: peak memory {torch.cuda.max_memory_allocated() / 2**30:.1f} GiB",
                  flush=True)
        return dt
    except Exception as e:  # noqa: BLE001 -- one failing column must not end the script
        msg = " ".join(f"{type(e).__name__}: {e}".split())
        print(f"  {name}/{impl}: skipped: {msg[:400]}", flush=True)
        return None
    finally:
        del model, opt
        if impl == "torch_compile":
            # Compiled graphs keep references to the model's tensors until dynamo forgets them.
            torch._dynamo.reset()
        free(device)


def device_name(device):
    if device == "cuda":
        return torch.cuda.get_device_name(0)
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "cpu"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--only", default="gpt2,lm,mlp", help="comma-separated models (gpt2,lm,mlp)")
    ap.add_argument("--steps", type=int, default=10, help="timed steps")
    ap.add_argument("--warmup", type=int, default=3, help="untimed steps first (>= 3 for compile)")
    ap.add_argument("--out", default=None, help="write TSV results here")
    ap.add_argument("--device", choices=("cuda", "cpu"), default=None,
                    help="run every model here (default: gpt2 on cuda, lm and mlp on cpu)")
    ap.add_argument("--threads", type=int, default=None, help="torch.set_num_threads for CPU cases")
    ap.add_argument("--impls", default=",".join(IMPLS), help="comma-separated implementations")
    args = ap.parse_args()

    models = [m.strip() for m in args.only.split(",") if m.strip()]
    impls = [i.strip() for i in args.impls.split(",") if i.strip()]
    bad = [m for m in models if m not in MODELS] + [i for i in impls if i not in IMPLS]
    if bad:
        ap.error(f"unknown: {', '.join(bad)}")
    has_cuda = torch.cuda.is_available()
    if args.device == "cuda" and not has_cuda:
        ap.error("--device cuda but torch sees no CUDA device")
    if args.threads:
        torch.set_num_threads(args.threads)

    print(f"torch {torch.__version__}" + (f" (CUDA {torch.version.cuda})" if has_cuda else ""))
    print(f"cpu: {device_name('cpu')}, {torch.get_num_threads()} threads")
    if has_cuda:
        print(f"cuda: {device_name('cuda')}")

    rows = []
    for name in models:
        device = args.device or ("cuda" if name == "gpt2" else "cpu")
        model, _, items = build(name, "cpu")
        print(f"{name}: {n_params(model):,} parameters, {items} "
              f"{'tokens' if MODELS[name]['kind'] == 'gpt' else 'samples'} per step, "
              f"{str(MODELS[name]['dtype']).replace('torch.', '')}, {device}", flush=True)
        del model
        if device == "cuda" and not has_cuda:
            print(f"{name}: skipped, torch sees no CUDA device")
            continue
        if device == "cpu" and MODELS[name]["dtype"] == torch.bfloat16:
            print(f"{name}: note: bf16 on the CPU, expect it to be slow")
        for impl in impls:
            if impl == "torch_eager_fused" and device != "cuda":
                continue
            dt = run_impl(name, impl, device, args.steps, args.warmup)
            if dt is None:
                continue
            rows.append((name, impl, dt * 1e3, items / dt, device))
            print(f"  {name}/{impl}: {dt * 1e3:.2f} ms/step, {items / dt:,.0f} per s", flush=True)

    print()
    print(f"{'model':<6} {'impl':<18} {'device':<6} {'ms/step':>10} {'tokens/s':>14}")
    for name, impl, ms, tps, device in rows:
        print(f"{name:<6} {impl:<18} {device:<6} {ms:>10.2f} {tps:>14,.0f}")
    print("(tokens/s is samples/s for mlp)")
    if args.out:
        with open(args.out, "w") as f:
            f.write("model\timpl\tms_per_step\ttokens_per_s\tdevice\n")
            for name, impl, ms, tps, device in rows:
                f.write(f"{name}\t{impl}\t{ms:.4f}\t{tps:.1f}\t{device}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
