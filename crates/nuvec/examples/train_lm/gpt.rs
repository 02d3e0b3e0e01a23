//! A GPT-2-shaped language model on `nuvec::nn`: learned positions, pre-norm blocks of causal
//! attention (the fused `scaled_dot_product_attention`) and a GELU MLP, the output projection
//! tied to the token embedding. `train_lm` trains a small one; `bench_train` times GPT-2 small.

use nuvec::nn::gelu_approx;
use nuvec::nn::{Embedding, Layer, LayerNorm, Linear, Param, init, module};
use nuvec::{Array, DType, fast, ops};

/// The model's sizes.
#[derive(Clone, Copy, Debug)]
pub struct Config {
    /// Token ids are below this.
    pub vocab: i32,
    /// The longest sequence (learned positions).
    pub context: i32,
    /// Blocks.
    pub layers: i32,
    /// Attention heads.
    pub heads: i32,
    /// Features per token.
    pub dims: i32,
}

/// `train_lm`'s model: bytes in, 4 blocks of 256 features, 128 tokens of context (3.2M
/// parameters).
pub const SMALL: Config = Config { vocab: 256, context: 128, layers: 4, heads: 4, dims: 256 };

/// A linear layer as GPT-2 initialises it: weights normal with deviation 0.02, biases zero.
fn linear(input: i32, output: i32) -> Linear {
    Linear {
        weight: Param::new(init::normal(&[output, input], 0.0, 0.02, DType::F32, None)),
        bias: Some(Param::new(ops::zeros([output], DType::F32))),
        quantized: None,
    }
}

/// One pre-norm block: `x + attn(ln_1(x))`, then `x + mlp(ln_2(x))`.
#[derive(Clone)]
pub struct Block {
    ln_1: LayerNorm,
    c_attn: Linear,
    attn_proj: Linear,
    ln_2: LayerNorm,
    c_fc: Linear,
    mlp_proj: Linear,
    heads: i32,
}

module!(Block { ln_1, c_attn, attn_proj, ln_2, c_fc, mlp_proj });

impl Block {
    fn new(c: &Config) -> Block {
        let d = c.dims;
        Block {
            ln_1: LayerNorm::new(d, 1e-5, true, true),
            c_attn: linear(d, 3 * d),
            attn_proj: linear(d, d),
            ln_2: LayerNorm::new(d, 1e-5, true, true),
            c_fc: linear(d, 4 * d),
            mlp_proj: linear(4 * d, d),
            heads: c.heads,
        }
    }

    fn forward(&self, x: &Array) -> Array {
        let (b, l, d) = (x.shape()[0], x.shape()[1], x.shape()[2]);
        let h = self.heads;
        // [B, L, 3D] -> three [B, H, L, D/H].
        let qkv = self.c_attn.forward(&self.ln_1.forward(x)).reshape([b, l, 3, h, d / h]).transpose(&[2, 0, 3, 1, 4]);
        let [q, k, v]: [Array; 3] = qkv.split(3, 0).try_into().expect("three parts");
        let (q, k, v) = (q.squeeze(0), k.squeeze(0), v.squeeze(0));
        let scale = 1.0 / ((d / h) as f32).sqrt();
        let o = fast::scaled_dot_product_attention(&q, &k, &v, scale, &fast::AttentionOptions::causal());
        let x = x + &self.attn_proj.forward(&o.transpose(&[0, 2, 1, 3]).reshape([b, l, d]));
        let m = self.mlp_proj.forward(&gelu_approx(&self.c_fc.forward(&self.ln_2.forward(&x))));
        &x + &m
    }
}

/// The language model.
#[derive(Clone)]
pub struct Gpt {
    wte: Embedding,
    wpe: Embedding,
    h: Vec<Block>,
    ln_f: LayerNorm,
}

module!(Gpt { wte, wpe, h, ln_f });

impl Gpt {
    /// A model of `config`'s sizes, float32, initialised as GPT-2.
    pub fn new(config: &Config) -> Gpt {
        let table = |n: i32| Embedding {
            weight: Param::new(init::normal(&[n, config.dims], 0.0, 0.02, DType::F32, None)),
            quantized: None,
        };
        Gpt {
            wte: table(config.vocab),
            wpe: table(config.context),
            h: (0..config.layers).map(|_| Block::new(config)).collect(),
            ln_f: LayerNorm::new(config.dims, 1e-5, true, true),
        }
    }

    /// Logits `[B, L, vocab]` of token ids `[B, L]` (L at most the context).
    pub fn forward(&self, ids: &Array) -> Array {
        let l = ids.shape()[1];
        let mut x = &self.wte.forward(ids) + &self.wpe.forward(&ops::arange(0, l, 1));
        for block in &self.h {
            x = block.forward(&x);
        }
        self.wte.as_linear(&self.ln_f.forward(&x))
    }

    /// The mean cross entropy of the next tokens `targets [B, L]`.
    pub fn loss(&self, ids: &Array, targets: &Array) -> Array {
        fast::cross_entropy(&self.forward(ids), targets).mean(..)
    }
}
