//! Fused CPU kernel of the gated delta rule (`FastOp::GatedDelta`, Gated DeltaNet's recurrence).
//!
//! It computes what the composition in `nuvec_core::fast::gated_delta` computes, in `f32` with
//! the same roundings per element: for each step, each row `s` of a value head's state
//! `[Dv, Dk]` is decayed (`s·g`), read by the key (`kv = Σ s·k`), corrected (`δ = (v − kv)·β`,
//! `s ← s + δ·k`) and read by the query (`y = Σ s·q`); only the order of the two sums differs.
//! A state row depends on no other row, so one task takes a block of rows of one value head
//! through every step, the rows staying in L1 while the steps' `q`, `k`, `g` stream past. The
//! composition instead makes about ten passes over the whole state per step.

use half::{bf16, f16};
use nuvec_core::fast::GatedDeltaParams;
use nuvec_core::storage::{Data, HostBuffer, Operand, Output};
use nuvec_core::{DType, Result};

use super::elems;
use crate::internal;
use crate::map::simd_kernel;

/// State elements one task keeps (its block of rows): within L1 with the step's vectors.
const BLOCK_ELEMS: usize = 4096;

/// Runs the recurrence on row-major operands `[q, k, v, g, beta, state, mask?]` (the shape rule
/// accepted them): `y` in `q`'s dtype, the last state (or every step's) in `p.storage`.
pub(crate) fn eval(p: &GatedDeltaParams, inputs: &[Operand], outputs: &mut [Output]) -> Result<()> {
    let (q, k, v, g, beta, state) = match inputs {
        [q, k, v, g, beta, state, rest @ ..] if rest.len() == p.masked as usize => (q, k, v, g, beta, state),
        _ => return Err(internal("gated_delta takes q, k, v, g, beta, state and an optional mask")),
    };
    let [y_out, s_out] = outputs else {
        return Err(internal("gated_delta makes two outputs"));
    };
    let dims = |x: &Operand| -> Vec<usize> { x.shape.iter().map(|&d| d.max(0) as usize).collect() };
    let (qd, vd) = (dims(q), dims(v));
    let (&[b, t, hk, dk], &[_, _, hv, dv]) = (&qd[..], &vd[..]) else {
        return Err(internal("gated_delta: q or v is not 4-D"));
    };
    if hk == 0 || !hv.is_multiple_of(hk) {
        return Err(internal("gated_delta: value heads not a multiple of key heads"));
    }
    let channel_gate = g.shape.len() == 4;
    let heads = b * t * hv;
    let sizes = [
        (q.size(), b * t * hk * dk),
        (k.size(), b * t * hk * dk),
        (v.size(), heads * dv),
        (g.size(), if channel_gate { heads * dk } else { heads }),
        (beta.size(), heads),
        (state.size(), b * hv * dv * dk),
        (y_out.size(), heads * dv),
        (s_out.size(), if p.steps { heads * dv * dk } else { b * hv * dv * dk }),
    ];
    if sizes.iter().any(|(got, want)| got != want) || y_out.dtype != q.dtype || s_out.dtype != p.storage {
        return Err(internal("gated_delta: operands of shapes or dtypes the rule would not have accepted"));
    }
    let mask = match inputs.get(6) {
        Some(m) if m.size() == b * t && m.dtype == DType::Bool => Some(elems::<u8>(m)?),
        Some(_) => return Err(internal("gated_delta: the mask is not bool [B, T]")),
        None => None,
    };
    let task = Task {
        q: Floats::of(q)?,
        k: Floats::of(k)?,
        v: Floats::of(v)?,
        g: Floats::of(g)?,
        beta: Floats::of(beta)?,
        state: Floats::of(state)?,
        mask,
        t,
        hk,
        hv,
        dk,
        dv,
        groups: hv / hk,
        channel_gate,
        steps: p.steps,
        rows: (BLOCK_ELEMS / dk.max(1)).clamp(1, dv.max(1)),
    };
    let mut y = HostBuffer::uninit(y_out.size() * y_out.dtype.size())?;
    let mut s = HostBuffer::uninit(s_out.size() * s_out.dtype.size())?;
    let (ys, ss) = (Sink::of(&mut y, y_out.dtype)?, Sink::of(&mut s, s_out.dtype)?);
    let blocks = dv.div_ceil(task.rows);
    crate::pool::for_each(b * hv * blocks, &|i| {
        block_simd((&task, &ys, &ss, i / (hv * blocks), i / blocks % hv, i % blocks));
    });
    y_out.data = Some(Data::from_host_buffer(&y_out.shape, y));
    s_out.data = Some(Data::from_host_buffer(&s_out.shape, s));
    Ok(())
}

/// The operands and sizes every task shares.
struct Task<'a> {
    q: Floats<'a>,
    k: Floats<'a>,
    v: Floats<'a>,
    g: Floats<'a>,
    beta: Floats<'a>,
    state: Floats<'a>,
    /// `[B, T]` bytes, 0 for a padded step.
    mask: Option<&'a [u8]>,
    t: usize,
    hk: usize,
    hv: usize,
    dk: usize,
    dv: usize,
    /// Value heads per key head.
    groups: usize,
    /// Whether `g` is `[B, T, Hv, Dk]` rather than `[B, T, Hv]`.
    channel_gate: bool,
    /// Whether the state output holds every step's state.
    steps: bool,
    /// State rows per task.
    rows: usize,
}

type BlockArgs<'a, 'b> = (&'a Task<'b>, &'a Sink, &'a Sink, usize, usize, usize);

simd_kernel!(block_simd => block(BlockArgs));

/// Rows `blk·rows ..` of value head `h` of batch row `b` through all steps, writing their
/// outputs, and their states (every step's, or the last).
#[inline(always)]
fn block((c, ys, ss, b, h, blk): BlockArgs) {
    let (dk, dv) = (c.dk, c.dv);
    let i0 = blk * c.rows;
    let rows = c.rows.min(dv - i0);
    let kh = h / c.groups;
    // The block's rows of the state, in f32.
    let mut s = vec![0f32; rows * dk];
    c.state.read(((b * c.hv + h) * dv + i0) * dk, &mut s);
    let (mut q, mut k, mut g, mut v, mut y) =
        (vec![0f32; dk], vec![0f32; dk], vec![0f32; dk], vec![0f32; rows], vec![0f32; rows]);
    for t in 0..c.t {
        let bt = b * c.t + t;
        let head = bt * c.hv + h;
        if c.mask.is_some_and(|m| m[bt] == 0) {
            // A padded step keeps the state and outputs zeros.
            y.fill(0.0);
        } else {
            c.q.read((bt * c.hk + kh) * dk, &mut q);
            c.k.read((bt * c.hk + kh) * dk, &mut k);
            c.v.read(head * dv + i0, &mut v);
            let beta = c.beta.get(head);
            if c.channel_gate {
                c.g.read(head * dk, &mut g);
            } else {
                g.fill(c.g.get(head));
            }
            for ((row, y), &v) in s.chunks_exact_mut(dk.max(1)).zip(y.iter_mut()).zip(&v) {
                let kv = decay_dot(row, &g, &k);
                let delta = (v - kv) * beta;
                *y = update_dot(row, delta, &k, &q);
            }
        }
        // SAFETY: the element ranges of (batch row, step, head, block) are disjoint between tasks.
        unsafe { ys.store(head * dv + i0, &y) };
        if c.steps {
            // SAFETY: as above, for the steps' states.
            unsafe { ss.store((head * dv + i0) * dk, &s) };
        }
    }
    if !c.steps {
        // SAFETY: the element ranges of (batch row, head, block) are disjoint between tasks.
        unsafe { ss.store(((b * c.hv + h) * dv + i0) * dk, &s) };
    }
}

const L: usize = 16;

/// `s ← s·g`, then `Σ s·k`, in `L` independent lanes the compiler keeps in vector registers.
#[inline(always)]
fn decay_dot(s: &mut [f32], g: &[f32], k: &[f32]) -> f32 {
    let mut lanes = [0f32; L];
    let mut sc = s.chunks_exact_mut(L);
    let (mut gc, mut kc) = (g.chunks_exact(L), k.chunks_exact(L));
    for ((s, g), k) in (&mut sc).zip(&mut gc).zip(&mut kc) {
        for l in 0..L {
            s[l] *= g[l];
            lanes[l] += s[l] * k[l];
        }
    }
    let mut tail = 0f32;
    for ((s, g), k) in sc.into_remainder().iter_mut().zip(gc.remainder()).zip(kc.remainder()) {
        *s *= g;
        tail += *s * k;
    }
    lanes.iter().sum::<f32>() + tail
}

/// `s ← s + δ·k`, then `Σ s·q`, as [`decay_dot`].
#[inline(always)]
fn update_dot(s: &mut [f32], delta: f32, k: &[f32], q: &[f32]) -> f32 {
    let mut lanes = [0f32; L];
    let mut sc = s.chunks_exact_mut(L);
    let (mut kc, mut qc) = (k.chunks_exact(L), q.chunks_exact(L));
    for ((s, k), q) in (&mut sc).zip(&mut kc).zip(&mut qc) {
        for l in 0..L {
            s[l] += delta * k[l];
            lanes[l] += s[l] * q[l];
        }
    }
    let mut tail = 0f32;
    for ((s, k), q) in sc.into_remainder().iter_mut().zip(kc.remainder()).zip(qc.remainder()) {
        *s += delta * k;
        tail += *s * q;
    }
    lanes.iter().sum::<f32>() + tail
}

/// A row-major operand of any float dtype, read as `f32` (as the composition casts it).
enum Floats<'a> {
    F16(&'a [f16]),
    BF16(&'a [bf16]),
    F32(&'a [f32]),
    F64(&'a [f64]),
}

impl<'a> Floats<'a> {
    fn of(x: &'a Operand) -> Result<Floats<'a>> {
        Ok(match x.dtype {
            DType::F16 => Floats::F16(elems(x)?),
            DType::BF16 => Floats::BF16(elems(x)?),
            DType::F32 => Floats::F32(elems(x)?),
            DType::F64 => Floats::F64(elems(x)?),
            d => return Err(crate::unsupported(d)),
        })
    }

    /// Elements `at .. at + out.len()` into `out` (`eval` checked the sizes).
    #[inline(always)]
    fn read(&self, at: usize, out: &mut [f32]) {
        let n = out.len();
        match self {
            Floats::F16(x) => out.iter_mut().zip(&x[at..at + n]).for_each(|(o, x)| *o = x.to_f32()),
            Floats::BF16(x) => out.iter_mut().zip(&x[at..at + n]).for_each(|(o, x)| *o = x.to_f32()),
            Floats::F32(x) => out.copy_from_slice(&x[at..at + n]),
            Floats::F64(x) => out.iter_mut().zip(&x[at..at + n]).for_each(|(o, &x)| *o = x as f32),
        }
    }

    #[inline(always)]
    fn get(&self, at: usize) -> f32 {
        match self {
            Floats::F16(x) => x[at].to_f32(),
            Floats::BF16(x) => x[at].to_f32(),
            Floats::F32(x) => x[at],
            Floats::F64(x) => x[at] as f32,
        }
    }
}

/// An output buffer whose disjoint element ranges the tasks write at once, rounding from `f32`.
struct Sink {
    ptr: *mut u8,
    /// Elements.
    len: usize,
    dtype: DType,
}

// SAFETY: tasks write only ranges of their own through `store`.
unsafe impl Sync for Sink {}

impl Sink {
    fn of(buf: &mut HostBuffer, dtype: DType) -> Result<Sink> {
        if !matches!(dtype, DType::F16 | DType::BF16 | DType::F32 | DType::F64) {
            return Err(crate::unsupported(dtype));
        }
        Ok(Sink { ptr: buf.bytes_mut().as_mut_ptr(), len: buf.len() / dtype.size(), dtype })
    }

    /// Writes `vals` to elements `at ..` (a range past the end is skipped; `eval` checked the
    /// sizes).
    ///
    /// # Safety
    /// No other thread reads or writes these elements during the loop.
    #[inline(always)]
    unsafe fn store(&self, at: usize, vals: &[f32]) {
        let n = vals.len();
        if at.checked_add(n).is_none_or(|end| end > self.len) {
            return;
        }
        // SAFETY: in bounds (checked above), aligned (host buffers are 64-byte aligned), and
        // not shared (the caller's promise).
        unsafe {
            match self.dtype {
                DType::F16 => store_as(self.ptr.cast::<f16>().add(at), vals, f16::from_f32),
                DType::BF16 => store_as(self.ptr.cast::<bf16>().add(at), vals, bf16::from_f32),
                DType::F32 => store_as(self.ptr.cast::<f32>().add(at), vals, |v| v),
                _ => store_as(self.ptr.cast::<f64>().add(at), vals, |v| v as f64),
            }
        }
    }
}

/// # Safety
/// `dst .. dst + vals.len()` is valid, aligned and not accessed elsewhere meanwhile.
#[inline(always)]
unsafe fn store_as<T>(dst: *mut T, vals: &[f32], f: impl Fn(f32) -> T) {
    // SAFETY: the caller's promise.
    let d = unsafe { std::slice::from_raw_parts_mut(dst, vals.len()) };
    d.iter_mut().zip(vals).for_each(|(d, &v)| *d = f(v));
}

#[cfg(test)]
mod tests {
    use nuvec_core::DType;
    use nuvec_core::fast::{FastOp, GatedDeltaParams};

    use crate::fast::testing::{operand, output, run, sample, values};

    /// The recurrence in f64, one row at a time, for the kernel's own check.
    #[allow(clippy::too_many_arguments)]
    fn reference(
        (b, t, hk, hv, dk, dv): (usize, usize, usize, usize, usize, usize),
        q: &[f64],
        k: &[f64],
        v: &[f64],
        g: &[f64],
        beta: &[f64],
        state: &[f64],
    ) -> (Vec<f64>, Vec<f64>) {
        let mut s = state.to_vec();
        let mut y = vec![0.0; b * t * hv * dv];
        for bi in 0..b {
            for h in 0..hv {
                let kh = h / (hv / hk);
                for ti in 0..t {
                    let qk = ((bi * t + ti) * hk + kh) * dk;
                    let head = (bi * t + ti) * hv + h;
                    for i in 0..dv {
                        let row = &mut s[((bi * hv + h) * dv + i) * dk..][..dk];
                        let mut kv = 0.0;
                        for j in 0..dk {
                            row[j] *= g[head];
                            kv += row[j] * k[qk + j];
                        }
                        let delta = (v[head * dv + i] - kv) * beta[head];
                        let mut o = 0.0;
                        for j in 0..dk {
                            row[j] += delta * k[qk + j];
                            o += row[j] * q[qk + j];
                        }
                        y[head * dv + i] = o;
                    }
                }
            }
        }
        (y, s)
    }

    #[test]
    fn matches_float64_with_grouped_heads_and_rows_past_a_block() {
        // Dk 20 (a tail past 16 lanes), Dv 300 (two blocks of 204 rows and a short one).
        let (b, t, hk, hv, dk, dv) = (2, 3, 1, 2, 20, 300);
        let q = sample(b * t * hk * dk, 1, -1.0, 1.0);
        let k = sample(b * t * hk * dk, 2, -0.3, 0.3);
        let v = sample(b * t * hv * dv, 3, -1.0, 1.0);
        let g = sample(b * t * hv, 4, 0.5, 1.0);
        let beta = sample(b * t * hv, 5, 0.0, 1.0);
        let state = sample(b * hv * dv * dk, 6, -0.5, 0.5);
        let f32s = |x: &[f64]| x.iter().map(|&v| v as f32).collect::<Vec<f32>>();
        let wide = |x: &[f64]| f32s(x).iter().map(|&v| v as f64).collect::<Vec<f64>>();
        let (want_y, want_s) =
            reference((b, t, hk, hv, dk, dv), &wide(&q), &wide(&k), &wide(&v), &wide(&g), &wide(&beta), &wide(&state));
        let [b_, t_, hk_, hv_, dk_, dv_] = [b, t, hk, hv, dk, dv].map(|d| d as i32);
        let inputs = vec![
            operand(&[b_, t_, hk_, dk_], &f32s(&q)),
            operand(&[b_, t_, hk_, dk_], &f32s(&k)),
            operand(&[b_, t_, hv_, dv_], &f32s(&v)),
            operand(&[b_, t_, hv_], &f32s(&g)),
            operand(&[b_, t_, hv_], &f32s(&beta)),
            operand(&[b_, hv_, dv_, dk_], &f32s(&state)),
        ];
        let p = GatedDeltaParams { steps: false, storage: DType::F32, masked: false };
        let outs = run(
            FastOp::GatedDelta(p),
            inputs,
            vec![output(&[b_, t_, hv_, dv_], DType::F32), output(&[b_, hv_, dv_, dk_], DType::F32)],
        );
        for (what, got, want) in [("y", values::<f32>(&outs[0]), want_y), ("state", values::<f32>(&outs[1]), want_s)] {
            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                assert!((*g as f64 - w).abs() <= 1e-5 * (1.0 + w.abs()), "{what} {i}: {g} vs {w}");
            }
        }
    }
}
