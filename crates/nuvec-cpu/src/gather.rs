//! Gathers and scatters along one axis.
//!
//! Both walk the indices' shape; the source (or output) is addressed with its stride on the
//! indexed axis set to zero, so each element's position is that offset plus the index times
//! the axis stride. Indices wrap once when negative; a gather clamps what is still out of
//! range and a scatter skips it, so no access leaves the buffer.

use nuvec_core::Result;
use nuvec_core::primitive::ScatterReduce;
use nuvec_core::shape::row_major_strides;
use nuvec_core::storage::{Data, HostBuffer, Operand, Output};
use rayon::prelude::*;

use crate::elem::{Elem, Num};
use crate::strided::{GRAIN, Rows};
use crate::{for_all, host_slice, internal};

/// The indices of an operand as `i64`, read through its layout by `f(offset)`.
pub(crate) fn with_index<R>(idx: &Operand, f: impl FnOnce(&(dyn Fn(isize) -> i64 + Sync)) -> Result<R>) -> Result<R> {
    macro_rules! typed {
        ($t:ty) => {{
            let s = host_slice::<$t>(idx)?;
            f(&|o: isize| s[o as usize] as i64)
        }};
    }
    use nuvec_core::DType::*;
    match idx.dtype {
        I8 => typed!(i8),
        I16 => typed!(i16),
        I32 => typed!(i32),
        I64 => {
            let s = host_slice::<i64>(idx)?;
            f(&|o: isize| s[o as usize])
        }
        U8 => typed!(u8),
        U16 => typed!(u16),
        U32 => typed!(u32),
        // Values past i64::MAX only need to stay out of range.
        U64 => {
            let s = host_slice::<u64>(idx)?;
            f(&|o: isize| Ord::min(s[o as usize], i64::MAX as u64) as i64)
        }
        d => Err(internal(format!("indices of dtype {d}"))),
    }
}

/// Where index `i` of an axis of `n` reads in a gather: a negative index wraps once, then any
/// index is clamped into the axis.
pub(crate) fn gathered(i: i64, n: i64) -> i64 {
    (if i < 0 { i + n } else { i }).clamp(0, n - 1)
}

/// Strides of `x` with the indexed axis zeroed.
fn without_axis(strides: &[isize], axis: usize) -> Vec<isize> {
    let mut s = strides.to_vec();
    s[axis] = 0;
    s
}

/// `out[.., j, ..] = src[.., idx[.., j, ..], ..]` along `axis` into a row-major output.
pub fn gather_axis(axis: usize, src: Operand, idx: Operand, out: &mut Output) -> Result<()> {
    for_all!(src.dtype, T => gather_typed::<T>(axis, &src, &idx, out))
}

fn gather_typed<T: Elem>(axis: usize, src: &Operand, idx: &Operand, out: &mut Output) -> Result<()> {
    let xs = host_slice::<T>(src)?;
    let total = out.size();
    let mut buf = HostBuffer::uninit(total * size_of::<T>())?;
    let n = src.shape[axis] as i64;
    let axis_stride = src.data.layout.strides[axis];
    let out_strides = row_major_strides(&out.shape);
    let src_strides = without_axis(&src.data.layout.strides, axis);
    let rows = Rows::new(
        &out.shape,
        [&out_strides, &idx.data.layout.strides, &src_strides],
        [0, idx.data.layout.offset, src.data.layout.offset],
    );
    if total > 0 {
        with_index(idx, |at| {
            buf.as_mut_slice::<T>().par_chunks_mut(GRAIN).enumerate().for_each(|(c, chunk)| {
                let start = c * GRAIN;
                rows.for_each_element(start, start + chunk.len(), |o| {
                    let i = gathered(at(o[1]), n) as isize;
                    chunk[o[0] as usize - start] = xs[(o[2] + i * axis_stride) as usize];
                });
            });
            Ok(())
        })?;
    }
    out.data = Some(Data::from_host_buffer(&out.shape, buf));
    Ok(())
}

/// `src` with `upd` combined into the positions `idx` names along `axis`, in order (so with
/// repeated indices the last update of a plain scatter wins).
pub fn scatter_axis(
    axis: usize,
    reduce: ScatterReduce,
    src: Operand,
    idx: Operand,
    upd: Operand,
    out: &mut Output,
) -> Result<()> {
    // A donated source, row-major and unshared, is written in place (a cache updated every
    // step); else a copy.
    let whole = src.writable()
        && src.data.layout.offset == 0
        && src.data.layout.flags.row_contiguous
        && src.data.storage.len() == out.size() * src.dtype.size();
    let mut data = match src {
        Operand { data, .. } if whole => data,
        src => {
            crate::copy::copy(src, out)?;
            out.data.take().ok_or_else(|| internal("copy produced no output"))?
        }
    };
    {
        let buf = std::sync::Arc::get_mut(&mut data.storage)
            .and_then(|s| s.host_buffer_mut())
            .ok_or_else(|| internal("scatter output is shared"))?;
        for_all!(upd.dtype, T => scatter_typed::<T>(axis, reduce, &out.shape, buf.as_mut_slice::<T>(), &idx, &upd))?;
    }
    out.data = Some(data);
    Ok(())
}

fn scatter_typed<T: Num>(
    axis: usize,
    reduce: ScatterReduce,
    shape: &[i32],
    dst: &mut [T],
    idx: &Operand,
    upd: &Operand,
) -> Result<()> {
    let us = host_slice::<T>(upd)?;
    let n = shape[axis] as i64;
    let dst_strides = row_major_strides(shape);
    let axis_stride = dst_strides[axis];
    let dst_base = without_axis(&dst_strides, axis);
    let rows = Rows::new(
        &idx.shape,
        [&idx.data.layout.strides, &upd.data.layout.strides, &dst_base],
        [idx.data.layout.offset, upd.data.layout.offset, 0],
    );
    let combine: fn(T, T) -> T = match reduce {
        ScatterReduce::None => |_, u| u,
        ScatterReduce::Sum => Num::add,
        ScatterReduce::Prod => Num::mul,
        ScatterReduce::Max => Num::max,
        ScatterReduce::Min => Num::min,
    };
    let total = rows.count * rows.inner;
    with_index(idx, |at| {
        rows.for_each_element(0, total, |o| {
            let mut i = at(o[0]);
            if i < 0 {
                i += n;
            }
            if (0..n).contains(&i) {
                let p = (o[2] + i as isize * axis_stride) as usize;
                dst[p] = combine(dst[p], us[o[1] as usize]);
            }
        });
        Ok(())
    })
}
