//! RoPE (`kernels/rope.cuh`): a thread per chunk of a row's features, rows in memory order;
//! and a decoding step's RoPE with its cache writes (`fast::rope_kv_write`).

use std::sync::Arc;

use nuvec_core::fast::RopeParams;
use nuvec_core::storage::{Operand, Output};
use nuvec_core::{DType, Result};

use super::{Rows, ptr_or_null};
use crate::driver::Gpu;
use crate::kernels::{Family, Source, ctype};
use crate::launch::{Arg, BLOCK, launch_dependent};
use crate::operand::{alloc_out, fresh_copy, internal, kernel, ptr_of, row_major};

/// The module of `d`: 16-byte chunks (`rope_vec`, `_t` traditional), or single features
/// (`rope_s1`) or pairs (`rope_s2`, traditional); `_f`: inverse frequencies from `freqs`; `_w`:
/// rows past 2^32 (64-bit row arithmetic). The same for `rope_kv_write_*`.
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
    for (name, width, vec, trad) in [
        ("rope_kv_write_vec", n, true, false),
        ("rope_kv_write_vec_t", n, true, true),
        ("rope_kv_write_s1", 1, false, false),
        ("rope_kv_write_s2", 2, false, true),
    ] {
        for (f, freqs) in [("", false), ("_f", true)] {
            s.kernel(format!(
                "{name}{f}(const {t}* qkv, {t}* q, {t}* kc, {t}* vc, const int32_t* start, const int32_t* dst, const float* freqs, float log2_base, float scale, int rows, int seq, int hq, int hkv, int d, int dims, int cap) {{ rope_kv_write<{t}, {width}, {vec}, {trad}, {freqs}>(qkv, q, kc, vc, start, dst, freqs, log2_base, scale, rows, seq, hq, hkv, d, dims, cap); }}"
            ));
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

/// `fast::rope_kv_write` (inputs `[qkv, k_cache, v_cache, start, freqs?]`; with `rows`,
/// `fast::rope_kv_write_rows`'s `[qkv, k_pool, v_pool, start, rows, freqs?]`): the rotated
/// queries into a new buffer, the keys and values into the caches' buffers when they were handed
/// over (donated, row-major), else into row-major copies of them.
pub(crate) fn kv_write(
    gpu: &Arc<Gpu>,
    p: &RopeParams,
    q_heads: i32,
    rows_given: bool,
    inputs: Vec<Operand>,
    outputs: &mut [Output],
) -> Result<()> {
    let mut it = inputs.into_iter();
    let mut next = || it.next().ok_or_else(|| internal("rope_kv_write is missing an input"));
    let qkv = row_major(gpu, next()?)?;
    let cache =
        |c: Operand| if c.writable() && c.data.layout.flags.row_contiguous { Ok(c) } else { fresh_copy(gpu, c) };
    let (kc, vc) = (cache(next()?)?, cache(next()?)?);
    let start = row_major(gpu, next()?)?;
    let dst = if rows_given { Some(row_major(gpu, next()?)?) } else { None };
    let freqs = it.next().map(|f| row_major(gpu, f)).transpose()?;
    let [q_out, k_out, v_out] = outputs else { return Err(internal("rope_kv_write has three outputs")) };
    let q = alloc_out(gpu, q_out)?;
    k_out.data = Some(kc.data.clone());
    v_out.data = Some(vc.data.clone());
    let [b, l, h, d] = [0, 1, 2, 3].map(|a| qkv.shape[a] as u64);
    let (hkv, dims) = (((h - q_heads as u64) / 2), p.dims as u64);
    // Positions per head's cache, or the pools' rows.
    let cap = match dst {
        Some(_) => kc.shape.iter().map(|&n| n as u64).product::<u64>() / d.max(1),
        None => kc.shape[2] as u64,
    };
    let rows = b * l * h;
    if rows == 0 {
        return Ok(());
    }
    let dt = qkv.dtype;
    let per = (16 / dt.size()) as u64;
    let ptrs = [ptr_of(&qkv)?, q, ptr_of(&kc)?, ptr_of(&vc)?];
    let rotated = if p.traditional { dims } else { dims / 2 };
    let vec = ptrs.iter().all(|p| p % 16 == 0) && d.is_multiple_of(per) && rotated.is_multiple_of(per);
    let (name, width) = match (vec, p.traditional) {
        (true, false) => ("rope_kv_write_vec", per),
        (true, true) => ("rope_kv_write_vec_t", per),
        (false, false) => ("rope_kv_write_s1", 1),
        (false, true) => ("rope_kv_write_s2", 2),
    };
    // Block: a row's chunks across x (a value row's are the most), rows across y.
    let bx = d.div_ceil(width).clamp(1, BLOCK as u64);
    let by = (BLOCK as u64 / bx).max(1);
    let gx = rows.div_ceil(by).clamp(1, i32::MAX as u64);
    let mut args: Vec<Arg> = ptrs.map(Arg::Ptr).into();
    args.extend([Arg::Ptr(ptr_of(&start)?), Arg::Ptr(ptr_or_null(dst.as_ref())?)]);
    args.push(Arg::Ptr(ptr_or_null(freqs.as_ref())?));
    args.extend([Arg::F32(p.base.map_or(0.0, f32::log2)), Arg::F32(p.scale)]);
    args.extend([rows, l, q_heads as u64, hkv, d, dims, cap].map(|v| Arg::I32(v as i32)));
    let f = kernel(gpu, Family::Rope(dt), &format!("{name}{}", if freqs.is_some() { "_f" } else { "" }))?;
    launch_dependent(gpu, f, gx as u32, (bx as u32, by as u32), 1, args)
}
