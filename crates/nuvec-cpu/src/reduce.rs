//! Reductions and arg-reductions.
//!
//! The reduced axes are read as one block per output element when they are the innermost,
//! dense axes (row reductions: vectorised lanes); as rows added into an accumulator row when
//! the kept axes are innermost (column reductions); otherwise by walking strides.

use nuvec_core::primitive::{ArgReduceOp, ReduceOp};
use nuvec_core::storage::{Data, HostBuffer, Operand, Output};
use nuvec_core::{DType, Result};
use rayon::prelude::*;

use crate::elem::{B8, Elem, Float, Num};
use crate::map::simd;
use crate::strided::{GRAIN, Rows};
use crate::{for_all, host_slice, unsupported};

/// A reduction as an accumulator: `init`, `step` per element, `merge` of partial results.
pub trait Reducer<T>: Copy + Send + Sync {
    /// Accumulator type (`f32` for half-precision sums).
    type Acc: Copy + Send + Sync;
    /// The identity.
    fn init(self) -> Self::Acc;
    /// Adds one element.
    fn step(self, acc: Self::Acc, x: T) -> Self::Acc;
    /// Combines two partial results.
    fn merge(self, a: Self::Acc, b: Self::Acc) -> Self::Acc;
    /// The result.
    fn finish(self, acc: Self::Acc) -> T;
}

#[derive(Clone, Copy)]
struct SumF;
impl<T: Float> Reducer<T> for SumF {
    type Acc = T::Acc;
    #[inline(always)]
    fn init(self) -> T::Acc {
        T::zero().to_acc()
    }
    #[inline(always)]
    fn step(self, a: T::Acc, x: T) -> T::Acc {
        a + x.to_acc()
    }
    #[inline(always)]
    fn merge(self, a: T::Acc, b: T::Acc) -> T::Acc {
        a + b
    }
    #[inline(always)]
    fn finish(self, a: T::Acc) -> T {
        T::from_acc(a)
    }
}

#[derive(Clone, Copy)]
struct ProdF;
impl<T: Float> Reducer<T> for ProdF {
    type Acc = T::Acc;
    #[inline(always)]
    fn init(self) -> T::Acc {
        T::one().to_acc()
    }
    #[inline(always)]
    fn step(self, a: T::Acc, x: T) -> T::Acc {
        a * x.to_acc()
    }
    #[inline(always)]
    fn merge(self, a: T::Acc, b: T::Acc) -> T::Acc {
        a * b
    }
    #[inline(always)]
    fn finish(self, a: T::Acc) -> T {
        T::from_acc(a)
    }
}

/// Sums, products, maxima and minima computed in the element type itself.
#[derive(Clone, Copy)]
struct Plain(ReduceOp);
impl<T: Num> Reducer<T> for Plain {
    type Acc = T;
    #[inline(always)]
    fn init(self) -> T {
        match self.0 {
            ReduceOp::Sum | ReduceOp::Or => T::zero(),
            ReduceOp::Prod | ReduceOp::And => T::one(),
            ReduceOp::Max => T::lowest(),
            ReduceOp::Min => T::highest(),
        }
    }
    #[inline(always)]
    fn step(self, a: T, x: T) -> T {
        match self.0 {
            ReduceOp::Sum | ReduceOp::Or => Num::add(a, x),
            ReduceOp::Prod | ReduceOp::And => Num::mul(a, x),
            ReduceOp::Max => Num::max(a, x),
            ReduceOp::Min => Num::min(a, x),
        }
    }
    #[inline(always)]
    fn merge(self, a: T, b: T) -> T {
        Reducer::<T>::step(self, a, b)
    }
    #[inline(always)]
    fn finish(self, a: T) -> T {
        a
    }
}

pub fn eval(op: ReduceOp, axes: &[usize], x: Operand, out: &mut Output) -> Result<()> {
    let dtype = x.dtype;
    match op {
        ReduceOp::And | ReduceOp::Or if dtype == DType::Bool => run::<B8, _>(Plain(op), axes, &x, out),
        ReduceOp::And | ReduceOp::Or => Err(unsupported(dtype)),
        ReduceOp::Sum if dtype.is_float() => crate::for_float!(dtype, T => run::<T, _>(SumF, axes, &x, out)),
        ReduceOp::Prod if dtype.is_float() => crate::for_float!(dtype, T => run::<T, _>(ProdF, axes, &x, out)),
        _ => for_all!(dtype, T => run::<T, _>(Plain(op), axes, &x, out)),
    }
}

/// Reduces a dense slice with 16 independent lanes (vectorisable, and more accurate than one
/// running sum).
#[inline(always)]
pub fn reduce_slice<T: Elem, R: Reducer<T>>((r, s): (R, &[T])) -> R::Acc {
    const L: usize = 16;
    let mut lanes = [r.init(); L];
    let mut chunks = s.chunks_exact(L);
    for c in &mut chunks {
        for i in 0..L {
            lanes[i] = r.step(lanes[i], c[i]);
        }
    }
    let mut acc = r.init();
    for &v in chunks.remainder() {
        acc = r.step(acc, v);
    }
    for l in lanes {
        acc = r.merge(acc, l);
    }
    acc
}

/// `acc[i] = step(acc[i], row[i])`: one row of a column reduction.
#[inline(always)]
fn step_row<T: Elem, R: Reducer<T>>((r, acc, row): (R, &mut [R::Acc], &[T])) {
    for (a, &v) in acc.iter_mut().zip(row) {
        *a = r.step(*a, v);
    }
}

fn run<T: Elem, R: Reducer<T>>(r: R, axes: &[usize], x: &Operand, out: &mut Output) -> Result<()> {
    let xs = host_slice::<T>(x)?;
    let n_out = out.size();
    let mut buf = HostBuffer::uninit(n_out * size_of::<T>())?;
    let o = buf.as_mut_slice::<T>();
    let strides = &x.data.layout.strides;
    // Kept and reduced axes with the input's strides.
    let kept: Vec<usize> = (0..x.shape.len()).filter(|a| !axes.contains(a)).collect();
    let kept_shape: Vec<i32> = kept.iter().map(|&a| x.shape[a]).collect();
    let kept_strides: Vec<isize> = kept.iter().map(|&a| strides[a]).collect();
    let red_shape: Vec<i32> = axes.iter().map(|&a| x.shape[a]).collect();
    let red_strides: Vec<isize> = axes.iter().map(|&a| strides[a]).collect();
    let red = Rows::new(&red_shape, [&red_strides], [0]);
    let red_count: usize = red_shape.iter().map(|&d| d as usize).product();
    let base = x.data.layout.offset;

    if red_count == 0 || n_out == 0 {
        o.fill(r.finish(r.init()));
    } else if red.count == 1 && red.inner_strides[0] == 1 {
        // Row reduction: each output reads one dense run of `red.inner` elements.
        let out_rows = Rows::new(&kept_shape, [&kept_strides], [base]);
        let len = red.inner;
        if n_out == 1 {
            let s = &xs[base..base + len];
            let acc =
                s.par_chunks(GRAIN * 4).map(|c| simd(reduce_slice, (r, c))).reduce(|| r.init(), |a, b| r.merge(a, b));
            o[0] = r.finish(acc);
        } else {
            let per = (GRAIN / len).max(1);
            o.par_chunks_mut(per).enumerate().for_each(|(c, chunk)| {
                let start = c * per;
                let mut i = 0;
                out_rows.for_each_element(start, start + chunk.len(), |off| {
                    let s = &xs[off[0] as usize..off[0] as usize + len];
                    chunk[i] = r.finish(simd(reduce_slice, (r, s)));
                    i += 1;
                });
            });
        }
    } else {
        let kept_rows = Rows::new(&kept_shape, [&kept_strides], [base]);
        if kept_rows.count == 1 && kept_rows.inner_strides[0] == 1 && kept_rows.inner == n_out {
            // Column reduction: add whole rows of outputs at a time.
            let per = GRAIN.min(n_out).max(1);
            o.par_chunks_mut(per).enumerate().for_each(|(c, chunk)| {
                let col0 = base + c * per;
                let mut acc = vec![r.init(); chunk.len()];
                red.for_each(0, red.count, |_, off| {
                    let mut p = off[0];
                    for _ in 0..red.inner {
                        let row = &xs[(col0 as isize + p) as usize..(col0 as isize + p) as usize + chunk.len()];
                        simd(step_row, (r, &mut acc[..], row));
                        p += red.inner_strides[0];
                    }
                });
                for (o, a) in chunk.iter_mut().zip(acc) {
                    *o = r.finish(a);
                }
            });
        } else {
            // General: each output walks its reduced positions.
            let out_rows = Rows::new(&kept_shape, [&kept_strides], [base]);
            let flat: Vec<isize> = {
                let mut v = Vec::with_capacity(red_count);
                red.for_each(0, red.count, |_, off| {
                    let mut p = off[0];
                    for _ in 0..red.inner {
                        v.push(p);
                        p += red.inner_strides[0];
                    }
                });
                v
            };
            let per = (GRAIN / red_count).max(1);
            o.par_chunks_mut(per).enumerate().for_each(|(c, chunk)| {
                let start = c * per;
                let mut i = 0;
                out_rows.for_each_element(start, start + chunk.len(), |off| {
                    let mut acc = r.init();
                    for &p in &flat {
                        acc = r.step(acc, xs[(off[0] + p) as usize]);
                    }
                    chunk[i] = r.finish(acc);
                    i += 1;
                });
            });
        }
    }
    out.data = Some(Data::from_host_buffer(&out.shape, buf));
    Ok(())
}

/// Index of the first maximum (or minimum) along `axis`; NaN counts as the extreme.
pub fn arg_reduce(op: ArgReduceOp, axis: usize, x: Operand, out: &mut Output) -> Result<()> {
    for_all!(x.dtype, T => arg::<T>(op, axis, &x, out))
}

fn arg<T: Num>(op: ArgReduceOp, axis: usize, x: &Operand, out: &mut Output) -> Result<()> {
    let xs = host_slice::<T>(x)?;
    let n_out = out.size();
    let mut buf = HostBuffer::uninit(n_out * 4)?;
    let o = buf.as_mut_slice::<u32>();
    let kept: Vec<usize> = (0..x.shape.len()).filter(|&a| a != axis).collect();
    let kept_shape: Vec<i32> = kept.iter().map(|&a| x.shape[a]).collect();
    let kept_strides: Vec<isize> = kept.iter().map(|&a| x.data.layout.strides[a]).collect();
    let rows = Rows::new(&kept_shape, [&kept_strides], [x.data.layout.offset]);
    let (len, stride) = (x.shape[axis] as usize, x.data.layout.strides[axis]);
    let better = move |v: T, best: T| -> bool {
        if best.is_nan() {
            return false;
        }
        v.is_nan() || if op == ArgReduceOp::ArgMax { Num::lt(best, v) } else { Num::lt(v, best) }
    };
    let per = (GRAIN / len.max(1)).max(1);
    o.par_chunks_mut(per).enumerate().for_each(|(c, chunk)| {
        let mut i = 0;
        rows.for_each_element(c * per, c * per + chunk.len(), |off| {
            let (mut best, mut at) = (xs[off[0] as usize], 0u32);
            let mut p = off[0];
            for j in 0..len {
                let v = xs[p as usize];
                if better(v, best) {
                    best = v;
                    at = j as u32;
                }
                p += stride;
            }
            chunk[i] = at;
            i += 1;
        });
    });
    out.data = Some(Data::from_host_buffer(&out.shape, buf));
    Ok(())
}
