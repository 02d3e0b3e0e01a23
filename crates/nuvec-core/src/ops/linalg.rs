//! Matrix products.

use crate::array::Array;
use crate::dtype::{DType, promote_types};
use crate::error::OpErrorKind;
use crate::primitive::Primitive;
use crate::shape::{Shape, broadcast_shapes};

use super::{invalid, propagate};

/// Operands of a product prepared as `[batch..., M, K]` and `[batch..., K, N]` with equal batch
/// shapes, plus the output shape after removing the axes added for 1-d operands.
#[track_caller]
fn prepare(op: &'static str, a: &Array, b: &Array) -> Result<(Array, Array, Vec<i32>), Array> {
    if a.ndim() == 0 || b.ndim() == 0 {
        return Err(invalid(
            op,
            format!("operands need at least 1 dimension, got shapes {:?} and {:?}", a.shape(), b.shape()),
        ));
    }
    let dtype = promote_types(a.dtype(), b.dtype());
    if dtype == DType::Bool || dtype == DType::Complex64 {
        return Err(Array::failed(op, OpErrorKind::UnsupportedDType(dtype)));
    }
    let a2 = if a.ndim() == 1 { a.reshape([1, -1]) } else { a.clone() };
    let b2 = if b.ndim() == 1 { b.reshape([-1, 1]) } else { b.clone() };
    let (ra, rb) = (a2.ndim(), b2.ndim());
    let (m, k) = (a2.shape()[ra - 2], a2.shape()[ra - 1]);
    let (k2, n) = (b2.shape()[rb - 2], b2.shape()[rb - 1]);
    // Both shape errors hold the operands' own shapes; the message says which dimensions clash
    // (`matmul at f.rs:3: [3, 4] @ [5, 6]: inner dimensions 4 and 5 differ`).
    let mismatch = || OpErrorKind::ShapeMismatch { lhs: a.shape().to_vec(), rhs: b.shape().to_vec() };
    if k != k2 {
        return Err(Array::failed(op, mismatch()));
    }
    let batch = match broadcast_shapes(&a2.shape()[..ra - 2], &b2.shape()[..rb - 2]) {
        Ok(b) => b,
        Err(_) => return Err(Array::failed(op, mismatch())),
    };
    let with = |x: i32, y: i32| -> Shape {
        let mut s = batch.clone();
        s.push(x);
        s.push(y);
        s
    };
    // A matrix on the right (a layer's weight): the left operand's batch axes fold into its
    // rows, one product reading the matrix once instead of once per batch element.
    let (a3, b3) = if rb == 2 && ra > 2 && k > 0 {
        (a2.astype(dtype).reshape([-1, k]), b2.astype(dtype))
    } else {
        (a2.astype(dtype).broadcast_to(with(m, k)), b2.astype(dtype).broadcast_to(with(k, n)))
    };
    let mut out: Vec<i32> = batch.to_vec();
    if a.ndim() > 1 {
        out.push(m);
    }
    if b.ndim() > 1 {
        out.push(n);
    }
    Ok((a3, b3, out))
}

impl Array {
    /// Matrix product with NumPy's rules: batch axes broadcast; a 1-d left operand is a row
    /// vector and a 1-d right operand a column vector, their axis removed from the result.
    ///
    /// ```
    /// use nuvec::array;
    /// let a = array![[1.0, 2.0], [3.0, 4.0]];
    /// assert_eq!(a.matmul(&array![1.0, 1.0]).to_vec::<f32>().unwrap(), vec![3.0, 7.0]);
    /// ```
    #[track_caller]
    pub fn matmul(&self, other: &Array) -> Array {
        if let Some(f) = propagate(&[self, other]) {
            return f;
        }
        match prepare("matmul", self, other) {
            Ok((a, b, out)) => Array::from_op("matmul", Primitive::Matmul, vec![a, b]).reshape(out),
            Err(f) => f,
        }
    }

    /// `alpha * (self @ b) + beta * c` in one product (`c` broadcasts to the result).
    #[track_caller]
    pub fn addmm(&self, b: &Array, c: &Array, alpha: f32, beta: f32) -> Array {
        addmm(c, self, b, alpha, beta)
    }
}

/// Matrix product (see [`Array::matmul`]).
#[track_caller]
pub fn matmul(a: &Array, b: &Array) -> Array {
    a.matmul(b)
}

/// `alpha * (a @ b) + beta * c` (MLX's argument order), for floating dtypes.
#[track_caller]
pub fn addmm(c: &Array, a: &Array, b: &Array, alpha: f32, beta: f32) -> Array {
    if let Some(f) = propagate(&[c, a, b]) {
        return f;
    }
    let (a3, b3, out) = match prepare("addmm", a, b) {
        Ok(p) => p,
        Err(f) => return f,
    };
    let dtype = promote_types(a3.dtype(), c.dtype());
    if !dtype.is_float() {
        return Array::failed("addmm", OpErrorKind::UnsupportedDType(dtype));
    }
    let mut full: Vec<i32> = a3.shape()[..a3.ndim() - 1].to_vec();
    full.push(b3.shape()[b3.ndim() - 1]);
    let c3 = match broadcast_shapes(c.shape(), &out) {
        Ok(s) if s[..] == out[..] => c.astype(dtype).broadcast_to(out.clone()).reshape(full),
        _ => {
            return Array::failed("addmm", OpErrorKind::ShapeMismatch { lhs: c.shape().to_vec(), rhs: out });
        }
    };
    if a3.shape()[a3.ndim() - 1] == 0 {
        // An empty product: only beta * c remains.
        return (c3 * beta).astype(dtype).reshape(out);
    }
    let prim = Primitive::AddMM { alpha, beta };
    Array::from_op("addmm", prim, vec![a3.astype(dtype), b3.astype(dtype), c3]).reshape(out)
}
