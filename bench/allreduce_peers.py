#!/usr/bin/env python3
"""PyTorch's all_reduce (NCCL) bus bandwidth on this machine's GPUs, at the sizes of
crates/nuvec/examples/bench_allreduce.rs (1 MiB to 1 GiB of bfloat16, best of 5 after 2
warm-up runs, bus bandwidth 2 (n - 1) / n · bytes / seconds as nccl-tests defines it).
NCCL_NVLS_ENABLE=0 as nuvec's launcher sets it.

    python3 bench/allreduce_peers.py [RANKS]
Prints torch_allreduce_<bytes><TAB>busbw GB/s."""
import os, sys, time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

SIZES = [1 << p for p in range(20, 31, 2)]


def rank_main(rank, n, port, out):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), NCCL_NVLS_ENABLE="0")
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=n)
    best = []
    for size in SIZES:
        x = torch.ones(size // 2, dtype=torch.bfloat16, device="cuda")
        times = []
        for run in range(7):
            torch.cuda.synchronize()
            t = time.perf_counter()
            dist.all_reduce(x)
            torch.cuda.synchronize()
            if run >= 2:
                times.append(time.perf_counter() - t)
        best.append(min(times))
    out[rank] = best
    dist.destroy_process_group()


def main():
    gpus = torch.cuda.device_count()
    n = int(sys.argv[1]) if len(sys.argv) > 1 else gpus
    if n < 2 or n > gpus:
        print(f"allreduce_peers: needs 2 or more GPUs ({gpus} here, {n} asked)", file=sys.stderr)
        return
    out = mp.Manager().dict()
    mp.spawn(rank_main, args=(n, 29517, out), nprocs=n, join=True)
    for i, size in enumerate(SIZES):
        t = max(out[r][i] for r in range(n))
        print(f"torch_allreduce_{size}\t{2 * (n - 1) / n * size / t / 1e9:.1f}")


if __name__ == "__main__":
    main()
