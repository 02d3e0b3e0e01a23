#!/usr/bin/env python3
"""PyTorch peer of nuvec's Qwen3-Next decode benchmark (`nuvec bench --random
bench/configs/qwen3-next-12l.json`): a Qwen3-Next decoder written by hand in PyTorch with random
bf16 weights, on GPU 0, with flash-linear-attention's (FLA, the `fla` package of the fla-core
0.6.0 wheel) gated delta rule kernels for the linear-attention layers. It follows bench/lm_peers.py
(the Llama peer): the same arguments, JSON, copy ceiling, eager and CUDA-graph decode, and a
correctness check first.

What it measures, all in one run:

  1. Copy ceiling: `dst.copy_(src)` of a 4 GiB bf16 buffer (--copy-gib), median of 10 copies timed
     with CUDA events, reported as traffic (bytes read + written) / time and as bytes copied /
     time, as lm_peers.py does. `bytes_per_token` is what one decode step at batch 1 must read:
     the active weights only (every layer's attention or linear-attention projections, its
     convolution, gate parameters and norms, the router, the shared expert and its gate, the
     num_experts_per_tok routed experts' weights, i.e. 10 of 512; the final norm, lm_head and
     one embedding row), the full-attention layers' KV cache at `--context`, and the
     linear-attention layers' recurrent states (the float32 delta-rule state [Hv, Dk, Dv] and the
     convolution's window of the previous kernel - 1 inputs). The step also writes the recurrent
     states back (saved as `state_write_bytes`, not in the ceiling, as a read-only ceiling is the
     one lm_peers.py uses). The ceiling tokens/s at batch 1 is the traffic bandwidth /
     bytes_per_token (why traffic: see lm_peers.py); the copied-bytes ceiling is saved too.
  2. Eager decode tokens/s per batch size (--batches): a prefill of `--context` tokens (nuvec
     bench's token sequence, (i * 2654435761 + 7) % vocab, the same in every row), then after a
     warm-up `--steps` greedy steps, timed with CUDA events; tokens/s = batch * steps / time,
     median of 3 runs, each started from the same state.
  3. The same step captured once in a CUDA graph (torch.cuda.CUDAGraph) and replayed `--steps`
     times; tokens/s as above.

The model is transformers' Qwen3NextForCausalLM (transformers 5.x,
models/qwen3_next/modeling_qwen3_next.py) operation for operation, and reads its weights under
its names and layouts (random_weights() makes them; --check-hf loads the same tensors into
transformers' model). Layer i is "linear_attention" (Gated DeltaNet) except every
full_attention_interval-th, "full_attention" (or as `layer_types` says). Each layer: x + mix(norm(x)),
then x + moe(norm(x)), the norms zero-centred RMSNorms (x * (1 + w), in float32, rounded once).

  Gated DeltaNet: in_proj_qkvz and in_proj_ba, whose rows transformers' checkpoints group by key
  head (q, k, the group's values, the group's z; b, a: fix_query_key_value_ordering). That order
  is undone once, when the model is built, by permuting the weights' rows (the same outputs as
  transformers' per-token reshuffle, which is then not done at every step), and the two
  projections become one matmul whose output is [q | k | v | z | b | a]. q, k, v go through the
  causal depthwise convolution of kernel 4 (summed in float32 and rounded once, then SiLU); its
  state is the window of the last 4 inputs, [B, 4, C], rolled in place each step. beta =
  sigmoid(b), g = -exp(A_log) * softplus(a + dt_bias) (float32, the log-space decay FLA takes).
  The recurrence: decode through FLA's fused_recurrent_gated_delta_rule, prefill through its
  chunk_gated_delta_rule, with use_qk_l2norm_in_kernel=True and the default scale Dk^-1/2, as
  transformers calls them; the 16 query/key heads serve the 32 value heads (value head h reads
  key head h // 2, transformers' repeat_interleave; FLA does the grouping itself). FLA returns
  the new state [B, 32, 128, 128] float32, copied into the static one. Then RMSNormGated (the
  norm of each value head in float32, times its weight, times silu(z) in float32) and out_proj.
  With --gdr torch (the default on the CPU) the recurrence is a plain loop in float32 instead.

  Gated attention: q_proj gives each head's query and then its gate ([Hq, 2 * D]), k_proj, v_proj
  (one fused matmul here), q_norm / k_norm per head, RoPE on the first partial_rotary_factor *
  head_dim features (64 of 256, HF's rotate_half, base rope_theta), GQA (16 query heads over 2
  KV heads), SDPA, the output times sigmoid(gate), o_proj. The KV cache is static, [B, Hkv, S,
  D] with S = context + steps rounded up to 64; decode attends over all of it under an additive
  mask [1, 1, 1, S] opened in place at the step's position, the G = Hq / Hkv query heads of a KV
  head passed as G query rows of it, as lm_peers.py does.

  Sparse MoE (every layer with decoder_sparse_step 1): router logits, softmax in float32 over
  the 512 experts, top 10, renormalised (norm_topk_prob), rounded to bf16; the experts are
  SwiGLU (moe_intermediate_size 512) in transformers' stacks gate_up_proj [E, 2I, H] and
  down_proj [E, H, I]; plus the shared expert (SwiGLU, shared_expert_intermediate_size 512)
  times sigmoid(shared_expert_gate(x)). The router, the shared expert's gate/up and its gate are
  one fused matmul. Routed experts in a decode step, which a CUDA graph must run without host
  syncs, by --moe:
    gather (the default): the chosen experts' weights are gathered by index, gate_up_proj[idx]
      [N, 10, 2I, H] and down_proj[idx] [N, 10, H, I], and multiplied with batched matmuls. The
      gather copies them: the step reads the chosen experts' weights, writes the copy and reads
      it again, 3x the bytes of reading them once (an extra 2 * 10 * 3 * H * I * 2 bytes per
      sparse layer and row: 126 MB a layer, 1.51 GB a step at batch 1 for 12 layers, against
      bytes_per_token of 2.27 GB; saved as `moe_gather_copy_bytes`). Rows do not share copies.
    grouped_mm: the (row, expert) pairs sorted by expert, offsets from searchsorted, and
      torch's grouped GEMM (F.grouped_mm / torch._grouped_mm) over the whole stacks: only the
      chosen experts' weights are read, once, in place.
  Several modes (--moe gather,grouped_mm) are each measured. The prefill (not captured) groups
  the rows by expert with one host sync per layer and loops over the experts that have rows.

Everything a step changes (the convolution windows, the recurrent states, the KV cache, the
position, the mask and the next token ids) is a static buffer updated in place, so one graph
captured at the first position replays for every position; eager and graphed steps run the
same kernels. Random weights as nuvec's random_model makes them: N(0, 0.02), norms at scale 1
(zero-centred weights 0, RMSNormGated's weight 1).

Checks. In every run, first: the logits of token n + 1 from a 17-token prefill against those of
a 16-token prefill plus one decode step (relative max difference, bf16 tolerance: it checks the
state hand-over from FLA's chunked kernel to its recurrent one, the convolution window, the KV
cache and mask, and the decode MoE against the prefill's; the two paths' routers are traced,
and where bf16 rounding swapped an expert at a router near-tie between them the difference is
reported, not judged), and per batch the graph's first next-token ids against the eager step's. With --check-hf (then nothing is timed; on --device,
where transformers itself takes FLA's kernels if it finds them on a GPU): a tiny model (TINY:
hidden 64, 4 layers of both kinds, 8 experts, one dense MLP layer) with weights of realistic
scale is loaded into transformers' Qwen3NextForCausalLM as well, and the logits of a 12-token
prefill at batch 2 (every position) and of 4 decode steps (the same forced tokens) are compared,
in float32 (tolerance 1e-4 of the largest logit) and bfloat16 (5e-2), for every --moe mode. In
bfloat16 two experts whose router logits are an ulp apart can swap between two correct
implementations; both routers are traced, and a position at or past such a near-tie swap is
reported but not judged (any other swap fails). Needs transformers 5.x; exits 1 on a mismatch.

Usage (from the repository root; needs torch with CUDA, triton, and fla-core 0.6.0 importable,
e.g. its wheel's contents on PYTHONPATH; --gdr torch runs without FLA, slowly):

  python3 bench/qwen3_next_peers.py [--config bench/configs/qwen3-next-12l.json] [--batches 1]
      [--context 512] [--steps 64] [--moe gather] [--json OUT.json]
  python3 bench/qwen3_next_peers.py --check-hf [--device cpu]
  python3 bench/qwen3_next_peers.py --device cpu --config TINY.json ...   (the flow, on the CPU)
"""
import argparse
import gc
import inspect
import json
import os
import statistics
import time

import torch
import torch.nn.functional as F

# What the Llama peer already has (same folder): argument lists, padding, a step captured as a
# CUDA graph (warmed up on a side stream first), and the JSON written after every result.
from lm_peers import capture, ints, round_up, save

REPS = 3  # timed runs per measurement; the median is reported
# Two experts whose router probabilities are within this fraction of each other are a near-tie:
# bf16 rounding differences between two correct computations may swap them (about 3 ulps of a
# bf16 logit near 2).
NEAR_TIE = 0.05
# nuvec bench's prompt: token i is (i * 2654435761 + 7) % vocab (crates/nuvec-cli's run_bench).
NUVEC_TOKEN_MUL, NUVEC_TOKEN_ADD = 2_654_435_761, 7

# The model of --check-hf: every kind of layer and a dense MLP, sizes that catch swapped axes
# (Dk != Dv, shared intermediate != expert intermediate, head_dim != hidden / heads).
TINY = {
    "model_type": "qwen3_next", "hidden_size": 64, "num_hidden_layers": 4, "num_attention_heads": 4,
    "num_key_value_heads": 2, "head_dim": 32, "linear_num_key_heads": 2, "linear_num_value_heads": 4,
    "linear_key_head_dim": 32, "linear_value_head_dim": 16, "linear_conv_kernel_dim": 4,
    "num_experts": 8, "num_experts_per_tok": 3, "moe_intermediate_size": 32,
    "shared_expert_intermediate_size": 48, "intermediate_size": 96, "vocab_size": 256,
    "full_attention_interval": 2, "partial_rotary_factor": 0.25, "rope_theta": 10000.0,
    "rms_norm_eps": 1e-6, "decoder_sparse_step": 1, "mlp_only_layers": [2], "norm_topk_prob": True,
    "hidden_act": "silu", "tie_word_embeddings": False, "max_position_embeddings": 256,
}






def free_memory(dev):
    gc.collect()
    if dev.type == "cuda":
        torch.cuda.empty_cache()


def elapsed_ms(fn, dev):
    """Milliseconds fn takes: on a GPU its work by CUDA events, the queue drained first so that
    the host's launch time of fn's kernels counts (it does for a user waiting on a token)."""
    if dev.type != "cuda":
        t = time.perf_counter()
        fn()
        return (time.perf_counter() - t) * 1e3
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end)


_FLA = None


def fla_ops():
    """FLA's (chunk, fused_recurrent) gated delta rule, imported on first use."""
    global _FLA
    if _FLA is None:
        try:
            from fla.ops.gated_delta_rule import chunk_gated_delta_rule, fused_recurrent_gated_delta_rule
        except ImportError as e:
            raise SystemExit(
                f"qwen3_next_peers.py: flash-linear-attention is not importable ({e}). Install the "
                "fla-core 0.6.0 wheel (it needs triton and einops) or put its contents on PYTHONPATH; "
                "--gdr torch runs the recurrence as a plain PyTorch loop instead (slow, not the peer).")
        _FLA = (chunk_gated_delta_rule, fused_recurrent_gated_delta_rule)
    return _FLA


def fla_version():
    try:
        from importlib.metadata import version
        return version("fla-core")
    except Exception:
        try:
            import fla
            return getattr(fla, "__version__", "unknown")
        except ImportError:
            return None


def grouped_mm_fn():
    return getattr(F, "grouped_mm", None) or getattr(torch, "_grouped_mm", None)


def l2norm(x, eps=1e-6):
    """x / sqrt(sum(x^2) + eps) over the last axis: FLA's and transformers' l2norm."""
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + eps)


def gated_delta_loop(q, k, v, g, beta, state):
    """The gated delta rule as a float32 loop over positions (transformers'
    torch_recurrent_gated_delta_rule). q, k [B, T, Hk, Dk]; v [B, T, Hv, Dv]; g (log decay),
    beta [B, T, Hv]; state [B, Hv, Dk, Dv] float32, updated in place. Returns [B, T, Hv, Dv] in
    v's dtype. Value head h reads query/key head h // (Hv / Hk)."""
    rep = v.shape[2] // q.shape[2]
    q = l2norm(q.float()).repeat_interleave(rep, 2) * q.shape[-1] ** -0.5
    k = l2norm(k.float()).repeat_interleave(rep, 2)
    vf, g, beta = v.float(), g.float(), beta.float()
    s = state.clone()
    out = []
    for t in range(q.shape[1]):
        s = s * g[:, t].exp()[..., None, None]
        kt = k[:, t, :, :, None]  # [B, Hv, Dk, 1]
        delta = (vf[:, t] - (s * kt).sum(-2)) * beta[:, t, :, None]  # [B, Hv, Dv]
        s = s + kt * delta[:, :, None, :]
        out.append((s * q[:, t, :, :, None]).sum(-2))
    state.copy_(s)
    return torch.stack(out, 1).to(v.dtype)


def rope(x, cos, sin):
    """RoPE on the first cos.shape[-1] features of x (HF's rotate_half on them); the rest pass."""
    r = cos.shape[-1]
    xr, xp = x[..., :r], x[..., r:]
    x1, x2 = xr.chunk(2, -1)
    return torch.cat([xr * cos + torch.cat([-x2, x1], -1) * sin, xp], -1)


class Config:
    """The facts of an HF-style config.json that the model needs, with Qwen3NextConfig's defaults."""

    def __init__(self, cfg):
        if cfg.get("model_type", "qwen3_next") != "qwen3_next":
            raise SystemExit(f"qwen3_next_peers.py: model_type {cfg.get('model_type')!r} is not qwen3_next")
        rp = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
        if rp.get("rope_type", rp.get("type", "default")) != "default":
            raise SystemExit("qwen3_next_peers.py: only the default RoPE is modelled")
        if cfg.get("hidden_act", "silu") not in ("silu", "swish"):
            raise SystemExit(f"qwen3_next_peers.py: hidden_act {cfg['hidden_act']!r} is not modelled")
        self.raw = cfg
        self.H, self.V = cfg["hidden_size"], cfg["vocab_size"]
        self.L = cfg["num_hidden_layers"]
        self.HQ, self.HKV = cfg["num_attention_heads"], cfg.get("num_key_value_heads") or cfg["num_attention_heads"]
        self.D = cfg.get("head_dim") or self.H // self.HQ
        self.G = self.HQ // self.HKV
        self.eps = cfg.get("rms_norm_eps", 1e-6)
        self.theta = cfg.get("rope_theta") or rp.get("rope_theta", 10000.0)
        factor = cfg.get("partial_rotary_factor") or rp.get("partial_rotary_factor", 0.25)
        self.R = int(self.D * factor)  # rotated features of each head
        self.HK, self.HV = cfg.get("linear_num_key_heads", 16), cfg.get("linear_num_value_heads", 32)
        self.DK, self.DV = cfg.get("linear_key_head_dim", 128), cfg.get("linear_value_head_dim", 128)
        self.KW = cfg.get("linear_conv_kernel_dim", 4)
        self.KD, self.VD = self.HK * self.DK, self.HV * self.DV
        self.C = 2 * self.KD + self.VD  # convolution channels: q, k, v
        self.E, self.K = cfg.get("num_experts", 512), cfg.get("num_experts_per_tok", 10)
        self.I = cfg.get("moe_intermediate_size", 512)
        self.IS = cfg.get("shared_expert_intermediate_size", 512)
        self.ID = cfg.get("intermediate_size", 5632)
        self.norm_topk = cfg.get("norm_topk_prob", True)
        self.tied = cfg.get("tie_word_embeddings", False)
        types = cfg.get("layer_types")
        if types is None:
            every = cfg.get("full_attention_interval", 4)
            types = ["linear_attention" if (i + 1) % every else "full_attention" for i in range(self.L)]
        if len(types) != self.L or any(t not in ("linear_attention", "full_attention") for t in types):
            raise SystemExit(f"qwen3_next_peers.py: bad layer_types {types}")
        self.types = types
        step, dense = cfg.get("decoder_sparse_step", 1), set(cfg.get("mlp_only_layers") or [])
        self.sparse = [self.E > 0 and i not in dense and (i + 1) % step == 0 for i in range(self.L)]


def random_weights(c, dev, dt, realistic=False):
    """Random weights under transformers' names and shapes. Default: nuvec's random_model
    (N(0, 0.02), every norm at scale 1: the zero-centred norms' weights 0, RMSNormGated's 1).
    realistic: weights that keep activations O(1) and every parameter away from its neutral
    value (norms, A_log, dt_bias), so that --check-hf tests each of them."""
    sd = {}

    def w(name, *shape, std=None, mean=0.0):
        if std is None:
            std = shape[-1] ** -0.5 if realistic else 0.02
        # normal_ in place: no second copy of each weight while it is made.
        sd[name] = torch.empty(*shape, device=dev, dtype=dt).normal_(mean, std)

    def norm(name, n, centred=True):
        if realistic:
            w(name, n, std=0.1, mean=0.0 if centred else 1.0)
        else:
            sd[name] = (torch.zeros if centred else torch.ones)(n, device=dev, dtype=dt)

    H = c.H
    w("model.embed_tokens.weight", c.V, H, std=1.0 if realistic else 0.02)
    for i in range(c.L):
        p = f"model.layers.{i}."
        norm(p + "input_layernorm.weight", H)
        norm(p + "post_attention_layernorm.weight", H)
        if c.types[i] == "linear_attention":
            a = p + "linear_attn."
            w(a + "in_proj_qkvz.weight", 2 * c.KD + 2 * c.VD, H)
            w(a + "in_proj_ba.weight", 2 * c.HV, H)
            w(a + "conv1d.weight", c.C, 1, c.KW, std=0.5 if realistic else 0.02)
            w(a + "dt_bias", c.HV, std=0.5 if realistic else 0.02, mean=1.0 if realistic else 0.0)
            if realistic:  # transformers' initialisation: A uniform in [1, 16]
                sd[a + "A_log"] = torch.empty(c.HV, device=dev).uniform_(1, 16).log_().to(dt)
            else:
                w(a + "A_log", c.HV)
            norm(a + "norm.weight", c.DV, centred=False)
            w(a + "out_proj.weight", H, c.VD)
        else:
            a = p + "self_attn."
            w(a + "q_proj.weight", 2 * c.HQ * c.D, H)
            w(a + "k_proj.weight", c.HKV * c.D, H)
            w(a + "v_proj.weight", c.HKV * c.D, H)
            w(a + "o_proj.weight", H, c.HQ * c.D)
            norm(a + "q_norm.weight", c.D)
            norm(a + "k_norm.weight", c.D)
        m = p + "mlp."
        if c.sparse[i]:
            w(m + "gate.weight", c.E, H)
            w(m + "experts.gate_up_proj", c.E, 2 * c.I, H)
            w(m + "experts.down_proj", c.E, H, c.I)
            w(m + "shared_expert.gate_proj.weight", c.IS, H)
            w(m + "shared_expert.up_proj.weight", c.IS, H)
            w(m + "shared_expert.down_proj.weight", H, c.IS)
            w(m + "shared_expert_gate.weight", 1, H)
        else:
            w(m + "gate_proj.weight", c.ID, H)
            w(m + "up_proj.weight", c.ID, H)
            w(m + "down_proj.weight", H, c.ID)
    norm("model.norm.weight", H)
    if not c.tied:
        w("lm_head.weight", c.V, H)
    return sd


class Qwen3Next:
    """The decoder, built from transformers-named weights `sd` (entries it transforms are popped
    from sd, so their originals can be freed). gdr: "fla" or "torch"; moe: "gather" or
    "grouped_mm" (the routed experts of a decode step)."""

    def __init__(self, c, sd, dev, dt, gdr, moe="gather"):
        self.c, self.dev, self.dt, self.gdr, self.moe = c, dev, dt, gdr, moe
        self.trace = None
        f32 = torch.float32

        def scale(name):  # a zero-centred norm's scale, 1 + w, in float32 as transformers applies it
            return 1.0 + sd.pop(name).float()

        self.layers = []
        for i in range(c.L):
            p = f"model.layers.{i}."
            l = {"kind": c.types[i], "sparse": c.sparse[i],
                 "n1": scale(p + "input_layernorm.weight"), "n2": scale(p + "post_attention_layernorm.weight")}
            if l["kind"] == "linear_attention":
                a = p + "linear_attn."
                per = c.HV // c.HK
                # transformers' fix_query_key_value_ordering, done once on the rows: per key head
                # [q Dk, k Dk, v per*Dv, z per*Dv] and [b per, a per] become q | k | v | z | b | a.
                qkvz = sd.pop(a + "in_proj_qkvz.weight").view(c.HK, 2 * c.DK + 2 * per * c.DV, c.H)
                q, k, v, z = qkvz.split([c.DK, c.DK, per * c.DV, per * c.DV], 1)
                ba = sd.pop(a + "in_proj_ba.weight").view(c.HK, 2 * per, c.H)
                b, a_ = ba.split([per, per], 1)
                l["in"] = torch.cat([t.reshape(-1, c.H) for t in (q, k, v, z, b, a_)])
                del qkvz, q, k, v, z, ba, b, a_
                l["taps"] = sd.pop(a + "conv1d.weight").view(c.C, c.KW).t().to(f32).contiguous()  # [KW, C]
                l["neg_a"] = -sd.pop(a + "A_log").float().exp()
                l["dt_bias"] = sd.pop(a + "dt_bias").float()
                l["gnorm"] = sd.pop(a + "norm.weight")
                l["out"] = sd.pop(a + "out_proj.weight")
            else:
                a = p + "self_attn."
                l["qkv"] = torch.cat([sd.pop(a + n + "_proj.weight") for n in ("q", "k", "v")])
                l["o"] = sd.pop(a + "o_proj.weight")
                l["qn"], l["kn"] = scale(a + "q_norm.weight"), scale(a + "k_norm.weight")
            m = p + "mlp."
            if l["sparse"]:
                # One matmul for the router, the shared expert's gate and up, and its gate.
                l["moe_in"] = torch.cat([sd.pop(m + "gate.weight"), sd.pop(m + "shared_expert.gate_proj.weight"),
                                         sd.pop(m + "shared_expert.up_proj.weight"),
                                         sd.pop(m + "shared_expert_gate.weight")])
                l["gate_up"], l["down"] = sd.pop(m + "experts.gate_up_proj"), sd.pop(m + "experts.down_proj")
                l["shared_down"] = sd.pop(m + "shared_expert.down_proj.weight")
            else:
                l["gu"] = torch.cat([sd.pop(m + "gate_proj.weight"), sd.pop(m + "up_proj.weight")])
                l["down"] = sd.pop(m + "down_proj.weight")
            self.layers.append(l)
        self.emb = sd.pop("model.embed_tokens.weight")
        self.norm = scale("model.norm.weight")
        self.head = self.emb if c.tied else sd.pop("lm_head.weight")
        self.inv_freq = 1.0 / c.theta ** (torch.arange(0, c.R, 2, device=dev, dtype=f32) / c.R)
        self.expert_ids = torch.arange(c.E, device=dev)
        if gdr == "fla":
            fla_ops()
        if moe == "grouped_mm" and grouped_mm_fn() is None:
            raise SystemExit("qwen3_next_peers.py: --moe grouped_mm needs torch's grouped_mm (2.8 or later)")

    # -- sizes --------------------------------------------------------------------------------------

    def expert_bytes(self):
        l = next((l for l in self.layers if l["sparse"]), None)
        return 0 if l is None else l["gate_up"][0].nbytes + l["down"][0].nbytes

    def weight_bytes_per_token(self):
        """Bytes of weights one decode step at batch 1 reads: every layer's tensors, except that of
        the stacked experts only num_experts_per_tok are read; the final norm, lm_head, and one
        embedding row (not the whole table)."""
        total = 0
        for l in self.layers:
            for name, t in l.items():
                if not isinstance(t, torch.Tensor) or (l["sparse"] and name in ("gate_up", "down")):
                    continue
                total += t.nbytes
            if l["sparse"]:
                total += self.c.K * self.expert_bytes()
        head = 0 if self.c.tied else self.head.nbytes
        return total + self.norm.nbytes + head + self.c.H * self.emb.element_size()

    def kv_bytes(self, batch, positions):
        full = sum(l["kind"] == "full_attention" for l in self.layers)
        return 2 * full * batch * self.c.HKV * positions * self.c.D * self.emb.element_size()

    def state_bytes(self, batch):
        """The linear-attention layers' recurrent state a step reads: the delta rule's float32
        [Hv, Dk, Dv] and the convolution's previous kernel - 1 inputs."""
        c, lin = self.c, sum(l["kind"] == "linear_attention" for l in self.layers)
        return lin * batch * (c.HV * c.DK * c.DV * 4 + (c.KW - 1) * c.C * self.emb.element_size())

    def moe_gather_copy_bytes(self, batch):
        """The extra traffic of --moe gather per step: each row's chosen experts written to the
        copy and read back."""
        return 2 * batch * self.c.K * self.expert_bytes() * sum(l["sparse"] for l in self.layers)

    # -- state --------------------------------------------------------------------------------------

    def new_state(self, batch, size):
        """Per layer: (conv window [B, KW, C], delta-rule state [B, Hv, Dk, Dv] float32) or the KV
        cache (k, v) [B, Hkv, size, D]. Zeros, not empty: masked positions are still multiplied in,
        and garbage NaN/inf there would turn the softmax into NaN; the recurrent ones start at 0."""
        c, z = self.c, lambda *s, dt=self.dt: torch.zeros(*s, device=self.dev, dtype=dt)
        return [(z(batch, c.KW, c.C), z(batch, c.HV, c.DK, c.DV, dt=torch.float32))
                if l["kind"] == "linear_attention" else
                (z(batch, c.HKV, size, c.D), z(batch, c.HKV, size, c.D)) for l in self.layers]

    # -- layers -------------------------------------------------------------------------------------

    def znorm(self, x, scale):
        """Zero-centred RMSNorm: float32, times 1 + w, rounded once."""
        return F.rms_norm(x.float(), (x.shape[-1],), scale, self.c.eps).to(x.dtype)

    def gated_delta_net(self, l, h, conv, rec):
        c = self.c
        B, T, _ = h.shape
        mixed, z, b, a = F.linear(h, l["in"]).split([c.C, c.VD, c.HV, c.HV], -1)
        # The causal convolution over the window's last KW - 1 inputs and the T new ones; the
        # window keeps the last KW inputs (zeros before the first token).
        win = torch.cat([conv[:, 1:], mixed], 1)  # [B, KW - 1 + T, C]
        conv.copy_(win[:, -c.KW:])
        if T == 1:
            y = (win.float() * l["taps"]).sum(1, keepdim=True)
        else:
            y = sum(win[:, j:j + T].float() * l["taps"][j] for j in range(c.KW))
        y = F.silu(y.to(h.dtype))
        q, k, v = y.split([c.KD, c.KD, c.VD], -1)
        q, k, v = q.reshape(B, T, c.HK, c.DK), k.reshape(B, T, c.HK, c.DK), v.reshape(B, T, c.HV, c.DV)
        beta = b.sigmoid()
        g = l["neg_a"] * F.softplus(a.float() + l["dt_bias"])
        if self.gdr == "fla":
            chunk, fused = fla_ops()
            fn = fused if T == 1 else chunk
            o, new = fn(q, k, v, g=g, beta=beta, initial_state=rec, output_final_state=True,
                        use_qk_l2norm_in_kernel=True)
            rec.copy_(new)
        else:
            o = gated_delta_loop(q, k, v, g, beta, rec)
        # RMSNormGated: the norm in float32, rounded, times its weight; times silu(z) in float32.
        o = F.rms_norm(o.float(), (c.DV,), None, c.eps).to(h.dtype) * l["gnorm"]
        o = (o.float() * F.silu(z.reshape(B, T, c.HV, c.DV).float())).to(h.dtype)
        return F.linear(o.reshape(B, T, c.VD), l["out"])

    def attention(self, l, h, kc, vc, pos, cos, sin, mask):
        c = self.c
        B, T, _ = h.shape
        HQ, HKV, D = c.HQ, c.HKV, c.D
        qg, k, v = F.linear(h, l["qkv"]).split([2 * HQ * D, HKV * D, HKV * D], -1)
        qg = qg.view(B, T, HQ, 2 * D)
        q, gate = self.znorm(qg[..., :D], l["qn"]), qg[..., D:].reshape(B, T, HQ * D)
        k = self.znorm(k.view(B, T, HKV, D), l["kn"])
        if mask is None:  # prefill from position 0
            q, k = rope(q.transpose(1, 2), cos, sin), rope(k.transpose(1, 2), cos, sin)
            v = v.view(B, T, HKV, D).transpose(1, 2)
            kc.index_copy_(2, pos, k)
            vc.index_copy_(2, pos, v)
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=c.G > 1)
            o = o.transpose(1, 2).reshape(B, T, HQ * D)
        else:  # one token: query heads kv*G .. kv*G+G-1 as G query rows of KV head kv
            q = rope(q.reshape(B, HKV, c.G, D), cos, sin)
            kc.index_copy_(2, pos, rope(k.reshape(B, HKV, 1, D), cos, sin))
            vc.index_copy_(2, pos, v.reshape(B, HKV, 1, D))
            o = F.scaled_dot_product_attention(q, kc, vc, attn_mask=mask).reshape(B, 1, HQ * D)
        return F.linear(o * gate.sigmoid(), l["o"])

    def experts_gather(self, l, x, idx):
        """[N, K, H]: each row's chosen experts, their stacked weights gathered by index (a copy)
        and multiplied in batched matmuls; no host sync."""
        y = torch.matmul(l["gate_up"][idx], x[:, None, :, None]).squeeze(-1)  # [N, K, 2I]
        g, u = y.chunk(2, -1)
        return torch.matmul(l["down"][idx], (F.silu(g) * u)[..., None]).squeeze(-1)

    def experts_grouped_mm(self, l, x, idx):
        """[N, K, H] through torch's grouped GEMM over the stacks: the (row, slot) pairs sorted
        by expert, each expert's group delimited by offsets; reads only the chosen experts, in
        place; no host sync."""
        N, K = idx.shape
        chosen, order = idx.reshape(-1).sort(stable=True)
        offs = torch.searchsorted(chosen, self.expert_ids, right=True).to(torch.int32)  # group ends
        mm = grouped_mm_fn()
        y = mm(x[order // K], l["gate_up"].transpose(1, 2), offs=offs)  # [N*K, 2I]
        g, u = y.chunk(2, -1)
        y = mm(F.silu(g) * u, l["down"].transpose(1, 2), offs=offs)  # [N*K, H]
        return torch.empty_like(y).index_copy_(0, order, y).view(N, K, -1)

    def experts_looped(self, l, x, idx):
        """[N, K, H] by grouping the rows per expert (one host sync) and a loop over the experts
        that have rows: the prefill's way, as transformers' eager experts."""
        N, K = idx.shape
        chosen, order = idx.reshape(-1).sort(stable=True)
        counts = torch.bincount(chosen, minlength=self.c.E).tolist()
        xs, ys, start = x[order // K], [], 0
        for e, n in enumerate(counts):
            if n:
                g, u = F.linear(xs[start:start + n], l["gate_up"][e]).chunk(2, -1)
                ys.append(F.linear(F.silu(g) * u, l["down"][e]))
                start += n
        y = torch.cat(ys)
        return torch.empty_like(y).index_copy_(0, order, y).view(N, K, -1)

    def mlp(self, l, h, decode):
        c = self.c
        if not l["sparse"]:
            g, u = F.linear(h, l["gu"]).chunk(2, -1)
            return F.linear(F.silu(g) * u, l["down"])
        x = h.reshape(-1, c.H)
        logits, sgu, sgate = F.linear(x, l["moe_in"]).split([c.E, 2 * c.IS, 1], -1)
        if self.trace is not None:  # --check-hf compares the routers
            self.trace.append(logits)
        probs = logits.float().softmax(-1)
        w, idx = probs.topk(c.K, -1)
        if c.norm_topk:
            w = w / w.sum(-1, keepdim=True)
        w = w.to(x.dtype)
        if not decode:
            y = self.experts_looped(l, x, idx)
        elif self.moe == "grouped_mm":
            y = self.experts_grouped_mm(l, x, idx)
        else:
            y = self.experts_gather(l, x, idx)
        routed = (y * w[..., None]).sum(1)
        g, u = sgu.chunk(2, -1)
        shared = F.linear(F.silu(g) * u, l["shared_down"])
        return (routed + sgate.sigmoid() * shared).view(h.shape)

    def hidden(self, ids, pos, state, mask=None):
        """The final-normed hidden states [B, T, H] of ids [B, T] at positions pos [T] (a long
        device tensor). mask None: a prefill from position 0 (the states must be fresh). mask
        [1, 1, 1, S]: one decode step (T == 1) over the whole KV cache under the additive mask."""
        x = F.embedding(ids, self.emb)
        # cos/sin in float32 then the model's dtype, once per forward, as HF's rotary embedding.
        f = pos.to(torch.float32)[:, None] * self.inv_freq[None, :]
        e = torch.cat([f, f], -1)
        cos, sin = e.cos().to(x.dtype), e.sin().to(x.dtype)
        for l, (s0, s1) in zip(self.layers, state):
            h = self.znorm(x, l["n1"])
            if l["kind"] == "linear_attention":
                x = x + self.gated_delta_net(l, h, s0, s1)
            else:
                x = x + self.attention(l, h, s0, s1, pos, cos, sin, mask)
            x = x + self.mlp(l, self.znorm(x, l["n2"]), mask is not None)
        return self.znorm(x, self.norm)

    def logits(self, ids, pos, state, mask=None):
        """Logits [B, V] of the last position (see hidden)."""
        return F.linear(self.hidden(ids, pos, state, mask)[:, -1], self.head)

    def all_logits(self, ids, pos, state, mask=None):
        return F.linear(self.hidden(ids, pos, state, mask), self.head)


def copy_bandwidth(dev, nbytes, reps=10):
    """(bytes copied, median seconds) of dst.copy_(src) over nbytes of bf16."""
    n = nbytes // 2
    src = torch.empty(n, device=dev, dtype=torch.bfloat16).normal_()  # not zeros: no compressible memory
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    ms = statistics.median(elapsed_ms(lambda: dst.copy_(src), dev) for _ in range(reps))
    del src, dst
    free_memory(dev)
    return n * 2, ms / 1e3


def decode_mask(m, size, upto):
    mask = torch.full((1, 1, 1, size), float("-inf"), device=m.dev, dtype=m.dt)
    mask[..., :upto] = 0
    return mask


def self_check(m, n=16):
    """(relative max |logit| difference, smallest router margin of a swap or None): a prefill of
    n + 1 tokens against a prefill of n and one decode step of the last token. The two paths
    round differently (matmuls over n rows, a matrix-vector product for one), and in bf16 that
    can swap two of 512 experts whose router logits are an ulp apart; the routers of both are
    traced, and a swap's margin is returned (see route_flips)."""
    S = round_up(n + 1, 64)
    ids = torch.randint(0, m.c.V, (1, n + 1), device=m.dev)
    m.trace = []
    full = m.logits(ids, torch.arange(n + 1, device=m.dev), m.new_state(1, S)).float()
    routes_full, m.trace = m.trace, []
    state = m.new_state(1, S)
    m.logits(ids[:, :n], torch.arange(n, device=m.dev), state)
    routes_n, m.trace = m.trace, []
    one = m.logits(ids[:, n:], torch.tensor([n], device=m.dev), state, decode_mask(m, S, n + 1)).float()
    routes_one, m.trace = m.trace, None
    err = ((full - one).abs().max() / full.abs().max()).item()
    swaps = route_flips(m.c, routes_full, [torch.cat([a, b]) for a, b in zip(routes_n, routes_one)])
    margin = min((mg for mg, _ in swaps.values()), default=None)
    del full, one, state, routes_full, routes_n, routes_one
    free_memory(m.dev)
    return err, margin




def decode(m, b, context, steps):
    """Eager and CUDA-graph decode at batch b after a prefill of context tokens: dict of
    tokens/s, ms per step and notes."""
    dev = m.dev
    S = round_up(context + steps, 64)  # 64: aligned mask rows, no padding copy in SDPA
    # The context, as nuvec bench feeds it: prefilled once at batch 1 and copied to every row
    # (every row has the same prompt there too).
    prompt = torch.tensor([[(i * NUVEC_TOKEN_MUL + NUVEC_TOKEN_ADD) % m.c.V for i in range(context)]], device=dev)
    one = m.new_state(1, S)
    first = m.logits(prompt, torch.arange(context, device=dev), one).argmax(-1)
    state = m.new_state(b, S)
    for dst, src in zip((t for pair in state for t in pair), (t for pair in one for t in pair)):
        dst.copy_(src.expand_as(dst))
    del one
    # What a step changes besides the KV cache past the context (overwritten, and masked until
    # then): the linear-attention layers' states, saved to start every run from the same place.
    saved = [(s0.clone(), s1.clone()) for l, (s0, s1) in zip(m.layers, state) if l["kind"] == "linear_attention"]
    live = [(s0, s1) for l, (s0, s1) in zip(m.layers, state) if l["kind"] == "linear_attention"]
    ids0 = first.view(1, 1).expand(b, 1).clone()
    ids = ids0.clone()
    pos = torch.full((1,), context, device=dev, dtype=torch.long)
    mask = torch.full((1, 1, 1, S), float("-inf"), device=dev, dtype=m.dt)

    def reset():  # back to the first decode position; not timed
        pos.fill_(context)
        mask.fill_(float("-inf"))
        mask[..., :context] = 0
        ids.copy_(ids0)
        for (a, b_), (sa, sb) in zip(live, saved):
            a.copy_(sa)
            b_.copy_(sb)

    def step():  # everything on the device: open the position, run, write the token, advance
        mask.index_fill_(3, pos, 0.0)
        ids.copy_(m.logits(ids, pos, state, mask).argmax(-1).view(b, 1))
        pos.add_(1)

    def timed(fn):
        out = []
        for _ in range(REPS):
            reset()
            out.append(elapsed_ms(lambda: [fn() for _ in range(steps)], dev))
        return out

    r = {"batch": b, "context": context, "steps": steps, "cache_len": S, "moe": m.moe, "gdr": m.gdr}
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
    if dev.type != "cuda":
        r["graph_note"] = "no CUDA graph on the CPU"
    else:
        try:
            reset()
            g = capture(step)
        except RuntimeError as e:  # a backend that will not capture: retry without cuDNN attention
            r["graph_note"] = f"capture failed ({str(e).splitlines()[0][:200]}); retried with flash/efficient/math SDPA"
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
    del g, state, saved, live, mask, ids, ids0, pos
    free_memory(dev)
    return r


def route_flips(c, hf_logits, my_logits):
    """Rows whose chosen experts differ between transformers' router logits and ours (lists, one
    [N, E] tensor per sparse layer), each with transformers' margin between its k-th and
    (k+1)-th probability, relative to the k-th, and whether a layer after the swap mixes it
    into later positions: {row: (smallest margin, spreads)}."""
    flips = {}
    sparse = [i for i, s in enumerate(c.sparse) if s]
    for j, (h, m) in enumerate(zip(hf_logits, my_logits)):
        top = h.float().softmax(-1).topk(c.K + 1, -1)
        ours = m.float().softmax(-1).topk(c.K, -1).indices
        differ = (top.indices[:, :c.K].sort(-1).values != ours.sort(-1).values).any(-1)
        margin = (top.values[:, c.K - 1] - top.values[:, c.K]) / top.values[:, c.K - 1]
        for r in differ.nonzero().flatten().tolist():
            mg, spreads = flips.get(r, (1.0, False))
            flips[r] = (min(mg, margin[r].item()), spreads or sparse[j] < c.L - 1)
    return flips


def check_hf(dev, modes, gdr):
    """The model against transformers' Qwen3NextForCausalLM on TINY's shapes and the same
    weights: prefill logits of every position and 4 decode steps' logits (the same forced
    tokens), in float32 and bf16, for each MoE mode. Both routers are traced: in bf16 two experts
    whose router logits differ by an ulp can swap between two correct implementations, and
    that changes the row's later positions; a position past such a near-tie (transformers' k-th
    and (k+1)-th probabilities within NEAR_TIE of each other) is reported but not judged, any
    other swap fails. Returns (results, all within tolerance)."""
    try:
        import transformers
        from transformers import DynamicCache, Qwen3NextConfig, Qwen3NextForCausalLM
    except ImportError as e:
        raise SystemExit(f"qwen3_next_peers.py: --check-hf needs transformers 5.x ({e})")
    c = Config(TINY)
    hc = Qwen3NextConfig(**TINY)
    # The facts transformers derived from TINY must be the ones this model uses.
    assert list(hc.layer_types) == c.types, (hc.layer_types, c.types)
    rp = getattr(hc, "rope_parameters", None) or {}
    assert rp.get("rope_theta", getattr(hc, "rope_theta", None)) == c.theta, rp
    assert rp.get("partial_rotary_factor", getattr(hc, "partial_rotary_factor", None)) == TINY["partial_rotary_factor"]
    print(f"check against transformers {transformers.__version__} on {dev}: {json.dumps(TINY)}")
    B, T, steps = 2, 12, 4
    out, ok = [], True
    for dt, tol in ((torch.float32, 1e-4), (torch.bfloat16, 5e-2)):
        torch.manual_seed(1)
        sd = random_weights(c, dev, dt, realistic=True)
        hf = Qwen3NextForCausalLM(hc).to(device=dev, dtype=dt).eval()
        missing, unexpected = hf.load_state_dict(sd, strict=False)
        if missing or unexpected:
            raise SystemExit(f"check: weights do not map onto transformers' names: missing {missing}, "
                             f"unexpected {unexpected}")
        hf_routes = []
        for layer in hf.model.layers:
            if hasattr(layer.mlp, "gate"):  # the router's first output is its logits
                layer.mlp.gate.register_forward_hook(
                    lambda mod, inp, o: hf_routes.append(o[0] if isinstance(o, tuple) else o))
        ids = torch.randint(0, c.V, (B, T + steps), device=dev)
        cache_arg = "cache" if "cache" in inspect.signature(hf.forward).parameters else "past_key_values"
        cache = DynamicCache(config=hf.config)
        want, hf_calls = [], []
        for t0, t1 in [(0, T)] + [(t, t + 1) for t in range(T, T + steps)]:
            hf_routes.clear()
            want.append(hf(input_ids=ids[:, t0:t1], use_cache=True, **{cache_arg: cache}).logits.float())
            hf_calls.append(list(hf_routes))
        for moe in modes:
            m = Qwen3Next(c, dict(sd), dev, dt, gdr, moe)
            m.trace = []
            S = round_up(T + steps, 64)
            state = m.new_state(B, S)
            first_flip = {}  # row -> first position past which its routing differed from transformers'
            swapped = set()  # (row, position) whose own routing differed
            for i, (t0, t1) in enumerate([(0, T)] + [(t, t + 1) for t in range(T, T + steps)]):
                m.trace.clear()
                mask = None if i == 0 else decode_mask(m, S, t1)
                got = m.all_logits(ids[:, t0:t1], torch.arange(t0, t1, device=dev), state, mask).float()
                flips = route_flips(c, hf_calls[i], m.trace)
                for r, (margin, spreads) in flips.items():
                    b, t = divmod(r, t1 - t0)
                    swapped.add((b, t0 + t))
                    if spreads:  # a later layer carries the difference to the row's later positions
                        first_flip[b] = min(first_flip.get(b, t0 + t + 1), t0 + t + 1)
                margins = sorted(mg for mg, _ in flips.values())
                near = all(mg < NEAR_TIE for mg in margins)
                per_pos = (got - want[i]).abs().amax(-1)  # [B, t1 - t0]
                scale = want[i].abs().max().item()
                judged = torch.tensor([[t0 + t < first_flip.get(b, 1 << 30) and (b, t0 + t) not in swapped
                                        for t in range(t1 - t0)] for b in range(B)], device=per_pos.device)
                diff = per_pos.max().item()
                rel_judged = (per_pos[judged].max().item() if judged.any() else 0.0) / scale
                good = rel_judged < tol and near
                ok &= good
                what = f"prefill {T} tokens, all positions" if i == 0 else f"decode step {i} (position {t0})"
                out.append({"dtype": str(dt).removeprefix("torch."), "moe": moe, "gdr": gdr, "what": what,
                            "max_abs_diff": diff, "rel_diff": diff / scale, "rel_diff_judged": rel_judged,
                            "positions_past_router_near_tie": int((~judged).sum()),
                            "router_swaps": len(flips), "router_swap_margins": margins, "ok": good})
                note = ""
                if flips:
                    note += f"  [router swap at {len(flips)} row(s), margin {', '.join(f'{v:.1e}' for v in margins)}]"
                if not judged.all():
                    note += f"  [{int((~judged).sum())} position(s) at or past a swap not judged]"
                print(f"  {out[-1]['dtype']:>8} moe {moe:10} {what:36} max|d| {diff:.3e}  "
                      f"/ max|logit| {diff / scale:.3e}, judged {rel_judged:.3e}  {'ok' if good else 'MISMATCH'}{note}")
            del m, state
        del hf, sd
        free_memory(dev)
    return out, ok




def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", default="bench/configs/qwen3-next-12l.json", help="HF-style Qwen3-Next config.json")
    ap.add_argument("--batches", default="1", help="decode batch sizes, comma-separated")
    ap.add_argument("--context", type=int, default=512, help="tokens prefilled before decode is timed")
    ap.add_argument("--steps", type=int, default=64, help="decode steps timed")
    ap.add_argument("--moe", default="gather",
                    help="routed experts of a decode step: gather, grouped_mm, or both comma-separated")
    ap.add_argument("--gdr", choices=["auto", "fla", "torch"], default="auto",
                    help="gated delta rule: FLA's kernels or a float32 loop (auto: fla on CUDA, torch on the CPU)")
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    ap.add_argument("--dtype", choices=["bfloat16", "float32"], default="bfloat16")
    ap.add_argument("--copy-gib", type=float,
                    help="size of the copy-ceiling buffer (default 4 on CUDA, 0.25 on the CPU)")
    ap.add_argument("--check-hf", action="store_true", help="compare with transformers on a tiny model and exit")
    ap.add_argument("--json", help="write every number here")
    a = ap.parse_args()
    if a.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("qwen3_next_peers.py: no CUDA device (--device cpu runs on the CPU)")
    dev = torch.device("cuda:0" if a.device == "cuda" else "cpu")
    gdr = a.gdr if a.gdr != "auto" else ("fla" if dev.type == "cuda" else "torch")
    modes = [s.strip() for s in a.moe.split(",") if s.strip()]
    if any(s not in ("gather", "grouped_mm") for s in modes) or not modes:
        raise SystemExit(f"qwen3_next_peers.py: --moe takes gather and/or grouped_mm, got {a.moe!r}")
    dt = getattr(torch, a.dtype)
    if gdr == "fla":
        fla_ops()  # before anything takes time: a missing wheel fails here

    if a.check_hf:
        with torch.inference_mode():
            results, ok = check_hf(dev, modes, gdr)
        save(a.json, {"check_hf": results, "ok": ok, "torch": torch.__version__, "fla": fla_version()})
        raise SystemExit(0 if ok else 1)

    with open(a.config) as f:
        cfg = json.load(f)
    c = Config(cfg)
    name = os.path.splitext(os.path.basename(a.config))[0]
    torch.manual_seed(0)
    out = {"device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu", "torch": torch.__version__,
           "fla": fla_version() if gdr == "fla" else None, "config": a.config, "config_name": name,
           "args": vars(a), "gdr": gdr, "decode": [], "skipped": []}

    with torch.inference_mode():
        # The copy first, before the weights take memory.
        copy_gib = a.copy_gib if a.copy_gib is not None else (4 if dev.type == "cuda" else 0.25)
        copied, sec = copy_bandwidth(dev, int(copy_gib * 2**30) // 2 * 2)
        traffic_gbs, read_gbs = 2 * copied / sec / 1e9, copied / sec / 1e9
        m = Qwen3Next(c, random_weights(c, dev, dt), dev, dt, gdr, modes[0])
        wbytes = m.weight_bytes_per_token()
        kvbytes = m.kv_bytes(1, a.context)
        sbytes = m.state_bytes(1)
        per_token = wbytes + kvbytes + sbytes
        ceiling = traffic_gbs * 1e9 / per_token
        ceiling_read = read_gbs * 1e9 / per_token
        lin = sum(t == "linear_attention" for t in c.types)
        out.update({"shapes": {"hidden": c.H, "layers": c.L, "linear_layers": lin, "full_layers": c.L - lin,
                               "heads": c.HQ, "kv_heads": c.HKV, "head_dim": c.D, "rotary_dims": c.R,
                               "linear_key_heads": c.HK, "linear_value_heads": c.HV, "linear_key_dim": c.DK,
                               "linear_value_dim": c.DV, "conv_kernel": c.KW, "experts": c.E, "experts_per_tok": c.K,
                               "moe_intermediate": c.I, "shared_intermediate": c.IS, "vocab": c.V},
                    "copy_bytes": copied, "copy_traffic_gbs": traffic_gbs, "copy_read_gbs": read_gbs,
                    "weight_bytes_per_token": wbytes, "kv_bytes_per_token": kvbytes, "state_bytes_per_token": sbytes,
                    "state_write_bytes": sbytes, "bytes_per_token": per_token,
                    "moe_gather_copy_bytes": m.moe_gather_copy_bytes(1),
                    "ceiling_tokens_per_s": ceiling, "ceiling_tokens_per_s_read_bw": ceiling_read,
                    "model": "transformers' Qwen3NextForCausalLM; gated delta rule by "
                             + ("FLA (fused_recurrent decode, chunk prefill)" if gdr == "fla" else "a float32 loop")
                             + "; decode attention over the whole static cache under an additive mask opened in place"})
        print(f"{out['device']}, torch {torch.__version__}, fla {out['fla']}, config {name} ({a.config}): "
              f"H {c.H}, layers {c.L} ({lin} linear, {c.L - lin} full), heads {c.HQ}/{c.HKV}x{c.D}, "
              f"linear {c.HK}/{c.HV}x{c.DK}/{c.DV}, experts {c.K}/{c.E}x{c.I} + shared {c.IS}, vocab {c.V}")
        print(f"copy ceiling: {traffic_gbs:.0f} GB/s read + written ({read_gbs:.0f} GB/s copied), "
              f"{copied / 2**30:.2f} GiB bf16, median of 10")
        print(f"bytes_per_token at batch 1, context {a.context}: {per_token / 1e9:.3f} GB (weights {wbytes / 1e9:.3f} "
              f"+ KV {kvbytes / 1e9:.4f} + recurrent states {sbytes / 1e9:.4f}); ceiling {ceiling:.1f} tok/s "
              f"({ceiling_read:.1f} at the copied-bytes rate); --moe gather copies "
              f"{m.moe_gather_copy_bytes(1) / 1e9:.3f} GB more")

        save(a.json, out)
        err, margin = self_check(m)
        out["check_rel_logit_diff"] = err
        out["check_router_swap_margin"] = margin
        tol = 5e-2 if dt == torch.bfloat16 else 1e-3
        verdict = "ok" if err < tol else "MISMATCH"
        if margin is not None:  # an expert swapped between the paths: judged by the router, not the logits
            verdict = (f"{'ok' if err < tol else 'not judged'}: a router near-tie (margin {margin:.1e}) swapped "
                       "an expert between the two paths" if margin < NEAR_TIE else
                       f"MISMATCH: the two paths chose different experts (margin {margin:.1e})")
        print(f"check: prefill vs prefill + decode step, max |dlogit| / max |logit| = {err:.2e} ({verdict})")

        print(f"\ndecode, context {a.context}, {a.steps} steps, median of {REPS}")
        print(f"{'batch':>6} {'moe':>10} {'eager tok/s':>12} {'graph tok/s':>12} {'ceiling tok/s':>14} "
              f"{'eager/ceil':>11} {'graph/ceil':>11} {'graph ms/step':>14}")
        for moe in modes:
            m.moe = moe
            if moe == "grouped_mm" and grouped_mm_fn() is None:
                note = "--moe grouped_mm: torch has no grouped_mm, skipped"
                print(note)
                out["skipped"].append(note)
                continue
            for b in ints(a.batches):
                r = None
                try:
                    r = decode(m, b, a.context, a.steps)
                except torch.cuda.OutOfMemoryError:
                    note = f"decode batch {b}, moe {moe}: out of memory, skipped"
                free_memory(dev)  # after the except block, so the traceback's tensors are gone
                if r is None:
                    print(note)
                    out["skipped"].append(note)
                    continue
                e, g = r["eager_tokens_per_s"], r["graph_tokens_per_s"]
                if b == 1:
                    r.update(ceiling_tokens_per_s=ceiling, eager_fraction=e / ceiling,
                             graph_fraction=g / ceiling if g else None)
                fmt = lambda v, spec: format(v, spec) if v is not None else "-"
                print(f"{b:>6} {moe:>10} {e:12.1f} {fmt(g, '12.1f'):>12} "
                      f"{fmt(r.get('ceiling_tokens_per_s'), '14.1f'):>14} "
                      f"{fmt(r.get('eager_fraction'), '11.3f'):>11} {fmt(r.get('graph_fraction'), '11.3f'):>11} "
                      f"{fmt(r.get('graph_ms_per_step'), '14.3f'):>14}")
                if "graph_note" in r:
                    print(f"       {r['graph_note']}")
                if r.get("graph_matches_eager", 1.0) < 1.0:
                    print(f"       graph's first tokens match eager's in {r['graph_matches_eager']:.0%} of rows")
                out["decode"].append(r)
                save(a.json, out)
        if dev.type == "cuda":
            out["peak_memory_bytes"] = torch.cuda.max_memory_allocated()

    if save(a.json, out):
        print(f"\nwrote {a.json}")


if __name__ == "__main__":
    main()
