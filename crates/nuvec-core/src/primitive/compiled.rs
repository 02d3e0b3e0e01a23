//! `Compiled`: a fused element-wise program, made by `compile` from a chain or tree of unary,
//! binary, `where` and cast nodes of one shape. A backend runs it as one kernel (a generated
//! CUDA kernel, a chunked CPU loop); everywhere else it runs as its steps, the ordinary
//! primitives it replaced, which also define its derivatives and batching.
//!
//! Every value keeps the dtype the unfused node gave it, and each step computes what that node
//! computed, so fusion does not change results.

use std::fmt::{self, Write};
use std::hash::{Hash, Hasher};
use std::sync::Arc;

use crate::dtype::DType;
use crate::error::OpErrorKind;
use crate::storage::Spec;

use super::elementwise::{BinaryOp, UnaryOp, binary_spec, select_spec, unary_spec};

/// One step of a [`Program`]: an element-wise primitive over earlier values (indices into the
/// program's values: its inputs first, then one value per step).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Step {
    /// `Primitive::Unary`.
    Unary(UnaryOp, usize),
    /// `Primitive::Binary` (its operands of one dtype, or a widened pair).
    Binary(BinaryOp, usize, usize),
    /// `Primitive::Select`: condition, then the two values.
    Select(usize, usize, usize),
    /// `Primitive::AsType`.
    AsType(DType, usize),
}

impl Step {
    /// The values the step reads.
    pub fn args(&self) -> impl Iterator<Item = usize> {
        let (a, b, c) = match *self {
            Step::Unary(_, a) | Step::AsType(_, a) => (a, None, None),
            Step::Binary(_, a, b) => (a, Some(b), None),
            Step::Select(c, a, b) => (c, Some(a), Some(b)),
        };
        std::iter::once(a).chain(b).chain(c)
    }
}

/// A fused element-wise program: every input and value has the output shape (broadcasts stay
/// outside, as views), and each output is one of its values.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Program {
    /// The inputs' dtypes (values `0..inputs.len()`).
    pub inputs: Vec<DType>,
    /// The steps with the dtype of the value each makes (values `inputs.len()..`).
    pub steps: Vec<(Step, DType)>,
    /// The values returned, in output order.
    pub outputs: Vec<usize>,
}

impl Program {
    /// The dtype of value `v`.
    pub fn dtype(&self, v: usize) -> DType {
        match v.checked_sub(self.inputs.len()) {
            None => self.inputs[v],
            Some(s) => self.steps[s].1,
        }
    }

    /// Checks that every step reads earlier values of the dtypes its primitive takes, and
    /// gives the dtype it claims.
    pub fn validate(&self) -> Result<(), OpErrorKind> {
        let bad = |m: String| Err(OpErrorKind::InvalidArgument(format!("compiled: {m}")));
        let shape = crate::shape::Shape::new();
        let spec = |v: usize| Spec { shape: shape.clone(), dtype: self.dtype(v) };
        for (i, (step, dtype)) in self.steps.iter().enumerate() {
            let at = self.inputs.len() + i;
            if step.args().any(|a| a >= at) {
                return bad(format!("step {i} reads a later value"));
            }
            let got = match *step {
                Step::Unary(op, a) => unary_spec(op, &spec(a))?.dtype,
                Step::Binary(op, a, b) => binary_spec(op, &spec(a), &spec(b))?.dtype,
                Step::Select(c, a, b) => select_spec(&spec(c), &spec(a), &spec(b))?.dtype,
                Step::AsType(d, _) => d,
            };
            if got != *dtype {
                return bad(format!("step {i} makes {got:?}, not {dtype:?}"));
            }
        }
        let values = self.inputs.len() + self.steps.len();
        if self.outputs.is_empty() || self.outputs.iter().any(|&o| o >= values) {
            return bad("outputs must name values of the program".into());
        }
        Ok(())
    }

    /// A stable 64-bit digest, for kernel names and caches.
    pub fn digest(&self) -> u64 {
        // FNV-1a over the text form: stable across runs and platforms, unlike `DefaultHasher`.
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for b in self.to_string().bytes() {
            h = (h ^ b as u64).wrapping_mul(0x100_0000_01b3);
        }
        h
    }
}

impl fmt::Display for Program {
    /// One line per step, e.g. `v2 = multiply(v0, v1) : float32`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<String> = self.inputs.iter().map(|d| d.name().to_string()).collect();
        writeln!(f, "inputs: {}", names.join(", "))?;
        for (i, (step, dtype)) in self.steps.iter().enumerate() {
            let mut call = String::new();
            let _ = match *step {
                Step::Unary(op, a) => write!(call, "{}(v{a})", op.name()),
                Step::Binary(op, a, b) => write!(call, "{}(v{a}, v{b})", op.name()),
                Step::Select(c, a, b) => write!(call, "where(v{c}, v{a}, v{b})"),
                Step::AsType(d, a) => write!(call, "astype(v{a}, {})", d.name()),
            };
            writeln!(f, "v{} = {call} : {}", self.inputs.len() + i, dtype.name())?;
        }
        let outs: Vec<String> = self.outputs.iter().map(|o| format!("v{o}")).collect();
        write!(f, "outputs: {}", outs.join(", "))
    }
}

/// The payload of `Primitive::Compiled`: a shared [`Program`].
#[derive(Clone, Debug)]
pub struct Compiled(pub Arc<Program>);

impl PartialEq for Compiled {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0) || self.0 == other.0
    }
}

impl Hash for Compiled {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.0.hash(state)
    }
}

impl Compiled {
    /// The outputs' specs: every input has the program's dtype and one shape, which every
    /// output has.
    pub fn output_specs(&self, inputs: &[Spec]) -> Result<Vec<Spec>, OpErrorKind> {
        let p = &self.0;
        if inputs.len() != p.inputs.len() {
            return Err(OpErrorKind::InvalidArgument(format!(
                "compiled takes {} inputs, got {}",
                p.inputs.len(),
                inputs.len()
            )));
        }
        let shape = inputs.first().map(|s| s.shape.clone()).unwrap_or_default();
        for (s, &d) in inputs.iter().zip(&p.inputs) {
            if s.shape != shape {
                return Err(OpErrorKind::ShapeMismatch { lhs: shape.to_vec(), rhs: s.shape.to_vec() });
            }
            if s.dtype != d {
                return Err(OpErrorKind::DTypeMismatch { lhs: d, rhs: s.dtype });
            }
        }
        Ok(p.outputs.iter().map(|&o| Spec { shape: shape.clone(), dtype: p.dtype(o) }).collect())
    }
}
