//! Fused CPU kernels of the row norms: RMS norm (with the residual add) and layer norm. They
//! compute what the compositions in `nuvec_core::fast` compute —
//! statistics in the accumulator type (`f32`; `f64` for `f64`), the normalised row rounded to
//! the element type before the weight multiplies it and the bias is added — in one task per
//! block of rows instead of one pass over the whole tensor per operation (and no `f32` copies of
//! half-precision inputs).

use num_traits::{Float as _, NumCast, One};
use nuvec_core::Result;
use nuvec_core::fast::FastOp;
use nuvec_core::storage::{Data, Operand, Output};
use rayon::prelude::*;

use super::{buffer, elems, lane_sum, rows_per_task};
use crate::elem::{AccFloat, Float};
use crate::map::simd_kernel;
use crate::{for_float, internal};

fn acc_of<A: AccFloat>(v: f64) -> A {
    <A as NumCast>::from(v).unwrap_or_else(A::zero)
}

/// Runs `op` (RMS norm, its residual-add form or layer norm) on row-major operands of one float
/// dtype.
pub(crate) fn eval(op: &FastOp, inputs: &[Operand], outputs: &mut [Output]) -> Result<()> {
    let d = inputs.first().ok_or_else(|| internal("fast op without input"))?.dtype;
    for_float!(d, T => eval_typed::<T>(op, inputs, outputs))
}

fn eval_typed<T: Float>(op: &FastOp, inputs: &[Operand], outputs: &mut [Output]) -> Result<()> {
    let x = &inputs[0];
    let len = x.shape.last().copied().unwrap_or(1).max(0) as usize;
    let xs = elems::<T>(x)?;
    match *op {
        FastOp::RmsNorm { eps, weighted } => {
            let w = if weighted { Some(elems::<T>(&inputs[1])?) } else { None };
            let mut y = buffer::<T>(&outputs[0])?;
            rms_rows(xs, w, y.as_mut_slice::<T>(), len, acc_of(eps as f64));
            outputs[0].data = Some(Data::from_host_buffer(&outputs[0].shape, y));
        }
        FastOp::AddRmsNorm { eps, weighted } => {
            let r = elems::<T>(&inputs[1])?;
            let w = if weighted { Some(elems::<T>(&inputs[2])?) } else { None };
            let (mut h, mut y) = (buffer::<T>(&outputs[0])?, buffer::<T>(&outputs[1])?);
            let eps = acc_of(eps as f64);
            let per = rows_per_task(len) * len.max(1);
            h.as_mut_slice::<T>()
                .par_chunks_mut(per)
                .zip(y.as_mut_slice::<T>().par_chunks_mut(per))
                .zip(xs.par_chunks(per).zip(r.par_chunks(per)))
                .for_each(|((h, y), (x, r))| add_rms_simd((x, r, w, h, y, len, eps)));
            outputs[0].data = Some(Data::from_host_buffer(&outputs[0].shape, h));
            outputs[1].data = Some(Data::from_host_buffer(&outputs[1].shape, y));
        }
        FastOp::LayerNorm { eps, weighted, biased } => {
            let w = if weighted { Some(elems::<T>(&inputs[1])?) } else { None };
            let b = if biased { Some(elems::<T>(&inputs[inputs.len() - 1])?) } else { None };
            let mut y = buffer::<T>(&outputs[0])?;
            let eps = acc_of(eps as f64);
            let per = rows_per_task(len) * len.max(1);
            y.as_mut_slice::<T>()
                .par_chunks_mut(per)
                .zip(xs.par_chunks(per))
                .for_each(|(y, x)| layer_norm_simd((x, w, b, y, len, eps)));
            outputs[0].data = Some(Data::from_host_buffer(&outputs[0].shape, y));
        }
        _ => return Err(internal(format!("no fused CPU kernel for {}", op.name()))),
    }
    Ok(())
}

fn rms_rows<T: Float>(x: &[T], w: Option<&[T]>, y: &mut [T], len: usize, eps: T::Acc) {
    if len == 0 {
        return;
    }
    let per = rows_per_task(len) * len;
    y.par_chunks_mut(per).zip(x.par_chunks(per)).for_each(|(y, x)| rms_simd((x, w, y, len, eps)));
}

simd_kernel!(rms_simd => rms_chunk<T: Float>((&[T], Option<&[T]>, &mut [T], usize, T::Acc)));
simd_kernel!(add_rms_simd => add_rms_chunk<T: Float>((&[T], &[T], Option<&[T]>, &mut [T], &mut [T], usize, T::Acc)));
simd_kernel!(layer_norm_simd => layer_norm_chunk<T: Float>((&[T], Option<&[T]>, Option<&[T]>, &mut [T], usize, T::Acc)));

/// `y = round(x·n)·w` (or `round(x·n)`), each product rounded to `T`, for one row.
#[inline(always)]
fn scale_row<T: Float>(x: &[T], w: Option<&[T]>, y: &mut [T], n: T::Acc) {
    match w {
        Some(w) => {
            for ((y, x), w) in y.iter_mut().zip(x).zip(w) {
                *y = T::from_acc(T::from_acc(x.to_acc() * n).to_acc() * w.to_acc());
            }
        }
        None => {
            for (y, x) in y.iter_mut().zip(x) {
                *y = T::from_acc(x.to_acc() * n);
            }
        }
    }
}

/// `rsqrt(Σ v² / len + eps)`: the RMS norm's factor.
#[inline(always)]
fn rms_factor<T: Float>(x: &[T], eps: T::Acc) -> T::Acc {
    let n: T::Acc = acc_of(x.len() as f64);
    T::Acc::one() / (lane_sum(x, |v| v * v) / n + eps).sqrt()
}

#[inline(always)]
#[allow(clippy::type_complexity)]
fn rms_chunk<T: Float>((x, w, y, len, eps): (&[T], Option<&[T]>, &mut [T], usize, T::Acc)) {
    for (y, x) in y.chunks_mut(len).zip(x.chunks(len)) {
        scale_row(x, w, y, rms_factor(x, eps));
    }
}

#[inline(always)]
#[allow(clippy::type_complexity)]
fn add_rms_chunk<T: Float>((x, r, w, h, y, len, eps): (&[T], &[T], Option<&[T]>, &mut [T], &mut [T], usize, T::Acc)) {
    if len == 0 {
        return;
    }
    for (((x, r), h), y) in x.chunks(len).zip(r.chunks(len)).zip(h.chunks_mut(len)).zip(y.chunks_mut(len)) {
        for ((h, x), r) in h.iter_mut().zip(x).zip(r) {
            *h = T::from_acc(x.to_acc() + r.to_acc());
        }
        scale_row(h, w, y, rms_factor(h, eps));
    }
}

#[inline(always)]
#[allow(clippy::type_complexity)]
fn layer_norm_chunk<T: Float>((x, w, b, y, len, eps): (&[T], Option<&[T]>, Option<&[T]>, &mut [T], usize, T::Acc)) {
    if len == 0 {
        return;
    }
    let n: T::Acc = acc_of(len as f64);
    for (y, x) in y.chunks_mut(len).zip(x.chunks(len)) {
        let mean = lane_sum(x, |v| v) / n;
        let f = T::Acc::one() / (lane_sum(x, |v| (v - mean) * (v - mean)) / n + eps).sqrt();
        for (i, (y, x)) in y.iter_mut().zip(x).enumerate() {
            let mut v = T::from_acc((x.to_acc() - mean) * f);
            if let Some(w) = w {
                v = T::from_acc(v.to_acc() * w[i].to_acc());
            }
            if let Some(b) = b {
                v = T::from_acc(v.to_acc() + b[i].to_acc());
            }
            *y = v;
        }
    }
}
