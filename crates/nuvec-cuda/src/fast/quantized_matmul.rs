//! `quantized_matmul` of up to 8 rows of `x` with an affine-quantized `w[N, K]`
//! (`kernels/quantized_matmul.cuh`): decoding, where the product is a pass over the packed
//! weight. Half-precision `x` with 4- or 8-bit weights runs on tensor cores; the other cases
//! on CUDA cores. More rows, `w[K, N]` and the FP modes run as the composition (the GPU's
//! dequantize, then cuBLAS). `gather_qmm` runs the same kernels over experts picked by index,
//! any number of rows, each expert's weights read once per 8 rows that use it.

use std::sync::Arc;

use nuvec_core::fast::QuantMatmulParams;
use nuvec_core::primitive::QuantMode;
use nuvec_core::storage::{Operand, Output, Spec};
use nuvec_core::{DType, Result};

use super::gather_mm::{index_flags, list_tiles};
use crate::driver::Gpu;
use crate::kernels::{Family, Source, ctype};
use crate::launch::{Arg, launch_dependent};
use crate::operand::{alloc_out, fresh_copy, internal, kernel, ptr_of, row_major};

/// Rows of `x` the kernels take at most.
const MAX_ROWS: i64 = 8;
/// The kernels' row counts: a product of `m` rows runs the smallest at least `m`.
const ROW_TILES: [i64; 4] = [1, 2, 4, 8];
/// Bits per level with a kernel.
const BITS: [i32; 6] = [2, 3, 4, 5, 6, 8];
/// Weight rows per block, and warps splitting K.
const ROWS_PER_BLOCK: u32 = 4;
const WARPS: u32 = 4;

/// Whether a kernel covers this product: affine, `w[N, K]`, at most 8 rows of `x`, and `x`,
/// the scales and the biases in the product's dtype.
pub(crate) fn supports(p: &QuantMatmulParams, inputs: &[Spec]) -> bool {
    let d = p.dtype;
    let (Some(x), Some(w)) = (inputs.first(), inputs.get(1)) else { return false };
    let k = x.shape.last().copied().unwrap_or(0) as i64;
    let rows = if k > 0 { x.shape.iter().map(|&s| s as i64).product::<i64>() / k } else { 0 };
    p.mode == QuantMode::Affine
        && p.transpose
        && matches!(d, DType::F32 | DType::F16 | DType::BF16)
        && BITS.contains(&p.bits)
        && inputs.iter().enumerate().all(|(i, s)| i == 1 || s.dtype == d)
        && w.shape.len() == 2
        && (1..=MAX_ROWS).contains(&rows)
}

/// Warps of the tensor-core kernel's blocks (16 weight rows each).
const TC_WARPS: u32 = 8;
/// Steps of weight loads each warp of the tensor-core kernel issues at once: 4 (80 registers),
/// or 8 (128) where the grid is too small to fill the GPU with warps, so each warp must keep
/// more bytes in flight.
const TC_STEPS: [u32; 2] = [4, 8];

/// Whether the tensor-core kernel takes this product: half-precision x with 4-bit weights, or
/// 8-bit ones and more than 2 rows (one 8-bit row decodes faster on CUDA cores, whose byte
/// permutes need no conversion to half); `NUVEC_QMV_TC=0` keeps the CUDA-core kernel.
fn tensor_cores(d: DType, bits: i32, rows: usize) -> bool {
    tc_setting() != "0" && matches!(d, DType::F16 | DType::BF16) && (bits == 4 || (bits == 8 && rows > 2))
}

/// `NUVEC_QMV_TC`: `0` (CUDA cores), `u4` or `u8` (that many steps at once), or unset.
fn tc_setting() -> &'static str {
    static SETTING: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    SETTING.get_or_init(|| std::env::var("NUVEC_QMV_TC").unwrap_or_default())
}

/// The tensor-core steps for `n` weight rows: 8 when there are fewer blocks (16 rows each)
/// than two per SM.
fn tc_steps(gpu: &Gpu, n: i32) -> u32 {
    match tc_setting() {
        "u4" => 4,
        "u8" => 8,
        _ if (n as u64).div_ceil(16) < 2 * gpu.info.multiprocessors.max(1) as u64 => 8,
        _ => 4,
    }
}

/// The module of `d`: `qmv_b{bits}_m{rows}` (CUDA cores) for every bit width and row tile,
/// and for half precision `qmv_tc_b{4,8}_u{4,8}` (tensor cores).
pub(crate) fn source(d: DType) -> String {
    let mut s = Source::new(&["quantized_matmul.cuh"]);
    let t = ctype(d);
    if matches!(d, DType::F16 | DType::BF16) {
        for bits in [4, 8] {
            for steps in TC_STEPS {
                s.kernel(format!(
                    "__launch_bounds__({threads}) qmv_tc_b{bits}_u{steps}(const {t}* x, const u32* w, const {t}* scales, const {t}* biases, {t}* y, int rows, int n, int k, int group_shift) {{ qmv_tc<{t}, {bits}, {TC_WARPS}, {steps}>(x, w, scales, biases, y, rows, n, k, group_shift, blockIdx.x * 16); }}",
                    threads = TC_WARPS * 32
                ));
            }
        }
    }
    for bits in BITS {
        for mt in ROW_TILES {
            s.kernel(format!(
                "__launch_bounds__({threads}) qmv_b{bits}_m{mt}(const {t}* x, const u32* w, const {t}* scales, const {t}* biases, {t}* y, int rows, int n, int k, int group_shift) {{ qmv_affine<{t}, {bits}, {mt}, {ROWS_PER_BLOCK}, {WARPS}>(x, w, scales, biases, y, rows, n, k, group_shift, blockIdx.x * {ROWS_PER_BLOCK}); }}",
                threads = WARPS * 32
            ));
        }
    }
    // gather_qmm: the tiles' list (gather_mm.cuh), then the products over it.
    super::gather_mm::runs_kernel(&mut s);
    let gather_args = "const u32* lhs, const u32* rhs, const int* tiles, const int* count, int direct, int flags, int64_t bx, int64_t bw, int m, int n, int k, int group_shift, int64_t sw, int64_t ss";
    let gather_call = "lhs, rhs, tiles, count, direct, flags, bx, bw, m, n, k, group_shift, sw, ss";
    for bits in BITS {
        let tc = matches!(d, DType::F16 | DType::BF16) && matches!(bits, 4 | 8);
        let threads = if tc { GATHER_TC_WARPS } else { WARPS } * 32;
        s.kernel(format!(
            "__launch_bounds__({threads}) gather_qmv_b{bits}(const {t}* x, const u32* w, const {t}* scales, const {t}* biases, {t}* y, {gather_args}) {{ gather_qmv<{t}, {tc}, {bits}, {ROWS_PER_BLOCK}, {warps}, 4>(x, w, scales, biases, y, {gather_call}); }}",
            warps = threads / 32
        ));
    }
    s.finish()
}

/// The operand in a buffer whose first element is 16-byte aligned (the kernels' vector loads).
fn aligned(gpu: &Arc<Gpu>, x: Operand) -> Result<Operand> {
    let x = row_major(gpu, x)?;
    if ptr_of(&x)? % 16 == 0 { Ok(x) } else { fresh_copy(gpu, x) }
}

/// Inputs `[x, w, scales, biases]` as `supports` accepted them.
pub(crate) fn eval(gpu: &Arc<Gpu>, p: &QuantMatmulParams, inputs: Vec<Operand>, out: &mut Output) -> Result<()> {
    let [x, w, scales, biases] =
        <[Operand; 4]>::try_from(inputs).map_err(|_| internal("quantized_matmul takes x, w, scales and biases"))?;
    let (x, w) = (aligned(gpu, x)?, aligned(gpu, w)?);
    let (scales, biases) = (row_major(gpu, scales)?, row_major(gpu, biases)?);
    let (k, n) = p.inner_outer(&w.shape);
    let rows = out.size() / n.max(1) as usize;
    let y = alloc_out(gpu, out)?;
    if rows == 0 || n == 0 {
        return Ok(());
    }
    let tc = tensor_cores(p.dtype, p.bits, rows);
    let name = if tc {
        format!("qmv_tc_b{}_u{}", p.bits, tc_steps(gpu, n))
    } else {
        let tile = ROW_TILES.into_iter().find(|&t| t >= rows as i64).ok_or_else(|| internal("too many rows"))?;
        format!("qmv_b{}_m{tile}", p.bits)
    };
    let f = kernel(gpu, Family::QuantizedMatmul(p.dtype), &name)?;
    let args = vec![
        Arg::Ptr(ptr_of(&x)?),
        Arg::Ptr(ptr_of(&w)?),
        Arg::Ptr(ptr_of(&scales)?),
        Arg::Ptr(ptr_of(&biases)?),
        Arg::Ptr(y),
        Arg::I32(rows as i32),
        Arg::I32(n),
        Arg::I32(k),
        Arg::I32(p.group_size.trailing_zeros() as i32),
    ];
    if tc {
        return launch_dependent(gpu, f, (n as u32).div_ceil(16), (TC_WARPS * 32, 1), 1, args);
    }
    launch_dependent(gpu, f, (n as u32).div_ceil(ROWS_PER_BLOCK), (WARPS * 32, 1), 1, args)
}

/// Output rows per tile of `gather_qmm`'s kernels: the rows one product of x takes at most.
const GATHER_TILE: i64 = 8;
/// Warps of `gather_qmm`'s tensor-core blocks: experts' rows are short, so 4 warps load a
/// block's 16 rows in one round and twice as many blocks fit at once (see bench/results/).
const GATHER_TC_WARPS: u32 = 4;
/// Output rows at most that skip `gather_runs`, each output a tile (decoding a few tokens).
const DIRECT_ROWS: i64 = 64;

/// Whether a kernel covers this `gather_qmm` (inputs `[x, w, scales, biases, lhs, rhs]`): the
/// conditions of [`supports`] on each picked matrix, at most 2^31 output elements.
pub(crate) fn gather_supports(p: &QuantMatmulParams, inputs: &[Spec]) -> bool {
    let [x, w, scales, biases, lhs, _] = inputs else { return false };
    let (l, m) = (lhs.shape[0] as i64, x.shape[1] as i64);
    let n = p.inner_outer(&w.shape[1..]).1 as i64;
    p.mode == QuantMode::Affine
        && p.transpose
        && matches!(p.dtype, DType::F32 | DType::F16 | DType::BF16)
        && BITS.contains(&p.bits)
        && [x, scales, biases].iter().all(|s| s.dtype == p.dtype)
        && l * m * n.max(1) < i32::MAX as i64
        && l * m > 0
}

/// `gather_qmm` as [`gather_supports`] accepted it: `gather_runs` lists tiles of at most 8
/// output rows sharing an expert, then `gather_qmv_b{bits}` runs the products of each.
pub(crate) fn gather_eval(gpu: &Arc<Gpu>, p: &QuantMatmulParams, inputs: Vec<Operand>, out: &mut Output) -> Result<()> {
    let [x, w, scales, biases, lhs, rhs] = <[Operand; 6]>::try_from(inputs)
        .map_err(|_| internal("gather_qmm takes x, w, scales, biases and two index arrays"))?;
    let (x, w) = (aligned(gpu, x)?, aligned(gpu, w)?);
    let (scales, biases) = (row_major(gpu, scales)?, row_major(gpu, biases)?);
    let (lhs, rhs) = (row_major(gpu, lhs)?, row_major(gpu, rhs)?);
    let (k, n) = p.inner_outer(&w.shape[1..]);
    let (bx, m, l) = (x.shape[0] as i64, x.shape[1] as i64, lhs.shape[0] as i64);
    let y = alloc_out(gpu, out)?;
    if l * m == 0 || n == 0 {
        return Ok(());
    }
    let flags = index_flags(&lhs, &rhs);
    let family = Family::QuantizedMatmul(p.dtype);
    // Few rows: each output is its own tile (l of them), without listing them.
    let list = if m <= GATHER_TILE && l * m <= DIRECT_ROWS {
        None
    } else {
        Some(list_tiles(gpu, family, ptr_of(&rhs)?, flags, w.shape[0] as i64, l, m, GATHER_TILE)?)
    };
    let (tiles, count, bound) = list.as_ref().map_or((0, 0, l + 1), |t| (t.tiles, t.count, t.bound));
    let tc = matches!(p.dtype, DType::F16 | DType::BF16) && matches!(p.bits, 4 | 8);
    let (threads, per_block) = if tc { (GATHER_TC_WARPS * 32, 16) } else { (WARPS * 32, ROWS_PER_BLOCK) };
    let f = kernel(gpu, family, &format!("gather_qmv_b{}", p.bits))?;
    // Blocks loop over the items: as many as are resident at once, or fewer.
    let grid = super::row_grid(gpu, f, threads, (bound - 1) as u64 * (n as u64).div_ceil(per_block as u64), 1)?;
    let args = vec![
        Arg::Ptr(ptr_of(&x)?),
        Arg::Ptr(ptr_of(&w)?),
        Arg::Ptr(ptr_of(&scales)?),
        Arg::Ptr(ptr_of(&biases)?),
        Arg::Ptr(y),
        Arg::Ptr(ptr_of(&lhs)?),
        Arg::Ptr(ptr_of(&rhs)?),
        Arg::Ptr(tiles),
        Arg::Ptr(count),
        Arg::I32(l as i32),
        Arg::I32(flags),
        Arg::I64(bx),
        Arg::I64(w.shape[0] as i64),
        Arg::I32(m as i32),
        Arg::I32(n),
        Arg::I32(k),
        Arg::I32(p.group_size.trailing_zeros() as i32),
        Arg::I64(w.shape[1] as i64 * w.shape[2] as i64),
        Arg::I64(scales.shape[1] as i64 * scales.shape[2] as i64),
    ];
    launch_dependent(gpu, f, grid, (threads, 1), 1, args)
}
