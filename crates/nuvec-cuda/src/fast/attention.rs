//! Scaled-dot-product attention (`kernels/attention.cuh`): the vector kernel for up to
//! [`VECTOR_MAX_QUERIES`] queries (on tensor cores in half precision, filled by TMA on Hopper),
//! over the keys at once or split into partitions and merged, and the tiled
//! kernel on tensor cores for more: on Hopper FlashAttention-3's design (TMA, warpgroup MMAs),
//! elsewhere FlashAttention-2's on `mma.sync`. `q`, `k` and `v` are read through their strides (a cache's
//! slice is not copied) as long as each head's features are contiguous and 16-byte aligned.

use std::sync::Arc;

use cudarc::driver::sys;

use nuvec_core::fast::{AttentionKernel, AttentionParams, MaskInput, PagedParams, VECTOR_MAX_QUERIES};
use nuvec_core::storage::{Operand, Output, Spec, Storage};
use nuvec_core::{DType, Result};

use crate::driver::{Gpu, check};
use crate::kernels::{Family, Source, ctype};
use crate::launch::{Arg, allow_shared, launch};
use crate::operand::{alloc, alloc_out, internal, kernel, ptr_of, row_major};

/// Head sizes with kernels: (D, Dv).
const HEADS: [(i32, i32); 5] = [(64, 64), (80, 80), (96, 96), (128, 128), (256, 256)];

/// Head sizes of the tiled kernel (`float16` and `bfloat16`, `D = Dv`).
const TILED_HEADS: [i32; 4] = [64, 80, 96, 128];

/// Query rows of a tiled block (`ATT_BR`: 16 per warp) and its keys per step (`ATT_BC`).
const TILE_ROWS: u32 = 128;
const TILE_KEYS: u32 = 64;

/// The Hopper (warpgroup MMA) tiled kernel's shape per head size: a block is a producer
/// warpgroup and `consumers` warpgroups of 64 query rows, walking tiles of `keys` keys.
#[derive(Clone, Copy)]
struct Wgmma {
    head: i32,
    keys: u32,
    consumers: u32,
    /// Only for attention without a causal bound.
    full: bool,
}

/// Kernels of the Hopper forward, by head size (features in 64-wide swizzled panels): D 256
/// takes half the keys to stay in registers; D 64, whose products are short beside the softmax,
/// three consumers; attention without a causal bound takes 176 keys at D 128 (longer products
/// per softmax), causal attention 128, whose diagonal tiles mask less.
const WGMMA: [Wgmma; 4] = [
    Wgmma { head: 64, keys: 128, consumers: 3, full: false },
    Wgmma { head: 128, keys: 176, consumers: 2, full: true },
    Wgmma { head: 128, keys: 128, consumers: 2, full: false },
    Wgmma { head: 256, keys: 64, consumers: 2, full: false },
];

/// The compute capability whose `sm_90a` has `wgmma` and TMA (the Hopper kernels).
const HOPPER: (i32, i32) = (9, 0);

/// Stages of the Hopper kernel's key and value rings (a third measured slower).
const WGMMA_STAGES: u32 = 2;

impl Wgmma {
    /// The kernel for head size `hd` (and a causal bound or not) on a device of compute
    /// capability `cc`, if it runs there (9.0: `wgmma` is `sm_90a`'s).
    fn find(cc: (i32, i32), hd: i32, causal: bool) -> Option<Wgmma> {
        WGMMA.into_iter().find(|w| cc == HOPPER && w.head == hd && !(w.full && causal))
    }

    /// Query rows of a block.
    fn rows(self) -> u32 {
        64 * self.consumers
    }

    /// Dynamic shared memory of a block (`atw_smem`): 1024-byte alignment slack, the queries,
    /// the stages of keys and of values, the barriers.
    fn shared(self) -> u32 {
        let hd = self.head as u32;
        1024 + self.rows() * hd * 2 + 2 * WGMMA_STAGES * self.keys * hd * 2 + 128
    }
}

/// The first GPU's compute capability, which `supports` answers for (none without a GPU).
fn first_gpu_arch() -> Option<(i32, i32)> {
    Gpu::get(0).ok().map(|g| g.info.compute_capability)
}

/// Head sizes of the Hopper backward, its keys per block (`ATV_BC`, two consumer warpgroups of
/// 64) and query rows per step (`ATV_BR`).
const WGMMA_BACKWARD_HEADS: [i32; 2] = [64, 128];
const WGMMA_BACKWARD_KEYS: u32 = 128;
const WGMMA_BACKWARD_ROWS: u32 = 64;

/// Dynamic shared memory of a Hopper backward block (`atv_smem`): alignment slack, keys and
/// values, two stages of queries and cotangents, two dS tiles, two stages of statistics, barriers.
fn wgmma_backward_shared(hd: u32) -> u32 {
    let (keys, rows) = (WGMMA_BACKWARD_KEYS, WGMMA_BACKWARD_ROWS);
    1024 + 2 * keys * hd * 2 + 4 * rows * hd * 2 + 2 * rows * keys * 2 + 4 * rows * 4 + 64
}

/// Bytes of queries, cotangents and float32 dQ that the Hopper backward's running blocks share
/// in L2: the heads of one chunk.
const BACKWARD_CHUNK_BYTES: i64 = 64 << 20;

/// Key-value heads per chunk of the Hopper backward (`heads` in all, `group` query heads each,
/// `lq` rows of `hd` features): as many as keep a chunk's queries, cotangents and dQ under
/// [`BACKWARD_CHUNK_BYTES`], at least one.
fn backward_chunk(heads: i32, group: i32, lq: i32, hd: i32) -> i32 {
    let per_head = group as i64 * lq as i64 * hd as i64 * (2 + 2 + 4);
    (BACKWARD_CHUNK_BYTES / per_head.max(1)).clamp(1, heads.max(1) as i64) as i32
}

/// Blocks under which the Hopper backward splits each key tile's query heads between two blocks:
/// fewer than one per SM of a 132-SM GPU leave SMs idle while the longest causal tiles run.
const BACKWARD_SPLIT_BLOCKS: u32 = 132;

/// Blocks sharing one key tile's `group` query heads: 2 when `blocks` would not fill the GPU
/// once and the group divides in two, else 1 (more float32 additions of dK and dV than the
/// balance gains).
fn backward_split(blocks: u32, group: i32) -> i32 {
    if blocks < BACKWARD_SPLIT_BLOCKS && group % 2 == 0 { 2 } else { 1 }
}

/// Warps of a tensor-core vector block (16 keys each per tile) and the stages of its ring; for
/// the Hopper (TMA) vector kernel, its consumer warps (a producer warp joins them) and stages.
const VECTOR_WARPS: u32 = 4;
const VECTOR_STAGES: u32 = 3;
const VECTOR_TMA_WARPS: u32 = 4;
const VECTOR_TMA_STAGES: u32 = 2;

/// Head sizes of the Hopper vector kernel (whole 64-feature panels, `D = Dv`).
const VECTOR_TMA_HEADS: [i32; 3] = [64, 128, 256];

/// Dynamic shared memory a block may take: 227 KiB on Hopper and Ampere's A100, less than the
/// rings' stages ask at D 256.
const MAX_SHARED: u32 = 227 << 10;

/// Stages of a vector ring of `per_stage` bytes (plus `fixed`): `want`, or as many as fit.
fn vector_stages(want: u32, per_stage: u32, fixed: u32) -> u32 {
    want.min((MAX_SHARED - fixed) / per_stage).max(2)
}

/// The `mma.sync` vector kernel's stages and dynamic shared memory (`att_vector_smem`).
fn vector_mma_shape(hd: i32, hv: i32) -> (u32, u32) {
    let per_stage = VECTOR_WARPS * 16 * (hd as u32 * 2 + 16 + hv as u32 * 2 + 16);
    let st = vector_stages(VECTOR_STAGES, per_stage, 0);
    (st, st * per_stage)
}

/// The TMA vector kernel's stages and dynamic shared memory (`att_vector_tma_smem`).
fn vector_tma_shape(hd: i32) -> (u32, u32) {
    let per_stage = 2 * VECTOR_TMA_WARPS * 16 * hd as u32 * 2 + 16;
    let st = vector_stages(VECTOR_TMA_STAGES, per_stage, 1024);
    (st, 1024 + st * per_stage)
}

/// Warps of a backward block, each owning 16 keys, and its query rows per step (`ATB_BR`).
const BACKWARD_WARPS: u32 = 8;
const BACKWARD_ROWS: u32 = 64;

/// Dynamic shared memory of a backward block (`att_bwd_smem`): keys and values, two stages of
/// queries and cotangents (rows of `hd` 2-byte features and a 16-byte pad), dS^T (padded rows of
/// `BACKWARD_ROWS` queries), two stages of the rows' statistics.
fn backward_shared(hd: u32) -> u32 {
    let (keys, row) = (16 * BACKWARD_WARPS, hd * 2 + 16);
    2 * keys * row + 4 * BACKWARD_ROWS * row + keys * (BACKWARD_ROWS * 2 + 16) + 4 * BACKWARD_ROWS * 4
}

/// Warps of a vector block, and its dynamic shared memory: each warp stages a tile of 32 keys
/// (padded 16 bytes) and their values; four warps, or two where four would pass 200 KiB.
fn vector_block(d: DType, hd: i32, hv: i32) -> (u32, u32) {
    let per_warp = 32 * ((hd as usize * d.size() + 16) + hv as usize * d.size()) as u32;
    let warps = if 4 * per_warp <= 200 << 10 { 4 } else { 2 };
    (warps, warps * per_warp)
}

/// Query rows a block takes at most, by the rows sharing a key-value head.
const ROWS: [u32; 3] = [1, 4, 8];

/// The block's row count for `rows` rows sharing a key-value head.
fn rows_per_block(rows: u32) -> u32 {
    ROWS.into_iter().find(|&r| r >= rows).unwrap_or(8)
}

/// The module of `d`: for float32 `attention_vector_{D}_{Dv}_r{R}` (blocks of up to `R` query
/// rows) and its second pass `attention_vector_merge_{Dv}`; for float16/bfloat16
/// `attention_vector_mma_{D}_{Dv}`, its paged form `attention_paged_mma_{D}_{Dv}`, `attention_tiled_{D}`, and (empty off Hopper)
/// `attention_vector_tma_{D}`, `attention_paged_tma_{D}`, `attention_wgmma_{D}_{keys}` and `attention_backward_wgmma_{D}`,
/// and the backward's other kernels.
pub(crate) fn source(d: DType) -> String {
    let mut s = Source::new(&["attention.cuh"]);
    let t = ctype(d);
    // Half precision decodes on tensor cores (below); the CUDA-core vector kernel is float32's.
    for (hd, hv) in HEADS.into_iter().filter(|_| !d.is_half()) {
        let (nw, _) = vector_block(d, hd, hv);
        let threads = nw * 32;
        for r in ROWS {
            s.kernel(format!(
                "__launch_bounds__({threads}) attention_vector_{hd}_{hv}_r{r}(const {t}* q, const {t}* k, const {t}* v, {t}* out, const void* mask, const {t}* sinks, float* part, i64 qs0, i64 qs1, i64 qs2, i64 ks0, i64 ks1, i64 ks2, i64 vs0, i64 vs1, i64 vs2, i64 ms0, i64 ms1, i64 ms2, i64 ms3, int Hq, int Hkv, int Lq, int Lk, int causal, int window, int mask_kind, int blocks, float scale) {{ attention_vector<{t}, {hd}, {hv}, {r}, {nw}>(q, k, v, out, mask, sinks, part, qs0, qs1, qs2, ks0, ks1, ks2, vs0, vs1, vs2, ms0, ms1, ms2, ms3, Hq, Hkv, Lq, Lk, causal, window, mask_kind, blocks, scale); }}"
            ));
        }
    }
    if d.is_half() {
        for (hd, hv) in HEADS {
            let (threads, (st, _)) = (VECTOR_WARPS * 32, vector_mma_shape(hd, hv));
            s.kernel(format!(
                "__launch_bounds__({threads}) attention_vector_mma_{hd}_{hv}(const {t}* q, const {t}* k, const {t}* v, {t}* out, const void* mask, const {t}* sinks, float* part, unsigned* count, i64 qs0, i64 qs1, i64 qs2, i64 ks0, i64 ks1, i64 ks2, i64 vs0, i64 vs1, i64 vs2, i64 ms0, i64 ms1, i64 ms2, i64 ms3, int Hq, int Hkv, int Lq, int Lk, int causal, int window, int mask_kind, int blocks, float scale) {{ attention_vector_mma<{t}, {hd}, {hv}, {VECTOR_WARPS}, {st}>(q, k, v, out, mask, sinks, part, count, qs0, qs1, qs2, ks0, ks1, ks2, vs0, vs1, vs2, ms0, ms1, ms2, ms3, Hq, Hkv, Lq, Lk, causal, window, mask_kind, blocks, scale); }}"
            ));
        }
        for (hd, hv) in HEADS {
            let (threads, (st, _)) = (VECTOR_WARPS * 32, vector_mma_shape(hd, hv));
            s.kernel(format!(
                "__launch_bounds__({threads}) attention_paged_mma_{hd}_{hv}(const {t}* q, const {t}* kc, const {t}* vc, const int* tables, const int* lengths, {t}* out, const {t}* sinks, float* part, unsigned* count, i64 qs0, i64 qs1, i64 qs2, i64 ks0, i64 ks1, i64 ks2, i64 vs0, i64 vs1, i64 vs2, int nblocks, int bs_log2, int max_blocks, int Hq, int Hkv, int Lq, int window, int blocks, float scale) {{ attention_paged_mma<{t}, {hd}, {hv}, {VECTOR_WARPS}, {st}>(q, kc, vc, tables, lengths, out, sinks, part, count, qs0, qs1, qs2, ks0, ks1, ks2, vs0, vs1, vs2, nblocks, bs_log2, max_blocks, Hq, Hkv, Lq, window, blocks, scale); }}"
            ));
        }
        for hd in VECTOR_TMA_HEADS {
            let (threads, (st, _)) = ((VECTOR_TMA_WARPS + 1) * 32, vector_tma_shape(hd));
            s.kernel(format!(
                "__launch_bounds__({threads}) attention_paged_tma_{hd}(const __grid_constant__ AtwMap mk, const __grid_constant__ AtwMap mv, const {t}* q, const int* tables, const int* lengths, {t}* out, const {t}* sinks, float* part, unsigned* count, i64 qs0, i64 qs1, i64 qs2, int nblocks, int bs_log2, int max_blocks, int rows, int Hq, int Hkv, int Lq, int window, int blocks, float scale) {{ attention_paged_tma<{t}, {hd}, {VECTOR_TMA_WARPS}, {st}>(&mk, &mv, q, tables, lengths, out, sinks, part, count, qs0, qs1, qs2, nblocks, bs_log2, max_blocks, rows, Hq, Hkv, Lq, window, blocks, scale); }}"
            ));
            s.kernel(format!(
                "__launch_bounds__({threads}) attention_vector_tma_{hd}(const __grid_constant__ AtwMap mk, const __grid_constant__ AtwMap mv, const {t}* q, {t}* out, const void* mask, const {t}* sinks, float* part, unsigned* count, i64 qs0, i64 qs1, i64 qs2, i64 ms0, i64 ms1, i64 ms2, i64 ms3, int Hq, int Hkv, int Lq, int Lk, int causal, int window, int mask_kind, int blocks, float scale) {{ attention_vector_tma<{t}, {hd}, {VECTOR_TMA_WARPS}, {st}>(&mk, &mv, q, out, mask, sinks, part, count, qs0, qs1, qs2, ms0, ms1, ms2, ms3, Hq, Hkv, Lq, Lk, causal, window, mask_kind, blocks, scale); }}"
            ));
        }
        for hd in TILED_HEADS {
            s.kernel(format!(
                "__launch_bounds__({TILE_ROWS} * 2) attention_tiled_{hd}(const {t}* q, const {t}* k, const {t}* v, {t}* out, float* lse, const {t}* sinks, i64 qs0, i64 qs1, i64 qs2, i64 ks0, i64 ks1, i64 ks2, i64 vs0, i64 vs1, i64 vs2, int Hq, int Hkv, int Lq, int Lk, int causal, int window, float scale) {{ attention_tiled<{t}, {hd}>(q, k, v, out, lse, sinks, qs0, qs1, qs2, ks0, ks1, ks2, vs0, vs1, vs2, Hq, Hkv, Lq, Lk, causal, window, scale); }}"
            ));
            s.kernel(format!(
                "__launch_bounds__({BACKWARD_WARPS} * 32) attention_backward_{hd}(const {t}* q, const {t}* k, const {t}* v, const {t}* go, const float* lse, const float* delta, float* dq, {t}* dk, {t}* dv, i64 qs0, i64 qs1, i64 qs2, i64 ks0, i64 ks1, i64 ks2, i64 vs0, i64 vs1, i64 vs2, i64 gs0, i64 gs1, i64 gs2, int Hq, int Hkv, int Lq, int Lk, int causal, int window, float scale) {{ attention_backward<{t}, {hd}, {BACKWARD_WARPS}>(q, k, v, go, lse, delta, dq, dk, dv, qs0, qs1, qs2, ks0, ks1, ks2, vs0, vs1, vs2, gs0, gs1, gs2, Hq, Hkv, Lq, Lk, causal, window, scale); }}"
            ));
            s.kernel(format!(
                "attention_backward_delta_{hd}(const {t}* o, const {t}* g, float* delta, i64 rows) {{ attention_backward_delta<{t}, {hd}>(o, g, delta, rows); }}"
            ));
        }
        for Wgmma { head: hd, keys, consumers: nc, .. } in WGMMA {
            let threads = 128 * (nc + 1);
            s.kernel(format!(
                "__launch_bounds__({threads}, 1) attention_wgmma_{hd}_{keys}(const __grid_constant__ AtwMap mq, const __grid_constant__ AtwMap mk, const __grid_constant__ AtwMap mv, {t}* out, float* lse, const {t}* sinks, int Hq, int Hkv, int Lq, int Lk, int causal, int window, float scale) {{ attention_wgmma<{t}, {hd}, {keys}, {nc}, {WGMMA_STAGES}>(&mq, &mk, &mv, out, lse, sinks, Hq, Hkv, Lq, Lk, causal, window, scale); }}"
            ));
        }
        for hd in WGMMA_BACKWARD_HEADS {
            s.kernel(format!(
                "__launch_bounds__(384, 1) attention_backward_wgmma_{hd}(const __grid_constant__ AtwMap mq, const __grid_constant__ AtwMap mk, const __grid_constant__ AtwMap mv, const __grid_constant__ AtwMap mg, const float* stats, float* dq, {t}* dk, {t}* dv, int Hq, int Hkv, int Lq, int Lk, int causal, int window, float scale, int chunk, int split, float* dkv) {{ attention_backward_wgmma<{t}, {hd}>(&mq, &mk, &mv, &mg, stats, dq, dk, dv, Hq, Hkv, Lq, Lk, causal, window, scale, chunk, split, dkv); }}"
            ));
            s.kernel(format!(
                "attention_backward_stats_{hd}(const {t}* o, const {t}* g, const float* lse, float* stats, i64 heads, int Lq) {{ attention_backward_stats<{t}, {hd}>(o, g, lse, stats, heads, Lq); }}"
            ));
        }
        s.kernel(format!(
            "attention_backward_dq(const float* acc, {t}* dq, i64 n, float scale) {{ attention_backward_dq<{t}>(acc, dq, n, scale); }}"
        ));
    }
    for hv in HEADS.map(|(_, v)| v).into_iter().filter(|_| !d.is_half()) {
        s.kernel(format!(
            "attention_vector_merge_{hv}(const float* part, const {t}* sinks, {t}* out, i64 rows, int Hq, int Hkv, int Lq, int Lk, int causal, int window, int blocks) {{ attention_vector_merge<{t}, {hv}>(part, sinks, out, rows, Hq, Hkv, Lq, Lk, causal, window, blocks); }}"
        ));
    }
    s.finish()
}

/// Whether the backward kernel runs this attention's derivative: half precision, the tiled
/// kernel's head sizes, no array mask or sinks (the forward's log-sum-exp covers neither).
pub(crate) fn supports_vjp(p: &AttentionParams, inputs: &[Spec]) -> bool {
    let (q, k) = (&inputs[0], &inputs[1]);
    q.dtype.is_half()
        && p.mask.is_none()
        && !p.sinks
        && q.shape[3] == inputs[2].shape[3]
        && TILED_HEADS.contains(&q.shape[3])
        && k.shape[0] as i64 * k.shape[1] as i64 <= 65535
}

/// Whether a kernel runs this planned attention: a vector plan, `float32`/`float16`/`bfloat16`,
/// a head size with a kernel, a boolean mask or one of `q`'s dtype, sinks of `q`'s dtype.
pub(crate) fn supports(p: &AttentionParams, inputs: &[Spec]) -> bool {
    let q = &inputs[0];
    let d = q.dtype;
    let heads = (q.shape[3], inputs[2].shape[3]);
    let mask_ok = match p.mask {
        Some(MaskInput::Bool) => inputs[3].dtype == DType::Bool,
        Some(MaskInput::Additive) => inputs[3].dtype == d,
        None => true,
    };
    let sinks_ok = !p.sinks || inputs[inputs.len() - 1].dtype == d;
    match p.kernel {
        AttentionKernel::Vector { .. } => {
            q.shape[2] <= VECTOR_MAX_QUERIES
                && matches!(d, DType::F32 | DType::F16 | DType::BF16)
                && HEADS.contains(&heads)
                && mask_ok
                && sinks_ok
        }
        AttentionKernel::Tiled => {
            // The grid's y is batch x heads.
            d.is_half()
                && heads.0 == heads.1
                && (TILED_HEADS.contains(&heads.0)
                    || first_gpu_arch().is_some_and(|cc| Wgmma::find(cc, heads.0, true).is_some()))
                && p.mask.is_none()
                && sinks_ok
                && q.shape[0] as i64 * q.shape[1] as i64 <= 65535
        }
        _ => false,
    }
}

/// With `two` passes, the partitions' float32 partial outputs, maxima and sums of `rows` query
/// rows: `[rows][blocks][hv]` outputs, then `[rows][blocks][2]`.
fn partials(gpu: &Arc<Gpu>, two: bool, rows: u64, blocks: i32, hv: i32) -> Result<Option<(u64, Arc<Storage>)>> {
    if !two {
        return Ok(None);
    }
    alloc(gpu, rows as usize * blocks as usize * (hv as usize + 2) * 4, DType::U8).map(Some)
}

/// Whether the paged kernel runs this paged attention: `float16`/`bfloat16` caches of `q`'s
/// dtype, at most [`VECTOR_MAX_QUERIES`] queries, a head size with a kernel, sinks of `q`'s dtype.
pub(crate) fn supports_paged(p: &PagedParams, inputs: &[Spec]) -> bool {
    let (q, k, v) = (&inputs[0], &inputs[1], &inputs[2]);
    q.dtype.is_half()
        && k.dtype == q.dtype
        && v.dtype == q.dtype
        && q.shape[2] <= VECTOR_MAX_QUERIES
        && HEADS.contains(&(q.shape[3], v.shape[3]))
        && (!p.sinks || inputs[5].dtype == q.dtype)
}

/// Paged decode: as the vector kernel on tensor cores, a block per query of up to 16 grouped
/// heads and key partition, each sequence's keys read through its row of the block table; on
/// Hopper (`attention_paged_tma`, blocks of at least 8 positions) the ring is filled by TMA, a
/// box per block of a tile, elsewhere by cp.async (`attention_paged_mma`).
pub(crate) fn paged(gpu: &Arc<Gpu>, p: &PagedParams, inputs: Vec<Operand>, out: &mut Output) -> Result<()> {
    let out = alloc_out(gpu, out)?;
    let mut it = inputs.into_iter();
    let mut next = || it.next().ok_or_else(|| internal("paged_attention is missing an input"));
    let (q, qs) = heads(gpu, next()?, true)?;
    let (k, ks) = heads(gpu, next()?, true)?;
    let (v, vs) = heads(gpu, next()?, true)?;
    let tables = row_major(gpu, next()?)?;
    let lengths = row_major(gpu, next()?)?;
    let sinks = if p.sinks { Some(row_major(gpu, next()?)?) } else { None };
    let d = q.dtype;
    let [b, hq, lq, hd] = [0, 1, 2, 3].map(|a| q.shape[a]);
    let (nblocks, hkv, bs, hv) = (k.shape[0], k.shape[1], k.shape[2], v.shape[3]);
    let rows = b as u64 * hq as u64 * lq as u64;
    if rows == 0 {
        return Ok(());
    }
    let blocks = p.blocks.max(1);
    let scratch = partials(gpu, blocks > 1, rows, blocks, hv)?;
    let part = scratch.as_ref().map_or(0, |s| s.0);
    let group = (hq / hkv) as u32;
    let grid = (b as u32 * hkv as u32 * lq as u32 * group.div_ceil(16), blocks as u32, 1);
    let count = if blocks > 1 { gpu.counters(grid.0 as usize)? } else { 0 };
    let sinks_ptr = sinks.as_ref().map(ptr_of).transpose()?.unwrap_or(0);
    let max_blocks = tables.shape[1];
    let bs_log2 = bs.max(1).ilog2() as i32;
    let window = p.window.unwrap_or(0);
    if gpu.info.compute_capability == HOPPER && hd == hv && VECTOR_TMA_HEADS.contains(&hd) && bs >= 8 {
        let (k, ks) = tma_ready(gpu, k, ks)?;
        let (v, vs) = tma_ready(gpu, v, vs)?;
        let rows = (bs as u32).min(VECTOR_TMA_WARPS * 16);
        let mut args = vec![Arg::Bytes(tensor_map(&k, ks, rows)?), Arg::Bytes(tensor_map(&v, vs, rows)?)];
        args.extend([ptr_of(&q)?, ptr_of(&tables)?, ptr_of(&lengths)?, out, sinks_ptr, part, count].map(Arg::Ptr));
        args.extend(qs.map(Arg::I64));
        args.extend([nblocks, bs_log2, max_blocks, rows as i32, hq, hkv, lq, window, blocks].map(Arg::I32));
        args.push(Arg::F32(p.scale));
        let f = kernel(gpu, Family::Attention(d), &format!("attention_paged_tma_{hd}"))?;
        let (_, smem) = vector_tma_shape(hd);
        allow_shared(gpu, f, smem)?;
        return launch(gpu, f, grid, ((VECTOR_TMA_WARPS + 1) * 32, 1, 1), smem, args);
    }
    let mut args: Vec<Arg> =
        [ptr_of(&q)?, ptr_of(&k)?, ptr_of(&v)?, ptr_of(&tables)?, ptr_of(&lengths)?, out, sinks_ptr, part, count]
            .map(Arg::Ptr)
            .into();
    args.extend(qs.into_iter().chain(ks).chain(vs).map(Arg::I64));
    args.extend([nblocks, bs_log2, max_blocks, hq, hkv, lq, window, blocks].map(Arg::I32));
    args.push(Arg::F32(p.scale));
    let f = kernel(gpu, Family::Attention(d), &format!("attention_paged_mma_{hd}_{hv}"))?;
    let (_, smem) = vector_mma_shape(hd, hv);
    allow_shared(gpu, f, smem)?;
    launch(gpu, f, grid, (VECTOR_WARPS * 32, 1, 1), smem, args)
}

/// A 4-D operand whose last axis is contiguous, and with `vectors` each of its rows 16-byte
/// aligned (the keys, staged by 16-byte loads), copied row-major otherwise; and its first
/// three strides.
fn heads(gpu: &Arc<Gpu>, x: Operand, vectors: bool) -> Result<(Operand, [i64; 3])> {
    let st = &x.data.layout.strides;
    let bytes = x.dtype.size() as isize;
    let misaligned =
        vectors && (!ptr_of(&x)?.is_multiple_of(16) || (0..3).any(|a| x.shape[a] > 1 && (st[a] * bytes) % 16 != 0));
    let x = if (x.shape[3] > 1 && st[3] != 1) || misaligned { row_major(gpu, x)? } else { x };
    let s = [0, 1, 2].map(|a| x.data.layout.strides[a] as i64);
    Ok((x, s))
}

/// The strides reading a mask broadcast to `[B, Hq, Lq, Lk]` (0 along broadcast axes).
fn mask_strides(m: &Operand) -> [i64; 4] {
    let n = m.shape.len();
    let mut out = [0i64; 4];
    for a in 0..n {
        if m.shape[a] != 1 {
            out[4 - n + a] = m.data.layout.strides[a] as i64;
        }
    }
    out
}

/// Runs the planned kernel into `outputs` (the output, and with `lse` the rows' log-sum-exp).
pub(crate) fn eval(gpu: &Arc<Gpu>, p: &AttentionParams, inputs: Vec<Operand>, outputs: &mut [Output]) -> Result<()> {
    let ptrs: Vec<u64> = outputs.iter_mut().map(|o| alloc_out(gpu, o)).collect::<Result<_>>()?;
    match p.kernel {
        AttentionKernel::Vector { passes, blocks } => vector(gpu, p, passes, blocks, inputs, ptrs[0]),
        AttentionKernel::Tiled => tiled(gpu, p, inputs, ptrs[0], ptrs.get(1).copied().unwrap_or(0)),
        k => Err(internal(format!("no attention kernel for {k:?}"))),
    }
}

/// The tiled kernel: a block per 128 query rows of a head; `lse` (or null) takes the rows'
/// log-sum-exp.
fn tiled(gpu: &Arc<Gpu>, p: &AttentionParams, inputs: Vec<Operand>, out: u64, lse: u64) -> Result<()> {
    let mut it = inputs.into_iter();
    let mut next = || it.next().ok_or_else(|| internal("scaled_dot_product_attention is missing an input"));
    let (q, qs) = heads(gpu, next()?, true)?;
    let (k, ks) = heads(gpu, next()?, true)?;
    let (v, vs) = heads(gpu, next()?, true)?;
    let sinks = if p.sinks { Some(row_major(gpu, next()?)?) } else { None };
    let [b, hq, lq, hd] = [0, 1, 2, 3].map(|a| q.shape[a]);
    let (hkv, lk) = (k.shape[1], k.shape[2]);
    if b == 0 || hq == 0 || lq == 0 {
        return Ok(());
    }
    let heads = b as u32 * hq as u32;
    if let Some(w) = Wgmma::find(gpu.info.compute_capability, hd, p.causal) {
        let (q, qs) = tma_ready(gpu, q, qs)?;
        let (k, ks) = tma_ready(gpu, k, ks)?;
        let (v, vs) = tma_ready(gpu, v, vs)?;
        let mut args: Vec<Arg> = vec![
            Arg::Bytes(tensor_map(&q, qs, w.rows())?),
            Arg::Bytes(tensor_map(&k, ks, w.keys)?),
            Arg::Bytes(tensor_map(&v, vs, w.keys)?),
            Arg::Ptr(out),
            Arg::Ptr(lse),
            Arg::Ptr(sinks.as_ref().map(ptr_of).transpose()?.unwrap_or(0)),
        ];
        args.extend(bounds(p, [hq, hkv, lq, lk]));
        let f = kernel(gpu, Family::Attention(q.dtype), &format!("attention_wgmma_{hd}_{}", w.keys))?;
        allow_shared(gpu, f, w.shared())?;
        let grid = ((lq as u32).div_ceil(w.rows()), heads, 1);
        return launch(gpu, f, grid, (128 * (w.consumers + 1), 1, 1), w.shared(), args);
    }
    if !TILED_HEADS.contains(&hd) {
        return Err(internal(format!("no tiled attention kernel for head size {hd} on this GPU")));
    }
    let mut args =
        vec![Arg::Ptr(ptr_of(&q)?), Arg::Ptr(ptr_of(&k)?), Arg::Ptr(ptr_of(&v)?), Arg::Ptr(out), Arg::Ptr(lse)];
    args.push(Arg::Ptr(sinks.as_ref().map(ptr_of).transpose()?.unwrap_or(0)));
    args.extend(qs.into_iter().chain(ks).chain(vs).map(Arg::I64));
    args.extend(bounds(p, [hq, hkv, lq, lk]));
    let f = kernel(gpu, Family::Attention(q.dtype), &format!("attention_tiled_{hd}"))?;
    // Queries, keys and values staged: rows of `hd` 2-byte features and a 16-byte pad.
    let shared = (TILE_ROWS + 2 * TILE_KEYS) * (hd as u32 * 2 + 16);
    allow_shared(gpu, f, shared)?;
    // A warp per 16 query rows.
    launch(gpu, f, ((lq as u32).div_ceil(TILE_ROWS), heads, 1), (TILE_ROWS * 2, 1, 1), shared, args)
}

/// The tiled and backward kernels' last arguments: `Hq, Hkv, Lq, Lk, causal, window, scale`.
fn bounds(p: &AttentionParams, [hq, hkv, lq, lk]: [i32; 4]) -> impl Iterator<Item = Arg> {
    [hq, hkv, lq, lk, p.causal as i32, p.window.unwrap_or(0)].map(Arg::I32).into_iter().chain([Arg::F32(p.scale)])
}

/// `x` (with its strides) as TMA reads it: a broadcast axis (stride 0) copied out.
fn tma_ready(gpu: &Arc<Gpu>, x: Operand, strides: [i64; 3]) -> Result<(Operand, [i64; 3])> {
    if (0..3).any(|a| x.shape[a] > 1 && strides[a] == 0) {
        let x = row_major(gpu, x)?;
        let s = [0, 1, 2].map(|a| x.data.layout.strides[a] as i64);
        return Ok((x, s));
    }
    Ok((x, strides))
}

/// The TMA map (`CUtensorMap`'s bytes) of a `[B, H, L, D]` operand of half precision read
/// through its `strides` (elements; D contiguous), in boxes of `rows` rows by 64 features with
/// the 128-byte swizzle; rows past L read as zeros.
fn tensor_map(x: &Operand, strides: [i64; 3], rows: u32) -> Result<Vec<u64>> {
    let es = x.dtype.size() as u64;
    let dims = [3, 2, 1, 0].map(|a| x.shape[a] as u64);
    // Byte strides of L, H and B; an axis of size 1 takes any multiple of 16.
    let mut st = [2, 1, 0].map(|a| strides[a] as u64 * es);
    let mut inner = dims[0] * es;
    for i in 0..3 {
        if dims[i + 1] == 1 {
            st[i] = inner.next_multiple_of(16);
        }
        inner = st[i] * dims[i + 1];
    }
    let data = match x.dtype {
        DType::BF16 => sys::CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_BFLOAT16,
        _ => sys::CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_FLOAT16,
    };
    let boxes = [64u32, rows, 1, 1];
    let steps = [1u32; 4];
    let mut map = std::mem::MaybeUninit::<sys::CUtensorMap>::uninit();
    // SAFETY: every array has the rank's 4 entries (3 strides); `map` is written by the call
    // and read only after it succeeds.
    let map = unsafe {
        check(
            sys::cuTensorMapEncodeTiled(
                map.as_mut_ptr(),
                data,
                4,
                ptr_of(x)? as *mut std::ffi::c_void,
                dims.as_ptr(),
                st.as_ptr(),
                boxes.as_ptr(),
                steps.as_ptr(),
                sys::CUtensorMapInterleave::CU_TENSOR_MAP_INTERLEAVE_NONE,
                sys::CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_128B,
                sys::CUtensorMapL2promotion::CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                sys::CUtensorMapFloatOOBfill::CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,
            ),
            "cuTensorMapEncodeTiled",
        )?;
        map.assume_init()
    };
    Ok(map.opaque.to_vec())
}

/// The backward kernels on inputs `[q, k, v, out, lse, g]` into outputs `[dq, dk, dv]`: the
/// rows' `rowsum(g · out)` (on Hopper with the log-sum-exp, by 64-row tiles), a block per keys of
/// a key-value head accumulating `dk` and `dv` and adding to a `float32` `dq` (on Hopper 128 keys
/// on `wgmma`, elsewhere `16 * BACKWARD_WARPS` on `mma.sync`), and `dq` narrowed.
pub(crate) fn backward(
    gpu: &Arc<Gpu>,
    p: &AttentionParams,
    inputs: Vec<Operand>,
    outputs: &mut [Output],
) -> Result<()> {
    let mut it = inputs.into_iter();
    let mut next = || it.next().ok_or_else(|| internal("scaled_dot_product_attention_vjp is missing an input"));
    let (q, qs) = heads(gpu, next()?, true)?;
    let (k, ks) = heads(gpu, next()?, true)?;
    let (v, vs) = heads(gpu, next()?, true)?;
    let o = row_major(gpu, next()?)?;
    let lse = row_major(gpu, next()?)?;
    let go = row_major(gpu, next()?)?;
    let ptrs: Vec<u64> = outputs.iter_mut().map(|o| alloc_out(gpu, o)).collect::<Result<_>>()?;
    let d = q.dtype;
    let [b, hq, lq, hd] = [0, 1, 2, 3].map(|a| q.shape[a]);
    let (hkv, lk) = (k.shape[1], k.shape[2]);
    let rows = b as usize * hq as usize * lq as usize;
    if rows == 0 || lk == 0 {
        for (o, &ptr) in outputs.iter().zip(&ptrs) {
            gpu.zero(ptr, o.size() * o.dtype.size())?;
        }
        return Ok(());
    }
    let family = Family::Attention(d);
    let (acc, _acc_buf) = alloc(gpu, rows * hd as usize, DType::F32)?;
    gpu.zero(acc, rows * hd as usize * 4)?;
    // The cotangent's strides (row-major).
    let gs = [lq as i64 * hd as i64 * hq as i64, lq as i64 * hd as i64, hd as i64];
    if gpu.info.compute_capability == HOPPER && WGMMA_BACKWARD_HEADS.contains(&hd) {
        // The rows' statistics by 64-row tiles, a warp per padded row.
        let heads = b as usize * hq as usize;
        let padded = heads * (lq as usize).div_ceil(WGMMA_BACKWARD_ROWS as usize) * WGMMA_BACKWARD_ROWS as usize;
        let (stats, _stats_buf) = alloc(gpu, 2 * padded, DType::F32)?;
        let f = kernel(gpu, family, &format!("attention_backward_stats_{hd}"))?;
        let args = vec![
            Arg::Ptr(ptr_of(&o)?),
            Arg::Ptr(ptr_of(&go)?),
            Arg::Ptr(ptr_of(&lse)?),
            Arg::Ptr(stats),
            Arg::I64(heads as i64),
            Arg::I32(lq),
        ];
        launch(gpu, f, ((padded as u32).div_ceil(8), 1, 1), (256, 1, 1), 0, args)?;
        let (q, qs) = tma_ready(gpu, q, qs)?;
        let (k, ks) = tma_ready(gpu, k, ks)?;
        let (v, vs) = tma_ready(gpu, v, vs)?;
        let mut args: Vec<Arg> = vec![
            Arg::Bytes(tensor_map(&q, qs, WGMMA_BACKWARD_ROWS)?),
            Arg::Bytes(tensor_map(&k, ks, WGMMA_BACKWARD_KEYS)?),
            Arg::Bytes(tensor_map(&v, vs, WGMMA_BACKWARD_KEYS)?),
            Arg::Bytes(tensor_map(&go, gs, WGMMA_BACKWARD_ROWS)?),
        ];
        args.extend([stats, acc, ptrs[1], ptrs[2]].map(Arg::Ptr));
        args.extend(bounds(p, [hq, hkv, lq, lk]));
        let f = kernel(gpu, family, &format!("attention_backward_wgmma_{hd}"))?;
        let shared = wgmma_backward_shared(hd as u32);
        allow_shared(gpu, f, shared)?;
        // A block per 128 keys of a key-value head (and share of its query heads); heads in
        // chunks, the key tiles slowest in one.
        let blocks = (lk as u32).div_ceil(WGMMA_BACKWARD_KEYS) * b as u32 * hkv as u32;
        let split = backward_split(blocks, hq / hkv);
        let nk = b as usize * hkv as usize * lk as usize * hd as usize;
        // With a split, dK and dV add up in float32 ([dK; dV], zeroed) and are narrowed after.
        let (dkv, _dkv_buf) = if split > 1 {
            let (ptr, buf) = alloc(gpu, 2 * nk, DType::F32)?;
            gpu.zero(ptr, 2 * nk * 4)?;
            (ptr, Some(buf))
        } else {
            (0, None)
        };
        args.extend([backward_chunk(b * hkv, hq / hkv, lq, hd) * split, split].map(Arg::I32));
        args.push(Arg::Ptr(dkv));
        launch(gpu, f, (blocks * split as u32, 1, 1), (384, 1, 1), shared, args)?;
        if split > 1 {
            // dK (already scaled) and dV from their float32 sums.
            let f = kernel(gpu, family, "attention_backward_dq")?;
            for (src, dst) in [(dkv, ptrs[1]), (dkv + nk as u64 * 4, ptrs[2])] {
                let args = vec![Arg::Ptr(src), Arg::Ptr(dst), Arg::I64(nk as i64), Arg::F32(1.0)];
                launch(gpu, f, (nk.div_ceil(256).min(65535 * 8) as u32, 1, 1), (256, 1, 1), 0, args)?;
            }
        }
    } else {
        let (delta, _delta_buf) = alloc(gpu, rows, DType::F32)?;
        let f = kernel(gpu, family, &format!("attention_backward_delta_{hd}"))?;
        let args = vec![Arg::Ptr(ptr_of(&o)?), Arg::Ptr(ptr_of(&go)?), Arg::Ptr(delta), Arg::I64(rows as i64)];
        // A warp per row.
        launch(gpu, f, ((rows as u32).div_ceil(8), 1, 1), (256, 1, 1), 0, args)?;
        let operands =
            [ptr_of(&q)?, ptr_of(&k)?, ptr_of(&v)?, ptr_of(&go)?, ptr_of(&lse)?, delta, acc, ptrs[1], ptrs[2]];
        let mut args: Vec<Arg> = operands.map(Arg::Ptr).into();
        args.extend(qs.into_iter().chain(ks).chain(vs).chain(gs).map(Arg::I64));
        args.extend(bounds(p, [hq, hkv, lq, lk]));
        let f = kernel(gpu, family, &format!("attention_backward_{hd}"))?;
        let shared = backward_shared(hd as u32);
        allow_shared(gpu, f, shared)?;
        // A block per 16 * BACKWARD_WARPS keys of a key-value head, the key tiles slowest.
        let blocks = (lk as u32).div_ceil(16 * BACKWARD_WARPS) * b as u32 * hkv as u32;
        launch(gpu, f, (blocks, 1, 1), (BACKWARD_WARPS * 32, 1, 1), shared, args)?;
    }

    let n = rows * hd as usize;
    let f = kernel(gpu, family, "attention_backward_dq")?;
    let args = vec![Arg::Ptr(acc), Arg::Ptr(ptrs[0]), Arg::I64(n as i64), Arg::F32(p.scale)];
    let blocks = n.div_ceil(256).min(65535 * 8) as u32;
    launch(gpu, f, (blocks, 1, 1), (256, 1, 1), 0, args)
}

/// The vector kernel, in one pass or two.
fn vector(gpu: &Arc<Gpu>, p: &AttentionParams, passes: u8, blocks: i32, inputs: Vec<Operand>, out: u64) -> Result<()> {
    let mut it = inputs.into_iter();
    let mut next = || it.next().ok_or_else(|| internal("scaled_dot_product_attention is missing an input"));
    let (q, qs) = heads(gpu, next()?, false)?;
    let (k, ks) = heads(gpu, next()?, true)?;
    let (v, vs) = heads(gpu, next()?, true)?;
    let mask = if p.mask.is_some() { Some(next()?) } else { None };
    let sinks = if p.sinks { Some(row_major(gpu, next()?)?) } else { None };
    let d = q.dtype;
    let [b, hq, lq, hd] = [0, 1, 2, 3].map(|a| q.shape[a]);
    let (hkv, lk, hv) = (k.shape[1], k.shape[2], v.shape[3]);
    let rows = b as u64 * hq as u64 * lq as u64;
    if rows == 0 {
        return Ok(());
    }
    let blocks = if passes == 2 { blocks.max(1) } else { 1 };
    let scratch = partials(gpu, passes == 2, rows, blocks, hv)?;
    let part = scratch.as_ref().map_or(0, |s| s.0);
    let ms = mask.as_ref().map_or([0; 4], mask_strides);
    let mask_kind = match p.mask {
        Some(MaskInput::Bool) => 1,
        Some(MaskInput::Additive) => 2,
        None => 0,
    };
    let sinks_ptr = sinks.as_ref().map(ptr_of).transpose()?.unwrap_or(0);
    // Every kernel takes q (k, v), then the output, mask, sinks and partitions' pointers.
    let (qp, kp, vp) = (ptr_of(&q)?, ptr_of(&k)?, ptr_of(&v)?);
    let io = [out, mask.as_ref().map(ptr_of).transpose()?.unwrap_or(0), sinks_ptr, part].map(Arg::Ptr);
    let window = p.window.unwrap_or(0);
    let tail = [hq, hkv, lq, lk, p.causal as i32, window, mask_kind, blocks].map(Arg::I32).into_iter();
    let tail = tail.chain([Arg::F32(p.scale)]);
    let group = (hq / hkv) as u32;
    if d.is_half() {
        // Tensor cores: a block per query of up to 16 grouped heads and key partition; with
        // partitions, the last block of a grid column to finish merges them (a counter each).
        let grid = (b as u32 * hkv as u32 * lq as u32 * group.div_ceil(16), blocks as u32, 1);
        let count = Arg::Ptr(if passes == 2 { gpu.counters(grid.0 as usize)? } else { 0 });
        if gpu.info.compute_capability == HOPPER && hd == hv && VECTOR_TMA_HEADS.contains(&hd) {
            let (k, ks) = tma_ready(gpu, k, ks)?;
            let (v, vs) = tma_ready(gpu, v, vs)?;
            let keys = VECTOR_TMA_WARPS * 16;
            let mut args = vec![Arg::Bytes(tensor_map(&k, ks, keys)?), Arg::Bytes(tensor_map(&v, vs, keys)?)];
            args.push(Arg::Ptr(qp));
            args.extend(io.into_iter().chain([count]));
            args.extend(qs.into_iter().chain(ms).map(Arg::I64));
            args.extend(tail);
            let f = kernel(gpu, Family::Attention(d), &format!("attention_vector_tma_{hd}"))?;
            let (_, smem) = vector_tma_shape(hd);
            allow_shared(gpu, f, smem)?;
            launch(gpu, f, grid, ((VECTOR_TMA_WARPS + 1) * 32, 1, 1), smem, args)?;
        } else {
            let mut args: Vec<Arg> = [qp, kp, vp].map(Arg::Ptr).into();
            args.extend(io.into_iter().chain([count]));
            args.extend(qs.into_iter().chain(ks).chain(vs).chain(ms).map(Arg::I64));
            args.extend(tail);
            let f = kernel(gpu, Family::Attention(d), &format!("attention_vector_mma_{hd}_{hv}"))?;
            let (_, smem) = vector_mma_shape(hd, hv);
            allow_shared(gpu, f, smem)?;
            launch(gpu, f, grid, (VECTOR_WARPS * 32, 1, 1), smem, args)?;
        }
        drop(scratch);
        return Ok(());
    }
    // float32 on CUDA cores, then (with partitions) the merge as a second launch.
    let mut args: Vec<Arg> = [qp, kp, vp].map(Arg::Ptr).into();
    args.extend(io);
    args.extend(qs.into_iter().chain(ks).chain(vs).chain(ms).map(Arg::I64));
    args.extend(tail);
    let r = rows_per_block(group * lq as u32);
    let f = kernel(gpu, Family::Attention(d), &format!("attention_vector_{hd}_{hv}_r{r}"))?;
    let grid = b as u32 * hkv as u32 * (group * lq as u32).div_ceil(r);
    let (warps, smem) = vector_block(d, hd, hv);
    allow_shared(gpu, f, smem)?;
    launch(gpu, f, (grid, blocks as u32, 1), (warps * 32, 1, 1), smem, args)?;
    if passes == 2 {
        let f = kernel(gpu, Family::Attention(d), &format!("attention_vector_merge_{hv}"))?;
        let args = vec![
            Arg::Ptr(part),
            Arg::Ptr(sinks_ptr),
            Arg::Ptr(out),
            Arg::I64(rows as i64),
            Arg::I32(hq),
            Arg::I32(hkv),
            Arg::I32(lq),
            Arg::I32(lk),
            Arg::I32(p.causal as i32),
            Arg::I32(window),
            Arg::I32(blocks),
        ];
        launch(gpu, f, (rows as u32, 1, 1), ((hv as u32).clamp(32, 256), 1, 1), 0, args)?;
    }
    drop(scratch);
    Ok(())
}
