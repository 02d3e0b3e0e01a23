//! Fused CPU kernel of one Adam update (`fast::adam_step`): the parameter and both moments in
//! one pass, computed in the accumulator type and rounded once, in the composition's order of
//! operations (so `f32` and `f64` match it bit for bit).

use num_traits::{Float as _, cast};
use nuvec_core::Result;
use nuvec_core::fast::AdamParams;
use nuvec_core::storage::{Data, Operand, Output};
use rayon::prelude::*;

use super::{buffer, elems};
use crate::elem::Float;
use crate::strided::GRAIN;
use crate::{for_float, internal};

/// Runs the update on row-major operands `[p, g, m, v]` of one float dtype.
pub(crate) fn eval(a: &AdamParams, inputs: &[Operand], outputs: &mut [Output]) -> Result<()> {
    let d = inputs.first().ok_or_else(|| internal("adam_step without input"))?.dtype;
    for_float!(d, T => adam::<T>(a, inputs, outputs))
}

/// The update's scalars in the accumulator type, as the composition's weak scalars are.
struct Scalars<A> {
    b1: A,
    c1: A,
    b2: A,
    c2: A,
    eps: A,
    decay: Option<A>,
    step: A,
    scale: Option<A>,
}

fn adam<T: Float>(a: &AdamParams, inputs: &[Operand], outputs: &mut [Output]) -> Result<()> {
    let [p, g, m, v] = inputs else {
        return Err(internal("adam_step takes four inputs"));
    };
    let [op, om, ov] = outputs else {
        return Err(internal("adam_step makes three outputs"));
    };
    let c = |x: f32| cast::<f32, T::Acc>(x).unwrap_or_else(<T::Acc as num_traits::Float>::nan);
    let s = Scalars {
        b1: c(a.beta1),
        c1: c(1.0 - a.beta1),
        b2: c(a.beta2),
        c2: c(1.0 - a.beta2),
        eps: c(a.eps),
        decay: (a.decay != 1.0).then(|| c(a.decay)),
        step: c(a.step),
        scale: (a.scale != 1.0).then(|| c(a.scale)),
    };
    let (p, g, m, v) = (elems::<T>(p)?, elems::<T>(g)?, elems::<T>(m)?, elems::<T>(v)?);
    let (mut np, mut nm, mut nv) = (buffer::<T>(op)?, buffer::<T>(om)?, buffer::<T>(ov)?);
    np.as_mut_slice::<T>()
        .par_chunks_mut(GRAIN)
        .zip(nm.as_mut_slice::<T>().par_chunks_mut(GRAIN))
        .zip(nv.as_mut_slice::<T>().par_chunks_mut(GRAIN))
        .enumerate()
        .for_each(|(i, ((np, nm), nv))| {
            let at = i * GRAIN;
            let range = at..at + np.len();
            update(&s, (&p[range.clone()], &g[range.clone()], &m[range.clone()], &v[range]), (np, nm, nv));
        });
    for (out, buf) in [(op, np), (om, nm), (ov, nv)] {
        out.data = Some(Data::from_host_buffer(&out.shape, buf));
    }
    Ok(())
}

#[inline(always)]
fn update<T: Float>(
    s: &Scalars<T::Acc>,
    (p, g, m, v): (&[T], &[T], &[T], &[T]),
    (np, nm, nv): (&mut [T], &mut [T], &mut [T]),
) {
    for i in 0..np.len() {
        let g_ = g[i].to_acc();
        let m_ = m[i].to_acc() * s.b1 + g_ * s.c1;
        let v_ = v[i].to_acc() * s.b2 + g_ * g_ * s.c2;
        let p_ = p[i].to_acc();
        let p_ = s.decay.map_or(p_, |d| p_ * d);
        let root = s.scale.map_or(v_.sqrt(), |k| v_.sqrt() * k);
        np[i] = T::from_acc(p_ - m_ * s.step / (root + s.eps));
        nm[i] = T::from_acc(m_);
        nv[i] = T::from_acc(v_);
    }
}
