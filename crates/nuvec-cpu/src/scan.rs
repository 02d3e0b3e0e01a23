//! Cumulative reductions along one axis (row-major output).

use nuvec_core::dtype::Complex64;
use nuvec_core::primitive::ScanOp;
use nuvec_core::shape::row_major_strides;
use nuvec_core::storage::{Data, HostBuffer, Operand, Output};
use nuvec_core::{DType, Result};
use rayon::prelude::*;

use crate::elem::{Elem, Float, Num};
use crate::strided::{GRAIN, Rows};
use crate::{for_all, for_float, host_slice, unsupported};

pub fn eval(op: ScanOp, axis: usize, reverse: bool, inclusive: bool, x: Operand, out: &mut Output) -> Result<()> {
    let dtype = x.dtype;
    let plan = Plan { axis, reverse, inclusive };
    match op {
        ScanOp::LogAddExp | ScanOp::Sum | ScanOp::Prod if dtype.is_float() => {
            for_float!(dtype, T => float::<T>(&plan, op, &x, out))
        }
        ScanOp::Sum => for_all!(dtype, T => plan.run::<T, T>(&x, out, T::zero(), Num::add, |a| a)),
        ScanOp::Prod => for_all!(dtype, T => plan.run::<T, T>(&x, out, T::one(), Num::mul, |a| a)),
        ScanOp::Max => for_all!(dtype, T => plan.run::<T, T>(&x, out, T::lowest(), Num::max, |a| a)),
        ScanOp::Min => for_all!(dtype, T => plan.run::<T, T>(&x, out, T::highest(), Num::min, |a| a)),
        ScanOp::LogAddExp if dtype == DType::Complex64 => {
            let init = Complex64::new(f32::NEG_INFINITY, 0.0);
            plan.run::<Complex64, Complex64>(&x, out, init, crate::binary::complex_logaddexp, |a| a)
        }
        _ => Err(unsupported(dtype)),
    }
}

/// One step of a float scan: the running accumulator and the next element to the new accumulator.
type FloatStep<T> = fn(<T as Float>::Acc, T) -> <T as Float>::Acc;

/// Sums, products and log-add-exp of floats accumulate in `f32` (or `f64`).
fn float<T: Float>(plan: &Plan, op: ScanOp, x: &Operand, out: &mut Output) -> Result<()> {
    let (init, step): (T, FloatStep<T>) = match op {
        ScanOp::Sum => (T::zero(), |a, v| a + v.to_acc()),
        ScanOp::Prod => (T::one(), |a, v| a * v.to_acc()),
        _ => (T::lowest(), |a, v| lae(a, v.to_acc())),
    };
    plan.run::<T, T::Acc>(x, out, init.to_acc(), step, T::from_acc)
}

#[inline(always)]
fn lae<F: num_traits::Float>(a: F, b: F) -> F {
    if a.is_nan() || b.is_nan() {
        return a + b;
    }
    let m = a.max(b);
    if m.is_infinite() {
        return m;
    }
    m + (-(a - b).abs()).exp().ln_1p()
}

struct Plan {
    axis: usize,
    reverse: bool,
    inclusive: bool,
}

impl Plan {
    fn run<T: Elem, A: Copy + Send + Sync>(
        &self,
        x: &Operand,
        out: &mut Output,
        init: A,
        step: impl Fn(A, T) -> A + Sync,
        finish: impl Fn(A) -> T + Sync,
    ) -> Result<()> {
        let xs = host_slice::<T>(x)?;
        let n = out.size();
        let mut buf = HostBuffer::uninit(n * size_of::<T>())?;
        let len = x.shape[self.axis] as usize;
        if n > 0 && len > 0 {
            let o = buf.as_mut_slice::<T>();
            let out_strides = row_major_strides(&out.shape);
            let kept: Vec<usize> = (0..x.shape.len()).filter(|&a| a != self.axis).collect();
            let shape: Vec<i32> = kept.iter().map(|&a| x.shape[a]).collect();
            let xs_strides: Vec<isize> = kept.iter().map(|&a| x.data.layout.strides[a]).collect();
            let os_strides: Vec<isize> = kept.iter().map(|&a| out_strides[a]).collect();
            let lines = Rows::new(&shape, [&xs_strides, &os_strides], [x.data.layout.offset, 0]);
            let (sx, so) = (x.data.layout.strides[self.axis], out_strides[self.axis]);
            let n_lines = n / len;
            if self.axis + 1 == x.shape.len() {
                // Lines are the output's rows: process them in parallel chunks.
                let per = (GRAIN / len).max(1);
                o.par_chunks_mut(per * len).enumerate().for_each(|(c, chunk)| {
                    let lines_here = chunk.len() / len;
                    let mut i = 0;
                    lines.for_each_element(c * per, c * per + lines_here, |off| {
                        self.line(xs, off[0], sx, &mut chunk[i * len..(i + 1) * len], 0, 1, len, init, &step, &finish);
                        i += 1;
                    });
                });
            } else {
                lines.for_each_element(0, n_lines, |off| {
                    self.line(xs, off[0], sx, o, off[1], so, len, init, &step, &finish);
                });
            }
        }
        out.data = Some(Data::from_host_buffer(&out.shape, buf));
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    fn line<T: Elem, A: Copy>(
        &self,
        xs: &[T],
        x0: isize,
        sx: isize,
        o: &mut [T],
        o0: isize,
        so: isize,
        len: usize,
        init: A,
        step: &impl Fn(A, T) -> A,
        finish: &impl Fn(A) -> T,
    ) {
        let mut acc = init;
        for j in 0..len {
            let k = if self.reverse { len - 1 - j } else { j } as isize;
            let v = xs[(x0 + k * sx) as usize];
            let dst = (o0 + k * so) as usize;
            if self.inclusive {
                acc = step(acc, v);
                o[dst] = finish(acc);
            } else {
                o[dst] = finish(acc);
                acc = step(acc, v);
            }
        }
    }
}
