#!/usr/bin/env python3
"""CPU attention against PyTorch's and MLX's scaled-dot-product attention, in one run.

Runs `crates/nuvec/examples/bench_cpu.rs` on its `fast_sdpa_*` cases (f32, B 1, 8 heads,
L 4096, D 128, causal and full) and times the same calls in PyTorch
(`F.scaled_dot_product_attention`, its CPU flash kernel) and MLX (`mx.fast.scaled_dot_product_attention`
on its CPU device), each when importable, with the same method (inputs made first, a warm-up,
then at least 5 iterations and about 2 s, the median). Prints `case<TAB>nuvec ms<TAB>torch ms<TAB>mlx ms`
and nuvec's time over the faster peer's.

Usage: python3 bench/cpu_attention_peers.py   (PYTHONPATH may point at where torch/MLX live)
"""

import os
import statistics
import subprocess
import time

CASES = {"fast_sdpa_causal_f32_1x8x4096x128": True, "fast_sdpa_full_f32_1x8x4096x128": False}
SHAPE = (1, 8, 4096, 128)
SCALE = 0.088


def median_ms(run):
    run()
    times, start = [], time.perf_counter()
    while len(times) < 5 or time.perf_counter() - start < 2.0:
        t = time.perf_counter()
        run()
        times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times)


def torch_times():
    try:
        import torch
    except Exception as e:  # noqa: BLE001
        print(f"# torch: unavailable ({type(e).__name__})")
        return {}
    print(f"# torch {torch.__version__}, {torch.get_num_threads()} threads")
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.rand(SHAPE, generator=g) * 2 - 1 for _ in range(3))
    f = torch.nn.functional.scaled_dot_product_attention
    return {n: median_ms(lambda c=c: f(q, k, v, is_causal=c, scale=SCALE)) for n, c in CASES.items()}


def mlx_times():
    try:
        import mlx.core as mx
    except Exception as e:  # noqa: BLE001
        print(f"# mlx: unavailable ({type(e).__name__})")
        return {}
    mx.set_default_device(mx.cpu)
    print(f"# mlx {mx.__version__}")
    q, k, v = (mx.random.uniform(-1, 1, SHAPE) for _ in range(3))
    mx.eval(q, k, v)
    f = mx.fast.scaled_dot_product_attention
    return {
        n: median_ms(lambda c=c: mx.eval(f(q, k, v, scale=SCALE, mask="causal" if c else None)))
        for n, c in CASES.items()
    }


def nuvec_times():
    out = subprocess.run(
        ["cargo", "run", "--release", "-q", "-p", "nuvec", "--example", "bench_cpu", "--", "fast_sdpa_"],
        capture_output=True, text=True, check=True, cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
    ).stdout
    return {f[0]: float(f[1]) for f in (line.split("\t") for line in out.splitlines()) if len(f) >= 2}


def main():
    ours, torch_, mlx_ = nuvec_times(), torch_times(), mlx_times()
    print("case\tnuvec ms\ttorch ms\tmlx ms\tnuvec/best")
    for name in CASES:
        peers = [t for t in (torch_.get(name), mlx_.get(name)) if t]
        ratio = ours[name] / min(peers) if peers and name in ours else float("nan")
        cells = [ours.get(name), torch_.get(name), mlx_.get(name)]
        print(name + "\t" + "\t".join("-" if c is None else f"{c:.1f}" for c in cells) + f"\t{ratio:.2f}")


if __name__ == "__main__":
    main()
