#!/usr/bin/env python3
"""Record golden gradients from real MLX: mx.grad, mx.vjp, mx.jvp and mx.vmap (and nestings of
them) applied to op chains and small models.

Run from the repository root (MLX and NumPy must be importable):

    python3 scripts/mlx_fixtures_transforms.py          # writes crates/nuvec/tests/fixtures/transforms.bin
    python3 scripts/mlx_fixtures_transforms.py --check  # fails if regenerating would change the file

The replayer is crates/nuvec/tests/suite/mlx_transforms.rs, which holds the same functions under the
same names (FUNCTIONS below). The file format is scripts/mlx_fixtures.py's; each case's "op" is
the function's name and its params say which transform ran:

    {"kind": "vjp"}               inputs: primals..., cotangent;  outputs: output, gradients...
    {"kind": "grad"}              inputs: primals;  outputs: loss, gradients... where
                                  loss = sum(f(x)^2) / 2, through value_and_grad
    {"kind": "jvp"}               inputs: primals..., tangents...;  outputs: output, tangent
    {"kind": "vmap", "in_axes": [...], "out_axes": k}
                                  inputs: batched arguments;  outputs: the mapped output
    {"kind": "vmap_grad", "in_axes": [...]}
                                  inputs: batched arguments; outputs: vmap of grad (all args)
    {"kind": "grad_grad"}         one input; outputs: grad of (sum of grad of sum f)
    {"kind": "jvp_of_vjp"}        inputs: primals..., cotangent, tangents...;  outputs: the
                                  tangents of the vjp's gradients
"""

import argparse
import os
import sys

import mlx.core as mx
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from mlx_fixtures import encode_case, encode_file  # noqa: E402

SEED = 20261130
RECORDED_ON = "2026-11-30"
OUT = "crates/nuvec/tests/fixtures/transforms.bin"


def mlp(x, w1, b1, w2):
    return mx.softmax(mx.tanh(x @ w1 + b1) @ w2, axis=-1)


def attention(q, k, v):
    return mx.softmax((q @ mx.swapaxes(k, -1, -2)) * 0.5, axis=-1) @ v


def rms_norm(x, w):
    return x * mx.rsqrt(mx.mean(x * x, axis=-1, keepdims=True) + 1e-5) * w


def layer_norm(x):
    mu = mx.mean(x, axis=-1, keepdims=True)
    return (x - mu) * mx.rsqrt(mx.var(x, axis=-1, keepdims=True) + 1e-5)


def scans(x):
    return mx.cumsum(mx.exp(x), axis=1) * mx.cumprod(x, axis=0) + mx.logcumsumexp(x, axis=-1, reverse=True)


def max_min(x, y):
    return mx.maximum(x, y) * mx.min(x, axis=0) + mx.max(x, axis=1, keepdims=True)


def pow_div(x, y):
    return mx.power(x, y) / (1.0 + y * y)


def where_clip(x):
    return mx.where(x > 0, x * x, mx.clip(x, -0.5, 0.5))


def shapes(x):
    a = mx.transpose(x, (2, 0, 1)).reshape(4, 6)
    b = mx.pad(x[:, ::2, 1:], [(0, 0), (1, 0), (0, 0)]).reshape(3, 6)
    return mx.concatenate([a, mx.tile(b, (1, 1)) * 2.0], axis=0)


def var_std(x):
    return mx.var(x, axis=1, ddof=1) + mx.std(x, axis=0).sum()


def lse_softmax(x):
    return mx.logsumexp(x, axis=0) + mx.softmax(x, axis=-1).sum(axis=0) * mx.arange(5, dtype=mx.float32)


def smooth(x):
    return mx.erf(x) * mx.sigmoid(x) + mx.arctan2(x, 1.0 + x * x) + mx.logaddexp(x, -x) + mx.sin(x) * mx.cosh(x)


def batched_matmul(a, b):
    return a @ b


def prod_mean(x):
    return mx.prod(x, axis=1) * mx.mean(x)


def tri(x):
    return mx.tril(x) @ mx.triu(x, 1) + mx.repeat(x[:, :1], 4, axis=1)


def stack_split(x, y):
    p = mx.split(x, 2, axis=1)
    return mx.stack([p[0] * y, p[1] - y], axis=-1)


# name -> (function, input shapes, domains)
FUNCTIONS = {
    "mlp": (mlp, [[8, 6], [6, 16], [16], [16, 4]], "nnnn"),
    "attention": (attention, [[2, 3, 4], [2, 5, 4], [2, 5, 4]], "nnn"),
    "rms_norm": (rms_norm, [[4, 8], [8]], "nn"),
    "layer_norm": (layer_norm, [[4, 8]], "n"),
    "scans": (scans, [[3, 5]], "n"),
    "max_min": (max_min, [[3, 5], [5]], "nn"),
    "pow_div": (pow_div, [[4], [4]], "pn"),
    "where_clip": (where_clip, [[6]], "n"),
    "shapes": (shapes, [[2, 3, 4]], "n"),
    "var_std": (var_std, [[3, 5]], "n"),
    "lse_softmax": (lse_softmax, [[3, 5]], "n"),
    "smooth": (smooth, [[5]], "n"),
    "batched_matmul": (batched_matmul, [[2, 3, 4], [4, 5]], "nn"),
    "prod_mean": (prod_mean, [[3, 4]], "n"),
    "tri": (tri, [[4, 4]], "n"),
    "stack_split": (stack_split, [[3, 4], [3, 2]], "nn"),
}


class Writer:
    def __init__(self):
        self.rng = np.random.default_rng(SEED)
        self.cases = []

    def arr(self, shape, domain="n"):
        v = self.rng.standard_normal(shape).astype(np.float32)
        if domain == "p":
            v = np.abs(v) + 0.5
        return mx.array(v)

    def add(self, name, op, params, inputs, outputs):
        mx.eval(inputs, outputs)
        self.cases.append(encode_case(name, op, params, inputs, outputs))

    def attempt(self, name, op, params, run):
        """Records `run()`'s (inputs, outputs) unless MLX rejects the transform."""
        params = dict(params, n=self.n_primals)
        try:
            inputs, outputs = run()
            mx.eval(inputs, outputs)
        except Exception as e:
            print(f"skip {name}: {str(e).splitlines()[0]}", file=sys.stderr)
            return
        self.add(name, op, params, inputs, outputs)

    def serialize(self):
        return encode_file("scripts/mlx_fixtures_transforms.py", RECORDED_ON, SEED, self.cases)


def vmap_axes(w, shapes, variant):
    """in_axes for one variant: 0 everywhere, last axis (negative), or the first unmapped."""
    n = len(shapes)
    if variant == 0:
        return [0] * n
    if variant == 1:
        return [-1] * n
    return [None] + [1 if len(s) >= 1 else 0 for s in shapes[1:]] if n > 1 else [-1]


def batched(w, shape, domain, axis):
    if axis is None:
        return w.arr(shape, domain)
    return mx.stack([w.arr(shape, domain) for _ in range(3)], axis=axis)


def record():
    w = Writer()
    for name, (f, shapes_, doms) in FUNCTIONS.items():
        xs = [w.arr(s, d) for s, d in zip(shapes_, doms)]
        n = len(xs)
        w.n_primals = n
        argnums = list(range(n))
        y = f(*xs)
        # vjp with a random cotangent.
        cot = w.arr(list(y.shape))
        tans = [w.arr(list(x.shape)) for x in xs]
        tans2 = [w.arr(list(x.shape)) for x in xs]
        loss = lambda *a: (f(*a) ** 2).sum() / 2

        def vjp_case():
            outs, grads = mx.vjp(lambda *a: [f(*a)], xs, [cot])
            return xs + [cot], outs + list(grads)

        def grad_case():
            val, g = mx.value_and_grad(loss, argnums=argnums)(*xs)
            # One argument number gives the gradient itself, not a tuple.
            return xs, [val] + (list(g) if isinstance(g, (tuple, list)) else [g])

        def jvp_case():
            outs, jv = mx.jvp(lambda *a: [f(*a)], xs, tans)
            return xs + tans, outs + list(jv)

        def vmap_grad_case():
            bx = [batched(w, s, d, 0) for s, d in zip(shapes_, doms)]
            vg = mx.vmap(mx.grad(loss, argnums=argnums), in_axes=tuple([0] * n))(*bx)
            return bx, list(vg) if isinstance(vg, (tuple, list)) else [vg]

        def jvp_of_vjp_case():
            def grads_of(*a):
                return list(mx.vjp(lambda *b: [f(*b)], list(a), [cot])[1])

            _, hv = mx.jvp(grads_of, xs, tans2)
            return xs + [cot] + tans2, list(hv)

        def grad_grad_case():
            gg = mx.grad(lambda a: mx.grad(lambda b: f(b).sum())(a).sum())(xs[0])
            return xs, [gg]

        w.attempt(f"{name}/vjp", name, {"kind": "vjp"}, vjp_case)
        w.attempt(f"{name}/grad", name, {"kind": "grad"}, grad_case)
        w.attempt(f"{name}/jvp", name, {"kind": "jvp"}, jvp_case)
        for variant in range(3):
            axes = vmap_axes(w, shapes_, variant)
            out_axes = [0, -1, 1][variant] if y.ndim >= 1 else 0
            bx = [batched(w, s, d, a) for s, d, a in zip(shapes_, doms, axes)]
            params = {"kind": "vmap", "in_axes": axes, "out_axes": out_axes}
            w.attempt(f"{name}/vmap{variant}", name, params,
                      lambda bx=bx, axes=axes, out_axes=out_axes: (bx, [mx.vmap(f, in_axes=tuple(axes), out_axes=out_axes)(*bx)]))
        w.attempt(f"{name}/vmap_grad", name, {"kind": "vmap_grad", "in_axes": [0] * n}, vmap_grad_case)
        w.attempt(f"{name}/jvp_of_vjp", name, {"kind": "jvp_of_vjp"}, jvp_of_vjp_case)
        if n == 1:
            w.attempt(f"{name}/grad_grad", name, {"kind": "grad_grad"}, grad_grad_case)
    return w


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--check", action="store_true")
    args = ap.parse_args()
    data = record().serialize()
    if args.check:
        with open(OUT, "rb") as fh:
            if fh.read() != data:
                sys.exit(f"{OUT} is out of date")
        print("up to date")
        return
    with open(OUT, "wb") as fh:
        fh.write(data)
    print(f"wrote {OUT}: {len(data)} bytes")


if __name__ == "__main__":
    main()
