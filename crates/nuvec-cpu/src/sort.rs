//! Sorts and partitions along one axis, in parallel over rows.
//!
//! Each row is gathered as `(value, index)` pairs and ordered once; the value forms write the
//! values of that order and the index forms its indices, so `sort == take(argsort)` holds
//! exactly (the derivative rules rely on it). The output is written with the sorted axis last in
//! memory (its strides say so), which keeps every row one contiguous run.

use std::cmp::Ordering;
use std::sync::Arc;

use bytemuck::Pod;
use nuvec_core::primitive::SortOp;
use nuvec_core::shape::row_major_strides;
use nuvec_core::storage::{Data, HostBuffer, Layout, Operand, Output, Storage};
use nuvec_core::{DType, Result};
use rayon::prelude::*;

use crate::elem::{B8, Elem};
use crate::strided::{Rows, rows_per_chunk};
use crate::{for_all, host_slice};

/// MLX's sort order: NaN after every number and equal to other NaNs; `-0.0 == 0.0`; complex
/// numbers by real, then imaginary part (NaN when either part is).
pub(crate) trait SortKey: Copy {
    /// The order of `self` and `other`.
    fn key_cmp(&self, other: &Self) -> Ordering;
}

macro_rules! ord_key {
    ($($t:ty),*) => {$(
        impl SortKey for $t {
            #[inline(always)]
            fn key_cmp(&self, other: &Self) -> Ordering { self.cmp(other) }
        }
    )*};
}
ord_key!(B8, u8, u16, u32, u64, i8, i16, i32, i64);

#[inline(always)]
fn nan_last<F: PartialOrd + Copy>(a: F, b: F, a_nan: bool, b_nan: bool) -> Ordering {
    match (a_nan, b_nan) {
        (false, false) => a.partial_cmp(&b).unwrap_or(Ordering::Equal),
        (a_nan, b_nan) => a_nan.cmp(&b_nan),
    }
}

macro_rules! float_key {
    ($($t:ty),*) => {$(
        impl SortKey for $t {
            #[inline(always)]
            fn key_cmp(&self, other: &Self) -> Ordering { nan_last(*self, *other, self.is_nan(), other.is_nan()) }
        }
    )*};
}
float_key!(f32, f64, half::f16, half::bf16);

impl SortKey for nuvec_core::dtype::Complex64 {
    #[inline(always)]
    fn key_cmp(&self, other: &Self) -> Ordering {
        let (an, bn) = (self.re.is_nan() || self.im.is_nan(), other.re.is_nan() || other.im.is_nan());
        if an || bn {
            return an.cmp(&bn);
        }
        nan_last(self.re, other.re, false, false).then(nan_last(self.im, other.im, false, false))
    }
}

/// Runs `op` along `axis` of `x`.
pub fn eval(op: SortOp, axis: usize, x: Operand, out: &mut Output) -> Result<()> {
    let dtype: DType = x.dtype;
    for_all!(dtype, T => {
        if op.returns_indices() {
            run::<T, u32>(op, axis, &x, out, |_, i| i)
        } else {
            run::<T, T>(op, axis, &x, out, |v, _| v)
        }
    })
}

fn run<T: Elem + SortKey, O: Pod + Send>(
    op: SortOp,
    axis: usize,
    x: &Operand,
    out: &mut Output,
    pick: impl Fn(T, u32) -> O + Sync,
) -> Result<()> {
    let xs = host_slice::<T>(x)?;
    let nd = x.shape.len();
    let len = x.shape[axis] as usize;
    let n = out.size();
    // The output's memory order: the other axes row-major, then the sorted axis.
    let perm: Vec<usize> = (0..nd).filter(|&a| a != axis).chain([axis]).collect();
    let moved_shape: Vec<i32> = perm.iter().map(|&a| x.shape[a]).collect();
    let moved_strides = row_major_strides(&moved_shape);
    let mut strides = vec![0isize; nd];
    for (i, &a) in perm.iter().enumerate() {
        strides[a] = moved_strides[i];
    }
    let mut buf = HostBuffer::uninit(n * size_of::<O>())?;
    if n > 0 && len > 0 {
        let o = buf.as_mut_slice::<O>();
        let kept_shape: Vec<i32> = perm[..nd - 1].iter().map(|&a| x.shape[a]).collect();
        let kept_strides: Vec<isize> = perm[..nd - 1].iter().map(|&a| x.data.layout.strides[a]).collect();
        let rows = Rows::new(&kept_shape, [&kept_strides], [x.data.layout.offset]);
        let sx = x.data.layout.strides[axis];
        let per = rows_per_chunk(len);
        o.par_chunks_mut(per * len).enumerate().for_each(|(c, chunk)| {
            let mut pairs: Vec<(T, u32)> = Vec::with_capacity(len);
            let count = chunk.len() / len;
            let mut dst = chunk.chunks_mut(len);
            rows.for_each_element(c * per, c * per + count, |off| {
                pairs.clear();
                pairs.extend((0..len).map(|j| (xs[(off[0] + j as isize * sx) as usize], j as u32)));
                order(op, &mut pairs);
                if let Some(row) = dst.next() {
                    for (d, &(v, i)) in row.iter_mut().zip(&pairs) {
                        *d = pick(v, i);
                    }
                }
            });
        });
    }
    let layout = Layout::new(&out.shape, strides.into_iter().collect(), 0);
    out.data = Some(Data { storage: Arc::new(Storage::host(buf)), layout });
    Ok(())
}

/// Orders one row of `(value, index)` pairs, given in index order.
fn order<T: SortKey>(op: SortOp, pairs: &mut [(T, u32)]) {
    match op.kth() {
        // A stable sort keeps equal values in index order.
        None => pairs.sort_by(|a, b| a.0.key_cmp(&b.0)),
        // Ties ranked by index make the selected element the one a stable sort puts at `kth`.
        Some(k) => {
            pairs.select_nth_unstable_by(k, |a, b| a.0.key_cmp(&b.0).then(a.1.cmp(&b.1)));
        }
    }
}
