#!/usr/bin/env python3
"""Records the reference outputs nuvec-lm's tests compare against, with Hugging Face
transformers (and PyTorch, float32, on the CPU or a GPU):

  tiny/<arch>/      a random-weight model of each architecture: config.json, model.safetensors
                    (float32), and expected.json: the logits of fixed token ids and the greedy
                    continuation transformers' generate() gives
  smollm2.json      SmolLM2-135M-Instruct's Q4_1 GGUF as transformers loads it (the `gguf`
                    package dequantizes it): the token ids of fixed texts, the last position's
                    largest logits and the greedy continuation

Usage: python3 scripts/lm-fixtures.py OUT_DIR [--gguf PATH] [--only ARCH...]
       (no --gguf: tiny models only)
"""
import argparse
import json
import os

import torch
from safetensors.torch import save_file
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

IDS = [[5, 17, 42, 99, 3, 64, 7, 120, 33, 8, 71, 2]]
COMMON = dict(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
              rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=False)
ARCHS = {
    "llama": dict(model_type="llama", rope_scaling={"rope_type": "llama3", "factor": 8.0,
                  "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                  "original_max_position_embeddings": 16}),
    "llama_linear": dict(model_type="llama", rope_scaling={"rope_type": "linear", "factor": 2.0},
                         tie_word_embeddings=True),
    "llama_yarn": dict(model_type="llama", rope_scaling={"rope_type": "yarn", "factor": 4.0,
                       "original_max_position_embeddings": 64}),
    "mistral": dict(model_type="mistral", head_dim=32, sliding_window=None),
    "qwen2": dict(model_type="qwen2", tie_word_embeddings=True),
    "qwen3": dict(model_type="qwen3", head_dim=16),
    # One dense layer (mlp_only_layers) beside a sparse one.
    "qwen3_moe": dict(model_type="qwen3_moe", head_dim=16, num_experts=8, num_experts_per_tok=2,
                      moe_intermediate_size=48, norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[1]),
    # Sliding layers of 4 keys around a full one, per-type RoPE, soft-capped logits (the score
    # cap is in the config, and transformers' Gemma 3 leaves it unused).
    "gemma3": dict(model_type="gemma3_text", head_dim=16, query_pre_attn_scalar=24, sliding_window=4,
                   num_hidden_layers=3, layer_types=["sliding_attention", "full_attention", "sliding_attention"],
                   hidden_activation="gelu_pytorch_tanh", attn_logit_softcapping=5.0, final_logit_softcapping=3.0,
                   tie_word_embeddings=True, rms_norm_eps=1e-6,
                   rope_parameters={"full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e6},
                                    "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}),
    # Gated DeltaNet layers (key heads of 16 features, value heads of 8) between gated
    # full-attention ones with partial RoPE; experts and a shared expert in the last layer alone
    # (every second layer is sparse, and layer 1 is named dense) to keep the file small.
    "qwen3_next": dict(model_type="qwen3_next", head_dim=16, num_hidden_layers=4,
                       layer_types=["linear_attention", "full_attention"] * 2, full_attention_interval=2,
                       linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16,
                       linear_value_head_dim=8, linear_conv_kernel_dim=4, num_experts=8, num_experts_per_tok=2,
                       moe_intermediate_size=48, shared_expert_intermediate_size=32, norm_topk_prob=True,
                       decoder_sparse_step=2, mlp_only_layers=[1], partial_rotary_factor=0.25),
}

# Norms that scale by 1 + weight (their checkpoints store the offset from one).
ZERO_CENTRED = ("gemma", "qwen3_next")


def hub_layout(state):
    """Per-expert tensors, as checkpoints on the Hub hold them, where transformers keeps the
    experts stacked ([E, 2I, H] gate and up; [E, H, I] down)."""
    out = {}
    for k, v in state.items():
        if k.endswith("experts.gate_up_proj"):
            base, half = k[: -len("gate_up_proj")], v.shape[1] // 2
            for e in range(v.shape[0]):
                out[f"{base}{e}.gate_proj.weight"] = v[e, :half].contiguous()
                out[f"{base}{e}.up_proj.weight"] = v[e, half:].contiguous()
        elif k.endswith("experts.down_proj"):
            base = k[: -len("down_proj")]
            for e in range(v.shape[0]):
                out[f"{base}{e}.down_proj.weight"] = v[e].contiguous()
        else:
            out[k] = v
    return out


def tiny(out, only=None):
    for name, extra in ARCHS.items():
        if only and name not in only:
            continue
        torch.manual_seed(0)
        kw = dict(COMMON)
        kw.update(extra)
        if "rope_parameters" in extra:
            kw.pop("rope_theta")
        try:
            config = AutoConfig.for_model(**kw)
        except Exception as e:  # one architecture's failure leaves the others' fixtures
            print(name, "FAILED", repr(e))
            continue
        # Eager attention: the reference implementation.
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32, attn_implementation="eager").eval()
        # Larger weights than the default init, so that the logits differ clearly.
        with torch.no_grad():
            for n, p in model.named_parameters():
                if "norm" in n:
                    # Gemma's and Qwen3-Next's norms scale by 1 + weight; Qwen3-Next's gated
                    # norm (linear_attn.norm) by its weight.
                    centred = name.startswith(ZERO_CENTRED) and "linear_attn.norm" not in n
                    p.copy_((0.0 if centred else 1.0) + 0.1 * torch.randn_like(p))
                elif n.endswith("A_log"):
                    # Decays near 0.9 per step, so that the recurrent state reaches back a while.
                    p.copy_(-2.0 + 0.5 * torch.randn_like(p))
                elif "conv1d" in n:
                    p.normal_(0.0, 0.3)
                else:
                    p.normal_(0.0, 0.08)
        d = os.path.join(out, "tiny", name)
        os.makedirs(d, exist_ok=True)
        config.save_pretrained(d)
        state = hub_layout({k: v.contiguous() for k, v in model.state_dict().items()})
        if config.tie_word_embeddings:
            state.pop("lm_head.weight", None)
        save_file(state, os.path.join(d, "model.safetensors"))
        ids = torch.tensor(IDS)
        with torch.no_grad():
            logits = model(ids).logits[0]
            gen = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=12, do_sample=False,
                                 pad_token_id=0, eos_token_id=None)
        expected = {"ids": IDS[0], "logits": logits.tolist(),
                    "greedy": gen[0, ids.shape[1]:].tolist(), "transformers": __import__("transformers").__version__}
        with open(os.path.join(d, "expected.json"), "w") as f:
            json.dump(expected, f)
        print(name, "ok", tuple(logits.shape), sorted({k.split(".", 3)[-1] for k in state})[:40])


TEXTS = ["The capital of France is", "Hello, world! 12345 + 678 = ?\n\tIndented  twice;  café, naïve 東京 🚀",
         "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n"]


def smollm2(out, gguf):
    d, f = os.path.split(gguf)
    tok = AutoTokenizer.from_pretrained(d, gguf_file=f)
    model = AutoModelForCausalLM.from_pretrained(d, gguf_file=f, torch_dtype=torch.float32).eval()
    cases = []
    for text in TEXTS:
        ids = tok(text, add_special_tokens=False).input_ids
        t = torch.tensor([ids])
        with torch.no_grad():
            last = model(t).logits[0, -1]
            # The attention mask is explicit: generate() would otherwise mask out every prompt
            # token equal to the pad token (2 is also <|im_end|>).
            gen = model.generate(t, attention_mask=torch.ones_like(t), max_new_tokens=16, do_sample=False,
                                 pad_token_id=2, eos_token_id=None)
        top = torch.topk(last, 20)
        cases.append({"text": text, "ids": ids, "top_ids": top.indices.tolist(), "top_logits": top.values.tolist(),
                      "greedy": gen[0, len(ids):].tolist()})
        print(repr(text[:30]), len(ids), "tokens, greedy", cases[-1]["greedy"][:6])
    with open(os.path.join(out, "smollm2.json"), "w") as fh:
        json.dump({"gguf_sha256": "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
                   "transformers": __import__("transformers").__version__, "cases": cases}, fh, indent=1)


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--gguf")
    ap.add_argument("--only", nargs="*", help="these tiny architectures alone")
    a = ap.parse_args()
    tiny(a.out, a.only)
    if a.gguf:
        smollm2(a.out, a.gguf)
