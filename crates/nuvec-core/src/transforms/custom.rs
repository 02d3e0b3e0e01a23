//! `custom_function` (a function with its own vjp, jvp or vmap rule) and `checkpoint`
//! (recompute in the backward pass instead of keeping intermediates).
//!
//! A call records one `Primitive::Custom` node whose evaluation runs the body; transforms use
//! the custom rules when given and otherwise transform the body.

use std::sync::Arc;

use crate::array::Array;
use crate::error::{Error, Result};
use crate::primitive::Primitive;
use crate::primitive::custom::{Body, CustomFn, CustomInner, JvpRule, VjpRule, VmapRule};

use super::{AxesSpec, IntoResult, Tree, jvp_flat, vjp_flat, vmap_impl};

/// Failed arrays standing for `n` results of a rule that returned an error.
fn failed_all(e: Error, n: usize) -> Vec<Array> {
    vec![Array::from_error(e); n]
}

// The transforms' side of a recorded call: its body as the evaluator's composition, and its
// rules (the given ones, or the body's).
impl CustomFn {
    /// The body on evaluated inputs (the evaluator's composition).
    pub(crate) fn body(&self, x: &[Array]) -> Vec<Array> {
        (self.0.body)(x).unwrap_or_else(|e| failed_all(e, self.0.outputs.len()))
    }

    pub(crate) fn vjp(&self, x: &[Array], y: &[Array], g: &[Array]) -> Vec<Option<Array>> {
        let r = match &self.0.vjp {
            Some(rule) => rule(x, y, g),
            None => {
                let body = self.0.body.clone();
                vjp_flat(move |xs| body(xs), x, g).map(|(_, d)| d)
            }
        };
        match r {
            Ok(d) if d.len() == x.len() => d.into_iter().map(Some).collect(),
            Ok(d) => failed_all(
                Error::InvalidArgument(format!(
                    "{}: the vjp rule returned {} cotangents for {} inputs",
                    self.0.name,
                    d.len(),
                    x.len()
                )),
                x.len(),
            )
            .into_iter()
            .map(Some)
            .collect(),
            Err(e) => failed_all(e, x.len()).into_iter().map(Some).collect(),
        }
    }

    pub(crate) fn jvp(&self, x: &[Array], _y: &[Array], t: &[Option<Array>]) -> Vec<Option<Array>> {
        let tangents: Vec<Array> = t.iter().zip(x).map(|(t, x)| t.clone().unwrap_or_else(|| x.zeros_like())).collect();
        let r = match &self.0.jvp {
            Some(rule) => rule(x, &tangents),
            None => {
                let body = self.0.body.clone();
                jvp_flat(move |xs| body(xs), x, &tangents).map(|(_, t)| t)
            }
        };
        r.unwrap_or_else(|e| failed_all(e, self.0.outputs.len())).into_iter().map(Some).collect()
    }

    pub(crate) fn vmap(&self, x: &[Array], mapped: &[bool]) -> Vec<(Array, bool)> {
        let axes: Vec<Option<i32>> = mapped.iter().map(|&m| m.then_some(0)).collect();
        let r = match &self.0.vmap {
            Some(rule) => rule(x, &axes).map(|(outs, out_axes)| {
                outs.iter().zip(out_axes.iter().chain(std::iter::repeat(&0))).map(|(o, &a)| o.moveaxis(a, 0)).collect()
            }),
            None => {
                let body = self.0.body.clone();
                vmap_impl(&move |xs: &[Array]| body(xs), x, &AxesSpec::PerLeaf(axes), &AxesSpec::All(Some(0)))
            }
        };
        r.unwrap_or_else(|e| failed_all(e, self.0.outputs.len())).into_iter().map(|o| (o, true)).collect()
    }
}

/// Records a call of `custom` on `inputs`.
fn record(custom: CustomFn, inputs: Vec<Array>) -> Vec<Array> {
    let specs = custom.0.outputs.clone();
    Array::from_node(Primitive::Custom(custom), inputs, specs)
}

/// A function over flat arrays with optional custom rules (see [`custom_function`]).
#[derive(Clone)]
pub struct CustomFunctionFlat {
    name: &'static str,
    body: Body,
    vjp: Option<VjpRule>,
    jvp: Option<JvpRule>,
    vmap: Option<VmapRule>,
}

/// A custom function over flat arrays.
pub fn custom_function_flat(f: impl Fn(&[Array]) -> Result<Vec<Array>> + Send + Sync + 'static) -> CustomFunctionFlat {
    CustomFunctionFlat { name: "custom_function", body: Arc::new(f), vjp: None, jvp: None, vmap: None }
}

impl CustomFunctionFlat {
    /// The reverse-mode rule: `(primals, outputs, output cotangents) -> input cotangents`.
    pub fn with_vjp(
        mut self,
        rule: impl Fn(&[Array], &[Array], &[Array]) -> Result<Vec<Array>> + Send + Sync + 'static,
    ) -> Self {
        self.vjp = Some(Arc::new(rule));
        self
    }

    /// The forward-mode rule: `(primals, tangents) -> output tangents`.
    pub fn with_jvp(mut self, rule: impl Fn(&[Array], &[Array]) -> Result<Vec<Array>> + Send + Sync + 'static) -> Self {
        self.jvp = Some(Arc::new(rule));
        self
    }

    /// The batching rule: `(inputs, batch axis of each) -> (outputs, batch axis of each)`.
    pub fn with_vmap(
        mut self,
        rule: impl Fn(&[Array], &[Option<i32>]) -> Result<(Vec<Array>, Vec<i32>)> + Send + Sync + 'static,
    ) -> Self {
        self.vmap = Some(Arc::new(rule));
        self
    }

    /// Records a call (the body runs when the outputs are evaluated or transformed).
    pub fn call(&self, inputs: &[Array]) -> Result<Vec<Array>> {
        if let Some(e) = inputs.iter().find_map(|a| a.error()) {
            return Err(e);
        }
        // Shapes and dtypes of the outputs, from recording the body once (nothing runs).
        let probe = (self.body)(inputs)?;
        self.record_like(inputs, &probe)
    }

    /// Records a call whose outputs have the shapes and dtypes of `probe`.
    fn record_like(&self, inputs: &[Array], probe: &[Array]) -> Result<Vec<Array>> {
        if let Some(e) = probe.iter().find_map(|a| a.error()) {
            return Err(e);
        }
        let custom = CustomFn(Arc::new(CustomInner {
            name: self.name,
            body: self.body.clone(),
            vjp: self.vjp.clone(),
            jvp: self.jvp.clone(),
            vmap: self.vmap.clone(),
            outputs: probe.iter().map(Array::spec).collect(),
        }));
        Ok(record(custom, inputs.to_vec()))
    }
}

type TreeBody<I, O> = Arc<dyn Fn(&I) -> Result<O> + Send + Sync>;
/// A tree-level VJP rule: (primals, outputs, output cotangents) to the input cotangents.
type TreeVjpRule<I, O> = Arc<dyn Fn(&I, &O, &O) -> Result<I> + Send + Sync>;
/// A tree-level JVP rule: (primals, tangents) to the output tangents.
type TreeJvpRule<I, O> = Arc<dyn Fn(&I, &I) -> Result<O> + Send + Sync>;
/// A tree-level vmap rule: (inputs, batch axis of each input leaf) to (outputs, their batch axis).
type TreeVmapRule<I, O> = Arc<dyn Fn(&I, &[Option<i32>]) -> Result<(O, i32)> + Send + Sync>;

/// A function with its own derivative or batching rules (MLX's `mx.custom_function`).
pub struct CustomFunction<I, O> {
    body: TreeBody<I, O>,
    vjp: Option<TreeVjpRule<I, O>>,
    jvp: Option<TreeJvpRule<I, O>>,
    vmap: Option<TreeVmapRule<I, O>>,
    name: &'static str,
}

/// Wraps `f` so transforms use the rules given with `with_vjp`, `with_jvp` and `with_vmap`
/// instead of transforming `f` itself.
///
/// ```
/// use nuvec::{array, transforms::{custom_function, grad}, Array};
/// // exp, with a (deliberately different) custom derivative.
/// let f = custom_function(|x: &Array| x.exp()).with_vjp(|_x: &Array, _y: &Array, g: &Array| Ok(g * 10.0));
/// let df = grad(move |x: &Array| f.call(x).map(|y| y.sum(..)));
/// assert_eq!(df(&array![0.0, 1.0]).unwrap().to_vec::<f32>().unwrap(), vec![10.0, 10.0]);
/// ```
pub fn custom_function<I, O, F, R>(f: F) -> CustomFunction<I, O>
where
    I: Tree + Send + Sync + 'static,
    O: Tree + Send + Sync + 'static,
    F: Fn(&I) -> R + Send + Sync + 'static,
    R: IntoResult<Ok = O>,
{
    CustomFunction {
        body: Arc::new(move |i: &I| f(i).into_result()),
        vjp: None,
        jvp: None,
        vmap: None,
        name: "custom_function",
    }
}

impl<I, O> CustomFunction<I, O>
where
    I: Tree + Send + Sync + 'static,
    O: Tree + Send + Sync + 'static,
{
    /// The reverse-mode rule: `(primals, outputs, output cotangents) -> input cotangents`.
    pub fn with_vjp(mut self, rule: impl Fn(&I, &O, &O) -> Result<I> + Send + Sync + 'static) -> Self {
        self.vjp = Some(Arc::new(rule));
        self
    }

    /// The forward-mode rule: `(primals, tangents) -> output tangents`.
    pub fn with_jvp(mut self, rule: impl Fn(&I, &I) -> Result<O> + Send + Sync + 'static) -> Self {
        self.jvp = Some(Arc::new(rule));
        self
    }

    /// The batching rule: `(inputs, batch axis of each input leaf) -> (outputs, their batch axis)`.
    pub fn with_vmap(mut self, rule: impl Fn(&I, &[Option<i32>]) -> Result<(O, i32)> + Send + Sync + 'static) -> Self {
        self.vmap = Some(Arc::new(rule));
        self
    }

    /// Records a call of the function on `input`.
    pub fn call(&self, input: &I) -> Result<O> {
        // The structures of input and output, needed to rebuild trees from flat arrays.
        let shape_in = Arc::new(input.with_leaves(input.flatten()));
        let out = (self.body)(input)?;
        let shape_out = Arc::new(out.with_leaves(out.flatten()));
        let body = self.body.clone();
        let si = shape_in.clone();
        let mut flat = custom_function_flat(move |xs| body(&si.with_leaves(xs.to_vec())).map(|o| o.flatten()));
        flat.name = self.name;
        if let Some(rule) = self.vjp.clone() {
            let (si, so) = (shape_in.clone(), shape_out.clone());
            flat = flat.with_vjp(move |x, y, g| {
                rule(&si.with_leaves(x.to_vec()), &so.with_leaves(y.to_vec()), &so.with_leaves(g.to_vec()))
                    .map(|i| i.flatten())
            });
        }
        if let Some(rule) = self.jvp.clone() {
            let si = shape_in.clone();
            flat = flat.with_jvp(move |x, t| {
                rule(&si.with_leaves(x.to_vec()), &si.with_leaves(t.to_vec())).map(|o| o.flatten())
            });
        }
        if let Some(rule) = self.vmap.clone() {
            let si = shape_in.clone();
            flat = flat.with_vmap(move |x, axes| {
                rule(&si.with_leaves(x.to_vec()), axes).map(|(o, ax)| {
                    let leaves = o.flatten();
                    let n = leaves.len();
                    (leaves, vec![ax; n])
                })
            });
        }
        let outs = flat.record_like(&input.flatten(), &out.flatten())?;
        Ok(shape_out.with_leaves(outs))
    }
}

/// `f` with its intermediate results recomputed during the backward pass instead of kept
/// (gradient checkpointing): the forward pass records one node, and its vjp runs `f` again.
///
/// ```
/// use nuvec::{array, transforms::{checkpoint, grad}, Array};
/// let block = checkpoint(|x: &Array| (x * x).sin());
/// let g = grad(move |x: &Array| block(x).map(|y| y.sum(..)))(&array![0.5]).unwrap();
/// let want = 2.0f32 * 0.5 * (0.25f32).cos();
/// assert!((g.to_vec::<f32>().unwrap()[0] - want).abs() < 1e-6);
/// ```
pub fn checkpoint<I, O, F, R>(f: F) -> impl Fn(&I) -> Result<O> + Send + Sync
where
    I: Tree + Send + Sync + 'static,
    O: Tree + Send + Sync + 'static,
    F: Fn(&I) -> R + Send + Sync + 'static,
    R: IntoResult<Ok = O>,
{
    let f = Arc::new(move |i: &I| f(i).into_result());
    let recompute = f.clone();
    let mut c = custom_function(move |i: &I| f(i)).with_vjp(move |x: &I, _y: &O, g: &O| {
        let r = recompute.clone();
        super::vjp(move |i: &I| r(i), x, g).map(|(_, d)| d)
    });
    c.name = "checkpoint";
    move |i: &I| c.call(i)
}

/// `checkpoint` over flat arrays.
pub fn checkpoint_flat(
    f: impl Fn(&[Array]) -> Result<Vec<Array>> + Send + Sync + 'static,
) -> impl Fn(&[Array]) -> Result<Vec<Array>> + Send + Sync {
    let f = Arc::new(f);
    let recompute = f.clone();
    let mut c = custom_function_flat(move |x| f(x)).with_vjp(move |x, _y, g| {
        let r = recompute.clone();
        vjp_flat(move |xs| r(xs), x, g).map(|(_, d)| d)
    });
    c.name = "checkpoint";
    move |x: &[Array]| c.call(x)
}
