#!/usr/bin/env python3
"""A load generator for `nuvec serve` (or any OpenAI-compatible server): C concurrent
streaming chat requests, each of a fixed number of greedy tokens, repeated; prints output
tokens/s, time to first token and inter-token latency (p50/p99), after as many unmeasured
warm-up requests at once (`--no-warmup`: none).

    python3 scripts/serve-load.py --url http://127.0.0.1:8080 --concurrency 1,8,64 --tokens 64
Standard library only."""
import argparse, http.client, json, statistics, threading, time, urllib.parse


def stream(url, body):
    u = urllib.parse.urlparse(url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=600)
    start = time.perf_counter()
    conn.request("POST", "/v1/chat/completions", json.dumps(body), {"Content-Type": "application/json"})
    resp = conn.getresponse()
    assert resp.status == 200, resp.read()
    times, tokens = [], 0
    while True:
        line = resp.readline()
        if not line:
            break
        if line.startswith(b"data: ") and line.strip() != b"data: [DONE]":
            chunk = json.loads(line[6:])
            if chunk["choices"] and chunk["choices"][0]["delta"].get("content") is not None:
                times.append(time.perf_counter())
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
    conn.close()
    return start, times, tokens


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p / 100 * len(xs)))] if xs else float("nan")


def run(url, c, tokens, rounds, warmup):
    results, lock = [], threading.Lock()
    # Unmeasured requests first, as many at once as measured: the server's first steps at a
    # batch size load kernels and record its decode graph.
    warm = [threading.Thread(target=stream, args=(url, {
        "messages": [{"role": "user", "content": f"Warm-up {i}."}], "max_tokens": 8, "temperature": 0,
        "stream": True})) for i in range(c if warmup else 0)]
    for t in warm:
        t.start()
    for t in warm:
        t.join()

    def worker(i):
        for r in range(rounds):
            body = {"messages": [{"role": "user", "content": f"Tell me story number {i * rounds + r} about a cat."}],
                    "max_tokens": tokens, "temperature": 0, "stream": True,
                    "stream_options": {"include_usage": True}}
            s, t, n = stream(url, body)
            with lock:
                results.append((s, t, n))

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(c)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    # Output tokens as the server counted them (a chunk can hold several, or none yet).
    n = sum(k for _, _, k in results)
    ttft = [t[0] - s for s, t, _ in results if t]
    itl = [b - a for _, t, _ in results for a, b in zip(t, t[1:])]
    print(f"concurrency {c:4d}: {n / wall:8.1f} output tok/s, TTFT p50 {pct(ttft, 50) * 1e3:7.1f} ms p99 "
          f"{pct(ttft, 99) * 1e3:7.1f} ms, ITL p50 {pct(itl, 50) * 1e3:6.1f} ms p99 {pct(itl, 99) * 1e3:6.1f} ms, "
          f"{len(results)} requests, {n} tokens, {wall:.1f} s", flush=True)


def main():
    a = argparse.ArgumentParser()
    a.add_argument("--url", default="http://127.0.0.1:8080")
    a.add_argument("--concurrency", default="1,8,64")
    a.add_argument("--tokens", type=int, default=64)
    a.add_argument("--rounds", type=int, default=2)
    a.add_argument("--no-warmup", action="store_true", help="measure from the first request")
    args = a.parse_args()
    for c in [int(x) for x in args.concurrency.split(",")]:
        run(args.url, c, args.tokens, args.rounds, not args.no_warmup)


main()
