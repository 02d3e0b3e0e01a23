#!/usr/bin/env python3
"""PyTorch and Liger Kernel peers of nuvec's fused-op benchmark (crates/nuvec/examples/bench_fast.rs).

Times the cases of bench_fast, by the same names and byte (or FLOP) counts, on GPU 0, in these modes
(the prefix of each output line):

* ``torch_eager``: plain PyTorch. RMS norm as MLX computes it,
  ``(x * rsqrt(mean(x^2) + eps))`` in float32, cast to bf16, times ``w``; the residual add
  then that; ``F.layer_norm``; ``F.silu(gate) * up``; rotary embedding by halves,
  ``x * cos + cat(-x2, x1) * sin`` in float32 with the cos/sin tables made before timing (as a
  model shares them between layers); ``F.cross_entropy``; attention
  ``F.scaled_dot_product_attention(q, k, v, is_causal=..., enable_gqa=True, scale=1/sqrt(128))``
  with torch's default choice of backend. torch's ``is_causal`` aligns the queries upper left,
  nuvec's causal lower right (the queries are the last Lq of the Lk positions), the same when
  Lq == Lk; the 4-query causal decode cases therefore pass a boolean ``attn_mask`` (query i
  attends keys j <= i + Lk - Lq), made before timing, instead of ``is_causal`` (which may
  change the backend torch picks: flash takes no mask).
* ``torch_composition``: PyTorch eager running nuvec's own composition of the op, op for op,
  where it differs from the eager mode: SwiGLU ``(g * sigmoid(g) * u)`` in float32 rounded
  once, layer norm as centred values times ``rsqrt(var + eps)`` in float32 then ``* w + b``,
  cross entropy as ``logsumexp(x) - x[target]`` in float32 with the ignore/NaN masks, and
  the RoPE forward with its cos/sin tables made inside the timed call from the offset
  (the comparison for nuvec's ``NUVEC_FUSED=0``; RMS norm's eager mode already is).
* ``torch_flash``: attention prefill only, the eager call inside
  ``torch.nn.attention.sdpa_kernel(SDPBackend.FLASH_ATTENTION)``. Where that backend refuses
  ``enable_gqa``, k and v are repeated to the 32 query heads (``repeat_interleave``) before
  timing, said in a ``# torch_flash:<case>: k and v repeated ...`` line; where it refuses the
  case anyway, a ``# torch_flash:<case> skipped (...)`` line and no result.
* ``torch_compile``: ``torch.compile`` of the eager function (forward and backward); not for
  attention.
* ``torch_F_rms_norm``: ``torch.nn.functional.rms_norm`` (RMS norm cases only).
* ``liger``: Liger Kernel's autograd functions from ``liger_kernel.ops``
  (LigerRMSNormFunction with ``in_place=False`` so that the cotangent survives repeated
  backward passes, LigerFusedAddRMSNormFunction, LigerLayerNormFunction, LigerSiLUMulFunction,
  LigerRopeFunction, LigerCrossEntropyFunction), when the package imports; otherwise the mode
  is skipped with a ``#`` line. Liger's rope rotates q and k together, in place, in the
  [B, T, H, D] memory layout that attention projections produce: here q and k have 16 heads
  each (the 32 of the case) as transposed views of that layout, and bf16 cos/sin tables.
  Liger's SwiGLU backward writes the gradients over its saved inputs, so repeated backward
  passes see changed values (the time does not depend on them). Not for attention.

* ``fla_recurrent`` and ``fla_chunk``: flash-linear-attention's
  ``fused_recurrent_gated_delta_rule`` and ``chunk_gated_delta_rule`` (gated delta cases only),
  when ``fla.ops.gated_delta_rule`` imports (its wheels, e.g. ``fla-core`` and ``einops``, in
  ``.gpu/wheels``); otherwise the modes are skipped with a ``#`` line. They take the gate in
  log space (``log g``, made before timing), the state as ``[B, Hv, K, V]`` (the same bytes as
  nuvec's ``[B, Hv, Dv, Dk]``) and ``scale=1``. Where ``chunk_gated_delta_rule`` refuses more
  value heads than key heads, q and k are repeated to the value heads before timing, said in a
  ``# fla_chunk:<case>: ...`` line.

Attention cases (bf16, ``q [B, 32, Lq, 128]``, ``k``, ``v [B, 8, Lk, 128]``, as bench_fast):

* ``sdpa_decode_bf16_B{B}_Lq{Lq}_Lk{Lk}``, GB/s of ``2*B*8*Lk*128*2`` bytes of k and v read
  plus ``2*B*32*Lq*128*2`` of q read and the output written: Lq = 1 (no mask) for (B, Lk) in
  (1, 4096), (1, 32768), (1, 131072), (8, 8192), (32, 8192), (64, 4096); Lq = 4 causal for
  (1, 32768) and (32, 8192). Each adds a ``_us`` row.
* ``sdpa_prefill_bf16_B{B}_L{L}_{causal|full}[_D{D}]``, Lq = Lk = L, TFLOP/s of
  ``4*B*32*L*L*D`` FLOPs, halved when causal, for ``PREFILL``'s (B, L, causal, D).
* ``sdpa_fwdbwd_bf16_B{B}_L{L}_causal``: the forward and ``torch.autograd.grad`` of q, k and v
  every iteration, TFLOP/s of 3.5 times the forward's FLOPs, for (B, L) in (1, 2048), (1, 4096),
  (4, 4096), (1, 8192); ``sdpa_bwd_bf16_*`` the backward alone (as the other backward cases),
  TFLOP/s of 2.5 times the forward's.

Gated delta cases (Qwen3-Next's heads as bench_fast: q, k ``[B, T, 16, 128]``, v
``[B, T, 32, 128]`` bf16, a float32 gate per head, bf16 beta, a float32 state
``[B, 32, 128, 128]``):

* ``gated_delta_decode_bf16_B{B}``, T = 1, B in 1, 8, 32, 64: GB/s of the state read and
  written (``2*B*32*128*128*4``), with a ``_us`` row: ``eager`` and ``compile`` run one step
  as nuvec's composition does (mlx-lm's ops path: heads repeated, decay, ``S k``, update,
  ``S q`` in float32), ``fla_recurrent`` FLA's recurrent kernel.
* ``gated_delta_prefill_bf16_B1_T{T}``, T in 4096, 8192, 32768: TFLOP/s of
  ``7*T*32*128*128`` FLOPs (the recurrence's, whatever the algorithm), ``fla_recurrent`` and
  ``fla_chunk``.
* ``gated_delta_bwd_bf16_B1_T{T}``, T in 4096, 8192, 32768: the backward alone of
  ``fla_chunk`` (``torch.autograd.grad`` of the output and the final state at random
  cotangents, with respect to q, k, v, the log gate, beta and the state), TFLOP/s of
  ``14*T*32*128*128`` FLOPs, twice the forward's.

Mixture-of-experts products (as bench_fast: 512 experts ``w [512, 512, 2048]`` bf16, each
token's 10 choices sorted by expert, rows ``x [10*T, 1, 2048]``):

* ``gather_mm_decode_bf16_T{T}``, T in 1, 8, 64: GB/s of the distinct chosen experts' weights;
  ``gather_mm_prefill_bf16_T4096``: TFLOP/s of ``2*10*T*512*2048``. ``eager`` gathers the
  chosen matrices and multiplies (``torch.bmm(x, w[idx].transpose(1, 2))``, what
  ``gather_mm``'s composition does); ``grouped_mm`` is ``torch._grouped_mm`` (PyTorch's
  grouped GEMM for mixtures of experts) over the sorted rows with each expert's end offset,
  where this torch has it.

Backward cases (``*_bwd_*``) build the forward graph before timing and time
``torch.autograd.grad(outputs, inputs, cotangents, retain_graph=True)``; the graph of
``torch.compile`` keeps its buffers (``torch._functorch.config.donated_buffer = False``) so
that it can run backward again. ``cross_entropy_fwdbwd_*`` times the forward and the logits'
gradient together, of the mean loss (Liger's fused path: it writes the gradient during the
forward pass, over the logits); ``cross_entropy_fwd_*`` uses ``reduction='none'``.

Method (as in bench/gpu_peers.py, whose Timer it uses): inputs made before timing; warm-up
iterations (for torch.compile and Triton the first call compiles); then at least 3 batches
(default 5) of ``count`` iterations, each batch timed with CUDA events around the whole batch,
per-iteration time = batch time / count, median over batches; ``count`` makes a batch last
about 100 ms. Inputs smaller than 3x the L2 cache rotate among copies (with their graphs, for
backward cases).

Output: on stdout, ``# ...`` comment lines and one line per case and mode
``<mode>:<case>\\t<GB/s>\\tGB/s\\t<fraction>``, the fraction being against torch's own copy
ceiling ``torch_eager:ceiling_copy_memcpy`` (a 1 GiB ``copy_``, bytes read + written, measured
first whatever ``--only`` says); attention prefill writes
``<mode>:<case>\\t<TFLOP/s>\\tTFLOP/s\\t-`` (no compute ceiling here); latency-bound cases
(1 and 16 tokens, decode rope, attention decode) add
``<mode>:<case>_us\\t<microseconds per call>\\tus\\t-``. A case that fails prints ``nan``;
progress and errors go to stderr.

    python3 bench/gpu_fast_peers.py                          # everything
    python3 bench/gpu_fast_peers.py --only cross_entropy     # cases whose name contains it
    python3 bench/gpu_fast_peers.py --only sdpa              # the attention cases
    python3 bench/gpu_fast_peers.py --modes eager,liger      # some modes only
    python3 bench/gpu_fast_peers.py --only gated_delta       # the gated delta cases
    python3 bench/gpu_fast_peers.py --deadline 300           # end within 300 s

Time: eager, composition, F.rms_norm, Liger and flash run case by case first, then
torch.compile, the cases with a target (main tensor of at least 64 MiB) first; with
``--deadline`` no case starts within 10 s of it and no torch.compile case within 60 s.
"""

import argparse
import inspect
import math
import os
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpu_peers import L2_FLOOR, Timer, copy_ceiling_gbs, emit, log, random  # noqa: E402  (the core peers' timing)

EPS = 1e-5
BF16 = torch.bfloat16
ELEM = 2  # bytes per bf16
TARGET_MIN_BYTES = 64 << 20
ROPE_BASE = 10000.0
HEADS, HEAD_DIM = 32, 128
# Attention: query heads, key-value heads (grouped, 4 query heads each), head size, scale.
ATTN_HQ, ATTN_HKV, ATTN_D = 32, 8, 128
ATTN_SCALE = 1.0 / math.sqrt(ATTN_D)
# Attention prefill cases (B, L, causal, D), as bench_fast's PREFILL.
PREFILL = ((1, 4096, True, 128), (4, 4096, True, 128), (1, 8192, True, 128), (1, 8192, False, 128),
           (1, 16384, True, 128), (8, 4096, False, 128), (1, 32768, True, 128), (1, 8192, True, 64),
           (1, 8192, False, 64), (1, 8192, True, 256), (1, 8192, False, 256))
# Gated DeltaNet (Qwen3-Next's): query/key heads, value heads, head size.
GDN_HK, GDN_HV, GDN_D = 16, 32, 128
# A mixture of experts (Qwen3-Next's): experts, their rows and columns, choices per token.
MOE_E, MOE_N, MOE_K, MOE_TOP = 512, 512, 2048, 10
MODES = ("eager", "composition", "F_rms_norm", "liger", "flash", "fla_recurrent", "fla_chunk", "grouped_mm",
         "compile")
# The modes that run case by case before torch.compile.
FIRST_MODES = ("eager", "composition", "F_rms_norm", "liger", "flash", "fla_recurrent", "fla_chunk", "grouped_mm")


def prefix_of(mode):
    """The output prefix of a mode: torch's modes say so, Liger's and FLA's do not."""
    return mode if mode == "liger" or mode.startswith("fla_") else f"torch_{mode}"


# --- the eager functions (torch.compile compiles the same ones) ---------------------------

def rms_norm_eager(x, w):
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + EPS)).to(x.dtype) * w


def rms_norm_functional(x, w):
    return F.rms_norm(x, (x.shape[-1],), w, EPS)


def add_rms_norm_eager(x, r, w):
    h = x + r
    return h, rms_norm_eager(h, w)


def layer_norm_eager(x, w, b):
    return F.layer_norm(x, (x.shape[-1],), w, b, EPS)


def swiglu_eager(gate, up):
    return F.silu(gate) * up


def swiglu_composition(gate, up):
    g = gate.float()
    return (g * torch.sigmoid(g) * up.float()).to(gate.dtype)


def layer_norm_composition(x, w, b):
    xf = x.float()
    centred = xf - xf.mean(-1, keepdim=True)
    var = centred.square().mean(-1, keepdim=True)
    return (centred * torch.rsqrt(var + EPS)).to(x.dtype) * w + b


def rope_eager(x, cos, sin):
    xf = x.float()
    half = xf.shape[-1] // 2
    rotated = torch.cat((-xf[..., half:], xf[..., :half]), -1)
    return (xf * cos + rotated * sin).to(x.dtype)


def cross_entropy_eager(logits, targets):
    return F.cross_entropy(logits, targets, reduction="none")


def cross_entropy_mean_eager(logits, targets):
    return F.cross_entropy(logits, targets)


def cross_entropy_composition(logits, targets):
    v = logits.shape[-1]
    x = logits.float()
    t = targets.to(torch.int32)
    keep = (t >= 0) & (t < v)
    idx = torch.where(keep, t, 0).unsqueeze(-1).long()
    loss = torch.logsumexp(x, -1) - x.gather(-1, idx).squeeze(-1)
    loss = torch.where(keep, loss, 0.0)
    return torch.where(t >= v, float("nan"), loss)


def cross_entropy_mean_composition(logits, targets):
    return cross_entropy_composition(logits, targets).mean()


def rope_composition(x, offset):
    """rope_eager with the tables made inside, from the position offset, as nuvec's composition."""
    cos, sin = rope_tables(x.shape[-2], offset, torch.float32)
    return rope_eager(x, cos, sin)


def rope_tables(t, offset, dtype):
    """cos and sin of positions offset..offset+t, [t, HEAD_DIM] with both halves equal (as HF)."""
    inv = ROPE_BASE ** (-torch.arange(0, HEAD_DIM, 2, device="cuda", dtype=torch.float32) / HEAD_DIM)
    pos = torch.arange(offset, offset + t, device="cuda", dtype=torch.float32)
    ang = torch.outer(pos, inv)
    ang = torch.cat((ang, ang), -1)
    return ang.cos().to(dtype), ang.sin().to(dtype)


def sdpa_eager(q, k, v, mask=None, causal=False, scale=ATTN_SCALE):
    """torch's attention with its default backend selection, the key-value heads shared."""
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal, scale=scale,
                                          enable_gqa=True)


def lower_right_mask(lq, lk):
    """[lq, lk] booleans, True where query i (the last lq of lk positions) attends key j:
    j <= i + lk - lq (nuvec's causal; torch's ``is_causal`` aligns upper left instead)."""
    i = torch.arange(lq, device="cuda").unsqueeze(-1)
    j = torch.arange(lk, device="cuda").unsqueeze(0)
    return j <= i + (lk - lq)


class Unsupported(Exception):
    """A mode that cannot run a case (a backend that rejects its shapes): skipped, not failed."""


def flash_maker(name, make_inputs, k):
    """``sdpa_eager``'s call inside ``sdpa_kernel(SDPBackend.FLASH_ATTENTION)``. Where the flash
    backend refuses ``enable_gqa``, k and v are repeated to the query heads before timing (said
    in a ``#`` line); where it refuses that too, the case is skipped."""
    def make():
        try:
            from torch.nn.attention import SDPBackend, sdpa_kernel
        except Exception as e:
            raise Unsupported(f"no torch.nn.attention.sdpa_kernel: {type(e).__name__}")

        def call(gqa, q, kk, v, mask, causal, scale=ATTN_SCALE):
            extra = {"enable_gqa": True} if gqa else {}
            with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                return F.scaled_dot_product_attention(q, kk, v, attn_mask=mask, is_causal=causal, scale=scale,
                                                      **extra)

        ins = [make_inputs(j) for j in range(k)]
        try:
            call(True, *ins[0])
            gqa = True
        except Exception as e:
            why = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
            groups = ATTN_HQ // ATTN_HKV
            ins = [(q, kk.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1), *rest)
                   for q, kk, v, *rest in ins]
            try:
                call(False, *ins[0])
            except Exception as e2:
                first = str(e2).splitlines()[0] if str(e2) else ""
                raise Unsupported(f"flash backend: {type(e2).__name__}: {first}")
            emit(f"# torch_flash:{name}: k and v repeated to {ATTN_HQ} heads before timing "
                 f"(flash with enable_gqa: {why})")
            gqa = False
        return (lambda i: call(gqa, *ins[i % k])), k
    return make


# --- Liger ---------------------------------------------------------------------------------

class Liger:
    """Liger Kernel's autograd functions, called by parameter name (their positional order
    has changed between versions), or ``None`` where the package or a function is missing."""

    # Optional parameters that some versions declare without a default.
    NONE_UNLESS_GIVEN = ("weight",)
    NAMES = ("LigerRMSNormFunction", "LigerFusedAddRMSNormFunction", "LigerLayerNormFunction",
             "LigerSiLUMulFunction", "LigerRopeFunction", "LigerCrossEntropyFunction")

    def __init__(self, load=True):
        self.error = None
        self.version = "?"
        self.fns = {}
        if not load:
            return
        try:
            import liger_kernel.ops as ops
        except Exception as e:  # not installed, or not importable with this torch/triton
            self.error = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
            return
        try:
            from importlib.metadata import version
            self.version = version("liger-kernel")
        except Exception:
            pass
        for name in self.NAMES:
            fn = getattr(ops, name, None)
            if fn is not None:
                self.fns[name] = fn

    def has(self, name):
        return name in self.fns

    def __call__(self, name, **kw):
        cls = self.fns[name]
        params = list(inspect.signature(cls.forward).parameters.values())[1:]  # without ctx
        names = [p.name for p in params]
        unknown = set(kw) - set(names)
        if unknown:
            raise TypeError(f"{name}.forward has no parameter {sorted(unknown)}")
        last = max(names.index(k) for k in kw)
        args = []
        for p in params[: last + 1]:
            if p.name in kw:
                args.append(kw[p.name])
            elif p.default is not inspect.Parameter.empty:
                args.append(p.default)
            elif p.name in self.NONE_UNLESS_GIVEN:
                args.append(None)
            else:
                raise TypeError(f"{name}.forward needs {p.name}")
        return cls.apply(*args)


# --- flash-linear-attention ----------------------------------------------------------------

class Fla:
    """flash-linear-attention's gated delta rule kernels, or ``error`` saying why not."""

    def __init__(self, load=True):
        self.error = None
        self.version = "?"
        self.recurrent = self.chunk = None
        if not load:
            return
        try:
            from fla.ops.gated_delta_rule import chunk_gated_delta_rule, fused_recurrent_gated_delta_rule
        except Exception as e:  # not installed, or not importable with this torch/triton
            self.error = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
            return
        self.recurrent, self.chunk = fused_recurrent_gated_delta_rule, chunk_gated_delta_rule
        for dist in ("fla-core", "flash-linear-attention"):
            try:
                from importlib.metadata import version
                self.version = f"{dist} {version(dist)}"
                break
            except Exception:
                pass


def gdn_inputs(b, t, seed):
    """A gated delta call's inputs as bench_fast makes them (q and k of length about 1/2, the
    gate in (0.93, 0.98), beta in (0.25, 0.75), a small state), with the gate's log for FLA."""
    g = torch.Generator(device="cuda")
    g.manual_seed(seed)

    def uniform(shape):
        return torch.rand(shape, device="cuda", dtype=torch.float32, generator=g) * 2 - 1
    scale = GDN_D ** -0.5
    q = (uniform((b, t, GDN_HK, GDN_D)) * scale).to(BF16)
    k = (uniform((b, t, GDN_HK, GDN_D)) * scale).to(BF16)
    v = uniform((b, t, GDN_HV, GDN_D)).to(BF16)
    gate = uniform((b, t, GDN_HV)) * 0.025 + 0.955
    beta = (uniform((b, t, GDN_HV)) * 0.25 + 0.5).to(BF16)
    state = uniform((b, GDN_HV, GDN_D, GDN_D)) * 0.1
    return q, k, v, gate, gate.log(), beta, state


def gdn_step_eager(q, k, v, gate, beta, state):
    """One step (T = 1) as nuvec's composition and mlx-lm's ops path: float32, heads repeated."""
    rep = v.shape[2] // q.shape[2]
    qf = q[:, 0].float().repeat_interleave(rep, 1)  # [B, Hv, Dk]
    kf = k[:, 0].float().repeat_interleave(rep, 1)
    s = state * gate[:, 0, :, None, None]
    kv = (s * kf[:, :, None, :]).sum(-1)  # [B, Hv, Dv]
    delta = (v[:, 0].float() - kv) * beta[:, 0, :, None].float()
    s = s + delta[..., None] * kf[:, :, None, :]
    y = (s * qf[:, :, None, :]).sum(-1)
    return y.to(q.dtype)[:, None], s


def fla_maker(name, fn, make_inputs, k, repeat_on_failure):
    """An FLA kernel over ``make_inputs(j)``'s q, k, v, log gate, beta and state, the final state
    returned. Where it refuses more value heads than key heads and ``repeat_on_failure``, q and
    k are repeated to the value heads before timing (said in a ``#`` line)."""
    def make():
        def call(q, kk, v, g_log, beta, state):
            return fn(q=q, k=kk, v=v, g=g_log, beta=beta, scale=1.0, initial_state=state,
                      output_final_state=True)

        ins = []
        for j in range(k):
            q, kk, v, _, g_log, beta, state = make_inputs(j)
            ins.append((q, kk, v, g_log, beta, state))
        try:
            call(*ins[0])
        except Exception as e:
            if not repeat_on_failure:
                raise
            why = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
            rep = GDN_HV // GDN_HK
            ins = [(q.repeat_interleave(rep, 2), kk.repeat_interleave(rep, 2), *rest) for q, kk, *rest in ins]
            try:
                call(*ins[0])
            except Exception as e2:
                first = str(e2).splitlines()[0] if str(e2) else ""
                raise Unsupported(f"{type(e2).__name__}: {first}")
            emit(f"# {name}: q and k repeated to {GDN_HV} heads before timing ({why})")
        return (lambda i: call(*ins[i % k])), k
    return make


def fla_bwd_maker(name, fn, t, k):
    """The backward of FLA's chunked kernel, ``bench_fast``'s ``gated_delta_bwd`` inputs: the
    forward runs once per copy before timing. Where it refuses more value heads than key heads,
    q and k are repeated to the value heads (said in a ``#`` line)."""
    def make():
        graphs, note = [], None
        for j in range(k):
            q, kk, v, _, g_log, beta, state = gdn_inputs(1, t, 870 + 10 * j)
            gen = torch.Generator(device="cuda")
            gen.manual_seed(871 + 10 * j)
            dy = (torch.rand(v.shape, device="cuda", generator=gen) * 2 - 1).to(BF16)
            ds = (torch.rand(state.shape, device="cuda", generator=gen) * 2 - 1) * 0.1
            leaves = [q, kk, v, g_log, beta, state]
            for x in leaves:
                x.requires_grad_(True)

            def call(q_, k_):
                return fn(q=q_, k=k_, v=v, g=g_log, beta=beta, scale=1.0, initial_state=state,
                          output_final_state=True)
            try:
                o, s = call(q, kk)
            except Exception as e:
                rep = GDN_HV // GDN_HK
                note = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
                o, s = call(q.repeat_interleave(rep, 2), kk.repeat_interleave(rep, 2))
            graphs.append(((o, s), leaves, (dy, ds)))
        if note:
            emit(f"# fla_chunk:{name}: q and k repeated to {GDN_HV} heads before timing ({note})")

        def run(i):
            outs, wrt, cots = graphs[i % k]
            return torch.autograd.grad(outs, wrt, cots, retain_graph=True)
        return run, k
    return make


# --- cases ---------------------------------------------------------------------------------

class Case:
    """One benchmark case: its name, bytes (or, in TFLOP/s, FLOPs) per iteration, unit, target
    kind, and a maker per mode.

    A maker returns ``(run, k)``: iteration ``i`` calls ``run(i)``, ``k`` being the copies it
    rotates among (for the log); it raises ``Unsupported`` where its mode cannot run the case."""

    def __init__(self, name, amount, main_bytes, latency, unit="GB/s"):
        self.name = name
        self.amount = amount
        self.unit = unit
        self.has_target = main_bytes >= TARGET_MIN_BYTES
        self.latency = latency
        self.makers = {}


def fwd_maker(fn, make_inputs, k):
    """Forward: iteration ``i`` calls ``fn(*inputs[i % k])`` (no input requires grad)."""
    def make():
        ins = [make_inputs(j) for j in range(k)]
        return (lambda i: fn(*ins[i % k])), k
    return make


def bwd_maker(fn, make_inputs, diff, make_cots, k):
    """Backward: ``fn`` runs once per copy before timing, on inputs whose positions ``diff``
    require grad; iteration ``i`` runs the backward of copy ``i % k`` again."""
    def make():
        graphs = []
        for j in range(k):
            ins = list(make_inputs(j))
            for d in diff:
                ins[d].requires_grad_(True)
            outs = fn(*ins)
            outs = tuple(outs) if isinstance(outs, (tuple, list)) else (outs,)
            graphs.append((outs, [ins[d] for d in diff], make_cots(j, outs)))

        def run(i):
            outs, wrt, cots = graphs[i % k]
            return torch.autograd.grad(outs, wrt, cots, retain_graph=True)
        return run, k
    return make


def build_cases(copies, liger, fla):
    cases = []

    def rand(shape, seed):
        return random(shape, BF16, seed)

    def param(h, seed):
        return (1.0 + 0.25 * random((h,), torch.float32, seed)).to(BF16)

    def cots_like(seed):
        return lambda j, outs: tuple(rand(o.shape, seed + 7 * j + i) for i, o in enumerate(outs))

    def compiled(fn):
        def make_compiled(maker_of):
            def make():
                torch._dynamo.reset()
                return maker_of(torch.compile(fn, dynamic=False))()
            return make
        return make_compiled

    # RMS norm.
    for t in (1, 16, 4096, 32768):
        for h in (2048, 4096, 8192):
            xb, wb = t * h * ELEM, h * ELEM
            c = Case(f"rms_norm_fwd_bf16_{t}x{h}", 2 * xb + wb, xb, t <= 16)
            k = copies(xb)

            def ins(j, t=t, h=h):
                return rand((t, h), 100 + j), param(h, 110)
            for mode, fn in (("eager", rms_norm_eager), ("F_rms_norm", rms_norm_functional)):
                c.makers[mode] = fwd_maker(fn, ins, k)
            c.makers["compile"] = compiled(rms_norm_eager)(lambda fn, ins=ins, k=k: fwd_maker(fn, ins, k))
            if liger.has("LigerRMSNormFunction"):
                c.makers["liger"] = fwd_maker(
                    lambda x, w: liger("LigerRMSNormFunction", X=x, W=w, eps=EPS, casting_mode="llama"), ins, k)
            cases.append(c)
            if t == 1:
                continue
            c = Case(f"rms_norm_bwd_bf16_{t}x{h}", 3 * xb + 2 * wb, xb, t <= 16)
            k = copies(2 * xb)
            cots = cots_like(120)
            for mode, fn in (("eager", rms_norm_eager), ("F_rms_norm", rms_norm_functional)):
                c.makers[mode] = bwd_maker(fn, ins, (0, 1), cots, k)
            c.makers["compile"] = compiled(rms_norm_eager)(
                lambda fn, ins=ins, k=k, cots=cots: bwd_maker(fn, ins, (0, 1), cots, k))
            if liger.has("LigerRMSNormFunction"):
                c.makers["liger"] = bwd_maker(
                    lambda x, w: liger("LigerRMSNormFunction", X=x, W=w, eps=EPS, casting_mode="llama",
                                       in_place=False), ins, (0, 1), cots, k)
            cases.append(c)

    # Residual add + RMS norm.
    h = 4096
    for t in (4096, 32768):
        xb = t * h * ELEM
        c = Case(f"add_rms_norm_fwd_bf16_{t}x{h}", 4 * xb + h * ELEM, xb, False)
        k = copies(2 * xb)

        def ins(j, t=t):
            return rand((t, h), 200 + j), rand((t, h), 210 + j), param(h, 220)
        c.makers["eager"] = fwd_maker(add_rms_norm_eager, ins, k)
        c.makers["compile"] = compiled(add_rms_norm_eager)(lambda fn, ins=ins, k=k: fwd_maker(fn, ins, k))
        if liger.has("LigerFusedAddRMSNormFunction"):
            c.makers["liger"] = fwd_maker(
                lambda x, r, w: liger("LigerFusedAddRMSNormFunction", X=x, R=r, W=w, eps=EPS,
                                      casting_mode="llama", in_place=False), ins, k)
        cases.append(c)

    # Layer norm with weight and bias.
    for t in (4096, 32768):
        xb, pb = t * h * ELEM, h * ELEM

        def ins(j, t=t):
            return rand((t, h), 300 + j), param(h, 310), rand((h,), 320)
        c = Case(f"layer_norm_fwd_bf16_{t}x{h}", 2 * xb + 2 * pb, xb, False)
        k = copies(xb)
        c.makers["eager"] = fwd_maker(layer_norm_eager, ins, k)
        c.makers["composition"] = fwd_maker(layer_norm_composition, ins, k)
        c.makers["compile"] = compiled(layer_norm_eager)(lambda fn, ins=ins, k=k: fwd_maker(fn, ins, k))
        if liger.has("LigerLayerNormFunction"):
            c.makers["liger"] = fwd_maker(lambda x, w, b: liger("LigerLayerNormFunction", X=x, W=w, B=b, eps=EPS),
                                          ins, k)
        cases.append(c)
        c = Case(f"layer_norm_bwd_bf16_{t}x{h}", 3 * xb + 3 * pb, xb, False)
        k = copies(2 * xb)
        cots = cots_like(330)
        c.makers["eager"] = bwd_maker(layer_norm_eager, ins, (0, 1, 2), cots, k)
        c.makers["composition"] = bwd_maker(layer_norm_composition, ins, (0, 1, 2), cots, k)
        c.makers["compile"] = compiled(layer_norm_eager)(
            lambda fn, ins=ins, k=k, cots=cots: bwd_maker(fn, ins, (0, 1, 2), cots, k))
        if liger.has("LigerLayerNormFunction"):
            c.makers["liger"] = bwd_maker(lambda x, w, b: liger("LigerLayerNormFunction", X=x, W=w, B=b, eps=EPS),
                                          ins, (0, 1, 2), cots, k)
        cases.append(c)

    # SwiGLU.
    ffn = 14336
    for t in (4096, 32768):
        nb = t * ffn * ELEM

        def ins(j, t=t):
            return rand((t, ffn), 400 + j), rand((t, ffn), 410 + j)

        def liger_swiglu(g, u):
            return liger("LigerSiLUMulFunction", a=g, b=u)
        c = Case(f"swiglu_fwd_bf16_{t}x{ffn}", 3 * nb, nb, False)
        k = copies(2 * nb)
        c.makers["eager"] = fwd_maker(swiglu_eager, ins, k)
        c.makers["composition"] = fwd_maker(swiglu_composition, ins, k)
        c.makers["compile"] = compiled(swiglu_eager)(lambda fn, ins=ins, k=k: fwd_maker(fn, ins, k))
        if liger.has("LigerSiLUMulFunction"):
            c.makers["liger"] = fwd_maker(liger_swiglu, ins, k)
        cases.append(c)
        c = Case(f"swiglu_bwd_bf16_{t}x{ffn}", 5 * nb, nb, False)
        k = copies(3 * nb)
        cots = cots_like(420)
        c.makers["eager"] = bwd_maker(swiglu_eager, ins, (0, 1), cots, k)
        c.makers["composition"] = bwd_maker(swiglu_composition, ins, (0, 1), cots, k)
        c.makers["compile"] = compiled(swiglu_eager)(
            lambda fn, ins=ins, k=k, cots=cots: bwd_maker(fn, ins, (0, 1), cots, k))
        if liger.has("LigerSiLUMulFunction"):
            c.makers["liger"] = bwd_maker(liger_swiglu, ins, (0, 1), cots, k)
        cases.append(c)

    # Rotary embedding on [B, 32, T, 128].
    def liger_rope_inputs(b, t, offset, seed):
        """q and k of 16 heads each, [B, H, T, D] views of [B, T, H, D] memory, and tables."""
        def ins(j):
            q = rand((b, t, HEADS // 2, HEAD_DIM), seed + j).transpose(1, 2)
            kk = rand((b, t, HEADS // 2, HEAD_DIM), seed + 50 + j).transpose(1, 2)
            cos, sin = rope_tables(t, offset, BF16)
            return q, kk, cos.unsqueeze(0), sin.unsqueeze(0)
        return ins

    def liger_rope(q, kk, cos, sin):
        return liger("LigerRopeFunction", q=q, k=kk, cos=cos, sin=sin)

    for b, t, offset, tag in ((1, 4096, 0, ""), (4, 4096, 0, ""), (32, 1, 1000, "_decode")):
        xb = b * HEADS * t * HEAD_DIM * ELEM
        c = Case(f"rope_fwd_bf16_{b}x{HEADS}x{t}x{HEAD_DIM}{tag}", 2 * xb, xb, t == 1)
        k = copies(xb)

        def ins(j, b=b, t=t, offset=offset):
            cos, sin = rope_tables(t, offset, torch.float32)
            return rand((b, HEADS, t, HEAD_DIM), 500 + j), cos, sin
        c.makers["eager"] = fwd_maker(rope_eager, ins, k)
        c.makers["composition"] = fwd_maker(
            rope_composition, lambda j, b=b, t=t, offset=offset: (rand((b, HEADS, t, HEAD_DIM), 500 + j), offset), k)
        c.makers["compile"] = compiled(rope_eager)(lambda fn, ins=ins, k=k: fwd_maker(fn, ins, k))
        if liger.has("LigerRopeFunction"):
            c.makers["liger"] = fwd_maker(liger_rope, liger_rope_inputs(b, t, offset, 500), k)
        cases.append(c)
    b, t = 1, 4096
    xb = b * HEADS * t * HEAD_DIM * ELEM
    c = Case(f"rope_bwd_bf16_{b}x{HEADS}x{t}x{HEAD_DIM}", 2 * xb, xb, False)
    k = copies(xb)

    def rope_ins(j):
        cos, sin = rope_tables(t, 0, torch.float32)
        return rand((b, HEADS, t, HEAD_DIM), 500 + j), cos, sin
    cots = cots_like(510)
    c.makers["eager"] = bwd_maker(rope_eager, rope_ins, (0,), cots, k)
    c.makers["compile"] = compiled(rope_eager)(lambda fn, k=k, cots=cots: bwd_maker(fn, rope_ins, (0,), cots, k))
    if liger.has("LigerRopeFunction"):
        def liger_cots(j, outs):
            # The layout Liger works in, so that it needs no copy of the cotangent.
            return tuple(rand((o.shape[0], o.shape[2], o.shape[1], o.shape[3]), 510 + 7 * j + i).transpose(1, 2)
                         for i, o in enumerate(outs))
        c.makers["liger"] = bwd_maker(liger_rope, liger_rope_inputs(b, t, 0, 500), (0, 1), liger_cots, k)
    cases.append(c)

    # Cross entropy over 4096 rows.
    n = 4096
    for v in (32000, 128256, 152064):
        lb = n * v * ELEM
        k = copies(lb)

        def ins(j, v=v):
            targets = (torch.arange(n, device="cuda", dtype=torch.int64) * 7919) % v
            return rand((n, v), 600 + j), targets

        c = Case(f"cross_entropy_fwd_bf16_{n}x{v}", lb + 8 * n, lb, False)
        c.makers["eager"] = fwd_maker(cross_entropy_eager, ins, k)
        c.makers["composition"] = fwd_maker(cross_entropy_composition, ins, k)
        c.makers["compile"] = compiled(cross_entropy_eager)(lambda fn, ins=ins, k=k: fwd_maker(fn, ins, k))
        if liger.has("LigerCrossEntropyFunction"):
            c.makers["liger"] = fwd_maker(
                lambda lg, tg: liger("LigerCrossEntropyFunction", _input=lg, target=tg, reduction="none")[0], ins, k)
        cases.append(c)

        def fwdbwd_maker(loss_fn, ins=ins, k=k):
            """The mean loss and the logits' gradient, every iteration."""
            def make():
                copies_ = []
                for j in range(k):
                    logits, targets = ins(j)
                    copies_.append((logits.requires_grad_(True), targets))

                def run(i):
                    logits, targets = copies_[i % k]
                    loss = loss_fn(logits, targets)
                    return loss, torch.autograd.grad(loss, logits)
                return run, k
            return make

        c = Case(f"cross_entropy_fwdbwd_bf16_{n}x{v}", 2 * lb + 12 * n, lb, False)
        c.makers["eager"] = fwdbwd_maker(cross_entropy_mean_eager)
        c.makers["composition"] = fwdbwd_maker(cross_entropy_mean_composition)
        c.makers["compile"] = compiled(cross_entropy_mean_eager)(lambda fn, m=fwdbwd_maker: m(fn))
        if liger.has("LigerCrossEntropyFunction"):
            c.makers["liger"] = fwdbwd_maker(
                lambda lg, tg: liger("LigerCrossEntropyFunction", _input=lg, target=tg, reduction="mean")[0])
        cases.append(c)

    # Attention decoding: q [B, 32, Lq, 128] over a cache k, v [B, 8, Lk, 128]; one query (no
    # mask) or 4 causal ones (a lower-right boolean mask, made before timing).
    for b, lq, lk in ((1, 1, 4096), (1, 1, 32768), (1, 1, 131072), (8, 1, 8192), (32, 1, 8192), (64, 1, 4096),
                      (1, 4, 32768), (32, 4, 8192)):
        qb = b * ATTN_HQ * lq * ATTN_D * ELEM
        kvb = b * ATTN_HKV * lk * ATTN_D * ELEM
        c = Case(f"sdpa_decode_bf16_B{b}_Lq{lq}_Lk{lk}", 2 * kvb + 2 * qb, 0, True)
        k = copies(2 * kvb + qb)

        def ins(j, b=b, lq=lq, lk=lk):
            mask = lower_right_mask(lq, lk) if lq > 1 else None
            return (rand((b, ATTN_HQ, lq, ATTN_D), 700 + j), rand((b, ATTN_HKV, lk, ATTN_D), 710 + j),
                    rand((b, ATTN_HKV, lk, ATTN_D), 720 + j), mask)
        c.makers["eager"] = fwd_maker(sdpa_eager, ins, k)
        cases.append(c)

    # Attention prefill: Lq = Lk = L, causal or full, in TFLOP/s.
    for b, t, causal, d in PREFILL:
        flops = 4 * b * ATTN_HQ * t * t * d // (2 if causal else 1)
        suffix = "" if d == ATTN_D else f"_D{d}"
        c = Case(f"sdpa_prefill_bf16_B{b}_L{t}_{'causal' if causal else 'full'}{suffix}", flops, 0, False, "TFLOP/s")
        k = copies((ATTN_HQ + 2 * ATTN_HKV) * b * t * d * ELEM)

        def ins(j, b=b, t=t, causal=causal, d=d):
            return (rand((b, ATTN_HQ, t, d), 730 + j), rand((b, ATTN_HKV, t, d), 740 + j),
                    rand((b, ATTN_HKV, t, d), 750 + j), None, causal, 1.0 / math.sqrt(d))
        c.makers["eager"] = fwd_maker(sdpa_eager, ins, k)
        c.makers["flash"] = flash_maker(c.name, ins, k)
        cases.append(c)

    # Attention's training step, causal: forward and backward, and the backward alone.
    for b, t in ((1, 2048), (1, 4096), (4, 4096), (1, 8192)):
        forward = 2 * b * ATTN_HQ * t * t * ATTN_D
        k = copies((2 * ATTN_HQ + 2 * ATTN_HKV) * b * t * ATTN_D * ELEM)

        def ins(j, b=b, t=t):
            return (rand((b, ATTN_HQ, t, ATTN_D), 760 + j), rand((b, ATTN_HKV, t, ATTN_D), 770 + j),
                    rand((b, ATTN_HKV, t, ATTN_D), 780 + j))

        def fwdbwd_maker(backend, ins=ins, k=k, b=b, t=t):
            def make():
                copies_ = []
                for j in range(k):
                    q, kk, v = ins(j)
                    copies_.append((q.requires_grad_(True), kk.requires_grad_(True), v.requires_grad_(True),
                                    rand((b, ATTN_HQ, t, ATTN_D), 790 + j)))

                def run(i):
                    q, kk, v, g = copies_[i % k]
                    if backend is None:
                        out = sdpa_eager(q, kk, v, causal=True)
                    else:
                        from torch.nn.attention import sdpa_kernel
                        with sdpa_kernel(backend):
                            out = sdpa_eager(q, kk, v, causal=True)
                    return torch.autograd.grad(out, (q, kk, v), g)
                return run, k
            return make

        c = Case(f"sdpa_fwdbwd_bf16_B{b}_L{t}_causal", int(3.5 * forward), 0, False, "TFLOP/s")
        c.makers["eager"] = fwdbwd_maker(None)
        try:
            from torch.nn.attention import SDPBackend
            c.makers["flash"] = fwdbwd_maker(SDPBackend.FLASH_ATTENTION)
        except Exception:
            pass
        cases.append(c)
        c = Case(f"sdpa_bwd_bf16_B{b}_L{t}_causal", int(2.5 * forward), 0, False, "TFLOP/s")
        c.makers["eager"] = bwd_maker(lambda q, kk, v: sdpa_eager(q, kk, v, causal=True), ins, (0, 1, 2),
                                      lambda j, outs, b=b, t=t: (rand((b, ATTN_HQ, t, ATTN_D), 790 + j),), k)
        cases.append(c)

    # Gated DeltaNet decoding: one step over the state, GB/s of the state read and written.
    for b in (1, 8, 32, 64):
        sb = b * GDN_HV * GDN_D * GDN_D * 4
        c = Case(f"gated_delta_decode_bf16_B{b}", 2 * sb, 0, True)
        k = copies(sb)

        def ins(j, b=b):
            q, kk, v, gate, _, beta, state = gdn_inputs(b, 1, 800 + 10 * j)
            return q, kk, v, gate, beta, state
        c.makers["eager"] = fwd_maker(gdn_step_eager, ins, k)
        c.makers["compile"] = compiled(gdn_step_eager)(lambda fn, ins=ins, k=k: fwd_maker(fn, ins, k))
        if fla.recurrent is not None:
            c.makers["fla_recurrent"] = fla_maker(f"fla_recurrent:{c.name}", fla.recurrent,
                                                  lambda j, b=b: gdn_inputs(b, 1, 800 + 10 * j), k, False)
        cases.append(c)

    # Gated DeltaNet prefill from a given state, TFLOP/s of the recurrence's FLOPs.
    for t in (4096, 8192, 32768):
        c = Case(f"gated_delta_prefill_bf16_B1_T{t}", 7 * t * GDN_HV * GDN_D * GDN_D, 0, False, "TFLOP/s")
        k = copies((2 * GDN_HK + GDN_HV) * t * GDN_D * ELEM)

        def ins(j, t=t):
            return gdn_inputs(1, t, 850 + 10 * j)
        if fla.recurrent is not None:
            c.makers["fla_recurrent"] = fla_maker(f"fla_recurrent:{c.name}", fla.recurrent, ins, k, False)
        if fla.chunk is not None:
            c.makers["fla_chunk"] = fla_maker(f"fla_chunk:{c.name}", fla.chunk, ins, k, True)
        cases.append(c)

    # Gated DeltaNet's derivative alone, TFLOP/s of twice the forward's FLOPs.
    for t in (4096, 8192, 32768):
        c = Case(f"gated_delta_bwd_bf16_B1_T{t}", 14 * t * GDN_HV * GDN_D * GDN_D, 0, False, "TFLOP/s")
        if fla.chunk is not None:
            k = copies((2 * GDN_HK + 2 * GDN_HV) * t * GDN_D * ELEM)
            c.makers["fla_chunk"] = fla_bwd_maker(c.name, fla.chunk, t, k)
        cases.append(c)

    # A mixture of experts' products: each token's choices sorted by expert (bench_fast's).
    def moe_choices(t, c):
        v = sorted((tt * 37 + j * 53 + c * 101 + (tt * tt * 7) % MOE_E) % MOE_E
                   for tt in range(t) for j in range(MOE_TOP))
        return v, len(set(v))

    moe_w = {}

    def moe_weights():
        if "w" not in moe_w:
            moe_w["w"] = random((MOE_E, MOE_N, MOE_K), torch.float32, 900).mul_(0.02).to(BF16)
        return moe_w["w"]

    def moe_inputs(t, c):
        v, _ = moe_choices(t, c)
        idx = torch.tensor(v, device="cuda", dtype=torch.int64)
        offs = torch.cumsum(torch.bincount(idx, minlength=MOE_E), 0).to(torch.int32)
        return rand((t * MOE_TOP, 1, MOE_K), 910 + c), idx, offs

    def moe_eager(x, idx, offs):
        return torch.bmm(x, moe_weights()[idx].transpose(1, 2))

    def moe_grouped(x, idx, offs):
        return torch._grouped_mm(x.view(-1, MOE_K), moe_weights().transpose(1, 2), offs=offs)

    def moe_makers(c, ins, k):
        c.makers["eager"] = fwd_maker(moe_eager, ins, k)
        if hasattr(torch, "_grouped_mm"):
            c.makers["grouped_mm"] = fwd_maker(moe_grouped, ins, k)

    for t in (1, 8, 64):
        _, distinct = moe_choices(t, 0)
        nbytes = distinct * MOE_N * MOE_K * ELEM
        c = Case(f"gather_mm_decode_bf16_T{t}", nbytes, 0, True)
        moe_makers(c, lambda j, t=t: moe_inputs(t, j), copies(nbytes))
        cases.append(c)
    t = 4096
    c = Case(f"gather_mm_prefill_bf16_T{t}", 2 * t * MOE_TOP * MOE_N * MOE_K, 0, False, "TFLOP/s")
    moe_makers(c, lambda j, t=t: moe_inputs(t, 0), 1)
    cases.append(c)
    return cases


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--only", default=None, help="run cases whose name contains this")
    ap.add_argument("--modes", default=",".join(MODES),
                    help=f"comma-separated modes among {', '.join(MODES)} (default: all)")
    ap.add_argument("--no-compile", action="store_true", help="skip torch.compile")
    ap.add_argument("--deadline", type=float, default=float(os.environ.get("GPU_FAST_PEERS_DEADLINE", "inf")),
                    help="seconds from the start within which to end: no case starts in its last 10 s, "
                         "no torch.compile case in its last 60 s")
    ap.add_argument("--batch-ms", type=float, default=100.0)
    ap.add_argument("--batches", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=3)
    args = ap.parse_args()
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    bad = [m for m in modes if m not in MODES]
    if bad:
        ap.error(f"unknown mode(s) {bad}; choose among {MODES}")
    if args.no_compile and "compile" in modes:
        modes.remove("compile")

    if not torch.cuda.is_available():
        emit("# torch sees no CUDA device")
        return 0
    t0 = time.time()
    props = torch.cuda.get_device_properties(0)
    l2 = max(getattr(props, "L2_cache_size", 0), L2_FLOOR)
    emit(f"# torch {torch.__version__} (CUDA {torch.version.cuda}), {props.name}, "
         f"{props.multi_processor_count} SMs, L2 {getattr(props, 'L2_cache_size', 0) / 1e6:.1f} MB")
    try:
        import triton
        emit(f"# triton {triton.__version__}")
    except Exception as e:
        emit(f"# triton: {type(e).__name__}")
    liger = Liger(load="liger" in modes)
    if liger.error:
        emit(f"# liger: unavailable, mode skipped ({liger.error})")
        modes.remove("liger")
    elif "liger" in modes:
        emit(f"# liger-kernel {liger.version}: {', '.join(sorted(liger.fns))}")
    fla_modes = [m for m in modes if m.startswith("fla_")]
    fla = Fla(load=bool(fla_modes))
    if fla.error:
        emit(f"# fla: unavailable, modes {', '.join(fla_modes)} skipped ({fla.error})")
        for m in fla_modes:
            modes.remove(m)
    elif fla_modes:
        emit(f"# fla: {fla.version}")
    try:
        import torch._functorch.config as functorch_config

        # A compiled graph whose saved buffers are donated to its backward cannot run the
        # backward twice, which the retained-graph timing of backward cases does.
        functorch_config.donated_buffer = False
    except Exception as e:
        log(f"# donated_buffer not set ({type(e).__name__}): compiled backward cases may fail")
    timer = Timer(args.batch_ms, args.batches, args.warmup)

    def copies(input_bytes):
        return max(1, min(8, math.ceil(3 * l2 / max(1, input_bytes))))

    def left():
        return args.deadline - (time.time() - t0)

    copy_gbs = None

    def report(mode, name, value, unit="GB/s"):
        frac = "-"
        if unit == "GB/s" and copy_gbs and math.isfinite(value):
            frac = f"{value / copy_gbs:.4f}"
        emit(f"{mode}:{name}\t{value:.4f}\t{unit}\t{frac}")

    # The copy ceiling first: every fraction is against it.
    try:
        copy_gbs = copy_ceiling_gbs(timer)
        report("torch_eager", "ceiling_copy_memcpy", copy_gbs)
    except Exception as e:
        report("torch_eager", "ceiling_copy_memcpy", float("nan"))
        log(f"# ceiling FAILED: {type(e).__name__}: {e}")
    torch.cuda.empty_cache()

    cases = [c for c in build_cases(copies, liger, fla) if args.only is None
             or args.only in c.name or (c.latency and args.only in c.name + "_us")]

    def measure(mode, case):
        """(median, min, max, count, copies); its inputs and graphs go when it returns."""
        run, k = case.makers[mode]()
        return (*timer.time(run), k)

    def run_case(mode, case):
        prefix = prefix_of(mode)
        t_start = time.time()
        try:
            med, lo, hi, count, k = measure(mode, case)
            report(prefix, case.name, case.amount / med / (1e12 if case.unit == "TFLOP/s" else 1e9), case.unit)
            if case.latency:
                report(prefix, case.name + "_us", med * 1e6, "us")
            log(f"# {prefix}:{case.name}: median {med * 1e3:.4f} ms (min {lo * 1e3:.4f}, max {hi * 1e3:.4f}; "
                f"{timer.batches}x{count}, k={k}) {time.time() - t_start:.1f} s")
        except Unsupported as e:  # a backend that does not take the case: no row
            skip(mode, case, str(e))
        except Exception as e:  # report and go on
            report(prefix, case.name, float("nan"), case.unit)
            if case.latency:
                report(prefix, case.name + "_us", float("nan"), "us")
            first = str(e).splitlines()[0] if str(e) else ""
            log(f"# {prefix}:{case.name} FAILED: {type(e).__name__}: {first}")
        try:
            torch.cuda.synchronize()
        except Exception as e:  # a broken context fails every later case too; say so once here
            log(f"# synchronize after {prefix}:{case.name} FAILED: {type(e).__name__}")
        torch.cuda.empty_cache()

    def skip(mode, case, why):
        emit(f"# {prefix_of(mode)}:{case.name} skipped ({why})")

    for case in cases:
        for mode in FIRST_MODES:
            if mode not in modes or mode not in case.makers:
                continue
            if left() < 10:
                skip(mode, case, "time budget")
                continue
            run_case(mode, case)

    if "compile" in modes:
        # Cases with a target first: they are the comparison that matters when time runs out.
        for case in sorted(cases, key=lambda c: not c.has_target):
            if "compile" not in case.makers:  # attention: no torch.compile peer
                continue
            if left() < 60:
                skip("compile", case, "time budget")
                continue
            run_case("compile", case)
    emit(f"# total {time.time() - t0:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
