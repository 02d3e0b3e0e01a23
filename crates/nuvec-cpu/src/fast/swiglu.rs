//! Fused CPU kernel of SwiGLU, `silu(gate)·up`: computed in the accumulator type (`f32`; `f64`
//! for `f64`) and rounded once, in one pass instead of the composition's one per operation.

use num_traits::One;
use nuvec_core::Result;
use nuvec_core::storage::{Data, Operand, Output};
use rayon::prelude::*;

use super::{buffer, elems};
use crate::elem::{AccFloat, Float};
use crate::map::simd_kernel;
use crate::strided::GRAIN;
use crate::{for_float, internal};

/// Runs SwiGLU on row-major operands of one float dtype: the gate, then the up projection.
pub(crate) fn eval(inputs: &[Operand], outputs: &mut [Output]) -> Result<()> {
    let d = inputs.first().ok_or_else(|| internal("swiglu without input"))?.dtype;
    for_float!(d, T => swiglu::<T>(inputs, outputs))
}

fn swiglu<T: Float>(inputs: &[Operand], outputs: &mut [Output]) -> Result<()> {
    let [gate, up, ..] = inputs else {
        return Err(internal("swiglu: fewer than two inputs"));
    };
    let (xs, up) = (elems::<T>(gate)?, elems::<T>(up)?);
    let out = outputs.first_mut().ok_or_else(|| internal("swiglu without output"))?;
    let mut y = buffer::<T>(out)?;
    y.as_mut_slice::<T>()
        .par_chunks_mut(GRAIN)
        .zip(xs.par_chunks(GRAIN).zip(up.par_chunks(GRAIN)))
        .for_each(|(y, (g, u))| swiglu_simd((g, u, y)));
    out.data = Some(Data::from_host_buffer(&out.shape, y));
    Ok(())
}

simd_kernel!(swiglu_simd => swiglu_chunk<T: Float>((&[T], &[T], &mut [T])));

/// `silu(g)·u = g·sigmoid(g)·u` in the accumulator type, rounded once.
#[inline(always)]
fn swiglu_chunk<T: Float>((g, u, y): (&[T], &[T], &mut [T])) {
    let one = T::Acc::one();
    for ((y, g), u) in y.iter_mut().zip(g).zip(u) {
        let g = g.to_acc();
        let s = one / (one + (-g).vexp());
        *y = T::from_acc(g * s * u.to_acc());
    }
}
