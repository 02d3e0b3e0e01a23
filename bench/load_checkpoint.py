#!/usr/bin/env python3
"""Disk side of the "load an 8B-shaped safetensors checkpoint" benchmark.

    python3 bench/load_checkpoint.py write DIR [--scale 1.0] [--shard-gb 4]
    python3 bench/load_checkpoint.py read DIR [--out FILE.tsv]
    python3 bench/load_checkpoint.py drop DIR

``write`` makes a Llama-3-8B-shaped checkpoint of random bf16 weights, laid out as Hugging
Face writes one: shards ``model-0000k-of-0000n.safetensors`` of about ``--shard-gb`` GB,
``model.safetensors.index.json`` and a ``config.json``. ``--scale`` multiplies the number of
layers (32) for quick local tests. The safetensors files are written by hand (numpy has no
bf16, and torch need not be installed), so this needs only the standard library.

``read`` measures how fast the shards come off the disk: cold (each shard's pages dropped
from the page cache first) and warm (read again at once, from the page cache), read
sequentially with 64 MiB readinto() calls into one reused buffer, so the number is the disk
and the kernel alone, with no allocation or page faults of ours in it. Where torch with CUDA
and the safetensors package are importable it also times
``safetensors.torch.load_file(path, device="cuda")`` of every shard, cold and warm, as the peer
of the Rust loader. Printed lines ``name<TAB>GB/s`` are appended to ``--out``.

``drop`` only drops the shards' pages from the page cache, so that a loader timed right after
reads from the disk. It uses posix_fadvise(DONTNEED), which needs no root; it cannot drop
dirty pages (``write`` fsyncs for that reason) nor pages another process has mapped.
"""

import argparse
import glob
import json
import os
import random
import sys
import time

# Llama 3 8B.
VOCAB, HIDDEN, LAYERS, HEADS, KV_HEADS, HEAD_DIM, INTERMEDIATE = 128256, 4096, 32, 32, 8, 128, 14336
CHUNK = 64 << 20
GB = 1e9


def tensors(layers):
    """(name, shape) in the order Hugging Face's Llama checkpoints list them; Linear weights are
    [out, in]."""
    kv = KV_HEADS * HEAD_DIM
    out = [("model.embed_tokens.weight", [VOCAB, HIDDEN])]
    for i in range(layers):
        p = f"model.layers.{i}."
        out += [
            (p + "input_layernorm.weight", [HIDDEN]),
            (p + "self_attn.q_proj.weight", [HEADS * HEAD_DIM, HIDDEN]),
            (p + "self_attn.k_proj.weight", [kv, HIDDEN]),
            (p + "self_attn.v_proj.weight", [kv, HIDDEN]),
            (p + "self_attn.o_proj.weight", [HIDDEN, HEADS * HEAD_DIM]),
            (p + "post_attention_layernorm.weight", [HIDDEN]),
            (p + "mlp.gate_proj.weight", [INTERMEDIATE, HIDDEN]),
            (p + "mlp.up_proj.weight", [INTERMEDIATE, HIDDEN]),
            (p + "mlp.down_proj.weight", [HIDDEN, INTERMEDIATE]),
        ]
    out += [("model.norm.weight", [HIDDEN]), ("lm_head.weight", [VOCAB, HIDDEN])]
    return out


def nbytes(shape):
    n = 2  # bf16
    for s in shape:
        n *= s
    return n


def random_bf16_block(size, seed=0):
    """``size`` bytes of random bf16 values of magnitude in [2^-7, 2^-3), with random signs.

    Random bytes alone would hold NaNs and huge values; fixing the top exponent bits keeps every
    value finite and small. The masking is done on one big Python integer, which is linear and
    fast, so numpy is not needed. The block is repeated through the files: a 64 MiB period is
    far beyond any filesystem compressor's window, so the disk still sees incompressible data."""
    r = int.from_bytes(random.Random(seed).randbytes(size), "little")
    # Per little-endian u16: keep sign (0x8000), the exponent's two low bits (0x0180) and the
    # mantissa (0x007F); set the exponent's high bits to 0b011110 (0x3C00): exponent 120..123.
    keep = int.from_bytes(b"\xff\x81" * (size // 2), "little")
    force = int.from_bytes(b"\x00\x3c" * (size // 2), "little")
    return ((r & keep) | force).to_bytes(size, "little")


def drop(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def shards(d):
    """The shard files of the checkpoint in DIR, from its index when there is one."""
    index = os.path.join(d, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index) as f:
            names = sorted(set(json.load(f)["weight_map"].values()))
        return [os.path.join(d, n) for n in names]
    return sorted(glob.glob(os.path.join(d, "*.safetensors")))


def cmd_write(args):
    layers = max(1, round(LAYERS * args.scale))
    ts = tensors(layers)
    total = sum(nbytes(s) for _, s in ts)
    n = max(1, round(total / (args.shard_gb * GB)))
    # A tensor goes to the shard its middle byte falls in: shards of nearly equal size, tensors
    # in order, none split.
    groups, pos = [[] for _ in range(n)], 0
    for name, shape in ts:
        b = nbytes(shape)
        groups[min(n - 1, int((pos + b / 2) * n / total))].append((name, shape))
        pos += b
    groups = [g for g in groups if g]
    n = len(groups)
    os.makedirs(args.dir, exist_ok=True)
    print(f"{layers} layers, {len(ts)} tensors, {total / GB:.2f} GB in {n} shards -> {args.dir}",
          flush=True)

    t_start = time.perf_counter()
    block = memoryview(random_bf16_block(CHUNK))
    print(f"random block: {time.perf_counter() - t_start:.2f} s", flush=True)
    weight_map, bpos = {}, 0
    for k, group in enumerate(groups, 1):
        fname = f"model-{k:05d}-of-{n:05d}.safetensors"
        header, off = {"__metadata__": {"format": "pt"}}, 0
        for name, shape in group:
            header[name] = {"dtype": "BF16", "shape": shape, "data_offsets": [off, off + nbytes(shape)]}
            off += nbytes(shape)
            weight_map[name] = fname
        hj = json.dumps(header, separators=(",", ":")).encode()
        # Pad with spaces to 8 bytes, as the safetensors package does, so the data is aligned.
        hj += b" " * (-len(hj) % 8)
        t0 = time.perf_counter()
        path = os.path.join(args.dir, fname)
        with open(path, "wb", buffering=0) as f:
            f.write(len(hj).to_bytes(8, "little"))
            f.write(hj)
            left = off
            while left:
                m = min(left, CHUNK - bpos)
                f.write(block[bpos:bpos + m])
                bpos = (bpos + m) % CHUNK
                left -= m
            # Dirty pages cannot be dropped: flush them so that the drop below leaves the cache
            # cold, and the next read of this file comes from the disk.
            os.fsync(f.fileno())
            os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
        dt = time.perf_counter() - t0
        print(f"  {fname}: {len(group)} tensors, {off / GB:.2f} GB, {dt:.1f} s "
              f"({off / GB / dt:.2f} GB/s with fsync)", flush=True)

    with open(os.path.join(args.dir, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)
    # Llama 3 8B's config, with the layer count actually written, for loaders that read it.
    config = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "torch_dtype": "bfloat16",
        "vocab_size": VOCAB, "hidden_size": HIDDEN, "intermediate_size": INTERMEDIATE,
        "num_hidden_layers": layers, "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS, "head_dim": HEAD_DIM, "max_position_embeddings": 8192,
        "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "hidden_act": "silu",
        "tie_word_embeddings": False, "bos_token_id": 128000, "eos_token_id": 128001,
    }
    with open(os.path.join(args.dir, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    print(f"wrote {total / GB:.2f} GB in {time.perf_counter() - t_start:.1f} s")
    return 0


def read_all(paths, cold):
    """(bytes, seconds) to read every file through once, dropping each from the cache first
    when ``cold``."""
    buf = bytearray(CHUNK)
    mv = memoryview(buf)
    total, elapsed = 0, 0.0
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        try:
            if cold:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            t0 = time.perf_counter()
            # SEQUENTIAL widens the kernel's readahead: this is meant as the disk's ceiling.
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)
            with os.fdopen(os.dup(fd), "rb", buffering=0) as f:
                while True:
                    n = f.readinto(mv)
                    if not n:
                        break
                    total += n
            elapsed += time.perf_counter() - t0
        finally:
            os.close(fd)
    return total, elapsed


def torch_cuda_load(paths, cold):
    """(bytes, seconds) for safetensors.torch.load_file(path, device="cuda") of every shard, or
    None when torch with CUDA or safetensors is missing."""
    try:
        import torch
        from safetensors.torch import load_file
    except Exception:  # noqa: BLE001 -- any import failure just means no peer to time
        return None
    if not torch.cuda.is_available():
        return None
    torch.zeros(1, device="cuda")  # CUDA context creation is not part of loading
    if cold:
        for p in paths:
            drop(p)
    total, elapsed = 0, 0.0
    for p in paths:
        t0 = time.perf_counter()
        ts = load_file(p, device="cuda")
        torch.cuda.synchronize()
        elapsed += time.perf_counter() - t0
        total += sum(t.numel() * t.element_size() for t in ts.values())
        del ts
    torch.cuda.empty_cache()
    return total, elapsed


def cmd_read(args):
    paths = shards(args.dir)
    if not paths:
        print(f"no .safetensors files in {args.dir}", file=sys.stderr)
        return 1
    results = []
    for label, cold in (("cold", True), ("warm", False)):
        b, s = read_all(paths, cold)
        print(f"read {label}: {b / GB:.2f} GB in {s:.2f} s = {b / GB / s:.2f} GB/s "
              f"({len(paths)} files)", flush=True)
        results.append((f"disk_read_{label}_GBps", b / GB / s))
    for label, cold in (("cold", True), ("warm", False)):
        r = torch_cuda_load(paths, cold)
        if r is None:
            break
        b, s = r
        print(f"torch safetensors load_file(device='cuda') {label}: {b / GB:.2f} GB in "
              f"{s:.2f} s = {b / GB / s:.2f} GB/s", flush=True)
        results.append((f"torch_safetensors_cuda_{label}_GBps", b / GB / s))
    lines = [f"{name}\t{v:.3f}" for name, v in results]
    print("\n".join(lines))
    if args.out:
        with open(args.out, "a") as f:
            f.write("".join(line + "\n" for line in lines))
    return 0


def cmd_drop(args):
    paths = shards(args.dir)
    for p in paths:
        drop(p)
    print(f"dropped {len(paths)} files from the page cache")
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    w = sub.add_parser("write", help="write a random Llama-3-8B-shaped bf16 checkpoint")
    w.add_argument("dir")
    w.add_argument("--scale", type=float, default=1.0, help="multiply the 32 layers by this")
    w.add_argument("--shard-gb", type=float, default=4.0, help="about this many GB per shard")
    r = sub.add_parser("read", help="time reading the shards, cold and warm")
    r.add_argument("dir")
    r.add_argument("--out", default=None, help="append the TSV lines here")
    d = sub.add_parser("drop", help="drop the shards from the page cache")
    d.add_argument("dir")
    args = ap.parse_args()
    return {"write": cmd_write, "read": cmd_read, "drop": cmd_drop}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
