//! `gather_mm`: products of matrices picked by index, read in place (`kernels/gather_mm.cuh`).
//! Up to 256 output rows in all (decoding through a mixture of experts) run as a GEMV
//! per output; more, in half precision, as tiles on tensor cores over runs of outputs that share
//! a matrix of `b`. The rest (more rows in `float32`, `K` or `N` not a multiple of 8) run as the
//! composition.

use std::sync::Arc;

use nuvec_core::storage::{Data, Layout, Operand, Output, Spec, Storage};
use nuvec_core::{DType, Result};

use crate::driver::Gpu;
use crate::kernels::{Family, Source, ctype};
use crate::launch::{Arg, BLOCK, allow_shared, launch, resident_blocks_with};
use crate::operand::{alloc, alloc_out, fresh_copy, internal, kernel, ptr_of};

/// Output rows (`L · M`) at most that run as GEMVs, more taking the tensor-core tiles:
/// `NUVEC_GATHER_GEMV_ROWS`, by default 256.
fn gemv_rows() -> i64 {
    static ROWS: std::sync::OnceLock<i64> = std::sync::OnceLock::new();
    *ROWS.get_or_init(|| std::env::var("NUVEC_GATHER_GEMV_ROWS").ok().and_then(|v| v.parse().ok()).unwrap_or(256))
}
/// Rows per matrix the GEMV takes at most (matmul.cuh's `gemv_rows`, one kernel per count).
const GEMV_M: i64 = 8;
/// Threads of `gather_mm_tc`'s blocks (GM_WARPS warps) and of `gather_runs` (GM_RUN_THREADS).
const TC_THREADS: u32 = 256;
const RUN_THREADS: u32 = 1024;

/// Adds `gather_runs` to a module's source (this one's and `gather_qmm`'s).
pub(crate) fn runs_kernel(s: &mut Source) {
    s.kernel(format!(
        "__launch_bounds__({RUN_THREADS}) gather_runs(const uint32_t* rhs, int flags, int64_t bb, int64_t rows, int m, int bm, int* tiles, int* count) {{ gm_runs(rhs, flags, bb, rows, m, bm, tiles, count); }}"
    ));
}

/// The kernels' `flags`: bit 0 when `lhs` is unsigned, bit 1 when `rhs` is.
pub(crate) fn index_flags(lhs: &Operand, rhs: &Operand) -> i32 {
    (lhs.dtype == DType::U32) as i32 | (((rhs.dtype == DType::U32) as i32) << 1)
}

/// The tiles `gather_runs` lists on the GPU: `tiles` (pairs of first row and matrix, then the
/// end), `*count` of them, at most `bound - 1`.
pub(crate) struct TileList {
    pub(crate) tiles: u64,
    pub(crate) count: u64,
    pub(crate) bound: i64,
    _buffer: Arc<Storage>,
}

/// Launches `family`'s `gather_runs` over the `l · m` output rows of indices `rhs` (into a
/// stack of `bb` matrices), cutting runs every `tile_rows` rows.
#[allow(clippy::too_many_arguments)]
pub(crate) fn list_tiles(
    gpu: &Arc<Gpu>,
    family: Family,
    rhs: u64,
    flags: i32,
    bb: i64,
    l: i64,
    m: i64,
    tile_rows: i64,
) -> Result<TileList> {
    let rows = l * m;
    // At most one tile per tile_rows rows plus one per run (a run holds whole outputs), and
    // the end's sentinel.
    let bound = (rows + tile_rows - 1) / tile_rows + l + 1;
    let (tiles, buffer) = alloc(gpu, 2 * bound as usize + 1, DType::I32)?;
    let count = tiles + 8 * bound as u64;
    let f = kernel(gpu, family, "gather_runs")?;
    let args = vec![
        Arg::Ptr(rhs),
        Arg::I32(flags),
        Arg::I64(bb),
        Arg::I64(rows),
        Arg::I32(m as i32),
        Arg::I32(tile_rows as i32),
        Arg::Ptr(tiles),
        Arg::Ptr(count),
    ];
    launch(gpu, f, (1, 1, 1), (RUN_THREADS, 1, 1), 0, args)?;
    Ok(TileList { tiles, count, bound, _buffer: buffer })
}

/// The tile of `gather_mm_tc`: rows, columns, K per step, steps staged at once.
#[derive(Clone, Copy)]
struct Tile {
    rows: i64,
    cols: u64,
    k: u32,
    stages: u32,
}

impl Tile {
    /// Dynamic shared memory: every stage's rows of a and W, each padded by 16 bytes.
    fn shared(&self) -> u32 {
        self.stages * (self.rows as u32 + self.cols as u32) * (self.k * 2 + 16)
    }
}

/// The tiles: `gather_mm_tc` of 64 × 128 (K 64, 4 stages) for few rows per matrix of `b`
/// (decoding a batch), `gather_mm_tc_tall` of 128 × 128 (K 64, 3 stages) from
/// [`TALL_ROWS`] rows per matrix on average (prefill); see bench/results/. For experiments,
/// `NUVEC_GATHER_TILE` and `NUVEC_GATHER_TILE_TALL` (`ROWSxCOLSxKxSTAGES`: rows 32, 64 or 128;
/// columns such that each of the 8 warps owns a multiple of 16; K 32 or 64) replace them.
fn tiles() -> [Tile; 2] {
    static TILES: std::sync::OnceLock<[Tile; 2]> = std::sync::OnceLock::new();
    *TILES.get_or_init(|| {
        [
            tile_setting("NUVEC_GATHER_TILE").unwrap_or(Tile { rows: 64, cols: 128, k: 64, stages: 4 }),
            tile_setting("NUVEC_GATHER_TILE_TALL").unwrap_or(Tile { rows: 128, cols: 128, k: 64, stages: 3 }),
        ]
    })
}

/// A tile from the environment variable `name`, `ROWSxCOLSxKxSTAGES`, where it is one the
/// kernel takes.
fn tile_setting(name: &str) -> Option<Tile> {
    let v: Vec<u64> = std::env::var(name).ok()?.split('x').filter_map(|p| p.trim().parse().ok()).collect();
    match v[..] {
        [r @ (32 | 64 | 128), c, k @ (32 | 64), st @ 2..=6] if c % (16 * 8 * 32 / r) == 0 && r * k >= 2048 => {
            Some(Tile { rows: r as i64, cols: c, k: k as u32, stages: st as u32 })
        }
        _ => None,
    }
}

/// Rows per matrix of `b` (`L · M / Bb`) from which the tall tile runs.
const TALL_ROWS: i64 = 64;

/// `(L, M, K, N)` of inputs `[a [Ba, M, K], b [Bb, K, N], lhs [L], rhs [L]]`.
fn dims(inputs: &[Spec]) -> Option<(i64, i64, i64, i64)> {
    let (a, b, l) = (inputs.first()?, inputs.get(1)?, inputs.get(2)?);
    Some((l.shape[0] as i64, a.shape[1] as i64, a.shape[2] as i64, b.shape[2] as i64))
}

/// Which kernel takes the product, if one does.
#[derive(Clone, Copy, PartialEq)]
enum Plan {
    /// A GEMV per output.
    Gemv,
    /// Tensor-core tiles.
    Tiles,
}

fn plan(d: DType, inputs: &[Spec]) -> Option<Plan> {
    let (l, m, k, n) = dims(inputs)?;
    let rows = l.checked_mul(m)?;
    if k == 0 || k % 8 != 0 || rows == 0 || n == 0 || rows.saturating_mul(n) >= i32::MAX as i64 {
        return None;
    }
    let half = matches!(d, DType::F16 | DType::BF16);
    let gemv = m <= GEMV_M && l <= 65535 && (rows <= gemv_rows() || !half);
    match gemv {
        true if matches!(d, DType::F32 | DType::F16 | DType::BF16) => Some(Plan::Gemv),
        _ if half && n % 8 == 0 && rows < i32::MAX as i64 / 2 => Some(Plan::Tiles),
        _ => None,
    }
}

/// Whether a kernel takes the product (the inputs checked by the operation's specs).
pub(crate) fn supports(inputs: &[Spec]) -> bool {
    inputs.len() == 4 && plan(inputs[0].dtype, inputs).is_some()
}

/// The module of `d`: `gather_gemv_m{1..8}`, and for half precision `gather_runs`,
/// `gather_mm_tc` and `gather_mm_tc_tall`.
pub(crate) fn source(d: DType) -> String {
    let mut s = Source::new(&["gather_mm.cuh"]);
    let t = ctype(d);
    for m in 1..=GEMV_M {
        s.kernel(format!(
            "gather_gemv_m{m}(const {t}* a, const {t}* w, {t}* out, const uint32_t* lhs, const uint32_t* rhs, int flags, int64_t ba, int64_t bb, u64 n, u64 k, u64 lda, u64 sa, u64 ldw, u64 sb) {{ gm_gemv<{t}, {m}>(a, w, out, lhs, rhs, flags, ba, bb, n, k, lda, sa, ldw, sb); }}"
        ));
    }
    if matches!(d, DType::F16 | DType::BF16) {
        runs_kernel(&mut s);
        for (name, Tile { rows, cols, k, stages }) in ["gather_mm_tc", "gather_mm_tc_tall"].into_iter().zip(tiles()) {
            s.kernel(format!(
                "__launch_bounds__({TC_THREADS}) {name}(const {t}* a, const {t}* w, {t}* out, const uint32_t* lhs, const int* tiles, const int* count, int flags, int64_t ba, int m, int n, int k, int64_t lda, int64_t sa, int64_t ldw, int64_t sb) {{ gm_tiles<{t}, {rows}, {cols}, {k}, {stages}>(a, w, out, lhs, tiles, count, flags, ba, m, n, k, lda, sa, ldw, sb); }}"
            ));
        }
    }
    s.finish()
}

/// A stack operand whose last axis is contiguous and whose other strides keep 16-byte
/// alignment, as `(operand, row stride, stack stride)`: itself, or a copy. `transpose` reads
/// `b [Bb, K, N]` as `W [Bb, N, K]`.
fn k_contiguous(gpu: &Arc<Gpu>, x: Operand, transpose: bool) -> Result<(Operand, i64, i64)> {
    let v = (16 / x.dtype.size()) as isize;
    let view = |x: &Operand| {
        let s = &x.data.layout.strides;
        if transpose { (s[0], s[2], s[1]) } else { (s[0], s[1], s[2]) }
    };
    let fits = |x: &Operand| {
        let (stack, row, col) = view(x);
        col == 1 && row % v == 0 && stack % v == 0 && ptr_of(x).is_ok_and(|p| p % 16 == 0)
    };
    let x = if fits(&x) {
        x
    } else if transpose {
        // A row-major W [Bb, N, K]: the transposed view of b, copied.
        let (stack, row, col) = view(&x);
        let shape: Vec<i32> = vec![x.shape[0], x.shape[2], x.shape[1]];
        let layout = Layout::new(&shape, [stack, row, col].into_iter().collect(), x.data.layout.offset);
        let t = Operand {
            shape: shape.into(),
            dtype: x.dtype,
            data: Data { storage: x.data.storage, layout },
            donated: false,
        };
        let w = fresh_copy(gpu, t)?;
        let s = w.data.layout.strides.clone();
        // Back to b's axes: [Bb, K, N] with K contiguous.
        let layout = Layout::new(&[w.shape[0], w.shape[2], w.shape[1]], [s[0], s[2], s[1]].into_iter().collect(), 0);
        let shape = vec![w.shape[0], w.shape[2], w.shape[1]];
        Operand { shape: shape.into(), dtype: w.dtype, data: Data { storage: w.data.storage, layout }, donated: false }
    } else {
        fresh_copy(gpu, x)?
    };
    let (stack, row, _) = view(&x);
    Ok((x, row as i64, stack as i64))
}

/// Inputs `[a, b, lhs, rhs]` as `supports` accepted them.
pub(crate) fn eval(gpu: &Arc<Gpu>, inputs: Vec<Operand>, out: &mut Output) -> Result<()> {
    let specs: Vec<Spec> = inputs.iter().map(|x| Spec { shape: x.shape.clone(), dtype: x.dtype }).collect();
    let d = out.dtype;
    let plan = plan(d, &specs).ok_or_else(|| internal("gather_mm without a kernel"))?;
    let [a, b, lhs, rhs] = <[Operand; 4]>::try_from(inputs).map_err(|_| internal("gather_mm takes a, b, lhs, rhs"))?;
    let (l, m, k, n) = dims(&specs).ok_or_else(|| internal("gather_mm's shapes"))?;
    let (ba, bb) = (a.shape[0] as i64, b.shape[0] as i64);
    let (a, lda, sa) = k_contiguous(gpu, a, false)?;
    let (b, ldw, sb) = k_contiguous(gpu, b, true)?;
    let (lhs, rhs) = (crate::operand::row_major(gpu, lhs)?, crate::operand::row_major(gpu, rhs)?);
    let flags = index_flags(&lhs, &rhs);
    let y = alloc_out(gpu, out)?;
    let family = Family::GatherMm(d);
    let (ap, bp, lp, rp) = (ptr_of(&a)?, ptr_of(&b)?, ptr_of(&lhs)?, ptr_of(&rhs)?);
    match plan {
        Plan::Gemv => {
            let f = kernel(gpu, family, &format!("gather_gemv_m{m}"))?;
            // A warp's worth of threads per output column, as matmul.rs's GEMV.
            let grid = (n as u64).div_ceil((BLOCK / 32) as u64).min(65535) as u32;
            let args = vec![
                Arg::Ptr(ap),
                Arg::Ptr(bp),
                Arg::Ptr(y),
                Arg::Ptr(lp),
                Arg::Ptr(rp),
                Arg::I32(flags),
                Arg::I64(ba),
                Arg::I64(bb),
                Arg::U64(n as u64),
                Arg::U64(k as u64),
                Arg::U64(lda as u64),
                Arg::U64(sa as u64),
                Arg::U64(ldw as u64),
                Arg::U64(sb as u64),
            ];
            launch(gpu, f, (grid, l as u32, 1), (BLOCK, 1, 1), 0, args)
        }
        Plan::Tiles => {
            let tall = l * m >= TALL_ROWS * bb.max(1);
            let shape = tiles()[tall as usize];
            let list = list_tiles(gpu, family, rp, flags, bb, l, m, shape.rows)?;
            let f = kernel(gpu, family, if tall { "gather_mm_tc_tall" } else { "gather_mm_tc" })?;
            allow_shared(gpu, f, shape.shared())?;
            // Blocks loop over the tiles: as many as are resident at once, or fewer.
            let work = (list.bound - 1) as u64 * (n as u64).div_ceil(shape.cols);
            let per_sm = resident_blocks_with(gpu, f, TC_THREADS, shape.shared())?.max(1);
            let resident = per_sm * gpu.info.multiprocessors.max(1) as u64;
            let grid = work.clamp(1, resident) as u32;
            let args = vec![
                Arg::Ptr(ap),
                Arg::Ptr(bp),
                Arg::Ptr(y),
                Arg::Ptr(lp),
                Arg::Ptr(list.tiles),
                Arg::Ptr(list.count),
                Arg::I32(flags),
                Arg::I64(ba),
                Arg::I32(m as i32),
                Arg::I32(n as i32),
                Arg::I32(k as i32),
                Arg::I64(lda),
                Arg::I64(sa),
                Arg::I64(ldw),
                Arg::I64(sb),
            ];
            launch(gpu, f, (grid, 1, 1), (TC_THREADS, 1, 1), shape.shared(), args)
        }
    }
}
