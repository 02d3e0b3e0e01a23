//! Quantized layers and [`quantize`] over a model, as MLX's `nn.quantize`: a [`Linear`] or an
//! [`Embedding`] keeps its packed weight in `weight` and its groups' [`Quantized`] parameters
//! beside it, under MLX's names (`weight`, `scales`, `biases`), so a quantized checkpoint
//! loads into a quantized model with [`Module::load_weights`].

use std::any::Any;

use nuvec_core::{Array, DType, Error, Result, ops};

use crate::layers::{Embedding, Linear};
use crate::module::{Module, Param, join};

/// What a quantized layer keeps besides its packed weight (MLX's `QuantizedLinear` and
/// `QuantizedEmbedding` fields). Its parameters are frozen, as MLX's.
#[derive(Clone, Debug)]
pub struct Quantized {
    /// Each group's scale.
    pub scales: Param,
    /// Each group's bias (affine mode only).
    pub biases: Option<Param>,
    /// Elements per group.
    pub group_size: i32,
    /// Bits per element.
    pub bits: i32,
    /// `"affine"`, `"mxfp4"`, `"nvfp4"` or `"mxfp8"`.
    pub mode: String,
}

/// How [`quantize_with`] quantizes one layer: `None` takes the mode's defaults (MLX's
/// `group_size`, `bits` and `mode` of `to_quantized`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QuantSpec {
    /// Elements per group.
    pub group_size: Option<i32>,
    /// Bits per element.
    pub bits: Option<i32>,
    /// `"affine"`, `"mxfp4"`, `"nvfp4"` or `"mxfp8"`.
    pub mode: String,
}

impl QuantSpec {
    /// `mode` with explicit or default group size and bits.
    pub fn new(group_size: impl Into<Option<i32>>, bits: impl Into<Option<i32>>, mode: &str) -> QuantSpec {
        QuantSpec { group_size: group_size.into(), bits: bits.into(), mode: mode.to_string() }
    }
}

impl Quantized {
    /// `weight` packed and its groups, frozen; the mode's defaults fill `None`. An error
    /// (from `layer`) names a bad mode, bits or group size, a weight that is not a float
    /// matrix whose rows split into groups, or a layer `already` quantized.
    pub(crate) fn of(
        layer: &str,
        weight: &Array,
        already: bool,
        group_size: Option<i32>,
        bits: Option<i32>,
        mode: &str,
    ) -> Result<(Param, Quantized)> {
        let bad = |why: String| Error::InvalidArgument(format!("{layer}.to_quantized: {why}"));
        if already {
            return Err(bad("the layer is already quantized".into()));
        }
        let parsed: ops::QuantMode = mode.parse().map_err(bad)?;
        let (dg, db) = parsed.default_params();
        let (group_size, bits) = (group_size.unwrap_or(dg), bits.unwrap_or(db));
        parsed.check_params(group_size, bits).map_err(bad)?;
        let cols = weight.shape().last().copied().unwrap_or(0);
        if weight.ndim() != 2 || !weight.dtype().is_float() || cols % group_size != 0 {
            return Err(bad(format!(
                "the weight must be a float matrix whose rows split into groups of {group_size}, got {} {:?}",
                weight.dtype(),
                weight.shape()
            )));
        }
        let (w, scales, biases) = ops::quantize(weight, group_size, bits, mode);
        let frozen = |value: Array| Param { value, frozen: true };
        let q =
            Quantized { scales: frozen(scales), biases: biases.map(frozen), group_size, bits, mode: mode.to_string() };
        Ok((frozen(w), q))
    }

    /// `x Wᵀ` for a layer's `weight` and its quantization, if any: the product Linear and a
    /// tied Embedding share.
    pub(crate) fn times_transposed(x: &Array, weight: &Array, quantized: &Option<Quantized>) -> Array {
        match quantized {
            Some(q) => {
                let biases = q.biases.as_deref();
                ops::quantized_matmul(x, weight, &q.scales, biases, true, q.group_size, q.bits, &q.mode)
            }
            None => x.matmul(&weight.t()),
        }
    }

    /// The rows `ids` of the packed table `w`, dequantized: `[..ids, dims]` in the scales'
    /// dtype (affine) or bfloat16 (the FP modes), as MLX's `QuantizedEmbedding`; or in `dtype`,
    /// affine scales and biases cast to it first.
    pub(crate) fn rows(&self, w: &Array, ids: &Array, dtype: Option<DType>) -> Array {
        let flat = ids.flatten(0, -1);
        let cast = |a: Array| match dtype {
            Some(d) if self.biases.is_some() => a.astype(d),
            _ => a,
        };
        let biases = self.biases.as_ref().map(|b| cast(b.take(&flat, 0)));
        let rows = ops::dequantize(
            &w.take(&flat, 0),
            &cast(self.scales.take(&flat, 0)),
            biases.as_ref(),
            self.group_size,
            self.bits,
            &self.mode,
            dtype,
        );
        let mut shape = ids.shape().to_vec();
        shape.push(-1);
        rows.reshape(shape)
    }
}

/// The scales and biases, beside the layer's `weight` (not under a name of their own).
impl Module for Quantized {
    fn visit(&self, prefix: &str, f: &mut dyn FnMut(&str, &Param)) {
        self.scales.visit(&join(prefix, "scales"), f);
        self.biases.visit(&join(prefix, "biases"), f);
    }
    fn visit_mut(&mut self, prefix: &str, f: &mut dyn FnMut(&str, &mut Param)) {
        self.scales.visit_mut(&join(prefix, "scales"), f);
        self.biases.visit_mut(&join(prefix, "biases"), f);
    }
}

/// Quantizes every [`Linear`] and [`Embedding`] of `model` in place (MLX's `nn.quantize`
/// without a predicate): groups of `group_size` elements of `bits` bits in `mode` (`None`: the
/// mode's defaults). The first layer that cannot be quantized (rows that do not split into
/// groups, say) is an error naming it, and leaves the layers before it quantized.
///
/// ```
/// # use nuvec as _;
/// use nuvec_nn::{Embedding, Linear, Module, module, quantize};
/// struct Lm {
///     embed: Embedding,
///     head: Linear,
/// }
/// module!(Lm { embed, head });
/// let mut lm = Lm { embed: Embedding::new(100, 64, None), head: Linear::new(64, 100, false, None) };
/// quantize(&mut lm, 32, 4, "affine").unwrap();
/// let names: Vec<String> = lm.parameters().into_keys().collect();
/// assert_eq!(names, ["embed.biases", "embed.scales", "embed.weight", "head.biases", "head.scales", "head.weight"]);
/// assert!(lm.trainable_parameters().is_empty());
/// ```
pub fn quantize<M: Module + ?Sized>(
    model: &mut M,
    group_size: impl Into<Option<i32>>,
    bits: impl Into<Option<i32>>,
    mode: &str,
) -> Result<()> {
    let spec = QuantSpec::new(group_size, bits, mode);
    quantize_with(model, |_, _| Some(spec.clone()))
}

/// Quantizes the [`Linear`] and [`Embedding`] layers for which `predicate(path, weight)`
/// gives a [`QuantSpec`] (MLX's `nn.quantize` with a `class_predicate`); `path` is the
/// layer's dotted name and `weight` its float weight. Layers already quantized are passed
/// over. A quantized checkpoint is loaded by quantizing the layers it has scales for:
///
/// ```
/// # use nuvec as _;
/// use nuvec_nn::{Linear, Module, QuantSpec, quantize_with};
/// let mut layers = vec![Linear::new(64, 8, true, None), Linear::new(64, 8, true, None)];
/// let mut saved = layers.clone();
/// saved[1] = saved[1].to_quantized(None, None, "affine").unwrap();
/// let weights = saved.parameters();
/// quantize_with(&mut layers, |path, _| {
///     weights.contains_key(&format!("{path}.scales")).then(|| QuantSpec::new(None, None, "affine"))
/// })
/// .unwrap();
/// layers.load_weights(&weights, true).unwrap();
/// assert!(layers[0].quantized.is_none() && layers[1].quantized.is_some());
/// ```
pub fn quantize_with<M, F>(model: &mut M, mut predicate: F) -> Result<()>
where
    M: Module + ?Sized,
    F: FnMut(&str, &Array) -> Option<QuantSpec>,
{
    let mut failure = None;
    model.visit_layers_mut("", &mut |path, layer: &mut dyn Any| {
        if failure.is_some() {
            return;
        }
        let done = if let Some(l) = layer.downcast_mut::<Linear>() {
            let spec = l.quantized.is_none().then(|| predicate(path, &l.weight)).flatten();
            spec.map(|s| l.to_quantized(s.group_size, s.bits, &s.mode).map(|q| *l = q))
        } else if let Some(e) = layer.downcast_mut::<Embedding>() {
            let spec = e.quantized.is_none().then(|| predicate(path, &e.weight)).flatten();
            spec.map(|s| e.to_quantized(s.group_size, s.bits, &s.mode).map(|q| *e = q))
        } else {
            None
        };
        if let Some(Err(e)) = done {
            failure = Some(Error::InvalidArgument(format!("quantize: layer '{path}': {e}")));
        }
    });
    failure.map_or(Ok(()), Err)
}
