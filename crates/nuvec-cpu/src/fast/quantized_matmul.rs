//! `quantized_matmul` without a dequantized copy of the weight: a few rows of it at a time are
//! dequantized (exactly as `dequantize` rounds them) into a buffer that stays in cache, then
//! multiplied in `f32`. Up to `DOT_ROWS` rows of `x` against `w[N, K]` run as dot products, one
//! task per block of weight rows; more rows, or `w[K, N]`, run blocks of the weight through
//! the matrix product.

use half::{bf16, f16};
use nuvec_core::fast::QuantMatmulParams;
use nuvec_core::primitive::QuantMode;
use nuvec_core::storage::{Data, HostBuffer, Operand, Output};
use nuvec_core::{DType, Result};
use rayon::prelude::*;

use super::elems;
use crate::elem::Float;
use crate::quantize::Packed;
use crate::{internal, matmul, sgemm, unsupported};

/// Rows of `x` at most that run as dot products against each weight row.
const DOT_ROWS: usize = 16;
/// Weight rows per task of the dot-product path.
const DOT_BLOCK: usize = 16;
/// Elements of `f32` per dequantized block of the matrix-product path (16 MiB): large enough
/// that each product amortises packing x and starting its threads.
const BLOCK_ELEMS: usize = 1 << 22;

/// The dtypes with a kernel: every float but `f64`, whose composition is exact enough.
pub(super) fn supports(d: DType) -> bool {
    matches!(d, DType::F32 | DType::F16 | DType::BF16)
}

/// Inputs `[x, w, scales, biases?]`, row-major, `x` already in the product's dtype.
pub(super) fn eval(p: &QuantMatmulParams, inputs: &[Operand], outputs: &mut [Output]) -> Result<()> {
    let out = outputs.first_mut().ok_or_else(|| internal("quantized_matmul without an output"))?;
    match p.dtype {
        DType::F32 => typed::<f32>(p, inputs, out),
        DType::F16 => typed::<f16>(p, inputs, out),
        DType::BF16 => typed::<bf16>(p, inputs, out),
        d => Err(unsupported(d)),
    }
}

fn typed<T: Float<Acc = f32> + bytemuck::Pod>(
    p: &QuantMatmulParams,
    inputs: &[Operand],
    out: &mut Output,
) -> Result<()> {
    let w_shape = &inputs[1].shape;
    let (k, n) = p.inner_outer(w_shape);
    let (k, n) = (k as usize, n as usize);
    let m = out.size().checked_div(n).unwrap_or(0);
    let packed = Packed::<T>::new(p.mode, p.group_size as usize, p.bits as u32, &inputs[1..])?;
    let x: Vec<f32> = elems::<T>(&inputs[0])?.iter().map(|v| v.to_acc()).collect();
    let mut y = vec![0f32; m * n];
    let gs = p.group_size as usize;
    let fused = p.dtype == DType::F32 && p.mode == QuantMode::Affine && matches!(p.bits, 4 | 8) && gs.is_multiple_of(8);
    if m > 0 && n > 0 && k > 0 {
        if p.transpose && m <= DOT_ROWS && fused {
            let words = elems::<u32>(&inputs[1])?;
            let (scales, biases) = (elems::<f32>(&inputs[2])?, elems::<f32>(&inputs[3])?);
            let w = Affine { words, scales, biases, bits: p.bits as usize, gs, k };
            affine_dots(&w, &x, &mut y, m, n);
        } else if p.transpose && m <= DOT_ROWS {
            dots(&packed, &x, &mut y, m, n, k, p.group_size as usize);
        } else {
            products(&packed, &x, &mut y, m, n, k, p);
        }
    }
    let mut buf = HostBuffer::uninit(m * n * size_of::<T>())?;
    buf.as_mut_slice::<T>().par_iter_mut().zip(y.par_iter()).for_each(|(o, &v)| *o = T::from_acc(v));
    out.data = Some(Data::from_host_buffer(&out.shape, buf));
    Ok(())
}

/// One weight row (of `k` elements, `k / gs` groups from group `row · k / gs`) into `buf`.
fn dequantize_row<T: Float<Acc = f32>>(packed: &Packed<T>, row: usize, k: usize, gs: usize, buf: &mut [f32]) {
    let groups = k / gs;
    for g in 0..groups {
        let dst = &mut buf[g * gs..(g + 1) * gs];
        packed.group(row * groups + g, |j, v| dst[j] = v.to_acc());
    }
}

/// `y = x · wᵀ` for few rows of `x`: each task dequantizes `DOT_BLOCK` weight rows and takes
/// their dot products with every row of `x`, writing `yᵀ`'s rows, which are then transposed.
#[allow(clippy::too_many_arguments)]
fn dots<T: Float<Acc = f32>>(packed: &Packed<T>, x: &[f32], y: &mut [f32], m: usize, n: usize, k: usize, gs: usize) {
    let mut yt = vec![0f32; n * m];
    yt.par_chunks_mut(DOT_BLOCK * m).enumerate().for_each_init(
        || vec![0f32; k],
        |row_buf, (b, yt)| {
            for (r, yt) in yt.chunks_mut(m).enumerate() {
                dequantize_row(packed, b * DOT_BLOCK + r, k, gs, row_buf);
                for (i, o) in yt.iter_mut().enumerate() {
                    *o = dot(&x[i * k..(i + 1) * k], row_buf);
                }
            }
        },
    );
    for (i, y) in y.chunks_mut(n).enumerate() {
        for (j, o) in y.iter_mut().enumerate() {
            *o = yt[j * m + i];
        }
    }
}

/// A `float32` affine weight `[N, K]` of 4 or 8 bits: packed words, a scale and a bias per
/// group of `gs`.
struct Affine<'a> {
    words: &'a [u32],
    scales: &'a [f32],
    biases: &'a [f32],
    bits: usize,
    gs: usize,
    k: usize,
}

/// `y = x · wᵀ` for few rows of `x` without a dequantized row: each group contributes
/// `scale · Σ q·x + bias · Σ x`, the integers unpacked in registers and the sums of `x` per
/// group computed once. Rounding differs from `dequantize` then a product only in the order
/// of the additions.
fn affine_dots(w: &Affine, x: &[f32], y: &mut [f32], m: usize, n: usize) {
    let (k, gs) = (w.k, w.gs);
    let groups = k / gs;
    let xsum: Vec<f32> = x.chunks(gs).map(|g| g.iter().sum()).collect();
    let words_per_row = k * w.bits / 32;
    let mut yt = vec![0f32; n * m];
    yt.par_chunks_mut(DOT_BLOCK * m).enumerate().for_each(|(b, yt)| {
        for (r, yt) in yt.chunks_mut(m).enumerate() {
            let row = b * DOT_BLOCK + r;
            let words = &w.words[row * words_per_row..(row + 1) * words_per_row];
            let (s, bias) = (&w.scales[row * groups..(row + 1) * groups], &w.biases[row * groups..(row + 1) * groups]);
            for (i, o) in yt.iter_mut().enumerate() {
                let xi = &x[i * k..(i + 1) * k];
                let xs = &xsum[i * groups..(i + 1) * groups];
                *o = row_dot(w.bits, words, xi, s, bias, xs, gs);
            }
        }
    });
    for (i, y) in y.chunks_mut(n).enumerate() {
        for (j, o) in y.iter_mut().enumerate() {
            *o = yt[j * m + i];
        }
    }
}

/// One weight row's product with `x`, compiled for AVX2 and FMA when the CPU has them (the
/// rayon task calls it, so the features must be on this function, not on a caller).
fn row_dot(bits: usize, words: &[u32], x: &[f32], s: &[f32], b: &[f32], xs: &[f32], gs: usize) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if crate::map::has_x86_v3() {
        // SAFETY: the features the function enables were detected on this CPU.
        return unsafe { row_dot_v3(bits, words, x, s, b, xs, gs) };
    }
    match bits {
        4 => affine_row::<4, false>(words, x, s, b, xs, gs),
        _ => affine_row::<8, false>(words, x, s, b, xs, gs),
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx,avx2,fma,f16c")]
unsafe fn row_dot_v3(bits: usize, words: &[u32], x: &[f32], s: &[f32], b: &[f32], xs: &[f32], gs: usize) -> f32 {
    match bits {
        4 => affine_row::<4, true>(words, x, s, b, xs, gs),
        _ => affine_row::<8, true>(words, x, s, b, xs, gs),
    }
}

/// Per group, eight lanes of `q·x`, eight elements at a time: one word of nibbles, or two
/// of bytes; `FMA` where the caller's target has fused multiply-adds.
#[inline(always)]
fn affine_row<const BITS: usize, const FMA: bool>(
    words: &[u32],
    x: &[f32],
    s: &[f32],
    b: &[f32],
    xs: &[f32],
    gs: usize,
) -> f32 {
    const { assert!(BITS == 4 || BITS == 8) };
    let words_per_8 = BITS / 4;
    let mask = (1u32 << BITS) - 1;
    let lanes_of = |w: &[u32], xe: &[f32], lanes: &mut [f32; 8]| {
        for l in 0..8 {
            let word = w[l * BITS / 32];
            let q = ((word >> ((l * BITS) % 32)) & mask) as f32;
            // `mul_add` is one instruction only where the caller enabled FMA (a call otherwise).
            lanes[l] = if FMA { q.mul_add(xe[l], lanes[l]) } else { lanes[l] + q * xe[l] };
        }
    };
    // Scaled group sums stay in eight lanes; one horizontal sum per row.
    let (mut acc, mut biased) = ([0f32; 8], 0f32);
    for (g, (wg, xg)) in words.chunks_exact(gs * BITS / 32).zip(x.chunks_exact(gs)).enumerate() {
        // Four sums of eight lanes, one per run of eight elements in 32: consecutive runs do not
        // wait for each other's additions (one sum made each wait a full add latency).
        let mut lanes = [[0f32; 8]; 4];
        let (w32, x32) = (wg.chunks_exact(4 * words_per_8), xg.chunks_exact(32));
        let (w_rest, x_rest) = (w32.remainder(), x32.remainder());
        for (w, xe) in w32.zip(x32) {
            for (u, lanes) in lanes.iter_mut().enumerate() {
                lanes_of(&w[u * words_per_8..], &xe[u * 8..], lanes);
            }
        }
        for (w, xe) in w_rest.chunks_exact(words_per_8).zip(x_rest.chunks_exact(8)) {
            lanes_of(w, xe, &mut lanes[0]);
        }
        for l in 0..8 {
            acc[l] += s[g] * ((lanes[0][l] + lanes[1][l]) + (lanes[2][l] + lanes[3][l]));
        }
        biased += b[g] * xs[g];
    }
    acc.iter().sum::<f32>() + biased
}

/// `Σ a·b` in sixteen independent lanes the compiler keeps in vector registers (`mul_add`
/// would be a library call without FMA in the target).
#[inline(always)]
fn dot(a: &[f32], b: &[f32]) -> f32 {
    const L: usize = 16;
    let mut lanes = [0f32; L];
    let (ca, cb) = (a.chunks_exact(L), b.chunks_exact(L));
    let tail: f32 = ca.remainder().iter().zip(cb.remainder()).map(|(x, y)| x * y).sum();
    for (u, v) in ca.zip(cb) {
        for l in 0..L {
            lanes[l] += u[l] * v[l];
        }
    }
    lanes.iter().sum::<f32>() + tail
}

/// Blocks of the weight, dequantized in parallel, through the matrix product: blocks of `w[N,
/// K]`'s rows give blocks of `yᵀ`'s rows (the block as the left operand, whose packing reads
/// it in order), copied into `y`'s columns; blocks of `w[K, N]`'s rows add their share of `y`.
fn products<T: Float<Acc = f32>>(
    packed: &Packed<T>,
    x: &[f32],
    y: &mut [f32],
    m: usize,
    n: usize,
    k: usize,
    p: &QuantMatmulParams,
) {
    let gs = p.group_size as usize;
    // Weight rows of `len` elements; a block holds `rows` of them.
    let (w_rows, len) = if p.transpose { (n, k) } else { (k, n) };
    let rows = (BLOCK_ELEMS / len).clamp(1, w_rows);
    let mut buf = vec![0f32; rows * len];
    let mut yt = if p.transpose { vec![0f32; rows * m] } else { Vec::new() };
    for r0 in (0..w_rows).step_by(rows) {
        let nb = rows.min(w_rows - r0);
        buf[..nb * len]
            .par_chunks_mut(len)
            .enumerate()
            .for_each(|(r, dst)| dequantize_row(packed, r0 + r, len, gs, dst));
        let mat = |ptr: *const f32, rs: usize, cs: usize| sgemm::Mat { ptr, rs: rs as isize, cs: cs as isize };
        // SAFETY: `x` is [m, k] and `buf` holds nb rows of `len`; the strides below name
        // elements inside them. The product writes `yt` ([nb, m], transpose) or every row of
        // `y` ([m, n], accumulating over blocks of k), allocations apart from `x` and `buf`.
        unsafe {
            if p.transpose {
                // yᵀ's rows from the block as the packed-friendly left operand (its rows are
                // contiguous), then into y's columns.
                let (a, b) = (mat(buf.as_ptr(), k, 1), mat(x.as_ptr(), 1, k));
                matmul::product_f32(nb, m, k, a, b, yt.as_mut_ptr(), m, false);
                for (i, y) in y.chunks_mut(n).enumerate() {
                    for (j, o) in y[r0..r0 + nb].iter_mut().enumerate() {
                        *o = yt[j * m + i];
                    }
                }
            } else {
                let (a, b) = (mat(x.as_ptr().add(r0), k, 1), mat(buf.as_ptr(), n, 1));
                matmul::product_f32(m, n, nb, a, b, y.as_mut_ptr(), n, r0 > 0);
            }
        }
    }
}
