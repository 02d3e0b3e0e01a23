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
    // In parallel only when large (prefill): a decode step's few outputs stay on this thread.
    crate::strided::par_chunks(buf.as_mut_slice::<T>(), crate::strided::GRAIN, &|i, o| {
        let y = &y[i * crate::strided::GRAIN..];
        o.iter_mut().zip(y).for_each(|(o, &v)| *o = T::from_acc(v));
    });
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
    let isa = Isa::for_groups(w.bits, gs);
    let xsum: Vec<f32> = x.chunks(gs).map(|g| g.iter().sum()).collect();
    let xs = isa.arrange(w.bits, x);
    let bytes_per_row = k * w.bits / 8;
    let bytes: &[u8] = bytemuck::cast_slice(w.words);
    let row = |r: usize, i: usize| {
        let (s, bias) = (&w.scales[r * groups..(r + 1) * groups], &w.biases[r * groups..(r + 1) * groups]);
        let q = &bytes[r * bytes_per_row..(r + 1) * bytes_per_row];
        for a in [w.scales, w.biases] {
            let p = a.as_ptr().wrapping_add((r + PREFETCH_ROWS) * groups);
            prefetch(p.cast());
            prefetch(p.wrapping_add(groups - 1).cast());
        }
        isa.row(w.bits, q, &xs[i * k..(i + 1) * k], s, gs, bias, &xsum[i * groups..(i + 1) * groups])
    };
    if m == 1 {
        crate::pool::for_each_chunk(y, DOT_BLOCK, &|b, y| {
            for (r, o) in y.iter_mut().enumerate() {
                *o = row(b * DOT_BLOCK + r, 0);
            }
        });
        return;
    }
    let mut yt = vec![0f32; n * m];
    crate::pool::for_each_chunk(&mut yt, DOT_BLOCK * m, &|b, yt| {
        for (r, yt) in yt.chunks_mut(m).enumerate() {
            for (i, o) in yt.iter_mut().enumerate() {
                *o = row(b * DOT_BLOCK + r, i);
            }
        }
    });
    for (i, y) in y.chunks_mut(n).enumerate() {
        for (j, o) in y.iter_mut().enumerate() {
            *o = yt[j * m + i];
        }
    }
}

/// How far ahead of its reads a row product asks for the packed weight: the hardware's
/// prefetchers alone leave the products waiting on memory, and stop at page boundaries.
const PREFETCH_BYTES: usize = 3072;
/// How many rows ahead the scales and biases are asked for.
const PREFETCH_ROWS: usize = 8;

/// Asks for the cache line at `p`, which may lie past the end of its allocation.
#[inline(always)]
fn prefetch(p: *const u8) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch is a hint; it does not fault on any address.
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(p.cast())
    };
}

/// The instructions an affine row product runs on. The SIMD kernels widen a run of packed
/// bytes to 32-bit lanes at once; for 4 bits, the low nibbles are then a run's even elements
/// and the high ones its odd elements, so `x` is laid out to match once per product.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Debug)]
enum Isa {
    Scalar,
    /// AVX2 and FMA: runs of 8 bytes.
    Avx2,
    /// AVX-512F: runs of 16 bytes.
    Avx512,
}

impl Isa {
    /// The widest kernel this CPU has whose runs tile a group of `gs`.
    fn for_groups(bits: usize, gs: usize) -> Isa {
        let best = Isa::detected();
        if best == Isa::Avx512 && gs.is_multiple_of(Isa::Avx512.run_elems(bits)) {
            Isa::Avx512
        } else if best != Isa::Scalar && gs.is_multiple_of(Isa::Avx2.run_elems(bits)) {
            Isa::Avx2
        } else {
            Isa::Scalar
        }
    }

    /// The widest kernel this CPU has.
    fn detected() -> Isa {
        #[cfg(target_arch = "x86_64")]
        {
            static DETECTED: std::sync::OnceLock<Isa> = std::sync::OnceLock::new();
            *DETECTED.get_or_init(|| match crate::map::has_x86_v3() {
                true if std::is_x86_feature_detected!("avx512f") => Isa::Avx512,
                true => Isa::Avx2,
                false => Isa::Scalar,
            })
        }
        #[cfg(not(target_arch = "x86_64"))]
        Isa::Scalar
    }

    /// Elements of one run of packed bytes.
    fn run_elems(self, bits: usize) -> usize {
        let bytes = match self {
            Isa::Avx512 => 16,
            _ => 8,
        };
        bytes * 8 / bits
    }

    /// `x`'s rows as the kernel reads them: for 4 bits each run's even elements, then its odd.
    fn arrange(self, bits: usize, x: &[f32]) -> Vec<f32> {
        if self == Isa::Scalar || bits != 4 {
            return x.to_vec();
        }
        let run = self.run_elems(bits);
        let mut out = vec![0f32; x.len()];
        for (o, x) in out.chunks_exact_mut(run).zip(x.chunks_exact(run)) {
            let (even, odd) = o.split_at_mut(run / 2);
            for (j, pair) in x.chunks_exact(2).enumerate() {
                (even[j], odd[j]) = (pair[0], pair[1]);
            }
        }
        out
    }

    /// `Σ_g s[g] · Σ q·x + b[g] · xs[g]` over one weight row's packed bytes `q`, `x` as
    /// `arrange` laid it out and `xs`, the sums of `x` per group.
    #[allow(clippy::too_many_arguments)]
    fn row(self, bits: usize, q: &[u8], x: &[f32], s: &[f32], gs: usize, b: &[f32], xs: &[f32]) -> f32 {
        debug_assert_eq!(q.len() * 8, x.len() * bits);
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `for_groups` chose a kernel whose features this CPU has, and whose runs tile
        // every group; `q` holds `x.len()` elements of `bits`, and `s` a scale per group.
        unsafe {
            match (self, bits) {
                (Isa::Avx512, 4) => return simd::row_avx512::<4>(q, x, s, gs, b, xs),
                (Isa::Avx512, _) => return simd::row_avx512::<8>(q, x, s, gs, b, xs),
                (Isa::Avx2, 4) => return simd::row_avx2::<4>(q, x, s, gs, b, xs),
                (Isa::Avx2, _) => return simd::row_avx2::<8>(q, x, s, gs, b, xs),
                _ => {}
            }
        }
        let words: &[u32] = bytemuck::cast_slice(q);
        let biased = dot(b, xs);
        match bits {
            4 => affine_row::<4>(words, x, s, gs) + biased,
            _ => affine_row::<8>(words, x, s, gs) + biased,
        }
    }
}

/// The affine row products in AVX2 and AVX-512 registers: a run of packed bytes widened to
/// 32-bit lanes, converted and multiplied into a group's sum, which its scale multiplies into
/// one of two row sums (alternating, so that consecutive groups do not wait on each other).
#[cfg(target_arch = "x86_64")]
mod simd {
    use std::arch::x86_64::*;

    #[target_feature(enable = "avx512f,avx2,fma")]
    pub(super) unsafe fn row_avx512<const BITS: usize>(
        q: &[u8],
        x: &[f32],
        s: &[f32],
        gs: usize,
        b: &[f32],
        xs: &[f32],
    ) -> f32 {
        let runs = gs * BITS / 128;
        let (q, x) = (q.as_ptr(), x.as_ptr());
        let low = _mm512_set1_epi32(0xF);
        // Group `g`'s `Σ q·x` in sixteen lanes.
        let group = |g: usize| {
            let mut acc = _mm512_setzero_ps();
            for r in g * runs..(g + 1) * runs {
                if r % 4 == 0 {
                    super::prefetch(q.wrapping_add(r * 16 + super::PREFETCH_BYTES));
                }
                // SAFETY: run `r` of 16 bytes and its 16 · 8 / BITS elements of `x` lie inside
                // the row (the caller's contract).
                unsafe {
                    let v = _mm512_cvtepu8_epi32(_mm_loadu_si128(q.add(r * 16).cast()));
                    if BITS == 4 {
                        let (even, odd) = (_mm512_and_si512(v, low), _mm512_srli_epi32::<4>(v));
                        acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(even), _mm512_loadu_ps(x.add(r * 32)), acc);
                        acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(odd), _mm512_loadu_ps(x.add(r * 32 + 16)), acc);
                    } else {
                        acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(v), _mm512_loadu_ps(x.add(r * 16)), acc);
                    }
                }
            }
            acc
        };
        let (mut even, mut odd) = (_mm512_setzero_ps(), _mm512_setzero_ps());
        let pairs = s.len() / 2;
        for g in 0..pairs {
            even = _mm512_fmadd_ps(group(2 * g), _mm512_set1_ps(s[2 * g]), even);
            odd = _mm512_fmadd_ps(group(2 * g + 1), _mm512_set1_ps(s[2 * g + 1]), odd);
        }
        if s.len() % 2 == 1 {
            even = _mm512_fmadd_ps(group(2 * pairs), _mm512_set1_ps(s[2 * pairs]), even);
        }
        // The biases' share, sixteen groups at a time.
        let len = b.len().min(xs.len());
        for g in (0..len).step_by(16) {
            let mask = (u32::MAX >> (32 - 16.min(len - g))) as u16;
            // SAFETY: the mask covers groups `g..len` only.
            let (bv, xv) = unsafe {
                (_mm512_maskz_loadu_ps(mask, b.as_ptr().add(g)), _mm512_maskz_loadu_ps(mask, xs.as_ptr().add(g)))
            };
            odd = _mm512_fmadd_ps(bv, xv, odd);
        }
        _mm512_reduce_add_ps(_mm512_add_ps(even, odd))
    }

    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn row_avx2<const BITS: usize>(
        q: &[u8],
        x: &[f32],
        s: &[f32],
        gs: usize,
        b: &[f32],
        xs: &[f32],
    ) -> f32 {
        let runs = gs * BITS / 64;
        let (q, x) = (q.as_ptr(), x.as_ptr());
        let low = _mm256_set1_epi32(0xF);
        // Group `g`'s `Σ q·x` in eight lanes, from two sums.
        let group = |g: usize| {
            let mut acc = [_mm256_setzero_ps(); 2];
            for r in g * runs..(g + 1) * runs {
                if r % 8 == 0 {
                    super::prefetch(q.wrapping_add(r * 8 + super::PREFETCH_BYTES));
                }
                // SAFETY: run `r` of 8 bytes and its 8 · 8 / BITS elements of `x` lie inside the
                // row (the caller's contract).
                unsafe {
                    let v = _mm256_cvtepu8_epi32(_mm_loadl_epi64(q.add(r * 8).cast()));
                    if BITS == 4 {
                        let (even, odd) = (_mm256_and_si256(v, low), _mm256_srli_epi32::<4>(v));
                        acc[0] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(even), _mm256_loadu_ps(x.add(r * 16)), acc[0]);
                        acc[1] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(odd), _mm256_loadu_ps(x.add(r * 16 + 8)), acc[1]);
                    } else {
                        acc[r & 1] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(v), _mm256_loadu_ps(x.add(r * 8)), acc[r & 1]);
                    }
                }
            }
            _mm256_add_ps(acc[0], acc[1])
        };
        let (mut even, mut odd) = (_mm256_setzero_ps(), _mm256_setzero_ps());
        let pairs = s.len() / 2;
        for g in 0..pairs {
            even = _mm256_fmadd_ps(group(2 * g), _mm256_set1_ps(s[2 * g]), even);
            odd = _mm256_fmadd_ps(group(2 * g + 1), _mm256_set1_ps(s[2 * g + 1]), odd);
        }
        if s.len() % 2 == 1 {
            even = _mm256_fmadd_ps(group(2 * pairs), _mm256_set1_ps(s[2 * pairs]), even);
        }
        // The biases' share, eight groups at a time, then the rest.
        let (bc, xc) = (b.chunks_exact(8), xs.chunks_exact(8));
        let rest: f32 = bc.remainder().iter().zip(xc.remainder()).map(|(b, x)| b * x).sum();
        for (bv, xv) in bc.zip(xc) {
            // SAFETY: each chunk holds eight values.
            let (bv, xv) = unsafe { (_mm256_loadu_ps(bv.as_ptr()), _mm256_loadu_ps(xv.as_ptr())) };
            odd = _mm256_fmadd_ps(bv, xv, odd);
        }
        let v = _mm256_add_ps(even, odd);
        let v = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
        let v = _mm_add_ps(v, _mm_movehl_ps(v, v));
        _mm_cvtss_f32(_mm_add_ss(v, _mm_movehdup_ps(v))) + rest
    }
}

/// The portable row product: per group, eight lanes of `q·x`, eight elements at a time (one
/// word of nibbles, or two of bytes), in four sums so that consecutive runs of eight do not
/// wait on one addition chain.
fn affine_row<const BITS: usize>(words: &[u32], x: &[f32], s: &[f32], gs: usize) -> f32 {
    const { assert!(BITS == 4 || BITS == 8) };
    let words_per_8 = BITS / 4;
    let mask = (1u32 << BITS) - 1;
    let lanes_of = |w: &[u32], xe: &[f32], lanes: &mut [f32; 8]| {
        for l in 0..8 {
            let word = w[l * BITS / 32];
            lanes[l] += ((word >> ((l * BITS) % 32)) & mask) as f32 * xe[l];
        }
    };
    let mut acc = [0f32; 8];
    for (g, (wg, xg)) in words.chunks_exact(gs * BITS / 32).zip(x.chunks_exact(gs)).enumerate() {
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
    }
    acc.iter().sum::<f32>()
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Every kernel this CPU has against float64, whichever `for_groups` would pick: the
    /// suite's products reach only the widest.
    #[test]
    fn row_kernels_match_float64() {
        let mut seed = 7u64;
        let mut next = move || {
            seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            (seed >> 33) as u32
        };
        let isas = [Isa::Scalar, Isa::Avx2, Isa::Avx512];
        // Groups on both sides of a vector of them (the biases' share).
        let cases =
            [4, 8].into_iter().flat_map(|b| [32, 64, 128].into_iter().flat_map(move |g| [(b, g, 3), (b, g, 19)]));
        for (bits, gs, groups) in cases {
            {
                let k = groups * gs;
                let q: Vec<u8> = (0..k * bits / 8).map(|_| next() as u8).collect();
                let x: Vec<f32> = (0..k).map(|_| next() as f32 / u32::MAX as f32 - 0.5).collect();
                let s: Vec<f32> = (0..k / gs).map(|_| next() as f32 / u32::MAX as f32 + 0.5).collect();
                let b: Vec<f32> = (0..k / gs).map(|_| next() as f32 / u32::MAX as f32 - 0.5).collect();
                let xs: Vec<f32> = x.chunks(gs).map(|g| g.iter().sum()).collect();
                let value = |j: usize| match bits {
                    4 => (q[j / 2] >> (4 * (j % 2))) & 0xF,
                    _ => q[j],
                } as f64;
                let weight = |j: usize| s[j / gs] as f64 * value(j) + b[j / gs] as f64;
                let want: f64 = (0..k).map(|j| weight(j) * x[j] as f64).sum();
                let bound: f64 = (0..k).map(|j| (weight(j) * x[j] as f64).abs()).sum();
                for isa in isas.into_iter().filter(|&i| i <= Isa::detected()) {
                    if isa != Isa::Scalar && !gs.is_multiple_of(isa.run_elems(bits)) {
                        continue;
                    }
                    let got = isa.row(bits, &q, &isa.arrange(bits, &x), &s, gs, &b, &xs) as f64;
                    assert!((got - want).abs() <= 1e-6 * bound, "{isa:?} bits {bits} group {gs}: {got} vs {want}");
                }
            }
        }
    }
}
