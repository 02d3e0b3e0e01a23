//! Modules: structs of parameters and sub-modules whose parameters form a tree with MLX's
//! dotted names (`layers.0.attn.q_proj.weight`), as MLX's `nn.Module`. A layer implements
//! [`Module`] by visiting its [`Param`]s; a user's struct of layers gets it from [`module!`](crate::module).

use std::any::Any;
use std::collections::BTreeMap;
use std::path::Path;

use nuvec_core::{Array, Error, Result};

/// A parameter: its value, and whether training leaves it alone (`frozen`).
#[derive(Clone, Debug)]
pub struct Param {
    /// The value.
    pub value: Array,
    /// Left out of [`Module::trainable_parameters`].
    pub frozen: bool,
}

impl Param {
    /// A trainable parameter holding `value`.
    pub fn new(value: Array) -> Param {
        Param { value, frozen: false }
    }
}

impl std::ops::Deref for Param {
    type Target = Array;
    fn deref(&self) -> &Array {
        &self.value
    }
}

/// Parameters by dotted name.
pub type Params = BTreeMap<String, Array>;

/// `prefix.name`, or `name` at the root.
pub fn join(prefix: &str, name: &str) -> String {
    if prefix.is_empty() { name.to_string() } else { format!("{prefix}.{name}") }
}

/// A module: something holding parameters, directly or in sub-modules.
pub trait Module {
    /// Calls `f` with each parameter's dotted name under `prefix`, in a fixed order.
    fn visit(&self, prefix: &str, f: &mut dyn FnMut(&str, &Param));

    /// [`Module::visit`] with the parameters mutable.
    fn visit_mut(&mut self, prefix: &str, f: &mut dyn FnMut(&str, &mut Param));

    /// Calls `f` with each layer under `prefix` that has state besides its parameters (a
    /// training flag, a quantization: [`Linear`](crate::Linear), [`Embedding`](crate::Embedding),
    /// [`Dropout`](crate::Dropout)), for [`Module::train`] and [`quantize`](crate::quantize())
    /// to find by type. [`module!`](crate::module) forwards it to the fields; a hand-written
    /// module of such layers forwards it too.
    fn visit_layers_mut(&mut self, _prefix: &str, _f: &mut dyn FnMut(&str, &mut dyn Any)) {}

    /// Sets training mode (`true`, dropout drops) or evaluation mode (`false`) in every layer
    /// below, as MLX's `train()` / `eval()`.
    fn train(&mut self, mode: bool) {
        self.visit_layers_mut("", &mut |_, layer| {
            if let Some(d) = layer.downcast_mut::<crate::Dropout>() {
                d.training = mode;
            }
        });
    }

    /// Every parameter, by dotted name.
    fn parameters(&self) -> Params {
        let mut out = Params::new();
        self.visit("", &mut |n, p| {
            out.insert(n.to_string(), p.value.clone());
        });
        out
    }

    /// The parameters training updates (not frozen), by dotted name.
    fn trainable_parameters(&self) -> Params {
        let mut out = Params::new();
        self.visit("", &mut |n, p| {
            if !p.frozen {
                out.insert(n.to_string(), p.value.clone());
            }
        });
        out
    }

    /// Casts every floating-point parameter to `dtype` (MLX's `set_dtype`); integer ones, such
    /// as packed quantized weights, are left alone.
    fn set_dtype(&mut self, dtype: nuvec_core::DType) {
        self.visit_mut("", &mut |_, p| {
            if p.value.dtype().is_float() {
                p.value = p.value.astype(dtype);
            }
        });
    }

    /// Freezes every parameter.
    fn freeze(&mut self) {
        self.visit_mut("", &mut |_, p| p.frozen = true);
    }

    /// Unfreezes every parameter.
    fn unfreeze(&mut self) {
        self.visit_mut("", &mut |_, p| p.frozen = false);
    }

    /// Replaces the parameters `params` names (others are kept). An error names a parameter
    /// the module does not have, or one of another shape (MLX's `update`).
    fn update(&mut self, params: &Params) -> Result<()> {
        set(self, params, false, true)
    }

    /// Sets the parameters from `weights`; with `strict`, a parameter `weights` lacks, or a
    /// name the module does not have, is an error naming it, and without, both are passed
    /// over (MLX's `load_weights`). Shapes must match either way.
    fn load_weights(&mut self, weights: &Params, strict: bool) -> Result<()> {
        set(self, weights, strict, strict)
    }

    /// The parameters saved to `path`: safetensors, or `.npz` by the name.
    fn save_weights(&self, path: &Path) -> Result<()> {
        let params = self.parameters();
        let refs: Vec<(&str, &Array)> = params.iter().map(|(k, v)| (k.as_str(), v)).collect();
        let name = path.to_string_lossy();
        if name.ends_with(".npz") {
            nuvec_io::save_npz(path, &refs, false)
        } else {
            nuvec_io::save_safetensors(path, &refs, None)
        }
    }

    /// [`Module::load_weights`] (strict) from a file [`nuvec_io::load`] reads.
    fn load_weights_file(&mut self, path: &Path) -> Result<()> {
        let weights = nuvec_io::load(path)?;
        set(self, &weights, true, true)
    }
}

/// Sets `module`'s parameters from `params`: a parameter `params` lacks is an error with
/// `all`, a name the module lacks with `known`.
fn set<M: Module + ?Sized>(module: &mut M, params: &Params, all: bool, known: bool) -> Result<()> {
    let mut problem: Option<String> = None;
    let mut seen = 0;
    module.visit_mut("", &mut |name, p| {
        if problem.is_some() {
            return;
        }
        match params.get(name) {
            Some(v) if v.shape() != p.value.shape() => {
                problem = Some(format!("parameter '{name}' has shape {:?}, given {:?}", p.value.shape(), v.shape()));
            }
            Some(v) => {
                p.value = v.clone();
                seen += 1;
            }
            None if all => problem = Some(format!("parameter '{name}' is missing")),
            None => {}
        }
    });
    if known && problem.is_none() && seen < params.len() {
        let mut names = Vec::new();
        module.visit("", &mut |n, _| names.push(n.to_string()));
        if let Some(extra) = params.keys().find(|k| !names.contains(k)) {
            problem = Some(format!("the module has no parameter '{extra}'"));
        }
    }
    match problem {
        Some(p) => Err(Error::InvalidArgument(format!("load_weights: {p}"))),
        None => Ok(()),
    }
}

impl Module for Param {
    fn visit(&self, prefix: &str, f: &mut dyn FnMut(&str, &Param)) {
        f(prefix, self)
    }
    fn visit_mut(&mut self, prefix: &str, f: &mut dyn FnMut(&str, &mut Param)) {
        f(prefix, self)
    }
}

impl<M: Module> Module for Option<M> {
    fn visit(&self, prefix: &str, f: &mut dyn FnMut(&str, &Param)) {
        if let Some(m) = self {
            m.visit(prefix, f)
        }
    }
    fn visit_mut(&mut self, prefix: &str, f: &mut dyn FnMut(&str, &mut Param)) {
        if let Some(m) = self {
            m.visit_mut(prefix, f)
        }
    }
    fn visit_layers_mut(&mut self, prefix: &str, f: &mut dyn FnMut(&str, &mut dyn Any)) {
        if let Some(m) = self {
            m.visit_layers_mut(prefix, f)
        }
    }
}

impl<M: Module> Module for Vec<M> {
    fn visit(&self, prefix: &str, f: &mut dyn FnMut(&str, &Param)) {
        for (i, m) in self.iter().enumerate() {
            m.visit(&join(prefix, &i.to_string()), f)
        }
    }
    fn visit_mut(&mut self, prefix: &str, f: &mut dyn FnMut(&str, &mut Param)) {
        for (i, m) in self.iter_mut().enumerate() {
            m.visit_mut(&join(prefix, &i.to_string()), f)
        }
    }
    fn visit_layers_mut(&mut self, prefix: &str, f: &mut dyn FnMut(&str, &mut dyn Any)) {
        for (i, m) in self.iter_mut().enumerate() {
            m.visit_layers_mut(&join(prefix, &i.to_string()), f)
        }
    }
}

/// Makes a struct whose fields are modules (layers, [`Param`]s, `Vec`s and `Option`s of them)
/// a [`Module`], each field's parameters under its name:
///
/// ```
/// # use nuvec as _;
/// use nuvec_nn::{Linear, Module, module};
/// struct Mlp {
///     up: Linear,
///     down: Linear,
/// }
/// module!(Mlp { up, down });
/// let mlp = Mlp { up: Linear::new(4, 8, true, None), down: Linear::new(8, 2, false, None) };
/// let names: Vec<String> = mlp.parameters().into_keys().collect();
/// assert_eq!(names, ["down.weight", "up.bias", "up.weight"]);
/// ```
#[macro_export]
macro_rules! module {
    ($ty:ty { $($field:ident),* $(,)? }) => {
        impl $crate::Module for $ty {
            fn visit(&self, prefix: &str, f: &mut dyn FnMut(&str, &$crate::Param)) {
                $( $crate::Module::visit(&self.$field, &$crate::join(prefix, stringify!($field)), f); )*
            }
            fn visit_mut(&mut self, prefix: &str, f: &mut dyn FnMut(&str, &mut $crate::Param)) {
                $( $crate::Module::visit_mut(&mut self.$field, &$crate::join(prefix, stringify!($field)), f); )*
            }
            fn visit_layers_mut(&mut self, prefix: &str, f: &mut dyn FnMut(&str, &mut dyn ::std::any::Any)) {
                $( $crate::Module::visit_layers_mut(&mut self.$field, &$crate::join(prefix, stringify!($field)), f); )*
            }
        }
    };
}

/// The loss `f(model, data)` and its gradients with respect to the model's trainable
/// parameters (by dotted name), as MLX's `nn.value_and_grad`.
pub fn value_and_grad<M, D, F>(model: &M, f: F, data: &D) -> Result<(Array, Params)>
where
    M: Module + Clone,
    D: ?Sized,
    F: Fn(&M, &D) -> Array,
{
    let params = model.trainable_parameters();
    let vg = nuvec_core::transforms::value_and_grad_args(|p: &Params, d: &D| -> Result<Array> {
        let mut m = model.clone();
        m.update(p)?;
        Ok(f(&m, d))
    });
    vg(&params, data)
}
