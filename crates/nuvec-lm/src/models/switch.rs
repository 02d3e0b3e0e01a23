//! Mixture-of-experts layers (mlx-lm's `switch_layers.py`): every expert's weights stacked in
//! one array, and each token's chosen experts applied through `gather_mm` (`gather_qmm` when
//! quantized), so that only the chosen experts are read.

use std::any::Any;
use std::collections::BTreeMap;

use nuvec::nn::{Layer, Linear, Module, Param, Params, QuantSpec, Quantized};
use nuvec::{Array, DType, ops};
use nuvec_nn::module;

use super::layers::{Activation, linear};
use crate::{Error, Result};

/// `x Wₑᵀ` for expert `e` of a stack `weight [E, out, in]` picked per token (MLX's
/// `SwitchLinear`; `QuantizedSwitchLinear` once [`SwitchLinear::to_quantized`]): a [`Linear`]
/// whose weight (and bias `[E, out]`, scales and biases) stack the experts, under the same
/// parameter names.
#[derive(Clone, Debug)]
pub struct SwitchLinear(pub Linear);

impl std::ops::Deref for SwitchLinear {
    type Target = Linear;
    fn deref(&self) -> &Linear {
        &self.0
    }
}

impl std::ops::DerefMut for SwitchLinear {
    fn deref_mut(&mut self) -> &mut Linear {
        &mut self.0
    }
}

/// The parameters are the inner layer's; the layer itself is found as a `SwitchLinear`, so
/// that quantizing a model leaves it to [`quantize_experts`].
impl Module for SwitchLinear {
    fn visit(&self, prefix: &str, f: &mut dyn FnMut(&str, &Param)) {
        self.0.visit(prefix, f)
    }
    fn visit_mut(&mut self, prefix: &str, f: &mut dyn FnMut(&str, &mut Param)) {
        self.0.visit_mut(prefix, f)
    }
    fn visit_layers_mut(&mut self, prefix: &str, f: &mut dyn FnMut(&str, &mut dyn Any)) {
        f(prefix, self)
    }
}

impl SwitchLinear {
    /// Placeholder weights of `experts` experts from `input` to `output` features.
    pub fn new(experts: i32, input: i32, output: i32) -> SwitchLinear {
        let weight = Param::new(ops::zeros([experts, output, input], DType::F32));
        SwitchLinear(Linear { weight, bias: None, quantized: None })
    }

    /// `x [.., 1, in]` through the experts `indices [.., k]` (broadcast against `x`'s
    /// leading axes): `[.., k, 1, out]`.
    pub fn forward(&self, x: &Array, indices: &Array) -> Array {
        let y = match &self.quantized {
            Some(q) => ops::gather_qmm(
                x,
                &self.weight,
                &q.scales,
                q.biases.as_deref(),
                None,
                Some(indices),
                true,
                q.group_size,
                q.bits,
                &q.mode,
                false,
            ),
            None => ops::gather_mm(x, &self.weight.swapaxes(-1, -2), None, Some(indices), false),
        };
        match &self.bias {
            Some(b) => &y + &b.take(indices, 0).expand_dims(-2),
            None => y,
        }
    }

    /// The stack quantized as `spec` says (MLX's affine groups along the input features);
    /// every parameter of the result is frozen. An error names bad parameters.
    pub fn to_quantized(&self, spec: &QuantSpec) -> Result<SwitchLinear> {
        if self.quantized.is_some() {
            return Err(Error::Weights("SwitchLinear.to_quantized: already quantized".into()));
        }
        let (w, scales, biases) = ops::quantize(&self.weight, spec.group_size, spec.bits, &spec.mode);
        if let Some(e) = w.error() {
            return Err(Error::Weights(format!("SwitchLinear.to_quantized: {e}")));
        }
        let mode: ops::QuantMode = spec.mode.parse().map_err(Error::Weights)?;
        let (group, bits) = mode.default_params();
        let frozen = |value: Array| Param { value, frozen: true };
        let quantized = Quantized {
            scales: frozen(scales),
            biases: biases.map(frozen),
            group_size: spec.group_size.unwrap_or(group),
            bits: spec.bits.unwrap_or(bits),
            mode: spec.mode.clone(),
        };
        let bias = self.bias.as_ref().map(|b| frozen(b.value.clone()));
        Ok(SwitchLinear(Linear { weight: frozen(w), bias, quantized: Some(quantized) }))
    }
}

/// The gated MLP of each chosen expert: `down(act(gate(x)) · up(x))` (MLX's `SwitchGLU`).
pub struct SwitchGlu {
    /// The gates.
    pub gate_proj: SwitchLinear,
    /// The up projections.
    pub up_proj: SwitchLinear,
    /// The down projections.
    pub down_proj: SwitchLinear,
}
module!(SwitchGlu { gate_proj, up_proj, down_proj });

impl SwitchGlu {
    /// `x [.., hidden]` through the experts `indices [.., k]`: `[.., k, hidden]`. From 64
    /// choices up, the tokens are sorted by expert first (as mlx-lm does), so that each
    /// expert's rows are adjacent and `gather_mm` reads its weights once for all of them.
    pub fn forward(&self, x: &Array, indices: &Array, act: Activation) -> Array {
        let x = x.expand_dims([-2, -3]);
        // Sorted: rows [tokens·k, 1, hidden] in expert order, and the order that puts them back.
        let (rows, idx, back) = if indices.size() < 64 {
            (x, indices.clone(), None)
        } else {
            let k = indices.shape()[indices.ndim() - 1];
            let flat = indices.reshape([-1]);
            let order = flat.argsort(0);
            (x.flatten(0, -3).take(&order.floor_divide(k), 0), flat.take(&order, 0), Some(order.argsort(0)))
        };
        let gated = act.gated(&self.gate_proj.forward(&rows, &idx), &self.up_proj.forward(&rows, &idx));
        let y = self.down_proj.forward(&gated, &idx);
        match back {
            None => y.squeeze(-2),
            Some(back) => {
                let mut shape = indices.shape().to_vec();
                shape.extend_from_slice(&y.shape()[2..]);
                y.take(&back, 0).reshape(shape)
            }
        }
    }
}

/// Qwen3-MoE's sparse block: a router picks `k` experts per token, whose outputs are summed
/// with the router's probabilities (renormalized over the chosen when `norm_topk_prob`).
pub struct SparseMoe {
    /// The router: a score per expert.
    pub gate: Linear,
    /// The experts, stacked.
    pub switch_mlp: SwitchGlu,
    /// Experts per token.
    pub top_k: i32,
    /// Renormalize the chosen experts' probabilities.
    pub norm_topk_prob: bool,
}
module!(SparseMoe { gate, switch_mlp });

impl SparseMoe {
    /// Placeholder weights: `experts` experts of `inner` features on a `hidden` stream.
    pub fn new(hidden: i32, inner: i32, experts: i32, top_k: i32, norm_topk_prob: bool) -> SparseMoe {
        let switch = |i, o| SwitchLinear::new(experts, i, o);
        SparseMoe {
            gate: linear(hidden, experts, false),
            switch_mlp: SwitchGlu {
                gate_proj: switch(hidden, inner),
                up_proj: switch(hidden, inner),
                down_proj: switch(inner, hidden),
            },
            top_k,
            norm_topk_prob,
        }
    }

    /// The block applied to `x [.., hidden]`.
    pub fn forward(&self, x: &Array) -> Array {
        // The router's softmax in float32, as transformers computes it.
        let probs = self.gate.forward(x).astype(DType::F32).softmax(-1);
        let experts = probs.shape()[probs.ndim() - 1];
        let chosen = probs.argpartition(experts - self.top_k, -1);
        let r = chosen.ndim();
        let (mut lo, hi) = (vec![0; r], chosen.shape().to_vec());
        lo[r - 1] = experts - self.top_k;
        let chosen = chosen.slice(&lo, &hi, &vec![1; r]);
        let mut weights = probs.take_along_axis(&chosen, -1);
        if self.norm_topk_prob {
            weights = &weights / &weights.sum_keepdims(-1);
        }
        let y = self.switch_mlp.forward(x, &chosen, Activation::Silu);
        (&y * &weights.astype(y.dtype()).expand_dims(-1)).sum(-2)
    }
}

/// Quantizes the expert stacks of `model` for which `predicate(path, weight)` gives a spec
/// (as [`nuvec::nn::quantize_with`] does for the other layers).
pub fn quantize_experts(
    model: &mut dyn super::LanguageModel,
    predicate: &mut dyn FnMut(&str, &Array) -> Option<QuantSpec>,
) -> Result<()> {
    let mut failure = None;
    model.visit_layers_mut("", &mut |path, layer| {
        if let (None, Some(s)) = (&failure, layer.downcast_mut::<SwitchLinear>())
            && s.quantized.is_none()
            && let Some(spec) = predicate(path, &s.weight)
        {
            match s.to_quantized(&spec) {
                Ok(q) => *s = q,
                Err(e) => failure = Some(Error::Weights(format!("quantize: layer '{path}': {e}"))),
            }
        }
    });
    failure.map_or(Ok(()), Err)
}

/// Checkpoint weights with each layer's experts stacked as [`SwitchGlu`] holds them: the
/// Hub's `mlp.experts.{e}.{gate,up,down}_proj.{weight,scales,biases}`, one tensor per expert,
/// and transformers 5's `mlp.experts.gate_up_proj [E, 2I, H]` and `down_proj [E, H, I]`,
/// become `mlp.switch_mlp.{gate,up,down}_proj.*`. An error names a missing expert.
pub fn stack_experts(weights: Params) -> Result<Params> {
    let mut out = Params::new();
    // (layer prefix, projection and parameter) -> expert -> tensor
    let mut parts: BTreeMap<(String, String), BTreeMap<i32, Array>> = BTreeMap::new();
    for (name, w) in weights {
        let Some((prefix, rest)) = name.split_once(".mlp.experts.") else {
            out.insert(name, w);
            continue;
        };
        if let Some((e, tail)) = rest.split_once('.')
            && let Ok(e) = e.parse::<i32>()
        {
            parts.entry((prefix.to_string(), tail.to_string())).or_default().insert(e, w);
            continue;
        }
        let stacked = |proj: &str| format!("{prefix}.mlp.switch_mlp.{proj}.weight");
        match rest {
            "gate_up_proj" => {
                let s = w.shape().to_vec();
                let half = s[1] / 2;
                out.insert(stacked("gate_proj"), w.slice(&[0, 0, 0], &[s[0], half, s[2]], &[1, 1, 1]));
                out.insert(stacked("up_proj"), w.slice(&[0, half, 0], &[s[0], s[1], s[2]], &[1, 1, 1]));
            }
            "down_proj" => {
                out.insert(stacked("down_proj"), w);
            }
            _ => {
                out.insert(name, w);
            }
        }
    }
    for ((prefix, tail), experts) in parts {
        let count = experts.len() as i32;
        if let Some(missing) = (0..count).find(|e| !experts.contains_key(e)) {
            return Err(Error::Weights(format!("{prefix}.mlp.experts.{missing}.{tail} is missing")));
        }
        let list: Vec<Array> = experts.into_values().collect();
        out.insert(format!("{prefix}.mlp.switch_mlp.{tail}"), ops::stack(&list, 0));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ramp(shape: &[i32], seed: f32) -> Array {
        let n: i32 = shape.iter().product();
        ((ops::arange(0, n, 1).astype(DType::F32) * 0.37 + seed).sin() * 0.5).reshape(shape)
    }

    #[test]
    fn sorted_tokens_give_what_each_token_gives_alone() {
        // 40 tokens of 2 choices each: 80 choices take the sorted path, one token's 2 do not.
        let (experts, hidden, inner, tokens) = (6, 16, 8, 40);
        let linear = |i: i32, o: i32, seed: f32| {
            let mut s = SwitchLinear::new(experts, i, o);
            s.weight = Param::new(ramp(&[experts, o, i], seed));
            s
        };
        let glu = SwitchGlu {
            gate_proj: linear(hidden, inner, 0.1),
            up_proj: linear(hidden, inner, 0.7),
            down_proj: linear(inner, hidden, 1.3),
        };
        let x = ramp(&[tokens, hidden], 2.1);
        let picks: Vec<i32> = (0..tokens).flat_map(|t| [(t * 5) % experts, (t * 5 + 1) % experts]).collect();
        let indices = Array::from_slice(&picks, [tokens, 2]);
        let all = glu.forward(&x, &indices, Activation::Silu);
        assert_eq!(all.shape(), &[tokens, 2, hidden]);
        for t in 0..tokens {
            let row = |a: &Array| a.slice(&[t, 0], &[t + 1, a.shape()[1]], &[1, 1]);
            let one = glu.forward(&row(&x), &row(&indices), Activation::Silu);
            let got = all.slice(&[t, 0, 0], &[t + 1, 2, hidden], &[1, 1, 1]);
            let diff = (&got - &one).abs().max(..).item::<f32>().unwrap();
            assert!(diff < 1e-5, "token {t}: {diff}");
        }
    }
}
