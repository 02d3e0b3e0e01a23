//! `quantized_matmul` without a dequantized copy of the weight: a few rows of it at a time are
//! dequantized (exactly as `dequantize` rounds them) into a buffer that stays in cache, then
//! multiplied in `f32`. Up to `DOT_ROWS` rows of `x` against `w[N, K]` run as dot products, one
//! task per block of weight rows (up to `FUSED_ROWS` for 4- and 8-bit affine weights, which
//! are never dequantized); more rows, or `w[K, N]`, run blocks of the weight through the
//! matrix product.

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
/// Rows of `x` at most that the fused affine kernels take (their weight runs widened once
/// for four rows): beyond, dequantized blocks through the matrix product.
const FUSED_ROWS: usize = 64;
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
    let x: Vec<f32> = elems::<T>(&inputs[0])?.iter().map(|v| v.to_acc()).collect();
    let mut y = vec![0f32; m * n];
    let gs = p.group_size as usize;
    let affine = p.mode == QuantMode::Affine;
    let fused = p.dtype == DType::F32 && affine && matches!(p.bits, 4 | 8) && gs.is_multiple_of(8);
    if m > 0 && n > 0 && k > 0 {
        // Past DOT_ROWS only AVX-512 shares each widened weight run between rows of x.
        let most = if Isa::detected() == Isa::Avx512 { FUSED_ROWS } else { DOT_ROWS };
        if p.transpose && m <= most && fused {
            let words = elems::<u32>(&inputs[1])?;
            let (scales, biases) = (Groups::of(&inputs[2])?, Groups::of(&inputs[3])?);
            let w = Affine { words, scales, biases, bits: p.bits as usize, gs, k };
            affine_dots(&w, &x, &mut y, m, n);
        } else {
            // Scales and biases in another dtype than the product's are converted first.
            let converted;
            let packed = if affine && inputs[2].dtype != p.dtype {
                converted = (in_dtype::<T>(&inputs[2])?, in_dtype::<T>(&inputs[3])?);
                Packed::affine(gs, p.bits as u32, &inputs[1], &converted.0, &converted.1)?
            } else {
                Packed::<T>::new(p.mode, gs, p.bits as u32, &inputs[1..])?
            };
            if p.transpose && m <= DOT_ROWS {
                dots(&packed, &x, &mut y, m, n, k, gs);
            } else {
                products(&packed, &x, &mut y, m, n, k, p);
            }
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

/// The elements of a floating operand in `T`.
fn in_dtype<T: Float<Acc = f32>>(x: &Operand) -> Result<Vec<T>> {
    let from = |v: f32| T::from_acc(v);
    Ok(match x.dtype {
        DType::F32 => elems::<f32>(x)?.iter().map(|&v| from(v)).collect(),
        DType::F16 => elems::<f16>(x)?.iter().map(|v| from(v.to_f32())).collect(),
        DType::BF16 => elems::<bf16>(x)?.iter().map(|v| from(v.to_f32())).collect(),
        d => return Err(unsupported(d)),
    })
}

/// An affine weight `[N, K]` of 4 or 8 bits for `float32` products: packed words, a scale and a
/// bias per group of `gs`.
struct Affine<'a> {
    words: &'a [u32],
    scales: Groups<'a>,
    biases: Groups<'a>,
    bits: usize,
    gs: usize,
    k: usize,
}

/// Per-group scales or biases as the row kernels read them: `float32` in place, or a half
/// dtype (a GGUF's `float16`: half the bytes to read) converted a task's rows at a time.
#[derive(Clone, Copy)]
enum Groups<'a> {
    F32(&'a [f32]),
    F16(&'a [f16]),
    Bf16(&'a [bf16]),
}

impl<'a> Groups<'a> {
    fn of(x: &'a Operand) -> Result<Self> {
        Ok(match x.dtype {
            DType::F32 => Groups::F32(elems(x)?),
            DType::F16 => Groups::F16(elems(x)?),
            DType::BF16 => Groups::Bf16(elems(x)?),
            d => return Err(unsupported(d)),
        })
    }

    /// Where group `i` lies (perhaps past the end), for prefetching.
    fn at(self, i: usize) -> *const u8 {
        match self {
            Groups::F32(s) => s.as_ptr().wrapping_add(i).cast(),
            Groups::F16(s) => s.as_ptr().wrapping_add(i).cast(),
            Groups::Bf16(s) => s.as_ptr().wrapping_add(i).cast(),
        }
    }

    /// Groups `range` in `float32`: borrowed, or converted into `buf` with `isa`'s instructions.
    fn get<'b>(self, range: std::ops::Range<usize>, buf: &'b mut Vec<f32>, isa: Isa) -> &'b [f32]
    where
        'a: 'b,
    {
        let bits: &[u16] = match self {
            Groups::F32(s) => return &s[range],
            Groups::F16(s) => bytemuck::cast_slice(&s[range]),
            Groups::Bf16(s) => bytemuck::cast_slice(&s[range]),
        };
        let bf16 = matches!(self, Groups::Bf16(_));
        buf.resize(bits.len(), 0.0);
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `for_groups` picked an `isa` whose features this CPU has (F16C with AVX2).
        unsafe {
            match isa {
                Isa::Avx512 => return simd::widen_avx512(bits, bf16, buf),
                Isa::Avx2 => return simd::widen_avx2(bits, bf16, buf),
                Isa::Scalar => {}
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = isa;
        for (o, &h) in buf.iter_mut().zip(bits) {
            *o = if bf16 { bf16::from_bits(h).to_f32() } else { f16::from_bits(h).to_f32() };
        }
        buf
    }
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
    // Row `r`'s product with row `i` of x, from the row's scales and biases.
    let prefetch_ahead = |r: usize| {
        for a in [w.scales, w.biases] {
            let ahead = (r + PREFETCH_ROWS) * groups;
            prefetch(a.at(ahead));
            prefetch(a.at(ahead + groups - 1));
        }
    };
    let q = |r: usize| &bytes[r * bytes_per_row..(r + 1) * bytes_per_row];
    let row = |r: usize, i: usize, s: &[f32], bias: &[f32]| {
        prefetch_ahead(r);
        isa.row(w.bits, q(r), &xs[i * k..(i + 1) * k], s, gs, bias, &xsum[i * groups..(i + 1) * groups])
    };
    // A task's rows `r0..r0 + rows`, their scales and biases converted at once where needed
    // (a row's few are too few to convert alone).
    thread_local! {
        static BUFS: std::cell::RefCell<[Vec<f32>; 2]> = const { std::cell::RefCell::new([Vec::new(), Vec::new()]) };
    }
    let block = |r0: usize, rows: usize, out: &mut TaskFn| {
        BUFS.with_borrow_mut(|[sb, bb]| {
            let span = r0 * groups..(r0 + rows) * groups;
            out(w.scales.get(span.clone(), sb, isa), w.biases.get(span, bb, isa))
        })
    };
    if m == 1 {
        // Rows in pairs (sharing the loads of x), then the odd one.
        crate::pool::for_each_chunk(y, DOT_BLOCK, &|c, y| {
            let r0 = c * DOT_BLOCK;
            block(r0, y.len(), &mut |s, b| {
                let (s, b) = (|j: usize| &s[j * groups..][..groups], |j: usize| &b[j * groups..][..groups]);
                let pairs = y.len() / 2;
                for j in (0..2 * pairs).step_by(2) {
                    let r = r0 + j;
                    prefetch_ahead(r);
                    prefetch_ahead(r + 1);
                    let two = isa.rows2(w.bits, [q(r), q(r + 1)], &xs, [s(j), s(j + 1)], gs, [b(j), b(j + 1)], &xsum);
                    y[j..j + 2].copy_from_slice(&two);
                }
                if y.len() % 2 == 1 {
                    let j = y.len() - 1;
                    y[j] = row(r0 + j, 0, s(j), b(j));
                }
            });
        });
        return;
    }
    // Each weight row against every row of x, its runs widened once for several of them.
    let xrows: Vec<&[f32]> = xs.chunks_exact(k).collect();
    let xsums: Vec<&[f32]> = xsum.chunks_exact(groups).collect();
    let mut yt = vec![0f32; n * m];
    crate::pool::for_each_chunk(&mut yt, DOT_BLOCK * m, &|c, yt| {
        block(c * DOT_BLOCK, yt.len() / m, &mut |s, b| {
            let rows = s.chunks_exact(groups).zip(b.chunks_exact(groups));
            for (j, ((s, b), yt)) in rows.zip(yt.chunks_mut(m)).enumerate() {
                let r = c * DOT_BLOCK + j;
                prefetch_ahead(r);
                isa.rows_x(w.bits, q(r), &xrows, s, gs, b, &xsums, yt);
            }
        });
    });
    for (i, y) in y.chunks_mut(n).enumerate() {
        for (j, o) in y.iter_mut().enumerate() {
            *o = yt[j * m + i];
        }
    }
}

/// What a task does with its rows' scales and biases.
type TaskFn<'a> = dyn FnMut(&[f32], &[f32]) + 'a;

/// How far ahead of its reads a row product asks for the packed weight: the hardware's
/// prefetchers alone leave the products waiting on memory, and stop at page boundaries.
const PREFETCH_BYTES: usize = 3072;
/// How many rows ahead the scales and biases are asked for: a task's worth, since a task
/// converts its rows' at once.
const PREFETCH_ROWS: usize = DOT_BLOCK;

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

    /// [`Isa::row`] of two weight rows at once: AVX-512 loads `x` once for both.
    #[allow(clippy::too_many_arguments)]
    fn rows2(
        self,
        bits: usize,
        q: [&[u8]; 2],
        x: &[f32],
        s: [&[f32]; 2],
        gs: usize,
        b: [&[f32]; 2],
        xs: &[f32],
    ) -> [f32; 2] {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as `row`'s, for each of the two rows.
        unsafe {
            match (self, bits) {
                (Isa::Avx512, 4) => return simd::tile_avx512::<4, 2, 1>(q, [x], s, gs, b, [xs]).map(|[r]| r),
                (Isa::Avx512, _) => return simd::tile_avx512::<8, 2, 1>(q, [x], s, gs, b, [xs]).map(|[r]| r),
                _ => {}
            }
        }
        [0, 1].map(|i| self.row(bits, q[i], x, s[i], gs, b[i], xs))
    }

    /// [`Isa::row`] of one weight row against several rows of `x` (`x[i]` arranged, `xs[i]`
    /// its sums per group) into `out[i]`: AVX-512 widens each run of the weight once for four
    /// of them.
    #[allow(clippy::too_many_arguments)]
    fn rows_x(
        self,
        bits: usize,
        q: &[u8],
        x: &[&[f32]],
        s: &[f32],
        gs: usize,
        b: &[f32],
        xs: &[&[f32]],
        out: &mut [f32],
    ) {
        #[cfg(target_arch = "x86_64")]
        if self == Isa::Avx512 {
            for ((x, xs), out) in x.chunks(4).zip(xs.chunks(4)).zip(out.chunks_mut(4)) {
                // SAFETY: as `row`'s, for each row of `x`.
                unsafe {
                    match (bits, x, xs) {
                        (4, &[a, b2, c, d], &[sa, sb, sc, sd]) => out.copy_from_slice(
                            &simd::tile_avx512::<4, 1, 4>([q], [a, b2, c, d], [s], gs, [b], [sa, sb, sc, sd])[0],
                        ),
                        (_, &[a, b2, c, d], &[sa, sb, sc, sd]) => out.copy_from_slice(
                            &simd::tile_avx512::<8, 1, 4>([q], [a, b2, c, d], [s], gs, [b], [sa, sb, sc, sd])[0],
                        ),
                        (4, &[a, b2], &[sa, sb]) => {
                            out.copy_from_slice(&simd::tile_avx512::<4, 1, 2>([q], [a, b2], [s], gs, [b], [sa, sb])[0])
                        }
                        (_, &[a, b2], &[sa, sb]) => {
                            out.copy_from_slice(&simd::tile_avx512::<8, 1, 2>([q], [a, b2], [s], gs, [b], [sa, sb])[0])
                        }
                        _ => {
                            for ((o, x), xs) in out.iter_mut().zip(x).zip(xs) {
                                *o = self.row(bits, q, x, s, gs, b, xs);
                            }
                        }
                    }
                }
            }
            return;
        }
        for ((o, x), xs) in out.iter_mut().zip(x).zip(xs) {
            *o = self.row(bits, q, x, s, gs, b, xs);
        }
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
                (Isa::Avx512, 4) => return simd::tile_avx512::<4, 1, 1>([q], [x], [s], gs, [b], [xs])[0][0],
                (Isa::Avx512, _) => return simd::tile_avx512::<8, 1, 1>([q], [x], [s], gs, [b], [xs])[0][0],
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

    /// `R` weight rows against `M` rows of `x`: each load of `x` is shared by the `R` weight
    /// rows and each weight run is widened once for the `M` rows of `x`. Result `[i][j]` is
    /// weight row `i` against `x[j]`, the same additions in the same order whatever `R` and
    /// `M` are (bit for bit).
    #[target_feature(enable = "avx512f,avx2,fma")]
    pub(super) unsafe fn tile_avx512<const BITS: usize, const R: usize, const M: usize>(
        q: [&[u8]; R],
        x: [&[f32]; M],
        s: [&[f32]; R],
        gs: usize,
        b: [&[f32]; R],
        xs: [&[f32]; M],
    ) -> [[f32; M]; R] {
        let runs = gs * BITS / 128;
        let (q, x) = (q.map(<[u8]>::as_ptr), x.map(<[f32]>::as_ptr));
        let lut = _mm512_setr_ps(0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0, 11.0, 12.0, 13.0, 14.0, 15.0);
        // Group `g`'s `Σ q·x` of each pair of rows in sixteen lanes.
        let group = |g: usize| {
            let mut acc = [[_mm512_setzero_ps(); M]; R];
            for r in g * runs..(g + 1) * runs {
                if r % 4 == 0 {
                    for q in q {
                        super::prefetch(q.wrapping_add(r * 16 + super::PREFETCH_BYTES));
                    }
                }
                // SAFETY: run `r` of 16 bytes of each weight row and its 16 · 8 / BITS elements
                // of each row of `x` lie inside them (the caller's contract).
                unsafe {
                    if BITS == 4 {
                        let xv: [(__m512, __m512); M] =
                            x.map(|x| (_mm512_loadu_ps(x.add(r * 32)), _mm512_loadu_ps(x.add(r * 32 + 16))));
                        for (acc, q) in acc.iter_mut().zip(q) {
                            let v = _mm512_cvtepu8_epi32(_mm_loadu_si128(q.add(r * 16).cast()));
                            // The nibbles as indices into a table of 0..16 (a permute reads an
                            // index's low four bits): fewer µops than masking and converting.
                            let even = _mm512_permutexvar_ps(v, lut);
                            let odd = _mm512_permutexvar_ps(_mm512_srli_epi32::<4>(v), lut);
                            for (acc, (xe, xo)) in acc.iter_mut().zip(xv) {
                                *acc = _mm512_fmadd_ps(odd, xo, _mm512_fmadd_ps(even, xe, *acc));
                            }
                        }
                    } else {
                        let xv: [__m512; M] = x.map(|x| _mm512_loadu_ps(x.add(r * 16)));
                        for (acc, q) in acc.iter_mut().zip(q) {
                            let w = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128(q.add(r * 16).cast())));
                            for (acc, xv) in acc.iter_mut().zip(xv) {
                                *acc = _mm512_fmadd_ps(w, xv, *acc);
                            }
                        }
                    }
                }
            }
            acc
        };
        let (mut even, mut odd) = ([[_mm512_setzero_ps(); M]; R], [[_mm512_setzero_ps(); M]; R]);
        let groups = s[0].len();
        for g in 0..groups / 2 {
            let (ge, go) = (group(2 * g), group(2 * g + 1));
            for i in 0..R {
                let (se, so) = (_mm512_set1_ps(s[i][2 * g]), _mm512_set1_ps(s[i][2 * g + 1]));
                for j in 0..M {
                    even[i][j] = _mm512_fmadd_ps(ge[i][j], se, even[i][j]);
                    odd[i][j] = _mm512_fmadd_ps(go[i][j], so, odd[i][j]);
                }
            }
        }
        if groups % 2 == 1 {
            let ge = group(groups - 1);
            for i in 0..R {
                for j in 0..M {
                    even[i][j] = _mm512_fmadd_ps(ge[i][j], _mm512_set1_ps(s[i][groups - 1]), even[i][j]);
                }
            }
        }
        // The biases' share, sixteen groups at a time.
        let len = groups.min(xs.iter().map(|x| x.len()).min().unwrap_or(0));
        for g in (0..len).step_by(16) {
            let mask = (u32::MAX >> (32 - 16.min(len - g))) as u16;
            // SAFETY: the mask covers groups `g..len` only, which every row has.
            let xv: [__m512; M] = xs.map(|xs| unsafe { _mm512_maskz_loadu_ps(mask, xs.as_ptr().add(g)) });
            for i in 0..R {
                // SAFETY: as above.
                let bv = unsafe { _mm512_maskz_loadu_ps(mask, b[i].as_ptr().add(g)) };
                for j in 0..M {
                    odd[i][j] = _mm512_fmadd_ps(bv, xv[j], odd[i][j]);
                }
            }
        }
        std::array::from_fn(|i| std::array::from_fn(|j| _mm512_reduce_add_ps(_mm512_add_ps(even[i][j], odd[i][j]))))
    }

    /// `f16` (or, with `bf16`, `bf16`) bit patterns as `f32` into `out`, sixteen at a time.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn widen_avx512<'b>(bits: &[u16], bf16: bool, out: &'b mut [f32]) -> &'b [f32] {
        let one = |h: __m256i| match bf16 {
            true => _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(h))),
            false => _mm512_cvtph_ps(h),
        };
        let (whole, rest) = (bits.chunks_exact(16), bits.chunks_exact(16).remainder());
        for (h, o) in whole.zip(out.chunks_exact_mut(16)) {
            // SAFETY: both chunks hold sixteen elements.
            unsafe { _mm512_storeu_ps(o.as_mut_ptr(), one(_mm256_loadu_si256(h.as_ptr().cast()))) };
        }
        if !rest.is_empty() {
            let (mut h, mut o) = ([0u16; 16], [0f32; 16]);
            h[..rest.len()].copy_from_slice(rest);
            // SAFETY: local arrays of sixteen elements.
            unsafe { _mm512_storeu_ps(o.as_mut_ptr(), one(_mm256_loadu_si256(h.as_ptr().cast()))) };
            let at = bits.len() - rest.len();
            out[at..].copy_from_slice(&o[..rest.len()]);
        }
        out
    }

    /// [`widen_avx512`] eight at a time.
    #[target_feature(enable = "avx2,f16c")]
    pub(super) unsafe fn widen_avx2<'b>(bits: &[u16], bf16: bool, out: &'b mut [f32]) -> &'b [f32] {
        let one = |h: __m128i| match bf16 {
            true => _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(h))),
            false => _mm256_cvtph_ps(h),
        };
        let (whole, rest) = (bits.chunks_exact(8), bits.chunks_exact(8).remainder());
        for (h, o) in whole.zip(out.chunks_exact_mut(8)) {
            // SAFETY: both chunks hold eight elements.
            unsafe { _mm256_storeu_ps(o.as_mut_ptr(), one(_mm_loadu_si128(h.as_ptr().cast()))) };
        }
        if !rest.is_empty() {
            let (mut h, mut o) = ([0u16; 8], [0f32; 8]);
            h[..rest.len()].copy_from_slice(rest);
            // SAFETY: local arrays of eight elements.
            unsafe { _mm256_storeu_ps(o.as_mut_ptr(), one(_mm_loadu_si128(h.as_ptr().cast()))) };
            let at = bits.len() - rest.len();
            out[at..].copy_from_slice(&o[..rest.len()]);
        }
        out
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

    /// Two rows at once give each row's single-row result, bit for bit.
    #[test]
    fn row_pairs_equal_single_rows() {
        let mut seed = 3u64;
        let mut next = move || {
            seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            (seed >> 33) as u32
        };
        for isa in [Isa::Scalar, Isa::Avx2, Isa::Avx512].into_iter().filter(|&i| i <= Isa::detected()) {
            for (bits, gs, groups) in [(4, 32, 18), (4, 64, 5), (8, 32, 19), (8, 128, 2)] {
                let k = gs * groups;
                let q: Vec<u8> = (0..2 * k * bits / 8).map(|_| next() as u8).collect();
                let x: Vec<f32> = (0..k).map(|_| next() as f32 / u32::MAX as f32 - 0.5).collect();
                let s: Vec<f32> = (0..2 * groups).map(|_| next() as f32 / u32::MAX as f32).collect();
                let b: Vec<f32> = (0..2 * groups).map(|_| next() as f32 / u32::MAX as f32 - 0.5).collect();
                let xs: Vec<f32> = x.chunks(gs).map(|g| g.iter().sum()).collect();
                let x = isa.arrange(bits, &x);
                let (qr, sr, br) = (q.split_at(k * bits / 8), s.split_at(groups), b.split_at(groups));
                let two = isa.rows2(bits, [qr.0, qr.1], &x, [sr.0, sr.1], gs, [br.0, br.1], &xs);
                let one = [isa.row(bits, qr.0, &x, sr.0, gs, br.0, &xs), isa.row(bits, qr.1, &x, sr.1, gs, br.1, &xs)];
                assert_eq!(two, one, "{isa:?} bits {bits} group {gs}");
            }
        }
    }

    /// One weight row against several rows of x gives each row's single-row result, bit for
    /// bit, for every count of rows (the kernel takes four and two at once).
    #[test]
    fn rows_of_x_equal_single_rows() {
        let mut seed = 5u64;
        let mut next = move || {
            seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            (seed >> 33) as u32
        };
        for isa in [Isa::Scalar, Isa::Avx2, Isa::Avx512].into_iter().filter(|&i| i <= Isa::detected()) {
            for (bits, gs, groups) in [(4, 32, 18), (4, 64, 5), (8, 32, 19), (8, 128, 2)] {
                let k = gs * groups;
                let q: Vec<u8> = (0..k * bits / 8).map(|_| next() as u8).collect();
                let s: Vec<f32> = (0..groups).map(|_| next() as f32 / u32::MAX as f32).collect();
                let b: Vec<f32> = (0..groups).map(|_| next() as f32 / u32::MAX as f32 - 0.5).collect();
                for m in 1..=7 {
                    let x: Vec<Vec<f32>> =
                        (0..m).map(|_| (0..k).map(|_| next() as f32 / u32::MAX as f32 - 0.5).collect()).collect();
                    let sums: Vec<Vec<f32>> =
                        x.iter().map(|x| x.chunks(gs).map(|g| g.iter().sum()).collect()).collect();
                    let arranged: Vec<Vec<f32>> = x.iter().map(|x| isa.arrange(bits, x)).collect();
                    let (xr, sr): (Vec<&[f32]>, Vec<&[f32]>) =
                        (arranged.iter().map(Vec::as_slice).collect(), sums.iter().map(Vec::as_slice).collect());
                    let mut got = vec![0f32; m];
                    isa.rows_x(bits, &q, &xr, &s, gs, &b, &sr, &mut got);
                    let want: Vec<f32> = (0..m).map(|i| isa.row(bits, &q, xr[i], &s, gs, &b, sr[i])).collect();
                    assert_eq!(got, want, "{isa:?} bits {bits} group {gs} rows {m}");
                }
            }
        }
    }

    /// Half-precision scales widened by every kernel this CPU has, against `half`'s conversion,
    /// over lengths on both sides of a vector.
    #[test]
    fn groups_widen_exactly() {
        let values: Vec<f32> = (0..40).map(|i| (i as f32 - 17.5) * 0.37).chain([0.0, -0.0, 6e-8, 65504.0]).collect();
        let f16s: Vec<f16> = values.iter().map(|&v| f16::from_f32(v)).collect();
        let bf16s: Vec<bf16> = values.iter().map(|&v| bf16::from_f32(v)).collect();
        for isa in [Isa::Scalar, Isa::Avx2, Isa::Avx512].into_iter().filter(|&i| i <= Isa::detected()) {
            for len in [0, 1, 7, 8, 9, 15, 16, 17, 33, values.len()] {
                let mut buf = Vec::new();
                let got = Groups::F16(&f16s).get(0..len, &mut buf, isa).to_vec();
                let want: Vec<f32> = f16s[..len].iter().map(|h| h.to_f32()).collect();
                assert_eq!(got, want, "{isa:?} f16 len {len}");
                let got = Groups::Bf16(&bf16s).get(0..len, &mut buf, isa).to_vec();
                let want: Vec<f32> = bf16s[..len].iter().map(|h| h.to_f32()).collect();
                assert_eq!(got, want, "{isa:?} bf16 len {len}");
            }
        }
    }

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
