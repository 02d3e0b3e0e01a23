//! Fused CPU kernel of the gated delta rule (`FastOp::GatedDelta`, Gated DeltaNet's recurrence).
//!
//! It computes what the composition in `nuvec_core::fast::gated_delta` computes, in `f32` with
//! the same roundings per element: for each step, each row `s` of a value head's state
//! `[Dv, Dk]` is decayed (`s·g`), read by the key (`kv = Σ s·k`), corrected (`δ = (v − kv)·β`,
//! `s ← s + δ·k`) and read by the query (`y = Σ s·q`); only the order of the two sums differs.
//! The composition makes about ten passes over the whole state per step.
//!
//! A state row depends on no other row, so one task takes a block of `ROWS` rows of one value
//! head through every step, the block in L1 while the steps stream past. For a few steps (a
//! decode) the block stays row-major and each row's sums run along its key channels
//! (`step_rows`); from `LANES_FROM` steps on it is held transposed, the rows as the vector
//! lanes and each key channel's `g`, `k`, `q` one value for all of them (`step_lanes`), which
//! pays for the transposes. Both sum in one order (`P` partials), so a prompt gives the same
//! bits in one call or in pieces, and `gated_delta_steps` the same states as `gated_delta`.

use half::{bf16, f16};
use nuvec_core::fast::GatedDeltaParams;
use nuvec_core::storage::{Data, HostBuffer, Operand, Output};
use nuvec_core::{DType, Result};

use super::elems;
use crate::internal;
use crate::map::simd_kernel;

/// Steps from which a task keeps its block transposed (`step_lanes`): below it, the transposes
/// in and out cost more than the row-major rows lose.
const LANES_FROM: usize = 8;

/// State rows per task: two AVX2 vectors of lanes.
const ROWS: usize = 16;

/// One key channel of a block: that element of each of its rows.
type Lanes = [f32; ROWS];

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
        lanes: !p.steps && t >= LANES_FROM,
    };
    let mut y = HostBuffer::uninit(y_out.size() * y_out.dtype.size())?;
    let mut s = HostBuffer::uninit(s_out.size() * s_out.dtype.size())?;
    let (ys, ss) = (Sink::of(&mut y, y_out.dtype)?, Sink::of(&mut s, s_out.dtype)?);
    let blocks = dv.div_ceil(ROWS);
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
    /// Whether blocks are kept transposed (`step_lanes`) rather than row-major (`step_rows`).
    lanes: bool,
}

type BlockArgs<'a, 'b> = (&'a Task<'b>, &'a Sink, &'a Sink, usize, usize, usize);

simd_kernel!(block_simd => block(BlockArgs));

/// Rows `blk·ROWS ..` of value head `h` of batch row `b` through all steps, writing their
/// outputs, and their states (every step's, or the last).
#[inline(always)]
fn block((c, ys, ss, b, h, blk): BlockArgs) {
    let dk = c.dk;
    let i0 = blk * ROWS;
    let rows = ROWS.min(c.dv - i0);
    let first = ((b * c.hv + h) * c.dv + i0) * dk;
    let mut bufs = [vec![0f32; dk], vec![0f32; dk], vec![0f32; dk]];
    let mut y = [0f32; ROWS];
    if c.lanes {
        // The rows as stored (rows past the block's zero), then transposed.
        let mut stage = vec![0f32; ROWS * dk];
        c.state.read(first, &mut stage[..rows * dk]);
        let mut st = vec![[0f32; ROWS]; dk];
        transpose(&stage, st.as_flattened_mut(), ROWS, dk);
        for t in 0..c.t {
            let head = (b * c.t + t) * c.hv + h;
            if let Some(x) = c.read_step(&mut bufs, b, t, h, i0, rows) {
                step_lanes(&mut st, &x, &mut y);
            } else {
                y.fill(0.0);
            }
            // SAFETY: the ranges of (batch row, step, head, block) are disjoint between tasks.
            unsafe { ys.store(head * c.dv + i0, &y[..rows]) };
        }
        transpose(st.as_flattened(), &mut stage, dk, ROWS);
        // SAFETY: the ranges of (batch row, head, block) are disjoint between tasks.
        unsafe { ss.store(first, &stage[..rows * dk]) };
        return;
    }
    // The last state in float32 is worked on where it is returned: one copy fewer.
    let mut own = Vec::new();
    // SAFETY: the range of (batch row, head, block) is this task's alone.
    let st = match (!c.steps).then(|| unsafe { ss.f32s(first, rows * dk) }).flatten() {
        Some(st) => st,
        None => {
            own.resize(rows * dk, 0f32);
            &mut own[..]
        }
    };
    c.state.read(first, st);
    for t in 0..c.t {
        let head = (b * c.t + t) * c.hv + h;
        if let Some(x) = c.read_step(&mut bufs, b, t, h, i0, rows) {
            step_rows(st, &x, &mut y);
        } else {
            y.fill(0.0);
        }
        // SAFETY: the ranges of (batch row, step, head, block) are disjoint between tasks.
        unsafe { ys.store(head * c.dv + i0, &y[..rows]) };
        if c.steps {
            // SAFETY: as above, for the steps' states.
            unsafe { ss.store((head * c.dv + i0) * dk, st) };
        }
    }
    if !c.steps && !own.is_empty() {
        // SAFETY: the ranges of (batch row, head, block) are disjoint between tasks.
        unsafe { ss.store(first, &own) };
    }
}

/// One step's inputs for a block of rows, in `f32`: `float32` operands' own elements, others
/// converted.
struct StepInputs<'a> {
    q: &'a [f32],
    k: &'a [f32],
    /// The decay of each key channel (one value repeated for a gate per head).
    g: &'a [f32],
    /// The rows' values, zero past the block's rows.
    v: Lanes,
    beta: f32,
}

impl Task<'_> {
    /// Step `t`'s inputs for rows `i0 .. i0 + rows` of value head `h` of batch row `b` (`bufs`
    /// holding what is converted), or `None` for a masked step (the state is kept, the output
    /// zero).
    #[inline(always)]
    fn read_step<'s>(
        &'s self,
        bufs: &'s mut [Vec<f32>; 3],
        b: usize,
        t: usize,
        h: usize,
        i0: usize,
        rows: usize,
    ) -> Option<StepInputs<'s>> {
        let (dk, bt) = (self.dk, b * self.t + t);
        if self.mask.is_some_and(|m| m[bt] == 0) {
            return None;
        }
        let head = bt * self.hv + h;
        let at = (bt * self.hk + h / self.groups) * dk;
        let [qb, kb, gb] = bufs;
        let g = if self.channel_gate {
            self.g.view(head * dk, gb)
        } else {
            gb.fill(self.g.get(head));
            &gb[..]
        };
        let mut v = [0f32; ROWS];
        for (r, v) in v.iter_mut().enumerate().take(rows) {
            *v = self.v.get(head * self.dv + i0 + r);
        }
        Some(StepInputs { q: self.q.view(at, qb), k: self.k.view(at, kb), g, v, beta: self.beta.get(head) })
    }
}

/// `dst` (`[m, n]`) ← `src` (`[n, m]`) transposed, both row-major.
#[inline(always)]
fn transpose(src: &[f32], dst: &mut [f32], n: usize, m: usize) {
    for (i, row) in src.chunks_exact(m.max(1)).take(n).enumerate() {
        for (j, &v) in row.iter().enumerate() {
            dst[j * n + i] = v;
        }
    }
}

/// Partial sums of a row's key channels: channel `j` adds to partial `j % P`, in order; the
/// partials are then added by halving, and the channels past the last multiple of `P` after
/// them. Both layouts sum in this order, so they give the same bits.
const P: usize = 32;
// `halve` and `halve_lanes` spell out the halving of 32 partials.
const _: () = assert!(P == 32);

/// One step of row-major rows: `s ← s·g`, `kv = Σ s·k`, `δ = (v − kv)·β`, `s ← s + δ·k`,
/// `y = Σ s·q`. The first pass does not store the decayed state: the second recomputes it, bit
/// for bit, saving a store per element.
#[inline(always)]
fn step_rows(st: &mut [f32], x: &StepInputs<'_>, y: &mut Lanes) {
    let (gc, gt) = x.g.as_chunks::<P>();
    let (kc, kt) = x.k.as_chunks::<P>();
    let (qc, qt) = x.q.as_chunks::<P>();
    for ((row, y), &v) in st.chunks_exact_mut(x.g.len().max(1)).zip(y.iter_mut()).zip(&x.v) {
        let (sc, stail) = row.as_chunks_mut::<P>();
        let mut part = [0f32; P];
        for ((s, g), k) in sc.iter().zip(gc).zip(kc) {
            for l in 0..P {
                part[l] += s[l] * g[l] * k[l];
            }
        }
        let tail = stail.iter().zip(gt).zip(kt).fold(0f32, |a, ((s, g), k)| a + s * g * k);
        let delta = (v - (halve(part) + tail)) * x.beta;
        let mut part = [0f32; P];
        for (((s, g), k), q) in sc.iter_mut().zip(gc).zip(kc).zip(qc) {
            for l in 0..P {
                s[l] = s[l] * g[l] + delta * k[l];
                part[l] += s[l] * q[l];
            }
        }
        let mut tail = 0f32;
        for (((s, g), k), q) in stail.iter_mut().zip(gt).zip(kt).zip(qt) {
            *s = *s * g + delta * k;
            tail += *s * q;
        }
        *y = halve(part) + tail;
    }
}

/// The sum of the partials: the upper half added to the lower, five times.
#[inline(always)]
fn halve(p: [f32; P]) -> f32 {
    let a: [f32; 16] = std::array::from_fn(|l| p[l] + p[l + 16]);
    let a: [f32; 8] = std::array::from_fn(|l| a[l] + a[l + 8]);
    let b: [f32; 4] = std::array::from_fn(|l| a[l] + a[l + 4]);
    (b[0] + b[2]) + (b[1] + b[3])
}

/// [`halve`] for each lane (row) of the partials, in place, in vector additions.
#[inline(always)]
fn halve_lanes(part: &mut [Lanes; P]) -> Lanes {
    for w in [16, 8, 4] {
        let (lo, hi) = part.split_at_mut(w);
        for (a, b) in lo.iter_mut().zip(hi.iter()) {
            for r in 0..ROWS {
                a[r] += b[r];
            }
        }
    }
    std::array::from_fn(|r| (part[0][r] + part[2][r]) + (part[1][r] + part[3][r]))
}

/// [`step_rows`] on a transposed block: the rows are the lanes, each key channel's `g`, `k` and
/// `q` one value for all of them. Partial `l`'s channels are visited together, so its sums stay
/// in registers.
#[inline(always)]
fn step_lanes(st: &mut [Lanes], x: &StepInputs<'_>, y: &mut Lanes) {
    let dk = st.len();
    let main = dk - dk % P;
    let (g, k, q) = (&x.g[..dk], &x.k[..dk], &x.q[..dk]);
    let mut part = [[0f32; ROWS]; P];
    for (l, part) in part.iter_mut().enumerate() {
        let mut acc = [0f32; ROWS];
        for j in (l..main).step_by(P) {
            let (s, g, k) = (&st[j], g[j], k[j]);
            for r in 0..ROWS {
                acc[r] += s[r] * g * k;
            }
        }
        *part = acc;
    }
    let mut tail = [0f32; ROWS];
    for j in main..dk {
        let (s, g, k) = (&st[j], g[j], k[j]);
        for r in 0..ROWS {
            tail[r] += s[r] * g * k;
        }
    }
    let kv = halve_lanes(&mut part);
    let delta: Lanes = std::array::from_fn(|r| (x.v[r] - (kv[r] + tail[r])) * x.beta);
    for (l, part) in part.iter_mut().enumerate() {
        let mut acc = [0f32; ROWS];
        for j in (l..main).step_by(P) {
            let (s, g, k, q) = (&mut st[j], g[j], k[j], q[j]);
            for r in 0..ROWS {
                s[r] = s[r] * g + delta[r] * k;
                acc[r] += s[r] * q;
            }
        }
        *part = acc;
    }
    let mut tail = [0f32; ROWS];
    for j in main..dk {
        let (s, g, k, q) = (&mut st[j], g[j], k[j], q[j]);
        for r in 0..ROWS {
            s[r] = s[r] * g + delta[r] * k;
            tail[r] += s[r] * q;
        }
    }
    let out = halve_lanes(&mut part);
    for r in 0..ROWS {
        y[r] = out[r] + tail[r];
    }
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

    /// Elements `at .. at + buf.len()`: a `float32` operand's own, else converted into `buf`.
    #[inline(always)]
    fn view<'b>(&'b self, at: usize, buf: &'b mut [f32]) -> &'b [f32] {
        match self {
            Floats::F32(x) => &x[at..at + buf.len()],
            _ => {
                self.read(at, buf);
                buf
            }
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

    /// Elements `at .. at + n` as `f32`s to work in, if the buffer is `float32` (and the range
    /// inside it).
    ///
    /// # Safety
    /// No other thread reads or writes these elements while the slice lives.
    #[inline(always)]
    #[allow(clippy::mut_from_ref)]
    unsafe fn f32s(&self, at: usize, n: usize) -> Option<&mut [f32]> {
        if self.dtype != DType::F32 || at.checked_add(n).is_none_or(|end| end > self.len) {
            return None;
        }
        // SAFETY: in bounds, aligned (host buffers are 64-byte aligned) and not shared (the
        // caller's promise).
        Some(unsafe { std::slice::from_raw_parts_mut(self.ptr.cast::<f32>().add(at), n) })
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
        // 3 steps row-major, 12 transposed.
        for t in [3, 12] {
            check(t);
        }
    }

    fn check(t: usize) {
        // Dk 37 (channels past the partials), Dv 300 (18 blocks of 16 rows and a short one).
        let (b, hk, hv, dk, dv) = (2, 1, 2, 37, 300);
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
                assert!((*g as f64 - w).abs() <= 1e-5 * (1.0 + w.abs()), "T {t} {what} {i}: {g} vs {w}");
            }
        }
    }
}
