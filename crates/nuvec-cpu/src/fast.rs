//! Fused CPU kernels of fast operations: softmax and log-sum-exp over rows here; the norms and
//! SwiGLU in `norm_rows.rs`.

use std::any::TypeId;

use num_traits::{Float as _, One, Zero};
use nuvec_core::Result;
use nuvec_core::fast::FastOp;
use nuvec_core::storage::{Data, HostBuffer, Operand, Output, Spec};
use rayon::prelude::*;

use crate::elem::{AccFloat, Float};
use crate::map::simd;
use crate::strided::GRAIN;
use crate::{copy, norm_rows};
use crate::{for_float, host_slice, internal};

/// Whether this backend has a kernel for `op` on inputs of these (float) dtypes.
pub fn supports(op: &FastOp, inputs: &[Spec]) -> bool {
    match op {
        FastOp::Softmax | FastOp::LogSumExp => true,
        // One dtype for every input, the output's: mixed dtypes take the composition.
        FastOp::RmsNorm { .. } | FastOp::AddRmsNorm { .. } | FastOp::LayerNorm { .. } | FastOp::SwiGlu => {
            inputs.iter().all(|s| s.dtype == inputs[0].dtype)
        }
        _ => false,
    }
}

pub fn eval(op: &FastOp, inputs: Vec<Operand>, outputs: &mut [Output]) -> Result<()> {
    let inputs: Vec<Operand> = inputs.into_iter().map(row_major).collect::<Result<_>>()?;
    let x = inputs.first().ok_or_else(|| internal("fast op without input"))?;
    let len = x.shape.last().copied().unwrap_or(1) as usize;
    match op {
        FastOp::Softmax => for_float!(x.dtype, T => rows::<T>(x, &mut outputs[0], len, softmax_row::<T>)),
        FastOp::LogSumExp => for_float!(x.dtype, T => rows::<T>(x, &mut outputs[0], 1, lse_row::<T>)),
        _ => norm_rows::eval(op, &inputs, outputs),
    }
}

/// The operand itself when its rows are dense, else a row-major copy.
fn row_major(x: Operand) -> Result<Operand> {
    if x.data.layout.flags.row_contiguous {
        return Ok(x);
    }
    let mut o = Output { shape: x.shape.clone(), dtype: x.dtype, data: None };
    let (shape, dtype) = (x.shape.clone(), x.dtype);
    copy::copy(x, &mut o)?;
    Ok(Operand { shape, dtype, data: o.data.ok_or_else(|| internal("copy produced no output"))?, donated: false })
}

/// Applies the row kernel `f` (a named `#[inline(always)]` function, see [`simd`]) to each row.
fn rows<T: Float>(x: &Operand, out: &mut Output, out_len: usize, f: impl Fn(&[T], &mut [T]) + Sync) -> Result<()> {
    let len = x.shape.last().copied().unwrap_or(1) as usize;
    let start = x.data.layout.offset;
    let xs = &host_slice::<T>(x)?[start..start + x.size()];
    let mut buf = HostBuffer::uninit(out.size() * size_of::<T>());
    if len > 0 && out_len > 0 {
        let per = (GRAIN / len).max(1);
        buf.as_mut_slice::<T>()
            .par_chunks_mut(per * out_len)
            .zip(xs.par_chunks(per * len))
            .for_each(|(o, x)| simd(each_row, (o, x, out_len, len, &f)));
    }
    out.data = Some(Data::from_host_buffer(&out.shape, buf));
    Ok(())
}

#[inline(always)]
fn each_row<T: Float, F: Fn(&[T], &mut [T])>((o, x, out_len, len, f): (&mut [T], &[T], usize, usize, &F)) {
    for (o, x) in o.chunks_mut(out_len).zip(x.chunks(len)) {
        f(x, o)
    }
}

const L: usize = 16;

/// Row maximum, NaN propagating.
#[inline(always)]
fn row_max<T: Float>(x: &[T]) -> T::Acc {
    let low = T::lowest().to_acc();
    let pick = |m: T::Acc, v: T::Acc| if v > m || v.is_nan() { v } else { m };
    let mut lanes = [low; L];
    let mut chunks = x.chunks_exact(L);
    for c in &mut chunks {
        for i in 0..L {
            lanes[i] = pick(lanes[i], c[i].to_acc());
        }
    }
    chunks.remainder().iter().map(|v| v.to_acc()).chain(lanes).fold(low, pick)
}

/// `Σ f(v)` over a row, in `L` independent lanes the compiler keeps in vector registers.
#[inline(always)]
pub(crate) fn lane_sum<T: Float>(x: &[T], f: impl Fn(T::Acc) -> T::Acc) -> T::Acc {
    let mut lanes = [T::Acc::zero(); L];
    let mut chunks = x.chunks_exact(L);
    for c in &mut chunks {
        for i in 0..L {
            lanes[i] = lanes[i] + f(c[i].to_acc());
        }
    }
    let tail = chunks.remainder().iter().fold(T::Acc::zero(), |a, v| a + f(v.to_acc()));
    lanes.into_iter().fold(tail, |a, b| a + b)
}

/// `sum(exp(x - m))`.
#[inline(always)]
fn exp_sum<T: Float>(x: &[T], m: T::Acc) -> T::Acc {
    lane_sum(x, |v| (v - m).vexp())
}

/// `sum(exp(x - m))`, writing each exponential to `o`.
#[inline(always)]
fn exp_sum_store<T: Float>(x: &[T], m: T::Acc, o: &mut [T]) -> T::Acc {
    let mut lanes = [T::Acc::zero(); L];
    let mut chunks = x.chunks_exact(L);
    let mut outs = o.chunks_exact_mut(L);
    for (c, o) in (&mut chunks).zip(&mut outs) {
        for i in 0..L {
            let e = (c[i].to_acc() - m).vexp();
            o[i] = T::from_acc(e);
            lanes[i] = lanes[i] + e;
        }
    }
    let mut tail = T::Acc::zero();
    for (v, o) in chunks.remainder().iter().zip(outs.into_remainder()) {
        let e = (v.to_acc() - m).vexp();
        *o = T::from_acc(e);
        tail = tail + e;
    }
    lanes.into_iter().fold(tail, |a, b| a + b)
}

#[inline(always)]
fn softmax_row<T: Float>(x: &[T], o: &mut [T]) {
    let m = row_max(x);
    if m.is_nan() || (m.is_infinite() && m > T::Acc::zero()) {
        // As the composition: inf − inf (or NaN) gives NaN everywhere.
        o.iter_mut().for_each(|v| *v = T::from_acc(T::Acc::nan()));
        return;
    }
    // When the element type is the accumulator type the stored exponentials are exact, so the
    // second pass only rescales them.
    let exact = TypeId::of::<T>() == TypeId::of::<T::Acc>();
    let sum = if exact { exp_sum_store(x, m, o) } else { exp_sum(x, m) };
    let inv = T::Acc::one() / sum;
    if exact {
        o.iter_mut().for_each(|v| *v = T::from_acc(v.to_acc() * inv));
    } else {
        for (o, v) in o.iter_mut().zip(x) {
            *o = T::from_acc((v.to_acc() - m).vexp() * inv);
        }
    }
}

#[inline(always)]
fn lse_row<T: Float>(x: &[T], o: &mut [T]) {
    let m = row_max(x);
    if m.is_infinite() || m.is_nan() {
        o[0] = T::from_acc(m);
        return;
    }
    o[0] = T::from_acc(exp_sum(x, m).ln() + m);
}
