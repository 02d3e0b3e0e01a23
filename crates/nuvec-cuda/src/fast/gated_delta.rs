//! The gated delta rule, `fast::gated_delta` and `fast::gated_delta_steps`
//! (`kernels/gated_delta.cuh`): the whole loop over the steps in one kernel, each value row's
//! state in registers throughout. Two kernels: one warp per value row (`gated_delta_n{Dk/32}`,
//! every case with `Dk` a multiple of 32 up to 256; `_ahead` for more than one step), and one of 8 rows per warp
//! (`gated_delta_packed`, `Dk` 128, a float32 gate per head, a float32 state, no mask; a single
//! step, decode, takes `gated_delta_decode` instead, whose loads and stores are whole rows), whose
//! results are bit-identical to the first's. `NUVEC_GDN_PACKED=0` (or mlx-lm's
//! `MLX_GDN_PACKED=0`) keeps every shape on the first, for comparisons. Long prompts at
//! Qwen3-Next's head sizes take a third way, 64 steps at a time on tensor cores
//! (`gated_delta_chunk_prep` then `gated_delta_chunk_scan`); `NUVEC_GDN_CHUNKED=0` turns it off.
//! The derivative (`FastOp::GatedDeltaVjp`) runs those two again, keeping what the chunks'
//! backward needs, then the chunked backward kernels (`gated_delta_bwd_*`).
//!
//! q, k, v, the gate and beta are read through their strides (a model's q, k and v are views
//! of one projection); only a last axis that is not contiguous is copied first.

use std::sync::{Arc, OnceLock};

use nuvec_core::fast::GatedDeltaParams;
use nuvec_core::storage::{Operand, Output, Spec};
use nuvec_core::{DType, Result};

use crate::driver::Gpu;
use crate::kernels::{Family, Source, ctype};
use crate::launch::{Arg, allow_shared, launch, launch_dependent};
use crate::operand::{alloc, alloc_out, fresh_copy, internal, kernel, ptr_of, row_major};
use cudarc::driver::sys::CUfunction;

/// Threads per block of both kernels (4 warps).
const THREADS: u32 = 128;
/// State elements per lane of the row kernel, at most (`Dk` 256).
const MAX_PER_LANE: i64 = 8;
/// 8-byte words of the kernels' parameter (`GdnArgs`, `GDN_ARG_WORDS` in the header).
const ARG_WORDS: usize = 37;
/// Steps per chunk of the chunked kernels (`GDN_C`).
const CHUNK: i64 = 64;
/// The fewest steps that take the chunked kernels: below, the recurrence's one kernel is faster.
pub const CHUNKED_FROM: i64 = 256;
/// The fewest prep blocks of value-head pairs for which pairs beat one head per block: with
/// fewer, pairs halve a grid that already leaves SMs idle.
const PAIRS_FROM_BLOCKS: i64 = 2048;
/// Value rows per block of `gated_delta_chunk_scan` (`GDN_BV`).
const SCAN_ROWS: i64 = 32;
/// Dynamic shared memory of `gated_delta_chunk_prep` for `nh` value heads per block
/// (`GDN_PREP_SMEM(NH)`): k and q in rows of 128 padded to 136, Aᵀ per head in rows of 68
/// floats, three floats per step and head.
const fn prep_shared(nh: u32) -> u32 {
    2 * 64 * 136 * 2 + nh * 64 * 68 * 4 + 3 * nh * 64 * 4
}
/// Dynamic shared memory of `gated_delta_chunk_scan` (`GDN_SCAN_SMEM`): two stages of q, k
/// (rows padded to 136), M, P (to 72), v (to 40) and the gates, then two state buffers and
/// three tiles of 64 × 40.
const SCAN_SHARED: u32 = 2 * ((2 * 64 * 136 + 2 * 64 * 72 + 64 * 40) * 2 + 64 * 8) + (2 * 32 * 136 + 3 * 64 * 40) * 2;

/// Threads per block of the derivative's kernels.
const BWD_THREADS: u32 = 256;
/// 8-byte words of the derivative's parameter (`GdnGrad`, `GDN_GRAD_WORDS`).
const GRAD_WORDS: usize = 14;
/// Value rows per block of `gated_delta_bwd_scan` (`GDN_BR`).
const BWD_SCAN_ROWS: u32 = 16;
/// Dynamic shared memory of `gated_delta_bwd_scan` (`GDN_BWD_SCAN_SMEM`): k and q in float32
/// rows of 128 padded to 132, X and P in rows of 65, four [64][16] tiles in rows of 17, 16 rows
/// of dS, three floats per step.
const BWD_SCAN_SHARED: u32 = (2 * 64 * 132 + 2 * 64 * 65 + 4 * 64 * 17 + 16 * 132 + 3 * 64) * 4;
/// Dynamic shared memory of `gated_delta_bwd_chunk` (`GDN_BWD_CHUNK_SMEM`): k and q, X and P,
/// seven floats per step, and five [64][65] squares (more than a value tile's rows).
const BWD_CHUNK_SHARED: u32 = (2 * 64 * 132 + 2 * 64 * 65 + 7 * 64 + 5 * 64 * 65) * 4;

/// The kernel that runs a gated delta rule on the GPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GatedDeltaKernel {
    /// One warp per value row, `Dk / 32` state elements per lane (`gated_delta_n{Dk/32}`).
    Rows,
    /// 8 value rows per warp, 4 lanes of 32 state elements per row (`gated_delta_packed`; one
    /// step, decode, takes `gated_delta_decode`: 8 rows per warp in the row kernel's layout):
    /// results bit-identical to [`GatedDeltaKernel::Rows`]'.
    Packed,
    /// 64 steps at a time, products on tensor cores (`gated_delta_chunk_prep`, then
    /// `gated_delta_chunk_scan` carrying the state across chunks): results within float16 or
    /// bfloat16 rounding of the recurrence's, as flash-linear-attention's chunked kernels.
    Chunked,
}

/// The kernel the CUDA backend runs for a `FastOp::GatedDelta` with `params` on inputs of these
/// specs (`[q, k, v, g, beta, state, mask?]`), or `None` where it runs the composition: q, k
/// and v of float32, float16 or bfloat16, `Dk` a multiple of 32 up to 256. The packed kernel
/// takes `Dk` 128 with `Dv` a multiple of 8, a float32 gate per head, a float32 state and no
/// mask, unless `NUVEC_GDN_PACKED=0` or `MLX_GDN_PACKED=0` (read once). Prompts of at least
/// [`CHUNKED_FROM`] steps with q, k and v of float16 or bfloat16, `Dk` = `Dv` = 128, a gate
/// per head, no mask and only the last state take the chunked kernels unless
/// `NUVEC_GDN_CHUNKED=0` (a device without 147 KiB of shared memory per block runs the packed
/// kernel instead). It does not say whether fusion is enabled (`NUVEC_FUSED`).
pub fn gated_delta_kernel(params: &GatedDeltaParams, inputs: &[Spec]) -> Option<GatedDeltaKernel> {
    plan(params, inputs, chunked_enabled())
}

/// [`gated_delta_kernel`], with the chunked kernels allowed or not.
fn plan(params: &GatedDeltaParams, inputs: &[Spec], chunked: bool) -> Option<GatedDeltaKernel> {
    let [q, k, v, g, beta, state, rest @ ..] = inputs else { return None };
    let floats = [q.dtype, g.dtype, beta.dtype, state.dtype, params.storage];
    if rest.len() != params.masked as usize
        || !floats.iter().all(|&d| dtype_code(d).is_some())
        || k.dtype != q.dtype
        || v.dtype != q.dtype
        || q.shape.len() != 4
        || v.shape.len() != 4
        || k.shape != q.shape
    {
        return None;
    }
    let (b, hk, dk) = (q.shape[0] as i64, q.shape[2] as i64, q.shape[3] as i64);
    let (hv, dv) = (v.shape[2] as i64, v.shape[3] as i64);
    if dk % 32 != 0 || !(1..=MAX_PER_LANE).contains(&(dk / 32)) || hk <= 0 || hv % hk != 0 {
        return None;
    }
    // One warp per row: the grid's blocks must fit its x dimension.
    if ((b * hv * dv) as u64).div_ceil((THREADS / 32) as u64) > i32::MAX as u64 {
        return None;
    }
    if chunked && q.shape[1] as i64 >= CHUNKED_FROM && chunk_shapes(params, inputs) {
        return Some(GatedDeltaKernel::Chunked);
    }
    let packed = packed_enabled()
        && dk == 128
        && dv % 8 == 0
        && g.shape.len() == 3
        && g.dtype == DType::F32
        && state.dtype == DType::F32
        && !params.masked;
    Some(if packed { GatedDeltaKernel::Packed } else { GatedDeltaKernel::Rows })
}

/// Whether the chunked kernels (forward and derivative) take these inputs, which [`plan`]
/// otherwise accepts: q, k and v of float16 or bfloat16, `Dk` = `Dv` = 128, a gate per head, no
/// mask, only the last state, and (batch, value head) pairs that fit a grid's y dimension.
fn chunk_shapes(params: &GatedDeltaParams, inputs: &[Spec]) -> bool {
    let [q, _, v, g, ..] = inputs else { return false };
    q.shape[3] == 128
        && v.shape[3] == 128
        && matches!(q.dtype, DType::F16 | DType::BF16)
        && g.shape.len() == 3
        && !params.masked
        && !params.steps
        && q.shape[0] as i64 * v.shape[2] as i64 <= u16::MAX as i64
}

/// Whether the packed kernel may run: `NUVEC_GDN_PACKED=0` or mlx-lm's `MLX_GDN_PACKED=0`
/// keeps every shape on the row kernel (read once per process).
fn packed_enabled() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| {
        ["NUVEC_GDN_PACKED", "MLX_GDN_PACKED"].iter().all(|v| std::env::var(v).map_or(true, |s| s != "0"))
    })
}

/// Whether the chunked kernels may run: `NUVEC_GDN_CHUNKED=0` keeps every prompt on the
/// recurrence's kernels, for comparisons (read once per process).
fn chunked_enabled() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| std::env::var("NUVEC_GDN_CHUNKED").map_or(true, |s| s != "0"))
}

/// The kernels' code for a state, gate or beta dtype.
fn dtype_code(d: DType) -> Option<u64> {
    match d {
        DType::F32 => Some(0),
        DType::F16 => Some(1),
        DType::BF16 => Some(2),
        _ => None,
    }
}

/// The module of `d` (the dtype of q, k, v and y): `gated_delta_n1` .. `gated_delta_n8` (the
/// row kernel at `Dk` = 32 .. 256; `_ahead`: loading each step's inputs during the step before,
/// for more than one step) and `gated_delta_packed`.
pub(crate) fn source(d: DType) -> String {
    let mut s = Source::new(&["gated_delta.cuh"]);
    let t = ctype(d);
    for n in 1..=MAX_PER_LANE {
        for (suffix, ahead) in [("", false), ("_ahead", true)] {
            s.kernel(format!(
                "__launch_bounds__({THREADS}) gated_delta_n{n}{suffix}(GdnArgs a) {{ gated_delta_rows<{t}, {n}, {ahead}>(a); }}"
            ));
        }
    }
    s.kernel(format!("__launch_bounds__({THREADS}) gated_delta_packed(GdnArgs a) {{ gated_delta_packed<{t}>(a); }}"));
    // 64 registers: 8 blocks per SM, the state bytes in flight that a pass over it needs.
    s.kernel(format!(
        "__launch_bounds__({THREADS}, 8) gated_delta_decode(GdnArgs a) {{ gated_delta_decode<{t}>(a); }}"
    ));
    // Tensor cores take half-precision operands.
    if matches!(d, DType::F16 | DType::BF16) {
        for (name, nh) in [("prep", 1), ("prep_pair", 2)] {
            s.kernel(format!(
                "__launch_bounds__({THREADS}) gated_delta_chunk_{name}(GdnArgs a, GdnChunk c) {{ gated_delta_chunk_prep<{t}, {nh}>(a, c); }}"
            ));
        }
        s.kernel(format!(
            "__launch_bounds__({THREADS}) gated_delta_chunk_scan(GdnArgs a, GdnChunk c) {{ gated_delta_chunk_scan<{t}>(a, c); }}"
        ));
        for name in ["scan", "chunk"] {
            s.kernel(format!(
                "__launch_bounds__({BWD_THREADS}) gated_delta_bwd_{name}(GdnArgs a, GdnChunk c, GdnGrad d) {{ gated_delta_bwd_{name}<{t}>(a, c, d); }}"
            ));
        }
        s.kernel(format!(
            "__launch_bounds__({BWD_THREADS}) gated_delta_bwd_heads(GdnArgs a, GdnGrad d) {{ gated_delta_bwd_heads<{t}>(a, d); }}"
        ));
    }
    s.finish()
}

/// The operand itself where its last axis is contiguous (or has one element), else a row-major
/// copy: the kernels read rows of `Dk` (or `Dv`) consecutive elements.
fn inner_contiguous(gpu: &Arc<Gpu>, x: Operand) -> Result<Operand> {
    let n = x.shape.len();
    let ok = n == 0 || x.shape[n - 1] <= 1 || x.data.layout.strides[n - 1] == 1;
    if ok { Ok(x) } else { fresh_copy(gpu, x) }
}

/// [`inner_contiguous`], copied again unless its rows start on 16 bytes: the chunked kernels
/// stage rows by 16-byte copies.
fn aligned_rows(gpu: &Arc<Gpu>, x: Operand) -> Result<Operand> {
    let x = inner_contiguous(gpu, x)?;
    let aligned = ptr_of(&x)? % 16 == 0 && x.data.layout.strides.iter().take(3).all(|&s| s % 8 == 0);
    if aligned { Ok(x) } else { fresh_copy(gpu, x) }
}

/// The strides of axes `0..N` of `x`, as the kernels' words.
fn strides<const N: usize>(x: &Operand) -> [u64; N] {
    std::array::from_fn(|a| x.data.layout.strides.get(a).map_or(0, |&s| s as i64 as u64))
}

/// Runs `fast::gated_delta` (inputs `[q, k, v, g, beta, state, mask?]`, outputs `[y, state']`
/// or `[y, states]`). The last state goes into the given state's buffer where it was handed
/// over and has the storage dtype.
pub(crate) fn eval(gpu: &Arc<Gpu>, p: &GatedDeltaParams, inputs: Vec<Operand>, outputs: &mut [Output]) -> Result<()> {
    let op = if p.steps { "gated_delta_steps" } else { "gated_delta" };
    let specs: Vec<Spec> = inputs.iter().map(|x| Spec { shape: x.shape.clone(), dtype: x.dtype }).collect();
    let plan = gated_delta_kernel(p, &specs).ok_or_else(|| internal(format!("{op}: no kernel for {specs:?}")))?;
    let [y_out, s_out] = outputs else { return Err(internal(format!("{op} has two outputs"))) };
    let mut it = inputs.into_iter();
    let mut next = |name: &str| it.next().ok_or_else(|| internal(format!("{op} is missing its input {name}")));
    let staged =
        |x: Operand| if plan == GatedDeltaKernel::Chunked { aligned_rows(gpu, x) } else { inner_contiguous(gpu, x) };
    let q = staged(next("q")?)?;
    let k = staged(next("k")?)?;
    let v = staged(next("v")?)?;
    let g = next("g")?;
    // A gate per head is read one element at a time, through any strides.
    let g = if g.shape.len() == 4 { inner_contiguous(gpu, g)? } else { g };
    let beta = next("beta")?;
    let state = row_major(gpu, next("state")?)?;
    let mask = if p.masked { Some(next("mask")?) } else { None };
    let y = alloc_out(gpu, y_out)?;
    let state_ptr = if !p.steps && state.dtype == p.storage && state.writable() {
        // Each warp reads its rows whole before it writes them: in place is safe.
        s_out.data = Some(state.data.clone());
        ptr_of(&state)?
    } else {
        alloc_out(gpu, s_out)?
    };
    let [b, t, hk] = [0, 1, 2].map(|a| q.shape[a] as i64);
    let (hv, dv, dk) = (v.shape[2] as i64, v.shape[3] as i64, q.shape[3] as i64);
    let rows = b * hv * dv;
    if rows == 0 || (t == 0 && p.steps) {
        return Ok(());
    }
    let words = arg_words(op, p, [&q, &k, &v, &g, &beta, &state], mask.as_ref(), [y, state_ptr])?;
    let mut plan = plan;
    if plan == GatedDeltaKernel::Chunked {
        // A key head's value heads in pairs where it has an even number of them (q and k are
        // staged once for both) and the pairs still fill the GPU: with fewer blocks, one head
        // per block finishes sooner.
        let pair_blocks = (t + CHUNK - 1) / CHUNK * b * hv / 2;
        let nh = if (hv / hk) % 2 == 0 && pair_blocks >= PAIRS_FROM_BLOCKS { 2 } else { 1 };
        let name = if nh == 2 { "gated_delta_chunk_prep_pair" } else { "gated_delta_chunk_prep" };
        let prep = kernel(gpu, Family::GatedDelta(q.dtype), name)?;
        let scan = kernel(gpu, Family::GatedDelta(q.dtype), "gated_delta_chunk_scan")?;
        if allow_shared(gpu, prep, prep_shared(nh)).is_ok() && allow_shared(gpu, scan, SCAN_SHARED).is_ok() {
            return chunked(gpu, q.dtype, [prep, scan], nh, words, b * hv, t);
        }
        // Less shared memory per block than the chunked kernels take: the recurrence runs.
        plan = self::plan(p, &specs, false).ok_or_else(|| internal(format!("{op}: no kernel")))?;
    }
    let (name, warps) = match plan {
        // A single step has nothing to load ahead: the registers that would take go to more
        // warps in flight.
        GatedDeltaKernel::Rows | GatedDeltaKernel::Chunked => {
            (format!("gated_delta_n{}{}", dk / 32, if t > 1 { "_ahead" } else { "" }), rows)
        }
        GatedDeltaKernel::Packed if t == 1 => ("gated_delta_decode".to_string(), rows / 8),
        GatedDeltaKernel::Packed => ("gated_delta_packed".to_string(), rows / 8),
    };
    let f = kernel(gpu, Family::GatedDelta(q.dtype), &name)?;
    let grid = (warps as u64).div_ceil((THREADS / 32) as u64) as u32;
    launch_dependent(gpu, f, grid, (THREADS, 1), 1, vec![Arg::Bytes(words)])
}

/// The kernels' parameter (`GdnArgs`) for inputs `[q, k, v, g, beta, state]`, a mask and the
/// outputs `[y, state']`.
fn arg_words(
    op: &str,
    p: &GatedDeltaParams,
    [q, k, v, g, beta, state]: [&Operand; 6],
    mask: Option<&Operand>,
    outs: [u64; 2],
) -> Result<Vec<u64>> {
    let code = |d: DType| dtype_code(d).ok_or_else(|| internal(format!("{op}: no kernel for {d}")));
    let mut words: Vec<u64> = Vec::with_capacity(ARG_WORDS);
    for x in [q, k, v, g, beta, state] {
        words.push(ptr_of(x)?);
    }
    words.push(mask.map(ptr_of).transpose()?.unwrap_or(0));
    words.extend(outs);
    words.extend([q.shape[0], q.shape[1], q.shape[2], v.shape[2], v.shape[3]].map(|x| x as i64 as u64));
    for x in [q, k, v, g, beta] {
        words.extend(strides::<3>(x));
    }
    words.extend(mask.map_or([0, 0], strides::<2>));
    words.extend([code(g.dtype)?, code(beta.dtype)?, code(state.dtype)?, code(p.storage)?]);
    words.extend([(g.shape.len() == 4) as u64, p.steps as u64]);
    if words.len() != ARG_WORDS {
        return Err(internal(format!("{op}: {} argument words, the kernels take {ARG_WORDS}", words.len())));
    }
    Ok(words)
}

/// Runs the chunked kernels (`[prep, scan]`, the prep taking `nh` value heads per block) on the
/// arguments `words` of `bh` (batch, value head) pairs and `t` steps, with their scratch: M and
/// P (`[bh, chunks, 64, 64]` each) and the gates' running log-products and signs (`[bh, T', 2]`,
/// float32, T' the steps rounded up to whole chunks).
fn chunked(
    gpu: &Arc<Gpu>,
    dtype: DType,
    [prep, scan]: [CUfunction; 2],
    nh: u32,
    words: Vec<u64>,
    bh: i64,
    t: i64,
) -> Result<()> {
    let nt = (t + CHUNK - 1) / CHUNK;
    let padded = (bh * nt * CHUNK) as usize;
    let (m, _m) = alloc(gpu, padded * CHUNK as usize, dtype)?;
    let (p, _p) = alloc(gpu, padded * CHUNK as usize, dtype)?;
    let (gam, _gam) = alloc(gpu, padded * 2, DType::F32)?;
    let scratch = vec![m, p, gam, nt as u64, 0, 0, 0];
    let args = || vec![Arg::Bytes(words.clone()), Arg::Bytes(scratch.clone())];
    let groups = (bh / nh as i64) as u32;
    launch(gpu, prep, (nt as u32, groups, 1), (THREADS, 1, 1), prep_shared(nh), args())?;
    launch(gpu, scan, ((128 / SCAN_ROWS) as u32, bh as u32, 1), (THREADS, 1, 1), SCAN_SHARED, args())
}

/// Whether the CUDA backend runs a `FastOp::GatedDeltaVjp` on inputs of these specs (`[q, k, v,
/// g, beta, state, dy, dstate']`) with the chunked derivative's kernels: as the chunked
/// forward's cases (q, k and v of float16 or bfloat16, `Dk` = `Dv` = 128, a gate per head, no
/// mask, the last state), at least one step, unless `NUVEC_GDN_CHUNKED=0`.
pub(crate) fn supports_vjp(p: &GatedDeltaParams, inputs: &[Spec]) -> bool {
    let [forward @ .., _dy, _ds] = inputs else { return false };
    chunked_enabled()
        && forward.len() == 6
        && plan(p, forward, false).is_some()
        && forward[0].shape[1] >= 1
        && chunk_shapes(p, forward)
}

/// Runs `FastOp::GatedDeltaVjp` (inputs `[q, k, v, g, beta, state, dy, dstate']`, outputs `[dq,
/// dk, dv, dg, dbeta, dstate]`): the chunked forward again, keeping X, P and each chunk's first
/// state in float32, then `gated_delta_bwd_scan` (the state's cotangent, chunk by chunk from the
/// last), `gated_delta_bwd_chunk` (every chunk at once) and `gated_delta_bwd_heads` (q's and k's
/// cotangents summed over the value heads sharing them).
pub(crate) fn backward(
    gpu: &Arc<Gpu>,
    p: &GatedDeltaParams,
    inputs: Vec<Operand>,
    outputs: &mut [Output],
) -> Result<()> {
    let op = "gated_delta_vjp";
    let [dq_out, dk_out, dv_out, dg_out, db_out, ds_out] = outputs else {
        return Err(internal(format!("{op} has six outputs")));
    };
    let mut it = inputs.into_iter();
    let mut next = |name: &str| it.next().ok_or_else(|| internal(format!("{op} is missing its input {name}")));
    let q = aligned_rows(gpu, next("q")?)?;
    let k = aligned_rows(gpu, next("k")?)?;
    let v = inner_contiguous(gpu, next("v")?)?;
    let g = next("g")?;
    let beta = next("beta")?;
    let state = row_major(gpu, next("state")?)?;
    let dy = inner_contiguous(gpu, next("dy")?)?;
    let ds = row_major(gpu, next("dstate")?)?;
    let [b, t, hk] = [0, 1, 2].map(|a| q.shape[a] as i64);
    let hv = v.shape[2] as i64;
    let (bh, nt) = (b * hv, (t + CHUNK - 1) / CHUNK);
    let d = q.dtype;
    let family = Family::GatedDelta(d);
    let found: Vec<CUfunction> = ["chunk_prep", "chunk_scan", "bwd_scan", "bwd_chunk", "bwd_heads"]
        .iter()
        .map(|name| kernel(gpu, family, &format!("gated_delta_{name}")))
        .collect::<Result<_>>()?;
    let &[prep, scan, bwd_scan, bwd_chunk, heads] = found.as_slice() else {
        return Err(internal(format!("{op}: five kernels, found {}", found.len())));
    };
    for (f, bytes) in
        [(prep, prep_shared(1)), (scan, SCAN_SHARED), (bwd_scan, BWD_SCAN_SHARED), (bwd_chunk, BWD_CHUNK_SHARED)]
    {
        allow_shared(gpu, f, bytes).map_err(|_| {
            internal(format!("{op}: the device gives a block less than {bytes} bytes of shared memory"))
        })?;
    }
    let mut grad: Vec<u64> = vec![ptr_of(&dy)?, ptr_of(&ds)?];
    for o in [dq_out, dk_out, dv_out, dg_out, db_out, ds_out] {
        grad.push(alloc_out(gpu, o)?);
    }
    // The forward again: y and the last state into scratch; X, P and every chunk's first state.
    let square = (bh * nt * CHUNK * CHUNK) as usize;
    let states = (bh * nt * 128 * 128) as usize;
    let (y, _y) = alloc(gpu, (b * t * hv * 128) as usize, d)?;
    let (last, _last) = alloc(gpu, (bh * 128 * 128) as usize, p.storage)?;
    let (m, _m) = alloc(gpu, square, d)?;
    let (pm, _pm) = alloc(gpu, square, d)?;
    let (gam, _gam) = alloc(gpu, (bh * nt * CHUNK * 2) as usize, DType::F32)?;
    let (xf, _xf) = alloc(gpu, square, DType::F32)?;
    let (pf, _pf) = alloc(gpu, square, DType::F32)?;
    let (s0, _s0) = alloc(gpu, states, DType::F32)?;
    let (dsc, _dsc) = alloc(gpu, states, DType::F32)?;
    let (dqv, _dqv) = alloc(gpu, (b * t * hv * 128) as usize, DType::F32)?;
    let (dkv, _dkv) = alloc(gpu, (b * t * hv * 128) as usize, DType::F32)?;
    let words = arg_words(op, p, [&q, &k, &v, &g, &beta, &state], None, [y, last])?;
    let chunk = vec![m, pm, gam, nt as u64, xf, pf, s0];
    grad.extend([dsc, dqv, dkv]);
    grad.extend(strides::<3>(&dy));
    if grad.len() != GRAD_WORDS {
        return Err(internal(format!("{op}: {} gradient words, the kernels take {GRAD_WORDS}", grad.len())));
    }
    let args = |with_chunk: bool| {
        let mut a = vec![Arg::Bytes(words.clone())];
        if with_chunk {
            a.push(Arg::Bytes(chunk.clone()));
        }
        a.push(Arg::Bytes(grad.clone()));
        a
    };
    let fwd = || vec![Arg::Bytes(words.clone()), Arg::Bytes(chunk.clone())];
    let (nt32, bh32) = (nt as u32, bh as u32);
    launch(gpu, prep, (nt32, bh32, 1), (THREADS, 1, 1), prep_shared(1), fwd())?;
    launch(gpu, scan, ((128 / SCAN_ROWS) as u32, bh32, 1), (THREADS, 1, 1), SCAN_SHARED, fwd())?;
    let rows = 128 / BWD_SCAN_ROWS;
    launch(gpu, bwd_scan, (rows, bh32, 1), (BWD_THREADS, 1, 1), BWD_SCAN_SHARED, args(true))?;
    launch(gpu, bwd_chunk, (nt32, bh32, 1), (BWD_THREADS, 1, 1), BWD_CHUNK_SHARED, args(true))?;
    let n = (b * t * hk * 128) as u64;
    launch(gpu, heads, (n.div_ceil(BWD_THREADS as u64) as u32, 1, 1), (BWD_THREADS, 1, 1), 0, args(false))
}
