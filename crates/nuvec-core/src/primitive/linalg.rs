//! Matrix products: `Matmul` and `AddMM`, and their shape and dtype rules.

use crate::error::OpErrorKind;
use crate::shape::{Shape, broadcast_shapes};
use crate::storage::Spec;

/// The shape of `a @ b` for `[..., M, K]` and `[..., K, N]` of one rank, batch shape and dtype.
pub fn matmul_shape(a: &Spec, b: &Spec) -> Result<Shape, OpErrorKind> {
    let (ra, rb) = (a.shape.len(), b.shape.len());
    let mismatch = || OpErrorKind::ShapeMismatch { lhs: a.shape.to_vec(), rhs: b.shape.to_vec() };
    if ra < 2 || rb < 2 || ra != rb || a.shape[..ra - 2] != b.shape[..rb - 2] {
        return Err(mismatch());
    }
    if a.dtype != b.dtype {
        return Err(OpErrorKind::DTypeMismatch { lhs: a.dtype, rhs: b.dtype });
    }
    if a.shape[ra - 1] != b.shape[rb - 2] {
        return Err(mismatch());
    }
    let mut s: Shape = a.shape[..ra - 1].into();
    s.push(b.shape[rb - 1]);
    Ok(s)
}

/// `Matmul`'s output: `a @ b` in `a`'s dtype.
pub fn matmul_spec(a: &Spec, b: &Spec) -> Result<Spec, OpErrorKind> {
    Ok(Spec { shape: matmul_shape(a, b)?, dtype: a.dtype })
}

/// `AddMM`'s output: `a @ b`, with `c` broadcastable to it and of `a`'s dtype.
pub fn addmm_spec(a: &Spec, b: &Spec, c: &Spec) -> Result<Spec, OpErrorKind> {
    let s = matmul_shape(a, b)?;
    let bc = broadcast_shapes(&c.shape, &s)?;
    if bc[..] != s[..] || c.dtype != a.dtype {
        return Err(OpErrorKind::ShapeMismatch { lhs: c.shape.to_vec(), rhs: s.to_vec() });
    }
    Ok(Spec { shape: s, dtype: a.dtype })
}
