//! Fused CPU kernels of the cross-entropy loss over the last (class) axis, its derivative with
//! respect to the logits, and both at once (`FastOp::CrossEntropyWithGrad`, what evaluation runs
//! when a step wants the loss and its gradient).
//!
//! They compute what the compositions in `nuvec_core::fast` compute, with the same roundings. The
//! composition widens the logits to the accumulator type (`f32`; `f64` for `f64` logits) and runs
//! the log-sum-exp and softmax kernels of `softmax.rs` on them; these kernels take the row's
//! statistics the same way (the same maximum, the same exponentials summed in the same lane
//! order), so the loss `lse − logits[target]` (in the accumulator type) and the gradient
//! `g·(softmax − onehot)` (each product in the accumulator type, rounded once to the logits'
//! dtype) come out the same — without the widened copy of the logits, the gathered target logit,
//! the one-hot matrix, and a pass over the whole tensor per operation. A row with a negative
//! target is ignored (loss 0), one past the classes gives NaN; neither has a gradient: zeros,
//! written without reading the row (as the CUDA kernels do; the composition multiplies the row's
//! `softmax − onehot(0)` by 0, which differs only in giving −0 at class 0, and NaN for a row
//! holding a NaN or +∞, or only −∞).
//!
//! The derivative's fourth input, the loss, is not used: a row's statistics are recomputed from
//! the row (its maximum, then its exponentials, kept in a scratch row so the gradient costs one
//! exponential per element), which keeps the gradient bit for bit the composition's (the loss
//! plus the target's logit is the log-sum-exp only up to a rounding, and NaN where the target's
//! logit is −∞).

use num_traits::{Float as _, One, Zero};
use nuvec_core::Result;
use nuvec_core::fast::FastOp;
use nuvec_core::storage::{Data, HostBuffer, Operand, Output};
use rayon::prelude::*;

use super::softmax::row_lse;
use super::{buffer, elems, exp_sum_store, row_max, rows_per_task};
use crate::elem::{AccFloat, Elem, Float};
use crate::map::simd;
use crate::{for_float, internal};

/// Runs `op` (`CrossEntropy`, `CrossEntropyVjp` or `CrossEntropyWithGrad`) on row-major operands:
/// logits of a float dtype, `i32` targets, and the cotangent (and the loss) in the accumulator
/// type, one per row (`fast::supports` checks the dtypes).
pub(crate) fn eval(op: &FastOp, inputs: &[Operand], outputs: &mut [Output]) -> Result<()> {
    let d = inputs.first().ok_or_else(|| internal("cross entropy without logits"))?.dtype;
    for_float!(d, T => eval_typed::<T>(op, inputs, outputs))
}

fn eval_typed<T: Float>(op: &FastOp, inputs: &[Operand], outputs: &mut [Output]) -> Result<()>
where
    T::Acc: Elem,
{
    let [x, targets, rest @ ..] = inputs else {
        return Err(internal("cross entropy without targets"));
    };
    let len = x.shape.last().copied().unwrap_or(1).max(0) as usize;
    let (xs, ts) = (elems::<T>(x)?, elems::<i32>(targets)?);
    if len == 0 || xs.len() != ts.len() * len {
        return Err(internal("cross entropy: the targets do not match the rows of logits"));
    }
    let per = rows_per_task(len);
    match op {
        FastOp::CrossEntropy => {
            let out = outputs.first_mut().ok_or_else(|| internal("cross entropy without output"))?;
            let mut loss = loss_buffer::<T>(out, ts.len())?;
            loss.as_mut_slice::<T::Acc>()
                .par_chunks_mut(per)
                .zip(xs.par_chunks(per * len).zip(ts.par_chunks(per)))
                .for_each(|(l, (x, t))| simd(loss_chunk, (x, t, l, len)));
            out.data = Some(Data::from_host_buffer(&out.shape, loss));
        }
        FastOp::CrossEntropyVjp | FastOp::CrossEntropyWithGrad => {
            let g = elems::<T::Acc>(rest.first().ok_or_else(|| internal("cross entropy vjp without cotangent"))?)?;
            if g.len() != ts.len() {
                return Err(internal("cross entropy vjp: the cotangent does not match the targets"));
            }
            let (loss_out, dx_out) = match outputs {
                [dx] if *op == FastOp::CrossEntropyVjp => (None, dx),
                [loss, dx] if *op == FastOp::CrossEntropyWithGrad => (Some(loss), dx),
                _ => return Err(internal(format!("{}: wrong number of outputs", op.name()))),
            };
            if dx_out.dtype != x.dtype || dx_out.size() != xs.len() {
                return Err(internal("cross entropy vjp: the gradient is not the logits' shape and dtype"));
            }
            let mut dx = buffer::<T>(dx_out)?;
            let mut loss = loss_out.as_deref().map(|l| loss_buffer::<T>(l, ts.len())).transpose()?;
            let work = dx
                .as_mut_slice::<T>()
                .par_chunks_mut(per * len)
                .zip(xs.par_chunks(per * len))
                .zip(ts.par_chunks(per).zip(g.par_chunks(per)));
            match loss.as_mut() {
                Some(l) => work
                    .zip(l.as_mut_slice::<T::Acc>().par_chunks_mut(per))
                    .for_each(|(((dx, x), (t, g)), l)| simd(grad_chunk, (x, t, g, dx, Some(l), len))),
                None => work.for_each(|((dx, x), (t, g))| simd(grad_chunk, (x, t, g, dx, None, len))),
            }
            if let (Some(out), Some(l)) = (loss_out, loss) {
                out.data = Some(Data::from_host_buffer(&out.shape, l));
            }
            dx_out.data = Some(Data::from_host_buffer(&dx_out.shape, dx));
        }
        _ => return Err(internal(format!("no fused CPU cross-entropy kernel for {}", op.name()))),
    }
    Ok(())
}

/// A buffer for the loss of `rows` rows, in the accumulator type.
fn loss_buffer<T: Float>(out: &Output, rows: usize) -> Result<HostBuffer>
where
    T::Acc: Elem,
{
    let acc = <T::Acc as Elem>::DTYPE;
    if out.dtype != acc || out.size() != rows {
        return Err(internal(format!("cross entropy: the loss is not {rows} values of {acc}")));
    }
    buffer::<T::Acc>(out)
}

/// The class a target picks when its row counts (`0 ≤ t < classes`).
#[inline(always)]
fn class(t: i32, classes: usize) -> Option<usize> {
    usize::try_from(t).ok().filter(|&c| c < classes)
}

/// The loss of a row whose target does not count: 0 for a negative (ignored) target, NaN for
/// one past the classes.
#[inline(always)]
fn uncounted<A: AccFloat>(t: i32) -> A {
    if t < 0 { A::zero() } else { A::nan() }
}

/// Each row's loss: `lse(x) − x[t]` in the accumulator type (the row is not read when its target
/// does not count).
#[inline(always)]
fn loss_chunk<T: Float>((x, t, loss, len): (&[T], &[i32], &mut [T::Acc], usize)) {
    for ((x, &t), l) in x.chunks(len).zip(t).zip(loss.iter_mut()) {
        *l = match class(t, len).and_then(|c| x.get(c)) {
            Some(v) => row_lse(x) - v.to_acc(),
            None => uncounted(t),
        };
    }
}

/// Each row's gradient and, when `loss` is given, its loss ([`grad_row`]).
#[inline(always)]
#[allow(clippy::type_complexity)]
fn grad_chunk<T: Float>(
    (x, t, g, dx, mut loss, len): (&[T], &[i32], &[T::Acc], &mut [T], Option<&mut [T::Acc]>, usize),
) {
    let mut e = vec![T::Acc::zero(); len];
    for (r, (((x, &t), &g), dx)) in x.chunks(len).zip(t).zip(g).zip(dx.chunks_mut(len)).enumerate() {
        let l = grad_row(x, t, g, &mut e, dx);
        if let Some(v) = loss.as_deref_mut().and_then(|loss| loss.get_mut(r)) {
            *v = l;
        }
    }
}

/// One row's gradient `g·(softmax(x) − onehot(t))`, rounded once to `T`, and its loss. The
/// softmax is the softmax kernel's on the widened row: `e = exp(x − max)` (kept in `e`, a scratch
/// row) times the reciprocal of their sum, NaN everywhere when the maximum is not finite. A row
/// whose target does not count gets a zero gradient, without reading it.
#[inline(always)]
fn grad_row<T: Float>(x: &[T], t: i32, g: T::Acc, e: &mut [T::Acc], dx: &mut [T]) -> T::Acc {
    let Some((c, target)) = class(t, x.len()).and_then(|c| Some((c, x.get(c)?.to_acc()))) else {
        dx.fill(T::from_acc(T::Acc::zero()));
        return uncounted(t);
    };
    let m = row_max(x);
    if !m.is_finite() {
        // As the composition: its softmax is NaN throughout (inf − inf, or a NaN), and its
        // log-sum-exp is the maximum.
        dx.fill(T::from_acc(T::Acc::nan()));
        return m - target;
    }
    let sum = exp_sum_store(x, m, e, |v| v);
    let inv = T::Acc::one() / sum;
    for (d, &e) in dx.iter_mut().zip(e.iter()) {
        *d = T::from_acc(e * inv * g);
    }
    if let (Some(d), Some(&e)) = (dx.get_mut(c), e.get(c)) {
        *d = T::from_acc((e * inv - T::Acc::one()) * g);
    }
    sum.ln() + m - target
}

#[cfg(test)]
mod tests {
    use half::{bf16, f16};
    use nuvec_core::DType;

    use super::*;
    use crate::elem::Cast;
    use crate::fast::testing::{fused, operand, output, run, sample, values};

    /// The loss and gradient of one row in `f64`.
    fn reference(row: &[f64], t: i32, g: f64) -> (f64, Vec<f64>) {
        let v = row.len() as i32;
        if t < 0 || t >= v {
            return (if t < 0 { 0.0 } else { f64::NAN }, vec![0.0; row.len()]);
        }
        let m = row.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let lse = m + row.iter().map(|x| (x - m).exp()).sum::<f64>().ln();
        let dx = row
            .iter()
            .enumerate()
            .map(|(i, x)| g * ((x - lse).exp() - if i as i32 == t { 1.0 } else { 0.0 }))
            .collect();
        (lse - row[t as usize], dx)
    }

    /// The loss, the derivative and both at once on `rows` rows of `len` classes of `T`, against
    /// `f64` on the same values: the loss within the accumulator's rounding of the statistics,
    /// the gradient within `eps` (the dtype's rounding) relative plus the statistics' error.
    fn check<T: Float>(rows: usize, len: usize, eps: f64)
    where
        T::Acc: Elem,
    {
        let xs: Vec<T> =
            sample(rows * len, (rows * 1000 + len) as u64, -8.0, 8.0).into_iter().map(T::from_f64).collect();
        let wide: Vec<f64> = xs.iter().map(|v| v.to_f64()).collect();
        let classes = len as i32;
        let ts: Vec<i32> = (0..rows as i32)
            .map(|r| match r % 5 {
                1 => -100,
                3 => classes + r,
                _ => (r * 31 + 7) % classes,
            })
            .collect();
        let gs: Vec<f64> = (0..rows).map(|r| 0.25 + r as f64 / 3.0).collect();
        let g_acc: Vec<T::Acc> = gs.iter().map(|&v| Cast::from_f64(v)).collect();
        let (xshape, tshape) = ([rows as i32, len as i32], [rows as i32]);
        let acc = <T::Acc as Elem>::DTYPE;
        let acc_eps = if acc == DType::F64 { f64::EPSILON } else { f32::EPSILON as f64 };
        let (logits, targets, cot) = (operand(&xshape, &xs), operand(&tshape, &ts), operand(&tshape, &g_acc));

        let loss = run(FastOp::CrossEntropy, vec![logits.clone(), targets.clone()], vec![output(&tshape, acc)]);
        let loss: Vec<T::Acc> = values(&loss[0]);
        let inputs = vec![logits.clone(), targets.clone(), cot.clone(), operand(&tshape, &loss)];
        let dx: Vec<T> = values(&run(FastOp::CrossEntropyVjp, inputs, vec![output(&xshape, T::DTYPE)])[0]);
        let joint = run(
            FastOp::CrossEntropyWithGrad,
            vec![logits, targets, cot],
            vec![output(&tshape, acc), output(&xshape, T::DTYPE)],
        );
        let (joint_loss, joint_dx): (Vec<T::Acc>, Vec<T>) = (values(&joint[0]), values(&joint[1]));
        for r in 0..rows {
            let (want_loss, want_dx) = reference(&wide[r * len..(r + 1) * len], ts[r], gs[r]);
            let what = format!("{} {rows}x{len} row {r} target {}", T::DTYPE, ts[r]);
            let got = loss[r].to_f64();
            let ok = (got - want_loss).abs() <= 64.0 * acc_eps * (1.0 + want_loss.abs());
            assert!(ok || (got.is_nan() && want_loss.is_nan()), "{what}: loss {got} vs {want_loss}");
            // The joint kernel computes the same values as the two kernels.
            assert_eq!(got.to_bits(), joint_loss[r].to_f64().to_bits(), "{what}: joint loss");
            for (i, w) in want_dx.iter().enumerate() {
                let (a, b) = (dx[r * len + i].to_f64(), joint_dx[r * len + i].to_f64());
                assert_eq!(a.to_bits(), b.to_bits(), "{what}: joint gradient element {i}");
                let tol = eps * w.abs() + 64.0 * acc_eps * gs[r];
                assert!((a - w).abs() <= tol, "{what}: gradient element {i}: {a} vs {w}");
            }
        }
    }

    #[test]
    fn cross_entropy_matches_f64_over_lengths_and_dtypes() {
        // Rows of one class, a tail shorter than the 16 lanes, lanes and a tail, many lanes; and
        // enough rows for several tasks.
        for (rows, len) in [(1, 1), (4, 1), (3, 7), (9, 33), (6, 1000), (2500, 16)] {
            check::<f32>(rows, len, 4.0 * f32::EPSILON as f64);
            check::<f64>(rows, len, 4.0 * f64::EPSILON);
            check::<bf16>(rows, len, 2f64.powi(-8));
            check::<f16>(rows, len, 2f64.powi(-11));
        }
    }

    #[test]
    fn non_finite_rows_follow_the_composition() {
        let inf = f32::INFINITY;
        // Rows: a −∞ target logit (loss +∞, finite gradient), a +∞ logit (NaN gradient), a NaN
        // logit, all −∞ (NaN), an ignored row of NaNs (zero gradient).
        let xs = [0.0, -inf, 1.0, inf, 0.0, 0.0, f32::NAN, 0.0, 0.0, -inf, -inf, -inf, f32::NAN, f32::NAN, 0.0];
        let ts = [1, 0, 2, 0, -1];
        let outs = vec![output(&[5], DType::F32), output(&[5, 3], DType::F32)];
        let inputs = vec![operand(&[5, 3], &xs), operand(&[5], &ts), operand(&[5], &[1.0f32; 5])];
        let outs = run(FastOp::CrossEntropyWithGrad, inputs, outs);
        let (loss, dx): (Vec<f32>, Vec<f32>) = (values(&outs[0]), values(&outs[1]));
        assert_eq!(loss[0], inf);
        // softmax of [0, −∞, 1] is [1/(1+e), 0, e/(1+e)]; the target's element takes −1.
        let s = 1.0 / (1.0 + 1f32.exp());
        assert!((dx[0] - s).abs() < 1e-6 && dx[1] == -1.0 && (dx[2] - (1.0 - s)).abs() < 1e-6, "{dx:?}");
        assert!(loss[1].is_nan() && dx[3..6].iter().all(|v| v.is_nan()));
        assert!(loss[2].is_nan() && dx[6..9].iter().all(|v| v.is_nan()));
        assert!(loss[3].is_nan() && dx[9..12].iter().all(|v| v.is_nan()));
        assert!(loss[4] == 0.0 && dx[12..15].iter().all(|&v| v == 0.0));
    }

    #[test]
    fn other_dtypes_take_the_composition() {
        let (x, t) = (operand(&[2, 3], &[0f32; 6]), operand(&[2], &[0i32, 1]));
        assert!(fused(&FastOp::CrossEntropy, &[x.clone(), t.clone()]));
        assert!(!fused(&FastOp::CrossEntropy, &[x.clone(), operand(&[2], &[0i64, 1])]));
        // The cotangent and the loss come in the accumulator type, one per row.
        let (g32, g64) = (operand(&[2], &[1f32; 2]), operand(&[2], &[1f64; 2]));
        assert!(fused(&FastOp::CrossEntropyVjp, &[x.clone(), t.clone(), g32.clone(), g32.clone()]));
        assert!(!fused(&FastOp::CrossEntropyVjp, &[x.clone(), t.clone(), g64.clone(), g32.clone()]));
        assert!(!fused(&FastOp::CrossEntropyVjp, &[x.clone(), t.clone(), operand(&[], &[1f32]), g32.clone()]));
        assert!(fused(&FastOp::CrossEntropyWithGrad, &[x.clone(), t.clone(), g32]));
        assert!(!fused(&FastOp::CrossEntropyWithGrad, &[x, t, g64]));
    }
}
