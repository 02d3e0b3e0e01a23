//! Shapes, strides, axes arguments and broadcasting rules.

use smallvec::SmallVec;

use crate::error::OpErrorKind;

/// An array shape (`i32` sizes, as MLX).
pub type Shape = SmallVec<[i32; 6]>;
/// Strides in elements (may be zero for broadcasts or negative for reversed slices).
pub type Strides = SmallVec<[isize; 6]>;

/// Something that names a shape: `[2, 3]`, `&[2, 3]`, `vec![2, 3]`, `()` for a scalar.
pub trait IntoShape {
    /// The shape, or `Err` with the offending values when an entry does not fit `i32`.
    fn into_shape(self) -> Result<Shape, Vec<i64>>;
}

macro_rules! into_shape_int {
    ($($t:ty),*) => {$(
        impl<const N: usize> IntoShape for [$t; N] {
            fn into_shape(self) -> Result<Shape, Vec<i64>> { (&self[..]).into_shape() }
        }
        impl<const N: usize> IntoShape for &[$t; N] {
            fn into_shape(self) -> Result<Shape, Vec<i64>> { (&self[..]).into_shape() }
        }
        impl IntoShape for &[$t] {
            fn into_shape(self) -> Result<Shape, Vec<i64>> {
                let wide: Vec<i64> = self.iter().map(|&d| d as i64).collect();
                if wide.iter().all(|&d| d >= i32::MIN as i64 && d <= i32::MAX as i64) {
                    Ok(wide.iter().map(|&d| d as i32).collect())
                } else {
                    Err(wide)
                }
            }
        }
        impl IntoShape for Vec<$t> {
            fn into_shape(self) -> Result<Shape, Vec<i64>> { (&self[..]).into_shape() }
        }
        impl IntoShape for &Vec<$t> {
            fn into_shape(self) -> Result<Shape, Vec<i64>> { (&self[..]).into_shape() }
        }
    )*};
}
into_shape_int!(i32, i64, usize, u32);

impl IntoShape for () {
    fn into_shape(self) -> Result<Shape, Vec<i64>> {
        Ok(Shape::new())
    }
}
impl IntoShape for Shape {
    fn into_shape(self) -> Result<Shape, Vec<i64>> {
        Ok(self)
    }
}
impl IntoShape for &Shape {
    fn into_shape(self) -> Result<Shape, Vec<i64>> {
        Ok(self.clone())
    }
}

/// A set of axes: one axis (`1`, `-1`), a list (`[0, 2]`, `&[0, 2]`, `vec![..]`), `..` for all
/// axes, or `1..` for the axes from 1 on. An empty list names no axis.
pub trait Axes {
    /// The axes as given (possibly negative), for an array of `ndim` dimensions.
    fn axes(&self, ndim: usize) -> Vec<i32>;
    /// Whether this is `..` ("every axis"; `squeeze` then takes every size-1 axis).
    fn is_all(&self) -> bool {
        false
    }
}

impl Axes for i32 {
    fn axes(&self, _ndim: usize) -> Vec<i32> {
        vec![*self]
    }
}
impl Axes for usize {
    fn axes(&self, _ndim: usize) -> Vec<i32> {
        vec![*self as i32]
    }
}
impl<const N: usize> Axes for [i32; N] {
    fn axes(&self, _ndim: usize) -> Vec<i32> {
        self.to_vec()
    }
}
impl Axes for [i32] {
    fn axes(&self, _ndim: usize) -> Vec<i32> {
        self.to_vec()
    }
}
impl Axes for Vec<i32> {
    fn axes(&self, _ndim: usize) -> Vec<i32> {
        self.clone()
    }
}
impl Axes for std::ops::RangeFull {
    fn axes(&self, ndim: usize) -> Vec<i32> {
        (0..ndim as i32).collect()
    }
    fn is_all(&self) -> bool {
        true
    }
}
impl<T: Axes + ?Sized> Axes for &T {
    fn axes(&self, ndim: usize) -> Vec<i32> {
        (**self).axes(ndim)
    }
    fn is_all(&self) -> bool {
        (**self).is_all()
    }
}
impl Axes for std::ops::RangeFrom<i32> {
    fn axes(&self, ndim: usize) -> Vec<i32> {
        let start = if self.start < 0 { self.start + ndim as i32 } else { self.start };
        (start.max(0)..ndim as i32).collect()
    }
}

/// Number of elements of a shape.
pub fn elem_count(shape: &[i32]) -> usize {
    shape.iter().map(|&d| d as usize).product()
}

/// Row-major strides of a shape.
pub fn row_major_strides(shape: &[i32]) -> Strides {
    let mut strides: Strides = SmallVec::from_elem(0, shape.len());
    let mut acc = 1isize;
    for i in (0..shape.len()).rev() {
        strides[i] = acc;
        acc *= shape[i].max(1) as isize;
    }
    strides
}

/// Checks a requested shape: every size non-negative and the element count representable.
pub fn check_shape(shape: &[i32]) -> Result<(), OpErrorKind> {
    let mut total: i64 = 1;
    for &d in shape {
        if d < 0 {
            return Err(OpErrorKind::InvalidShape(shape.iter().map(|&d| d as i64).collect()));
        }
        total = total.saturating_mul(d as i64);
    }
    if total > i64::MAX / 16 {
        return Err(OpErrorKind::InvalidShape(shape.iter().map(|&d| d as i64).collect()));
    }
    Ok(())
}

/// The broadcast of two shapes (NumPy rules), or the mismatch.
pub fn broadcast_shapes(a: &[i32], b: &[i32]) -> Result<Shape, OpErrorKind> {
    let n = a.len().max(b.len());
    let mut out: Shape = SmallVec::from_elem(0, n);
    for i in 0..n {
        let da = if i + a.len() >= n { a[i + a.len() - n] } else { 1 };
        let db = if i + b.len() >= n { b[i + b.len() - n] } else { 1 };
        out[i] = if da == db || db == 1 {
            da
        } else if da == 1 {
            db
        } else {
            return Err(OpErrorKind::ShapeMismatch { lhs: a.to_vec(), rhs: b.to_vec() });
        };
    }
    Ok(out)
}

/// Maps a possibly negative axis into `0..ndim`.
pub fn normalize_axis(axis: i32, ndim: usize) -> Result<usize, OpErrorKind> {
    let n = ndim as i32;
    if axis < -n || axis >= n {
        return Err(OpErrorKind::InvalidAxis { axis, ndim });
    }
    Ok(if axis < 0 { (axis + n) as usize } else { axis as usize })
}

/// Normalizes, sorts and deduplicates-checks a list of axes.
pub fn normalize_axes(axes: &[i32], ndim: usize) -> Result<Vec<usize>, OpErrorKind> {
    let mut out = Vec::with_capacity(axes.len());
    for &a in axes {
        let ax = normalize_axis(a, ndim)?;
        if out.contains(&ax) {
            return Err(OpErrorKind::InvalidArgument(format!("axis {a} is repeated")));
        }
        out.push(ax);
    }
    out.sort_unstable();
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn broadcasting() {
        assert_eq!(&broadcast_shapes(&[3, 1], &[4]).unwrap()[..], &[3, 4]);
        assert_eq!(&broadcast_shapes(&[], &[2, 0]).unwrap()[..], &[2, 0]);
        assert!(broadcast_shapes(&[3], &[4]).is_err());
    }

    #[test]
    fn axes() {
        assert_eq!(normalize_axes(&[-1, 0], 3).unwrap(), vec![0, 2]);
        assert!(normalize_axes(&[3], 3).is_err());
        assert!(normalize_axes(&[1, -2], 3).is_err());
        assert_eq!((1..).axes(3), vec![1, 2]);
    }
}
