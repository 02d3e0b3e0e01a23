//! Fused CPU kernel of rotary position embeddings (`FastOp::Rope`, forward and inverse).
//!
//! It computes what the composition in `nuvec_core::fast::rope` computes, with the same
//! roundings: row `t` of a sequence (the second-to-last axis) rotates its feature pairs — the two
//! halves `(x[i], x[i + dims/2])`, or neighbours `(x[2i], x[2i+1])` when `traditional` — by
//! `θ = ((t + offset)·scale)·fᵢ`, every step in `f32`, with `fᵢ = exp(i·(−ln base / (dims/2)))`
//! (the backend's `f32` exponential, as the composition's) or `1 / freqs[i]`. The rotation uses
//! the `f32` cosine and sine of `θ` (the sine negated for the inverse), computed once per
//! position into a table that every row at that position shares (once per batch row when the
//! offset is per batch), and runs in the accumulator type (`f32`; `f64` for `f64`, with the `f32`
//! cosines and sines widened), rounded once; features past `dims` are copied. The composition
//! instead builds the angles, slices, rotates, stacks or concatenates, and casts, one pass over
//! the tensor per operation.

use nuvec_core::Result;
use nuvec_core::fast::RopeParams;
use nuvec_core::storage::{Data, Operand, Output};
use rayon::prelude::*;

use super::{buffer, elems, rows_per_task};
use crate::elem::{AccFloat, Cast, Float};
use crate::map::simd;
use crate::{for_float, internal};

/// Runs RoPE on row-major operands: `x` (`[B, ..., T, D]`, a float dtype), the `i32` offset (a
/// scalar, or one per batch row) and, without a base, the `f32` frequencies (`fast::supports`
/// checks the dtypes).
pub(crate) fn eval(p: &RopeParams, inputs: &[Operand], outputs: &mut [Output]) -> Result<()> {
    let x = inputs.first().ok_or_else(|| internal("rope without input"))?;
    let out = outputs.first_mut().ok_or_else(|| internal("rope without output"))?;
    for_float!(x.dtype, T => rope::<T>(p, inputs, out))
}

/// The rows' layout: features per row, rotated features, rows per sequence (positions), and
/// whether pairs are neighbours.
struct Rows {
    len: usize,
    dims: usize,
    seq: usize,
    traditional: bool,
}

fn rope<T: Float>(p: &RopeParams, inputs: &[Operand], out: &mut Output) -> Result<()> {
    let [x, offset, freqs @ ..] = inputs else {
        return Err(internal("rope without offset"));
    };
    let freqs = match (p.base, freqs) {
        (Some(_), []) => None,
        (None, [f]) => Some(elems::<f32>(f)?),
        _ => return Err(internal("rope: not exactly one of base and freqs")),
    };
    let [batch, .., seq, len] = x.shape[..] else {
        return Err(internal("rope: x has fewer than 3 axes"));
    };
    let (len, seq, batch) = (len.max(0) as usize, seq.max(0) as usize, batch.max(0) as usize);
    let dims = p.dims.max(0) as usize;
    if dims == 0 || !dims.is_multiple_of(2) || dims > len {
        return Err(internal(format!("rope: dims {dims} for rows of {len}")));
    }
    let xs = elems::<T>(x)?;
    let offsets = elems::<i32>(offset)?;
    if out.size() != xs.len() || out.dtype != x.dtype {
        return Err(internal("rope: the output is not x's shape and dtype"));
    }
    let mut y = buffer::<T>(out)?;
    if !xs.is_empty() {
        // One table per offset: a scalar offset covers every batch row, else one per batch row.
        let groups = if offset.shape.is_empty() { 1 } else { batch };
        let group = xs.len() / groups.max(1);
        if offsets.len() != groups || group * groups != xs.len() || group % (seq * len) != 0 {
            return Err(internal("rope: the offset does not match x's batch"));
        }
        let inv_freq = inverse_frequencies(p, freqs, dims / 2)?;
        let rows = Rows { len, dims, seq, traditional: p.traditional };
        let per = rows_per_task(len) * len;
        y.as_mut_slice::<T>().par_chunks_mut(group).zip(xs.par_chunks(group)).zip(offsets.par_iter()).for_each(
            |((y, x), &offset)| {
                let table = table(p, &inv_freq, offset, seq);
                y.par_chunks_mut(per)
                    .zip(x.par_chunks(per))
                    .enumerate()
                    .for_each(|(k, (y, x))| simd(rope_chunk, (x, y, k * (per / len), &rows, &table)));
            },
        );
    }
    out.data = Some(Data::from_host_buffer(&out.shape, y));
    Ok(())
}

/// `fᵢ` for `i < half`, in `f32` as the composition computes them: `exp(i · (−ln base / half))`
/// with the backend's exponential, or `1 / freqs[i]`.
fn inverse_frequencies(p: &RopeParams, freqs: Option<&[f32]>, half: usize) -> Result<Vec<f32>> {
    match (p.base, freqs) {
        (Some(base), _) => {
            let k = -(base.ln()) / half as f32;
            Ok((0..half).map(|i| (i as f32 * k).vexp()).collect())
        }
        (None, Some(f)) if f.len() == half => Ok(f.iter().map(|f| 1.0 / f).collect()),
        _ => Err(internal("rope: no frequencies for dims / 2 pairs")),
    }
}

/// The cosines and sines of a sequence's angles: `seq` rows of `dims / 2`.
struct Table {
    cos: Vec<f32>,
    sin: Vec<f32>,
}

/// The cosines and sines (negated for the inverse rotation) of the angles
/// `((t + offset) · scale) · fᵢ` of positions `t < seq`, `f32` throughout.
fn table(p: &RopeParams, inv_freq: &[f32], offset: i32, seq: usize) -> Table {
    let half = inv_freq.len();
    let (mut cos, mut sin) = (vec![0f32; seq * half], vec![0f32; seq * half]);
    // A sine and a cosine cost far more than rotating a pair: smaller tasks than the rows'.
    let per = (rows_per_task(half) / 32).max(1) * half;
    cos.par_chunks_mut(per).zip(sin.par_chunks_mut(per)).enumerate().for_each(|(k, (cos, sin))| {
        let rows = cos.chunks_mut(half).zip(sin.chunks_mut(half));
        for (t, (cos, sin)) in (k * (per / half)..).zip(rows) {
            let pos = (t as f32 + offset as f32) * p.scale;
            for ((c, s), f) in cos.iter_mut().zip(sin.iter_mut()).zip(inv_freq) {
                let theta = pos * f;
                *c = theta.cos();
                *s = if p.forward { theta.sin() } else { -theta.sin() };
            }
        }
    });
    Table { cos, sin }
}

/// Rotates rows `first, first + 1, ...` of a sequence (position `t = row mod seq`) with the
/// table rows of their positions: `(a, b) → (a·c − b·s, a·s + b·c)` in the accumulator type,
/// rounded once; the features past `dims` are copied.
#[inline(always)]
fn rope_chunk<T: Float>((x, y, first, rows, table): (&[T], &mut [T], usize, &Rows, &Table)) {
    let (len, dims, half) = (rows.len, rows.dims, rows.dims / 2);
    let acc = <T::Acc as Cast>::from_f32;
    let rotate = |a: T, b: T, c: f32, s: f32| {
        let (a, b, c, s) = (a.to_acc(), b.to_acc(), acc(c), acc(s));
        (T::from_acc(a * c - b * s), T::from_acc(a * s + b * c))
    };
    // The table rows of positions first mod seq, ..., seq − 1, 0, 1, ...
    let table = table.cos.chunks_exact(half).zip(table.sin.chunks_exact(half));
    let positions = table.clone().skip(first % rows.seq.max(1)).chain(table.cycle());
    for ((y, x), (cos, sin)) in y.chunks_mut(len).zip(x.chunks(len)).zip(positions) {
        let (xr, xt) = x.split_at(dims.min(x.len()));
        let (yr, yt) = y.split_at_mut(dims.min(y.len()));
        if rows.traditional {
            let pairs = yr.chunks_exact_mut(2).zip(xr.chunks_exact(2));
            for ((y, x), (&c, &s)) in pairs.zip(cos.iter().zip(sin)) {
                (y[0], y[1]) = rotate(x[0], x[1], c, s);
            }
        } else {
            let (x1, x2) = xr.split_at(half.min(xr.len()));
            let (y1, y2) = yr.split_at_mut(half.min(yr.len()));
            let pairs = y1.iter_mut().zip(y2.iter_mut()).zip(x1.iter().zip(x2));
            for (((y1, y2), (&a, &b)), (&c, &s)) in pairs.zip(cos.iter().zip(sin)) {
                (*y1, *y2) = rotate(a, b, c, s);
            }
        }
        for (y, x) in yt.iter_mut().zip(xt) {
            *y = *x;
        }
    }
}

#[cfg(test)]
mod tests {
    use half::{bf16, f16};
    use nuvec_core::fast::FastOp;

    use super::*;
    use crate::fast::testing::{fused, operand, output, run, sample, values};

    /// One case: `x` is `[b, h, t, d]`.
    struct Case {
        shape: [usize; 4],
        dims: usize,
        traditional: bool,
        freqs: bool,
        scale: f32,
        offsets: Vec<i32>,
    }

    /// RoPE in `f64` on the same values, rotating by `−θ` for the inverse.
    fn reference(c: &Case, x: &[f64], freqs: &[f32], forward: bool) -> Vec<f64> {
        let [_, h, t, d] = c.shape;
        let half = c.dims / 2;
        let inv_freq = |i: usize| {
            if c.freqs { 1.0 / freqs[i] as f64 } else { 10000f64.powf(-((2 * i) as f64) / c.dims as f64) }
        };
        let mut y = x.to_vec();
        for (r, (y, x)) in y.chunks_mut(d).zip(x.chunks(d)).enumerate() {
            let offset = c.offsets[if c.offsets.len() == 1 { 0 } else { r / (h * t) }] as f64;
            let pos = ((r % t) as f64 + offset) * c.scale as f64;
            for i in 0..half {
                let theta = if forward { pos * inv_freq(i) } else { -pos * inv_freq(i) };
                let (ia, ib) = if c.traditional { (2 * i, 2 * i + 1) } else { (i, i + half) };
                let (a, b) = (x[ia], x[ib]);
                y[ia] = a * theta.cos() - b * theta.sin();
                y[ib] = a * theta.sin() + b * theta.cos();
            }
        }
        y
    }

    fn check<T: Float>(c: &Case, eps: f64) {
        let [b, h, t, d] = c.shape;
        let n = b * h * t * d;
        let xs: Vec<T> = sample(n, (n + c.dims) as u64, -2.0, 2.0).into_iter().map(T::from_f64).collect();
        let wide: Vec<f64> = xs.iter().map(|v| v.to_f64()).collect();
        let freqs: Vec<f32> = (0..c.dims / 2).map(|i| 1.0 + 3.0 * i as f32).collect();
        let shape = [b as i32, h as i32, t as i32, d as i32];
        let offset = if c.offsets.len() == 1 {
            operand::<i32>(&[], &c.offsets)
        } else {
            operand(&[c.offsets.len() as i32], &c.offsets)
        };
        let max_pos = (*c.offsets.iter().max().unwrap_or(&0) as f64 + t as f64) * c.scale as f64;
        let tol = 4.0 * eps + (16.0 + 4.0 * max_pos) * f32::EPSILON as f64;
        for forward in [true, false] {
            let p = RopeParams {
                dims: c.dims as i32,
                traditional: c.traditional,
                base: (!c.freqs).then_some(10000.0),
                scale: c.scale,
                forward,
            };
            let mut inputs = vec![operand(&shape, &xs), offset.clone()];
            if c.freqs {
                inputs.push(operand(&[freqs.len() as i32], &freqs));
            }
            let y: Vec<T> = values(&run(FastOp::Rope(p), inputs, vec![output(&shape, T::DTYPE)])[0]);
            let want = reference(c, &wide, &freqs, forward);
            let what = format!(
                "{} {:?} dims {} traditional {} freqs {} offsets {:?} forward {forward}",
                T::DTYPE,
                c.shape,
                c.dims,
                c.traditional,
                c.freqs,
                c.offsets
            );
            for (i, (g, w)) in y.iter().map(|v| v.to_f64()).zip(&want).enumerate() {
                if i % d >= c.dims {
                    assert_eq!(g.to_bits(), w.to_bits(), "{what}: element {i} is copied");
                }
                assert!((g - w).abs() <= tol * (1.0 + w.abs()), "{what}: element {i}: {g} vs {w}");
            }
        }
    }

    fn check_dtypes(c: Case) {
        check::<f32>(&c, f32::EPSILON as f64);
        check::<f64>(&c, f64::EPSILON);
        check::<bf16>(&c, 2f64.powi(-8));
        check::<f16>(&c, 2f64.powi(-11));
    }

    #[test]
    fn rope_matches_f64_over_layouts_offsets_and_dtypes() {
        for traditional in [false, true] {
            for freqs in [false, true] {
                let case = |shape, dims, scale, offsets: &[i32]| Case {
                    shape,
                    dims,
                    traditional,
                    freqs,
                    scale,
                    offsets: offsets.to_vec(),
                };
                // Rows of 2 features; partial rotations (the rest copied), a long row; offsets
                // scalar and per batch row; sequences longer than a task.
                check_dtypes(case([1, 1, 7, 2], 2, 1.0, &[0]));
                check_dtypes(case([2, 3, 5, 8], 8, 0.5, &[3]));
                check_dtypes(case([2, 3, 5, 34], 16, 1.0, &[5, 17]));
                check_dtypes(case([3, 2, 9, 1000], 64, 1.0, &[0, 100, 7]));
                check_dtypes(case([2, 1, 4100, 16], 6, 1.0, &[1, 2]));
            }
        }
    }

    #[test]
    fn rope_leaves_other_dtypes_to_the_composition() {
        let x = operand(&[1, 1, 2, 4], &[0f32; 8]);
        let p = RopeParams { dims: 4, traditional: false, base: None, scale: 1.0, forward: true };
        let f64_freqs = vec![x.clone(), operand::<i32>(&[], &[0]), operand(&[2], &[1f64, 2.0])];
        assert!(!fused(&FastOp::Rope(p), &f64_freqs));
        let f32_freqs = vec![x.clone(), operand::<i32>(&[], &[0]), operand(&[2], &[1f32, 2.0])];
        assert!(fused(&FastOp::Rope(p), &f32_freqs));
        let p = RopeParams { base: Some(1e4), ..p };
        assert!(!fused(&FastOp::Rope(p), &[x.clone(), operand::<i64>(&[], &[0])]));
        assert!(!fused(&FastOp::Rope(p), &[operand(&[1, 1, 2, 4], &[0i32; 8]), operand::<i32>(&[], &[0])]));
    }
}
