//! Fused CPU kernel of attention for a few query rows (`FastOp::Attention` planned as
//! `AttentionKernel::Vector`: decoding, speculative verification), `float32`; and of attention
//! over a paged cache (`FastOp::PagedAttention`: batches of sequences of their own lengths),
//! its keys read through the block table where they lie.
//!
//! Per query row it computes what the composition in `nuvec_core::fast::attention` computes:
//! the scaled query (`q · scale`, in `f32`), its products with the keys the row may attend
//! (the causal bound `j ≤ i + Lk − Lq`, and the window), a softmax over them (max subtracted,
//! the backend's exponential), and the probabilities' sum of the values; a row with no key gets
//! zeros. Keys and values are read where they lie (a cache's buffer, sliced to its length),
//! each head's rows `stride` apart, so a decoding step copies nothing. The composition is about
//! ten operations per layer, each a pass of its own; here one task per query head does it all.

use nuvec_core::Result;
use nuvec_core::fast::{AttentionParams, PagedParams};
use nuvec_core::storage::{Data, Operand, Output};

use super::{buffer, exp_sum_store, row_max};
use crate::map::simd_kernel;
use crate::matmul::dot;
use crate::{copy, host_slice, internal};

/// Whether the kernel covers an attention of these parameters on inputs of `dtype`: `float32`,
/// without a mask array, sinks or the log-sum-exp output.
pub(crate) fn supports(p: &AttentionParams, dtype: nuvec_core::DType) -> bool {
    dtype == nuvec_core::DType::F32 && p.mask.is_none() && !p.sinks && !p.lse
}

/// A `[B, H, L, D]` operand read in place: the element `(b, h, l, d)` lies at
/// `base + b·sb + h·sh + l·sl + d`.
struct Heads<'a> {
    data: &'a [f32],
    base: usize,
    sb: usize,
    sh: usize,
    sl: usize,
}

impl<'a> Heads<'a> {
    /// `x`'s elements where its last axis is contiguous and no stride is negative.
    fn of(x: &'a Operand) -> Result<Heads<'a>> {
        let s = &x.data.layout.strides;
        if x.shape.len() != 4 || s.len() != 4 || (s[3] != 1 && x.shape[3] > 1) || s.iter().any(|&v| v < 0) {
            return Err(internal("attention: an operand that is not [B, H, L, D] with contiguous rows"));
        }
        let data = host_slice::<f32>(x)?;
        Ok(Heads { data, base: x.data.layout.offset, sb: s[0] as usize, sh: s[1] as usize, sl: s[2] as usize })
    }

    /// Row `l` of head `h` of batch row `b`, `d` long.
    #[inline(always)]
    fn row(&self, b: usize, h: usize, l: usize, d: usize) -> &'a [f32] {
        let at = self.base + b * self.sb + h * self.sh + l * self.sl;
        &self.data[at..at + d]
    }
}

/// Whether the kernel covers a paged attention on inputs of `dtype`: `float32`, no sinks.
pub(crate) fn supports_paged(p: &PagedParams, dtype: nuvec_core::DType) -> bool {
    dtype == nuvec_core::DType::F32 && !p.sinks
}

/// A paged pool `[blocks, H, block_size, D]` (row-major) read through a block table
/// `[B, max_blocks]`: position `j` of sequence `b` lies in block `table[b][j / block_size]`.
struct Pages<'a> {
    data: &'a [f32],
    base: usize,
    table: &'a [i32],
    max_blocks: usize,
    blocks: usize,
    heads: usize,
    size: usize,
}

impl<'a> Pages<'a> {
    /// The pool `x` of rows `w` long, read through `table`; `geometry` is (max blocks per
    /// sequence, blocks, heads, block size).
    fn of(x: &'a Operand, w: usize, table: &'a [i32], geometry: (usize, usize, usize, usize)) -> Result<Rows<'a>> {
        let (max_blocks, blocks, heads, size) = geometry;
        let data = host_slice::<f32>(x)?;
        let base = x.data.layout.offset;
        if data.len() < base + blocks * heads * size * w {
            return Err(internal("paged attention: a cache shorter than its shape"));
        }
        Ok(Rows::Paged(Pages { data, base, table, max_blocks, blocks, heads, size }))
    }

    #[inline(always)]
    fn row(&self, b: usize, h: usize, j: usize, d: usize) -> &'a [f32] {
        // Block ids are clamped into the pool, as the composition does.
        let id = self.table[b * self.max_blocks + j / self.size].clamp(0, self.blocks as i32 - 1) as usize;
        let at = self.base + ((id * self.heads + h) * self.size + j % self.size) * d;
        &self.data[at..at + d]
    }
}

/// Where a head's keys or values lie: an operand's rows, or a paged pool's.
enum Rows<'a> {
    Dense(Heads<'a>),
    Paged(Pages<'a>),
}

impl<'a> Rows<'a> {
    #[inline(always)]
    fn row(&self, b: usize, h: usize, j: usize, d: usize) -> &'a [f32] {
        match self {
            Rows::Dense(x) => x.row(b, h, j, d),
            Rows::Paged(x) => x.row(b, h, j, d),
        }
    }
}

/// Runs the paged attention on `[q, k_cache, v_cache, block_tables, lengths]`
/// (`supports_paged` accepted them): each sequence's queries are its last positions, causal,
/// within the window.
pub(crate) fn eval_paged(p: &PagedParams, inputs: Vec<Operand>, outputs: &mut [Output]) -> Result<()> {
    let [q, kc, vc, table, lengths] = <[Operand; 5]>::try_from(inputs)
        .map_err(|_| internal("paged attention takes q, the caches, tables, lengths"))?;
    let out = outputs.first_mut().ok_or_else(|| internal("paged attention without output"))?;
    let q = if Heads::of(&q).is_ok() { q } else { copy::row_major(q)? };
    let [kc, vc, table, lengths] = [kc, vc, table, lengths].map(copy::row_major);
    let (kc, vc, table, lengths) = (kc?, vc?, table?, lengths?);
    let qh = Heads::of(&q)?;
    let [b, hq, lq, d] = [0, 1, 2, 3].map(|i| q.shape[i].max(0) as usize);
    let [blocks, hkv, size] = [0, 1, 2].map(|i| kc.shape[i].max(0) as usize);
    let dv = vc.shape[3].max(0) as usize;
    let max_blocks = table.shape[1].max(0) as usize;
    if hkv == 0 || blocks == 0 || size == 0 || !hq.is_multiple_of(hkv) || out.size() != b * hq * lq * dv {
        return Err(internal("paged attention: shapes the op would not have accepted"));
    }
    let (table, lengths) = (super::elems::<i32>(&table)?, super::elems::<i32>(&lengths)?);
    let geometry = (max_blocks, blocks, hkv, size);
    let (kr, vr) = (Pages::of(&kc, d, table, geometry)?, Pages::of(&vc, dv, table, geometry)?);
    let mut y = buffer::<f32>(out)?;
    let task = lq * dv;
    if task > 0 {
        let cap = (max_blocks * size) as i64;
        let lens: Vec<i64> = lengths.iter().map(|&l| (l as i64).clamp(0, cap)).collect();
        let shape = Shape {
            group: hq / hkv,
            lq,
            lk: max_blocks * size,
            d,
            dv,
            scale: p.scale,
            causal: true,
            window: p.window,
            lengths: Some(&lens),
        };
        crate::pool::for_each_chunk(y.as_mut_slice::<f32>(), task, &|i, o| {
            head_simd((&shape, &qh, &kr, &vr, i / hq, i % hq, o));
        });
    }
    out.data = Some(Data::from_host_buffer(&out.shape, y));
    Ok(())
}

/// Runs the attention on `[q, k, v]` (`supports` accepted them).
pub(crate) fn eval(p: &AttentionParams, inputs: Vec<Operand>, outputs: &mut [Output]) -> Result<()> {
    let [q, k, v] = <[Operand; 3]>::try_from(inputs).map_err(|_| internal("attention takes q, k and v"))?;
    let out = outputs.first_mut().ok_or_else(|| internal("attention without output"))?;
    // Strided keys and values are read in place; anything else is copied once.
    let in_place = |x: Operand| if Heads::of(&x).is_ok() { Ok(x) } else { copy::row_major(x) };
    let (q, k, v) = (in_place(q)?, in_place(k)?, in_place(v)?);
    let (qh, kh, vh) = (Heads::of(&q)?, Rows::Dense(Heads::of(&k)?), Rows::Dense(Heads::of(&v)?));
    let [b, hq, lq, d] = [0, 1, 2, 3].map(|i| q.shape[i].max(0) as usize);
    let [hkv, lk, dv] = [k.shape[1].max(0) as usize, k.shape[2].max(0) as usize, v.shape[3].max(0) as usize];
    if hkv == 0 || !hq.is_multiple_of(hkv) || out.size() != b * hq * lq * dv {
        return Err(internal("attention: shapes the planner would not have accepted"));
    }
    let mut y = buffer::<f32>(out)?;
    let task = lq * dv;
    if task > 0 {
        let shape =
            Shape { group: hq / hkv, lq, lk, d, dv, scale: p.scale, causal: p.causal, window: p.window, lengths: None };
        // On the backend's loop threads, as the products around it (rayon's would have to be
        // woken, and would contend with those spinning).
        crate::pool::for_each_chunk(y.as_mut_slice::<f32>(), task, &|i, o| {
            head_simd((&shape, &qh, &kh, &vh, i / hq, i % hq, o));
        });
    }
    out.data = Some(Data::from_host_buffer(&out.shape, y));
    Ok(())
}

/// The sizes and options every head shares.
struct Shape<'a> {
    group: usize,
    lq: usize,
    lk: usize,
    d: usize,
    dv: usize,
    scale: f32,
    causal: bool,
    window: Option<i32>,
    /// Paged: each sequence's length (its queries are its last `lq` positions).
    lengths: Option<&'a [i64]>,
}

type HeadArgs<'a, 'b> = (&'a Shape<'a>, &'a Heads<'b>, &'a Rows<'b>, &'a Rows<'b>, usize, usize, &'a mut [f32]);

simd_kernel!(head_simd => head(HeadArgs));

/// Query head `h` of batch row `b`: its `lq` rows into `o` (`lq · dv`).
#[inline(always)]
fn head((s, q, k, v, b, h, o): HeadArgs) {
    let kvh = h / s.group;
    // Keys a row may see: all of them, or a sequence's own.
    let lk = s.lengths.map_or(s.lk as i64, |l| l[b]);
    let off = lk - s.lq as i64;
    let mut qs = vec![0.0f32; s.d];
    let mut scores = Vec::with_capacity(s.lk);
    let mut probs = vec![0.0f32; s.lk];
    for (i, out) in o.chunks_exact_mut(s.dv).enumerate() {
        // Keys `lo..hi` of row i: up to its position, from its window's first.
        let (lo, hi) = if s.causal {
            let hi = (i as i64 + off + 1).clamp(0, lk);
            let lo = s.window.map_or(0, |w| (i as i64 + off - w as i64 + 1).clamp(0, hi));
            (lo as usize, hi as usize)
        } else {
            (0, s.lk)
        };
        out.fill(0.0);
        if lo >= hi {
            continue;
        }
        for (a, &x) in qs.iter_mut().zip(q.row(b, h, i, s.d)) {
            *a = x * s.scale;
        }
        // Loops, not closures, so that `simd`'s target features reach them.
        scores.clear();
        for j in lo..hi {
            scores.push(dot(&qs, k.row(b, kvh, j, s.d)));
        }
        // The softmax's exponentials and sum in independent lanes (vectorised).
        let e = &mut probs[..hi - lo];
        let sum = exp_sum_store::<f32, f32>(&scores, row_max::<f32>(&scores), e, |v| v);
        for (j, &e) in (lo..hi).zip(e.iter()) {
            let p = e / sum;
            for (a, &x) in out.iter_mut().zip(v.row(b, kvh, j, s.dv)) {
                *a += p * x;
            }
        }
    }
}
