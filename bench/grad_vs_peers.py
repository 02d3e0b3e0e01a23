#!/usr/bin/env python3
"""A training step through the transforms on the CPU: nuvec against MLX (CPU) and PyTorch (CPU),
in one run, plus nuvec's graph-building cost per op.

The step (the same in all three): a two-layer MLP, batch 256, 1024 inputs, 1024 hidden units
(ReLU), 10 classes, softmax cross-entropy against one-hot targets as logsumexp(logits) -
sum(logits * onehot), mean over the batch; value and gradient, an SGD update of the four
parameters, and evaluation of the loss and the new parameters. Median of 35 steps after 5
warm-up steps, each framework in its own process, one after another.

Usage:
    python3 bench/grad_vs_peers.py            # prints the table, writes bench/results/<date>-cpu-grad.md
    python3 bench/grad_vs_peers.py --no-write
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
B, DIN, H, C = 256, 1024, 1024, 10
STEPS, WARM = 40, 5


def _data(np):
    rng = np.random.default_rng(1)
    x = rng.uniform(-1, 1, (B, DIN)).astype(np.float32)
    onehot = np.eye(C, dtype=np.float32)[np.arange(B) % C]
    w1 = rng.uniform(-1 / 32, 1 / 32, (DIN, H)).astype(np.float32)
    w2 = rng.uniform(-1 / 32, 1 / 32, (H, C)).astype(np.float32)
    return x, onehot, w1, np.zeros(H, np.float32), w2, np.zeros(C, np.float32)


def run_mlx():
    import mlx.core as mx
    import numpy as np

    mx.set_default_device(mx.cpu)
    x, onehot, *params = [mx.array(a) for a in _data(np)]

    def loss(p):
        w1, b1, w2, b2 = p
        logits = mx.maximum(x @ w1 + b1, 0) @ w2 + b2
        return (mx.logsumexp(logits, axis=-1) - (logits * onehot).sum(-1)).mean()

    vg = mx.value_and_grad(loss)
    times = []
    for i in range(STEPS):
        t = time.perf_counter()
        l, g = vg(params)
        params = [p - 0.1 * gi for p, gi in zip(params, g)]
        mx.eval(l, params)
        if i >= WARM:
            times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times), mx.__version__


def run_torch():
    import numpy as np
    import torch

    torch.set_num_threads(os.cpu_count() or 1)
    x, onehot, *params = [torch.from_numpy(a) for a in _data(np)]
    params = [p.clone().requires_grad_(True) for p in params]
    times = []
    for i in range(STEPS):
        t = time.perf_counter()
        w1, b1, w2, b2 = params
        logits = torch.relu(x @ w1 + b1) @ w2 + b2
        l = (torch.logsumexp(logits, -1) - (logits * onehot).sum(-1)).mean()
        l.backward()
        with torch.no_grad():
            params = [(p - 0.1 * p.grad).requires_grad_(True) for p in params]
        l.item()
        if i >= WARM:
            times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times), torch.__version__


def run_nuvec():
    subprocess.run(["cargo", "build", "--release", "-q", "-p", "nuvec", "--example", "bench_grad"], cwd=ROOT, check=True)
    out = subprocess.run([str(ROOT / "target/release/examples/bench_grad")], cwd=ROOT, check=True, capture_output=True, text=True)
    vals = dict(line.split("\t") for line in out.stdout.strip().splitlines())
    return {k: float(v) for k, v in vals.items()}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--no-write", action="store_true")
    ap.add_argument("--worker", choices=["mlx", "torch"])
    args = ap.parse_args()
    if args.worker:
        ms, version = run_mlx() if args.worker == "mlx" else run_torch()
        print(json.dumps({"ms": ms, "version": version}))
        return
    nv = run_nuvec()
    peers = {}
    for name in ("mlx", "torch"):
        try:
            r = subprocess.run([sys.executable, __file__, "--worker", name], check=True, capture_output=True, text=True)
            peers[name] = json.loads(r.stdout)
        except subprocess.CalledProcessError as e:
            peers[name] = {"ms": None, "version": f"unavailable ({e.stderr.strip().splitlines()[-1]})"}
    best = min((p["ms"] for p in peers.values() if p["ms"]), default=None)
    ours = nv["mlp_grad_step"]
    lines = [
        f"# CPU training step through the transforms ({_dt.date.today()})",
        "",
        f"Machine: {platform.machine()}, {os.cpu_count()} cores. Commit "
        f"{subprocess.run(['git', 'rev-parse', '--short', 'HEAD'], cwd=ROOT, capture_output=True, text=True).stdout.strip()}. "
        f"MLX {peers['mlx']['version']}, PyTorch {peers['torch']['version']}.",
        "",
        "| case | nuvec | MLX CPU | PyTorch CPU | nuvec / faster peer |",
        "|---|---|---|---|---|",
        "| MLP grad step, batch 256, 1024→1024→10 (ms, median) | "
        f"{ours:.2f} | {peers['mlx']['ms'] or float('nan'):.2f} | {peers['torch']['ms'] or float('nan'):.2f} | "
        f"{ours / best if best else float('nan'):.2f} |",
        "",
        f"Graph building: {nv['record_per_op_us']:.3f} µs per recorded op; "
        f"{nv['record_grad_per_op_us']:.3f} µs per forward op under `grad` (forward and backward recorded). Target ≤ 2 µs.",
    ]
    text = "\n".join(lines) + "\n"
    print(text)
    if not args.no_write:
        path = ROOT / "bench/results" / f"{_dt.date.today()}-cpu-grad.md"
        path.write_text(text)
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
