//! Layers, as MLX's `mlx.nn` classes of the same names, with MLX's initialisations (drawn from
//! `key`, or from the global random state without one).

use nuvec_core::{Array, DType, fast, ops, random};

use crate::module::{Module, Param, join};

/// A layer: a module with a forward pass of one array.
pub trait Layer: Module {
    /// The layer applied to `x`.
    fn forward(&self, x: &Array) -> Array;
}

/// `x Wᵀ + b`: `weight [out, in]`, `bias [out]` (MLX's `nn.Linear`; both uniform in
/// `±1/√in`).
#[derive(Clone, Debug)]
pub struct Linear {
    /// `[out, in]`.
    pub weight: Param,
    /// `[out]`, if any.
    pub bias: Option<Param>,
}

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
        Linear { weight: Param::new(weight), bias }
    }
}

crate::module!(Linear { weight, bias });

impl Layer for Linear {
    fn forward(&self, x: &Array) -> Array {
        let y = x.matmul(&self.weight.t());
        match &self.bias {
            Some(b) => &y + &**b,
            None => y,
        }
    }
}

/// A table of `count` vectors of `dims` features, looked up by integer ids (MLX's
/// `nn.Embedding`; normal with standard deviation `1/√dims`).
#[derive(Clone, Debug)]
pub struct Embedding {
    /// `[count, dims]`.
    pub weight: Param,
}

impl Embedding {
    /// A table of `count` vectors of `dims` features.
    pub fn new(count: i32, dims: i32, key: Option<&Array>) -> Embedding {
        let scale = (1.0 / dims.max(1) as f32).sqrt();
        Embedding { weight: Param::new(random::normal([count, dims], DType::F32, 0.0, scale, key)) }
    }

    /// `x Wᵀ`: the table as an output projection (tied embeddings).
    pub fn as_linear(&self, x: &Array) -> Array {
        x.matmul(&self.weight.t())
    }
}

crate::module!(Embedding { weight });

impl Layer for Embedding {
    fn forward(&self, ids: &Array) -> Array {
        self.weight.take(ids, 0)
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
}

impl Layer for Sequential {
    fn forward(&self, x: &Array) -> Array {
        self.layers.iter().fold(x.clone(), |x, l| l.forward(&x))
    }
}
