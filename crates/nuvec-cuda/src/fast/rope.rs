//! RoPE (`kernels/rope.cuh`): a thread per chunk of a row's features, rows in memory order.

use nuvec_core::fast::RopeParams;
use nuvec_core::storage::Operand;
use nuvec_core::{DType, Result};

use super::{Rows, ptr_or_null};
use crate::driver::Gpu;
use crate::kernels::{Family, Source, ctype};
use crate::launch::{Arg, BLOCK, launch_dependent};
use crate::operand::{kernel, ptr_of};

/// The module of `d`: 16-byte chunks (`rope_vec`, `_t` traditional), or single features
/// (`rope_s1`) or pairs (`rope_s2`, traditional); `_f`: inverse frequencies from `freqs`; `_w`:
/// rows past 2^32 (64-bit row arithmetic).
pub(crate) fn source(d: DType) -> String {
    let mut s = Source::new(&["rope.cuh"]);
    let t = ctype(d);
    let n = 16 / d.size();
    for (name, width, vec, trad) in [
        ("rope_vec", n, true, false),
        ("rope_vec_t", n, true, true),
        ("rope_s1", 1, false, false),
        ("rope_s2", 2, false, true),
    ] {
        for (f, freqs) in [("", false), ("_f", true)] {
            for (wide, r32) in [("", true), ("_w", false)] {
                s.kernel(format!(
                    "{name}{f}{wide}(const {t}* x, {t}* out, const int32_t* offset, int offset_per_batch, const float* freqs, float log2_base, float scale, float sign, u64 rows, u64 len, u64 dims, u64 seq, u64 per_batch) {{ rope_rows<{t}, {width}, {vec}, {r32}, {trad}, {freqs}>(x, out, offset, offset_per_batch, freqs, log2_base, scale, sign, rows, len, dims, seq, per_batch); }}"
                ));
            }
        }
    }
    s.finish()
}

/// RoPE of the rows of `x` into `out`, positions from `offset`, inverse frequencies from
/// `freqs` when given.
pub(crate) fn eval(
    gpu: &Gpu,
    p: &RopeParams,
    r: Rows,
    x: &Operand,
    offset: &Operand,
    freqs: Option<&Operand>,
    out: u64,
) -> Result<()> {
    let Rows { d, rows, len } = r;
    let nd = x.shape.len();
    let (seq, dims) = (x.shape[nd - 2].max(1) as u64, p.dims as u64);
    // Rows per offset entry (a per-batch offset indexes the first axis).
    let per_batch = (rows / x.shape[0].max(1) as u64).max(1);
    let (xp, per) = (ptr_of(x)?, (16 / d.size()) as u64);
    let rotated = if p.traditional { dims } else { dims / 2 };
    let vec = xp.is_multiple_of(16) && out.is_multiple_of(16) && len.is_multiple_of(per) && rotated.is_multiple_of(per);
    let (name, width) = match (vec, p.traditional) {
        (true, false) => ("rope_vec", per),
        (true, true) => ("rope_vec_t", per),
        (false, false) => ("rope_s1", 1),
        (false, true) => ("rope_s2", 2),
    };
    let chunks = rotated / width + (len - dims).div_ceil(width);
    // Block: a row's chunks across x, rows across y; the grid covers the rows in memory order.
    let bx = chunks.clamp(1, BLOCK as u64);
    let by = (BLOCK as u64 / bx).max(1);
    let gx = rows.div_ceil(by).clamp(1, i32::MAX as u64);
    let args = vec![
        Arg::Ptr(xp),
        Arg::Ptr(out),
        Arg::Ptr(ptr_of(offset)?),
        Arg::I32((offset.shape.len() == 1) as i32),
        Arg::Ptr(ptr_or_null(freqs)?),
        Arg::F32(p.base.map_or(0.0, f32::log2)),
        Arg::F32(p.scale),
        Arg::F32(if p.forward { 1.0 } else { -1.0 }),
        Arg::U64(rows),
        Arg::U64(len),
        Arg::U64(dims),
        Arg::U64(seq),
        Arg::U64(per_batch),
    ];
    let f_suffix = if freqs.is_some() { "_f" } else { "" };
    let wide = if rows > u32::MAX as u64 { "_w" } else { "" };
    let f = kernel(gpu, Family::Rope(d), &format!("{name}{f_suffix}{wide}"))?;
    launch_dependent(gpu, f, gx as u32, (bx as u32, by as u32), 1, args)
}
