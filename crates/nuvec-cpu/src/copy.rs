//! Data movement: contiguous copies, casts, concatenation, window updates, ranges.

use std::sync::Arc;

use nuvec_core::Result;
use nuvec_core::shape::{elem_count, row_major_strides};
use nuvec_core::storage::{Data, HostBuffer, Operand, Output};
use rayon::prelude::*;

use crate::elem::{Cast, Elem, Num};
use crate::map::map1;
use crate::strided::{Rows, rows_per_chunk};
use crate::{for_all, for_real, host_slice, internal};

/// Runs `$body` with `$T` bound to an unsigned type of `$size` bytes: copies only move bytes.
macro_rules! by_size {
    ($size:expr, $T:ident => $body:expr) => {
        match $size {
            1 => {
                type $T = u8;
                $body
            }
            2 => {
                type $T = u16;
                $body
            }
            4 => {
                type $T = u32;
                $body
            }
            8 => {
                type $T = u64;
                $body
            }
            s => Err(internal(format!("no copy kernel for {s}-byte elements"))),
        }
    };
}

/// The operand itself when row-major, else a row-major copy (for kernels that walk dense rows).
pub(crate) fn row_major(x: Operand) -> Result<Operand> {
    if x.data.layout.flags.row_contiguous {
        return Ok(x);
    }
    let mut o = Output { shape: x.shape.clone(), dtype: x.dtype, data: None };
    let (shape, dtype) = (x.shape.clone(), x.dtype);
    copy(x, &mut o)?;
    Ok(Operand { shape, dtype, data: o.data.ok_or_else(|| internal("copy produced no output"))?, donated: false })
}

/// A row-major copy of `x`.
pub fn copy(x: Operand, out: &mut Output) -> Result<()> {
    by_size!(x.dtype.size(), T => {
        let n = out.size();
        let mut buf = HostBuffer::uninit(n * size_of_t::<T>())?;
        write_window::<T>(&x, buf.as_mut_slice::<T>(), &row_major_strides(&out.shape), 0)?;
        out.data = Some(Data::from_host_buffer(&out.shape, buf));
        Ok(())
    })
}

fn size_of_t<T>() -> usize {
    std::mem::size_of::<T>()
}

/// Copies `src` into `dst` at the positions given by `dst_strides` from `dst_offset`, in
/// parallel when `dst` is row-major (the rows are then disjoint slices).
fn write_window<T: bytemuck::Pod + Send + Sync>(
    src: &Operand,
    dst: &mut [T],
    dst_strides: &[isize],
    dst_offset: usize,
) -> Result<()> {
    let xs = host_slice::<T>(src)?;
    let rows = Rows::new(&src.shape, [dst_strides, &src.data.layout.strides], [dst_offset, src.data.layout.offset]);
    if rows.count == 0 || rows.inner == 0 {
        return Ok(());
    }
    let dense_dst = dst_offset == 0 && rows.inner_strides[0] == 1 && dst_strides == &row_major_strides(&src.shape)[..];
    if dense_dst && dst.len() == rows.count * rows.inner {
        let per = rows_per_chunk(rows.inner);
        dst.par_chunks_mut(per * rows.inner).enumerate().for_each(|(c, chunk)| {
            let start = c * per;
            let end = (start + per).min(rows.count);
            rows.for_each(start, end, |r, off| {
                let d = &mut chunk[(r - start) * rows.inner..(r - start + 1) * rows.inner];
                copy_row(d, xs, off[1], rows.inner_strides[1]);
            });
        });
        return Ok(());
    }
    rows.for_each(0, rows.count, |_, off| {
        let (mut pd, sd) = (off[0], rows.inner_strides[0]);
        let (mut ps, ss) = (off[1], rows.inner_strides[1]);
        for _ in 0..rows.inner {
            dst[pd as usize] = xs[ps as usize];
            pd += sd;
            ps += ss;
        }
    });
    Ok(())
}

#[inline(always)]
fn copy_row<T: Copy>(d: &mut [T], xs: &[T], start: isize, stride: isize) {
    if stride == 1 {
        d.copy_from_slice(&xs[start as usize..start as usize + d.len()]);
    } else {
        let mut p = start;
        for v in d.iter_mut() {
            *v = xs[p as usize];
            p += stride;
        }
    }
}

/// Conversion to `out.dtype`.
pub fn astype(x: Operand, out: &mut Output) -> Result<()> {
    let to = out.dtype;
    for_all!(x.dtype, S => for_all!(to, D => map1::<S, D>(x, out, |v: S| Cast::cast::<D>(v))))
}

/// Joins the inputs along `axis` into a row-major output.
pub fn concatenate(axis: usize, inputs: Vec<Operand>, out: &mut Output) -> Result<()> {
    by_size!(out.dtype.size(), T => {
        let mut buf = HostBuffer::uninit(out.size() * size_of_t::<T>())?;
        let strides = row_major_strides(&out.shape);
        let mut at = 0usize;
        for x in &inputs {
            write_window::<T>(x, buf.as_mut_slice::<T>(), &strides, at * strides[axis] as usize)?;
            at += x.shape[axis] as usize;
        }
        out.data = Some(Data::from_host_buffer(&out.shape, buf));
        Ok(())
    })
}

/// `src` with a strided window replaced by `update`; in `src`'s buffer when it was donated.
pub fn slice_update(start: &[i32], step: &[i32], src: Operand, update: Operand, out: &mut Output) -> Result<()> {
    by_size!(src.dtype.size(), T => {
        // In place only into a dense, unshared buffer (a broadcast source repeats elements).
        let (mut data, strides, offset) = if src.donated && src.data.layout.flags.contiguous {
            let mut d = src.data.clone();
            drop(src);
            if Arc::get_mut(&mut d.storage).is_some() {
                let (s, o) = (d.layout.strides.clone(), d.layout.offset);
                (d, s, o)
            } else {
                let op = Operand { shape: out.shape.clone(), dtype: out.dtype, data: d, donated: false };
                copy(op, out)?;
                let d = out.data.take().ok_or_else(|| internal("copy produced no output"))?;
                (d, row_major_strides(&out.shape), 0)
            }
        } else {
            copy(src, out)?;
            let d = out.data.take().ok_or_else(|| internal("copy produced no output"))?;
            (d, row_major_strides(&out.shape), 0)
        };
        let mut window_offset = offset as isize;
        let mut window_strides = strides.clone();
        for i in 0..start.len() {
            window_offset += start[i] as isize * strides[i];
            window_strides[i] = strides[i] * step[i] as isize;
        }
        if elem_count(&update.shape) > 0 {
            let buf = Arc::get_mut(&mut data.storage)
                .and_then(|s| s.host_buffer_mut())
                .ok_or_else(|| internal("slice_update output is shared"))?;
            write_window_signed::<T>(&update, buf.as_mut_slice::<T>(), &window_strides, window_offset)?;
        }
        out.data = Some(data);
        Ok(())
    })
}

fn write_window_signed<T: bytemuck::Pod + Send + Sync>(
    src: &Operand,
    dst: &mut [T],
    dst_strides: &[isize],
    dst_offset: isize,
) -> Result<()> {
    if dst_offset < 0 {
        return Err(internal("window starts before the buffer"));
    }
    let xs = host_slice::<T>(src)?;
    let rows =
        Rows::new(&src.shape, [dst_strides, &src.data.layout.strides], [dst_offset as usize, src.data.layout.offset]);
    rows.for_each(0, rows.count, |_, off| {
        let (mut pd, sd) = (off[0], rows.inner_strides[0]);
        let (mut ps, ss) = (off[1], rows.inner_strides[1]);
        for _ in 0..rows.inner {
            dst[pd as usize] = xs[ps as usize];
            pd += sd;
            ps += ss;
        }
    });
    Ok(())
}

/// `start + i * step` in the output dtype. Integer ranges step by `T(start + step) - T(start)`
/// (MLX's rule, so float bounds with an integer dtype step by whole numbers); float ranges are
/// `start + i * step` rounded once.
pub fn arange(start: f64, step: f64, out: &mut Output) -> Result<()> {
    if out.dtype.is_integer() {
        return crate::for_int!(out.dtype, T => {
            let s0 = T::from_f64(start);
            let st = Num::sub(T::from_f64(start + step), s0);
            fill_with::<T>(out, move |i| Num::add(s0, Num::mul(T::from_u64(i as u64), st)))
        });
    }
    for_real!(out.dtype, T => fill_with::<T>(out, |i| T::from_f64(start + i as f64 * step)))
}

fn fill_with<T: Elem>(out: &mut Output, f: impl Fn(usize) -> T + Sync) -> Result<()> {
    let n = out.size();
    let mut buf = HostBuffer::uninit(n * std::mem::size_of::<T>())?;
    buf.as_mut_slice::<T>().par_iter_mut().enumerate().for_each(|(i, v)| *v = f(i));
    out.data = Some(Data::from_host_buffer(&out.shape, buf));
    Ok(())
}
