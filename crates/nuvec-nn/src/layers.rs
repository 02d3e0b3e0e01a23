//! Layers, as MLX's `mlx.nn` classes of the same names, with MLX's initialisations (drawn from
//! `key`, or from the global random state without one).

use std::any::Any;

use nuvec_core::{Array, DType, Error, OpErrorKind, Result, fast, ops, random};

use crate::module::{Module, Param, join};
use crate::quantize::Quantized;

/// `y + bias`, or `y` without one.
fn plus_bias(y: Array, bias: &Option<Param>) -> Array {
    match bias {
        Some(b) => &y + &**b,
        None => y,
    }
}

/// A layer: a module with a forward pass of one array.
pub trait Layer: Module {
    /// The layer applied to `x`.
    fn forward(&self, x: &Array) -> Array;
}

/// `x Wᵀ + b`: `weight [out, in]`, `bias [out]` (MLX's `nn.Linear`; both uniform in
/// `±1/√in`). After [`Linear::to_quantized`] (or [`quantize`](crate::quantize())) it is MLX's
/// `nn.QuantizedLinear`: `weight` packed, with `scales` and `biases` beside it.
#[derive(Clone, Debug)]
pub struct Linear {
    /// `[out, in]`, or packed `uint32 [out, in · bits / 32]` when quantized.
    pub weight: Param,
    /// `[out]`, if any.
    pub bias: Option<Param>,
    /// The quantization groups, when the weight is quantized.
    pub quantized: Option<Quantized>,
}

/// MLX's `nn.QuantizedLinear`: a [`Linear`] whose weight [`Linear::to_quantized`] packed.
pub type QuantizedLinear = Linear;

impl Linear {
    /// A layer from `input` to `output` features, with a bias or not.
    pub fn new(input: i32, output: i32, bias: bool, key: Option<&Array>) -> Linear {
        let k = 1.0 / (input.max(1) as f32).sqrt();
        let (kw, kb) = match key.map(random::split2) {
            Some((a, b)) => (Some(a), Some(b)),
            None => (None, None),
        };
        let weight = random::uniform(-k, k, [output, input], DType::F32, kw.as_ref());
        let bias = bias.then(|| Param::new(random::uniform(-k, k, [output], DType::F32, kb.as_ref())));
        Linear { weight: Param::new(weight), bias, quantized: None }
    }

    /// The layer with its weight quantized in groups of `group_size` elements of `bits` bits
    /// (`None`: the mode's defaults, 64 and 4 for `"affine"`), as MLX's `to_quantized`; every
    /// parameter of the result is frozen. An error names a bad mode or group size, or a layer
    /// already quantized.
    pub fn to_quantized(
        &self,
        group_size: impl Into<Option<i32>>,
        bits: impl Into<Option<i32>>,
        mode: &str,
    ) -> Result<Linear> {
        let (weight, q) =
            Quantized::of("Linear", &self.weight, self.quantized.is_some(), group_size.into(), bits.into(), mode)?;
        let bias = self.bias.as_ref().map(|b| Param { value: b.value.clone(), frozen: true });
        Ok(Linear { weight, bias, quantized: Some(q) })
    }
}

impl Module for Linear {
    fn visit(&self, prefix: &str, f: &mut dyn FnMut(&str, &Param)) {
        self.weight.visit(&join(prefix, "weight"), f);
        self.quantized.visit(prefix, f);
        self.bias.visit(&join(prefix, "bias"), f);
    }
    fn visit_mut(&mut self, prefix: &str, f: &mut dyn FnMut(&str, &mut Param)) {
        self.weight.visit_mut(&join(prefix, "weight"), f);
        self.quantized.visit_mut(prefix, f);
        self.bias.visit_mut(&join(prefix, "bias"), f);
    }
    fn visit_layers_mut(&mut self, prefix: &str, f: &mut dyn FnMut(&str, &mut dyn Any)) {
        f(prefix, self)
    }
}

impl Layer for Linear {
    fn forward(&self, x: &Array) -> Array {
        plus_bias(Quantized::times_transposed(x, &self.weight, &self.quantized), &self.bias)
    }
}

/// A table of `count` vectors of `dims` features, looked up by integer ids (MLX's
/// `nn.Embedding`; normal with standard deviation `1/√dims`). After
/// [`Embedding::to_quantized`] it is MLX's `nn.QuantizedEmbedding`.
#[derive(Clone, Debug)]
pub struct Embedding {
    /// `[count, dims]`, or packed `uint32 [count, dims · bits / 32]` when quantized.
    pub weight: Param,
    /// The quantization groups, when the table is quantized.
    pub quantized: Option<Quantized>,
}

/// MLX's `nn.QuantizedEmbedding`: an [`Embedding`] whose table [`Embedding::to_quantized`]
/// packed.
pub type QuantizedEmbedding = Embedding;

impl Embedding {
    /// A table of `count` vectors of `dims` features.
    pub fn new(count: i32, dims: i32, key: Option<&Array>) -> Embedding {
        let scale = (1.0 / dims.max(1) as f32).sqrt();
        let weight = Param::new(random::normal([count, dims], DType::F32, 0.0, scale, key));
        Embedding { weight, quantized: None }
    }

    /// `x Wᵀ`: the table as an output projection (tied embeddings).
    pub fn as_linear(&self, x: &Array) -> Array {
        Quantized::times_transposed(x, &self.weight, &self.quantized)
    }

    /// The vectors of `ids` in `dtype`: a quantized table's rows dequantized in it (scales and
    /// biases kept narrower than the activations, say a GGUF's `float16` beside `float32`,
    /// give the rows a `float32` table of the same values would), a float table's cast.
    ///
    /// ```
    /// # use nuvec as _;
    /// use nuvec::{Array, DType};
    /// use nuvec_nn::Embedding;
    /// let table = Embedding::new(10, 64, None).to_quantized(32, 8, "affine").unwrap();
    /// let rows = table.forward_in(&Array::from_slice(&[3, 1], [2]), DType::F16);
    /// assert_eq!((rows.shape(), rows.dtype()), (&[2, 64][..], DType::F16));
    /// ```
    pub fn forward_in(&self, ids: &Array, dtype: DType) -> Array {
        match &self.quantized {
            Some(q) => q.rows(&self.weight, ids, Some(dtype)),
            None => self.weight.take(ids, 0).astype(dtype),
        }
    }

    /// The table quantized, as [`Linear::to_quantized`].
    pub fn to_quantized(
        &self,
        group_size: impl Into<Option<i32>>,
        bits: impl Into<Option<i32>>,
        mode: &str,
    ) -> Result<Embedding> {
        let (weight, q) =
            Quantized::of("Embedding", &self.weight, self.quantized.is_some(), group_size.into(), bits.into(), mode)?;
        Ok(Embedding { weight, quantized: Some(q) })
    }
}

impl Module for Embedding {
    fn visit(&self, prefix: &str, f: &mut dyn FnMut(&str, &Param)) {
        self.weight.visit(&join(prefix, "weight"), f);
        self.quantized.visit(prefix, f);
    }
    fn visit_mut(&mut self, prefix: &str, f: &mut dyn FnMut(&str, &mut Param)) {
        self.weight.visit_mut(&join(prefix, "weight"), f);
        self.quantized.visit_mut(prefix, f);
    }
    fn visit_layers_mut(&mut self, prefix: &str, f: &mut dyn FnMut(&str, &mut dyn Any)) {
        f(prefix, self)
    }
}

impl Layer for Embedding {
    fn forward(&self, ids: &Array) -> Array {
        match &self.quantized {
            Some(q) => q.rows(&self.weight, ids, None),
            None => self.weight.take(ids, 0),
        }
    }
}

/// Root-mean-square normalisation over the last axis, scaled by `weight` (MLX's `nn.RMSNorm`,
/// through `fast::rms_norm`).
#[derive(Clone, Debug)]
pub struct RmsNorm {
    /// `[dims]`, ones at first.
    pub weight: Param,
    /// Added to the mean square.
    pub eps: f32,
}

impl RmsNorm {
    /// Over `dims` features (MLX's default eps: 1e-5).
    pub fn new(dims: i32, eps: f32) -> RmsNorm {
        RmsNorm { weight: Param::new(ops::ones([dims], DType::F32)), eps }
    }
}

crate::module!(RmsNorm { weight });

impl Layer for RmsNorm {
    fn forward(&self, x: &Array) -> Array {
        fast::rms_norm(x, &*self.weight, self.eps)
    }
}

/// Layer normalisation over the last axis, with an affine weight and bias or none (MLX's
/// `nn.LayerNorm`, through `fast::layer_norm`).
#[derive(Clone, Debug)]
pub struct LayerNorm {
    /// `[dims]`, ones at first (with `affine`).
    pub weight: Option<Param>,
    /// `[dims]`, zeros at first (with `affine` and `bias`).
    pub bias: Option<Param>,
    /// Added to the variance.
    pub eps: f32,
}

impl LayerNorm {
    /// Over `dims` features (MLX's defaults: eps 1e-5, affine, bias).
    pub fn new(dims: i32, eps: f32, affine: bool, bias: bool) -> LayerNorm {
        LayerNorm {
            weight: affine.then(|| Param::new(ops::ones([dims], DType::F32))),
            bias: (affine && bias).then(|| Param::new(ops::zeros([dims], DType::F32))),
            eps,
        }
    }
}

crate::module!(LayerNorm { weight, bias });

impl Layer for LayerNorm {
    fn forward(&self, x: &Array) -> Array {
        fast::layer_norm(x, self.weight.as_deref(), self.bias.as_deref(), self.eps)
    }
}

/// Rotary position embedding of the first `dims` features (MLX's `nn.RoPE`, through
/// `fast::rope`); no parameters.
#[derive(Clone, Debug)]
pub struct Rope {
    /// Features rotated.
    pub dims: i32,
    /// Pairs of adjacent features (true) or of the two halves (false).
    pub traditional: bool,
    /// The frequencies' base (MLX's default 10000).
    pub base: f32,
    /// Positions are multiplied by this.
    pub scale: f32,
}

impl Rope {
    /// MLX's defaults for `dims`: halves, base 10000, scale 1.
    pub fn new(dims: i32) -> Rope {
        Rope { dims, traditional: false, base: 10000.0, scale: 1.0 }
    }

    /// The rotation of `x [..., L, D]`, positions from `offset`.
    pub fn forward_at(&self, x: &Array, offset: i32) -> Array {
        fast::rope(
            x,
            self.dims,
            self.traditional,
            Some(self.base),
            self.scale,
            &Array::scalar(offset, DType::I32),
            None,
        )
    }
}

impl Module for Rope {
    fn visit(&self, _: &str, _: &mut dyn FnMut(&str, &Param)) {}
    fn visit_mut(&mut self, _: &str, _: &mut dyn FnMut(&str, &mut Param)) {}
}

impl Layer for Rope {
    fn forward(&self, x: &Array) -> Array {
        self.forward_at(x, 0)
    }
}

/// Zeroes each element with probability `p` and scales the rest by `1/(1−p)` while
/// `training`; the identity otherwise (MLX's `nn.Dropout`).
#[derive(Clone, Debug)]
pub struct Dropout {
    /// The probability of dropping an element, in `[0, 1)`.
    pub p: f32,
    /// Whether to drop (MLX's `train()` / `eval()`).
    pub training: bool,
}

impl Dropout {
    /// Dropout with probability `p`, training.
    pub fn new(p: f32) -> Dropout {
        Dropout { p, training: true }
    }
}

impl Module for Dropout {
    fn visit(&self, _: &str, _: &mut dyn FnMut(&str, &Param)) {}
    fn visit_mut(&mut self, _: &str, _: &mut dyn FnMut(&str, &mut Param)) {}
    fn visit_layers_mut(&mut self, prefix: &str, f: &mut dyn FnMut(&str, &mut dyn Any)) {
        f(prefix, self)
    }
}

impl Layer for Dropout {
    fn forward(&self, x: &Array) -> Array {
        if !self.training || self.p == 0.0 {
            return x.clone();
        }
        let keep = random::bernoulli(1.0 - self.p, Some(x.shape()), None);
        &ops::where_(&keep, x, 0.0f32) / (1.0 - self.p)
    }
}

/// Layers applied one after another; their parameters under `layers.{i}` (MLX's
/// `nn.Sequential`).
pub struct Sequential {
    /// The layers, in order.
    pub layers: Vec<Box<dyn Layer>>,
}

impl Module for Sequential {
    fn visit(&self, prefix: &str, f: &mut dyn FnMut(&str, &Param)) {
        for (i, l) in self.layers.iter().enumerate() {
            l.visit(&join(prefix, &format!("layers.{i}")), f)
        }
    }
    fn visit_mut(&mut self, prefix: &str, f: &mut dyn FnMut(&str, &mut Param)) {
        for (i, l) in self.layers.iter_mut().enumerate() {
            l.visit_mut(&join(prefix, &format!("layers.{i}")), f)
        }
    }
    fn visit_layers_mut(&mut self, prefix: &str, f: &mut dyn FnMut(&str, &mut dyn Any)) {
        for (i, l) in self.layers.iter_mut().enumerate() {
            l.visit_layers_mut(&join(prefix, &format!("layers.{i}")), f)
        }
    }
}

impl Layer for Sequential {
    fn forward(&self, x: &Array) -> Array {
        self.layers.iter().fold(x.clone(), |x, l| l.forward(&x))
    }
}

/// 1-d convolution over `[N, L, C_in]` (channels last): `weight [C_out, K, C_in / groups]`,
/// `bias [C_out]` (MLX's `nn.Conv1d`: the weight uniform in `±1/√(C_in K / groups)`, the
/// bias zeros).
#[derive(Clone, Debug)]
pub struct Conv1d {
    /// `[C_out, K, C_in / groups]`.
    pub weight: Param,
    /// `[C_out]`, if any.
    pub bias: Option<Param>,
    /// Step between windows.
    pub stride: i32,
    /// Zeros added at both ends.
    pub padding: i32,
    /// Spacing of a window's taps.
    pub dilation: i32,
    /// Channel groups.
    pub groups: i32,
}

impl Conv1d {
    /// `input` to `output` channels in `groups` groups, windows of `kernel` (stride 1, no
    /// padding, dilation 1: set the fields for others).
    pub fn new(input: i32, output: i32, kernel: i32, groups: i32, bias: bool, key: Option<&Array>) -> Conv1d {
        let g = groups.max(1);
        let (weight, bias) = conv_init(&[output, kernel, input / g], input / g * kernel, bias, key);
        Conv1d { weight, bias, stride: 1, padding: 0, dilation: 1, groups: g }
    }
}

crate::module!(Conv1d { weight, bias });

impl Layer for Conv1d {
    fn forward(&self, x: &Array) -> Array {
        let y = ops::conv1d(x, &self.weight, self.stride, self.padding, self.dilation, self.groups);
        plus_bias(y, &self.bias)
    }
}

/// 2-d convolution over `[N, H, W, C_in]` (channels last): `weight [C_out, KH, KW, C_in /
/// groups]`, `bias [C_out]` (MLX's `nn.Conv2d`: the weight uniform in
/// `±1/√(C_in KH KW / groups)`, the bias zeros).
#[derive(Clone, Debug)]
pub struct Conv2d {
    /// `[C_out, KH, KW, C_in / groups]`.
    pub weight: Param,
    /// `[C_out]`, if any.
    pub bias: Option<Param>,
    /// Step between windows, per axis.
    pub stride: [i32; 2],
    /// Zeros added at both ends, per axis.
    pub padding: [i32; 2],
    /// Spacing of a window's taps, per axis.
    pub dilation: [i32; 2],
    /// Channel groups.
    pub groups: i32,
}

impl Conv2d {
    /// `input` to `output` channels in `groups` groups, `kernel` windows (stride 1, no
    /// padding, dilation 1: set the fields for others).
    pub fn new(input: i32, output: i32, kernel: [i32; 2], groups: i32, bias: bool, key: Option<&Array>) -> Conv2d {
        let g = groups.max(1);
        let fan_in = input / g * kernel[0] * kernel[1];
        let (weight, bias) = conv_init(&[output, kernel[0], kernel[1], input / g], fan_in, bias, key);
        Conv2d { weight, bias, stride: [1, 1], padding: [0, 0], dilation: [1, 1], groups: g }
    }
}

crate::module!(Conv2d { weight, bias });

impl Layer for Conv2d {
    fn forward(&self, x: &Array) -> Array {
        let y = ops::conv2d(x, &self.weight, self.stride, self.padding, self.dilation, self.groups);
        plus_bias(y, &self.bias)
    }
}

/// A convolution's weight of `shape`, uniform in `±1/√fan_in`, and its bias, zeros.
fn conv_init(shape: &[i32], fan_in: i32, bias: bool, key: Option<&Array>) -> (Param, Option<Param>) {
    let k = 1.0 / (fan_in.max(1) as f32).sqrt();
    let weight = Param::new(random::uniform(-k, k, shape, DType::F32, key));
    let bias = bias.then(|| Param::new(ops::zeros([shape[0]], DType::F32)));
    (weight, bias)
}

/// Multi-head attention (MLX's `nn.MultiHeadAttention`): query, key, value and output
/// projections around `fast::scaled_dot_product_attention`, `dims / heads` features per head,
/// scale `1/√(dims / heads)`.
#[derive(Clone, Debug)]
pub struct MultiHeadAttention {
    /// Heads.
    pub heads: i32,
    /// `[dims, query dims]`.
    pub query_proj: Linear,
    /// `[dims, key dims]`.
    pub key_proj: Linear,
    /// `[value dims, value input dims]`.
    pub value_proj: Linear,
    /// `[output dims, value dims]`.
    pub out_proj: Linear,
}

impl MultiHeadAttention {
    /// `dims` features in and out, `heads` heads, projections with a bias or not (MLX's
    /// default: no bias; other input and value sizes: set the projections).
    pub fn new(dims: i32, heads: i32, bias: bool, key: Option<&Array>) -> MultiHeadAttention {
        let keys: Vec<Option<Array>> = match key {
            Some(k) => {
                let ks = random::split(k, 4);
                (0..4).map(|i| Some(ks.take(&Array::scalar(i, DType::I32), 0))).collect()
            }
            None => vec![None; 4],
        };
        let lin = |i: usize| Linear::new(dims, dims, bias, keys[i].as_ref());
        MultiHeadAttention { heads, query_proj: lin(0), key_proj: lin(1), value_proj: lin(2), out_proj: lin(3) }
    }

    /// Attention of `queries [B, Lq, D]` over `keys` and `values [B, Lk, D]`, with an optional
    /// mask (boolean or additive, broadcastable to `[B, heads, Lq, Lk]`).
    #[track_caller]
    pub fn attend(&self, queries: &Array, keys: &Array, values: &Array, mask: Option<&Array>) -> Array {
        if [queries, keys, values].iter().any(|a| a.ndim() != 3) {
            let what = "queries, keys and values must be [B, L, D]".to_string();
            let at = std::panic::Location::caller();
            return Array::from_error(Error::Op {
                op: "MultiHeadAttention",
                at,
                kind: OpErrorKind::InvalidArgument(what),
            });
        }
        let split = |x: Array| {
            let (b, l, d) = (x.shape()[0], x.shape()[1], x.shape()[2]);
            x.reshape([b, l, self.heads, d / self.heads.max(1)]).transpose(&[0, 2, 1, 3])
        };
        let q = split(self.query_proj.forward(queries));
        let k = split(self.key_proj.forward(keys));
        let v = split(self.value_proj.forward(values));
        let head = q.shape().last().copied().unwrap_or(1).max(1);
        let mut opts = fast::AttentionOptions::default();
        if let Some(m) = mask {
            opts = opts.mask(m);
        }
        let o = fast::scaled_dot_product_attention(&q, &k, &v, 1.0 / (head as f32).sqrt(), &opts);
        let [b, h, l, d] = match o.shape() {
            &[b, h, l, d] => [b, h, l, d],
            _ => return o,
        };
        self.out_proj.forward(&o.transpose(&[0, 2, 1, 3]).reshape([b, l, h * d]))
    }
}

crate::module!(MultiHeadAttention { query_proj, key_proj, value_proj, out_proj });

impl Layer for MultiHeadAttention {
    /// Self-attention of `x` without a mask.
    fn forward(&self, x: &Array) -> Array {
        self.attend(x, x, x, None)
    }
}
