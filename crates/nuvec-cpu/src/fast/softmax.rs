//! Fused CPU kernels of softmax and log-sum-exp over the last axis: per row, the maximum, then
//! the exponentials summed in the accumulator type (`f32`; `f64` for `f64`) in the lane order
//! of [`lane_sum`](super::lane_sum), rounded once to the element type.

use std::any::TypeId;

use num_traits::{Float as _, One, Zero};
use nuvec_core::Result;
use nuvec_core::fast::FastOp;
use nuvec_core::storage::{Data, HostBuffer, Operand, Output};
use rayon::prelude::*;

use super::{exp_sum_store, lane_sum, row_max};
use crate::elem::{AccFloat, Float};
use crate::strided::GRAIN;
use crate::{for_float, host_slice, internal};

/// Runs `op` (`Softmax` or `LogSumExp`) on a row-major operand of a float dtype.
pub(crate) fn eval(op: &FastOp, inputs: &[Operand], outputs: &mut [Output]) -> Result<()> {
    let x = inputs.first().ok_or_else(|| internal("fast op without input"))?;
    let out = outputs.first_mut().ok_or_else(|| internal("fast op without output"))?;
    let len = x.shape.last().copied().unwrap_or(1) as usize;
    match op {
        FastOp::Softmax => for_float!(x.dtype, T => rows::<T>(x, out, len, softmax_rows::<T>)),
        FastOp::LogSumExp => for_float!(x.dtype, T => rows::<T>(x, out, 1, lse_rows::<T>)),
        _ => Err(internal(format!("no softmax kernel for {}", op.name()))),
    }
}

/// Applies `f` (rows of `len` inputs into rows of `out_len` outputs) to chunks of rows.
fn rows<T: Float>(
    x: &Operand,
    out: &mut Output,
    out_len: usize,
    f: impl Fn(&mut [T], &[T], usize, usize) + Sync,
) -> Result<()> {
    let len = x.shape.last().copied().unwrap_or(1) as usize;
    let start = x.data.layout.offset;
    let xs = &host_slice::<T>(x)?[start..start + x.size()];
    let mut buf = HostBuffer::uninit(out.size() * size_of::<T>())?;
    if len > 0 && out_len > 0 {
        let per = (GRAIN / len).max(1);
        buf.as_mut_slice::<T>()
            .par_chunks_mut(per * out_len)
            .zip(xs.par_chunks(per * len))
            .for_each(|(o, x)| f(o, x, out_len, len));
    }
    out.data = Some(Data::from_host_buffer(&out.shape, buf));
    Ok(())
}

/// Row kernels over chunks of rows, compiled twice: for AVX2 and FMA (taken when the CPU has
/// them) and for the baseline. The kernel is called by name inside the `target_feature`
/// function, so it is inlined there: passed to the generic `simd` wrapper it was too large to
/// inline and ran on SSE (half the lanes).
macro_rules! row_kernels {
    ($name:ident, $v3:ident, $row:ident) => {
        fn $name<T: Float>(o: &mut [T], x: &[T], out_len: usize, len: usize) {
            #[cfg(target_arch = "x86_64")]
            if crate::map::has_x86_v3() {
                // SAFETY: the features the function enables were detected on this CPU.
                return unsafe { $v3(o, x, out_len, len) };
            }
            for (o, x) in o.chunks_mut(out_len).zip(x.chunks(len)) {
                $row(x, o)
            }
        }

        #[cfg(target_arch = "x86_64")]
        #[target_feature(enable = "avx,avx2,fma,f16c")]
        unsafe fn $v3<T: Float>(o: &mut [T], x: &[T], out_len: usize, len: usize) {
            for (o, x) in o.chunks_mut(out_len).zip(x.chunks(len)) {
                $row(x, o)
            }
        }
    };
}
row_kernels!(softmax_rows, softmax_rows_v3, softmax_row);
row_kernels!(lse_rows, lse_rows_v3, lse_row);

/// `sum(exp(x - m))`.
#[inline(always)]
fn exp_sum<T: Float>(x: &[T], m: T::Acc) -> T::Acc {
    lane_sum(x, |v| (v - m).vexp())
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
    let sum = if exact { exp_sum_store(x, m, o, T::from_acc) } else { exp_sum(x, m) };
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
    o[0] = T::from_acc(row_lse(x));
}

/// `log(sum(exp(x)))` in the accumulator type: `log(sum(exp(x − m))) + m`, or the maximum `m`
/// itself when it is infinite or NaN.
#[inline(always)]
pub(crate) fn row_lse<T: Float>(x: &[T]) -> T::Acc {
    let m = row_max(x);
    if m.is_infinite() || m.is_nan() {
        return m;
    }
    exp_sum(x, m).ln() + m
}
