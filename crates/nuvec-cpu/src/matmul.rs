//! Matrix products on the `gemm` crate (f32, f64, f16; bf16 through f32), with a plain loop
//! for integers.

use gemm::Parallelism;
use half::{bf16, f16};
use nuvec_core::shape::row_major_strides;
use nuvec_core::storage::{Data, HostBuffer, Operand, Output};
use nuvec_core::{DType, Result};
use rayon::prelude::*;

use crate::elem::{Elem, Num};
use crate::strided::Rows;
use crate::{copy, sgemm};
use crate::{for_int, host_slice, internal, unsupported};

/// `alpha * a @ b + beta * c` for batched `[.., M, K] @ [.., K, N]`; `c` is `None` for a plain
/// product.
pub fn eval(a: Operand, b: Operand, c: Option<Operand>, alpha: f32, beta: f32, out: &mut Output) -> Result<()> {
    // The destination starts as `c` (row-major) when there is one.
    let mut buf = match c {
        Some(c) => {
            let mut tmp = Output { shape: out.shape.clone(), dtype: out.dtype, data: None };
            copy::copy(c, &mut tmp)?;
            let data = tmp.data.ok_or_else(|| internal("copy produced no output"))?;
            let mut storage = std::sync::Arc::try_unwrap(data.storage).map_err(|_| internal("fresh copy is shared"))?;
            let host = storage.host_buffer_mut().ok_or_else(|| internal("copy not on the host"))?;
            std::mem::replace(host, HostBuffer::uninit(0)?)
        }
        None => HostBuffer::uninit(out.size() * out.dtype.size())?,
    };
    let read_dst =
        beta != 0.0 && !buf.is_empty() && matches!(out.dtype, DType::F16 | DType::BF16 | DType::F32 | DType::F64);
    let batch = batches(&a, &b, &out.shape);
    match out.dtype {
        DType::F32 => gemm_batched::<f32>(&a, &b, buf.as_mut_slice(), &out.shape, &batch, read_dst, beta, alpha)?,
        DType::F64 => {
            gemm_batched::<f64>(&a, &b, buf.as_mut_slice(), &out.shape, &batch, read_dst, beta as f64, alpha as f64)?
        }
        // Half precision accumulates in f32 (gemm's f16 kernels may accumulate in f16).
        DType::F16 => via_f32::<f16>(&a, &b, &mut buf, &out.shape, read_dst, beta, alpha)?,
        DType::BF16 => via_f32::<bf16>(&a, &b, &mut buf, &out.shape, read_dst, beta, alpha)?,
        d if d.is_integer() => for_int!(d, T => naive::<T>(&a, &b, buf.as_mut_slice(), &out.shape))?,
        d => return Err(unsupported(d)),
    }
    out.data = Some(Data::from_host_buffer(&out.shape, buf));
    Ok(())
}

/// Batch offsets of `a`, `b` and the output, in elements.
fn batches(a: &Operand, b: &Operand, out_shape: &[i32]) -> Vec<[isize; 3]> {
    let nb = out_shape.len() - 2;
    let out_strides = row_major_strides(out_shape);
    let rows = Rows::new(
        &out_shape[..nb],
        [&a.data.layout.strides[..nb], &b.data.layout.strides[..nb], &out_strides[..nb]],
        [a.data.layout.offset, b.data.layout.offset, 0],
    );
    let mut v = Vec::with_capacity(rows.count * rows.inner);
    rows.for_each_element(0, rows.count * rows.inner, |o| v.push(o));
    v
}

/// Products at least this large (m·n·k) take `sgemm` when it runs here: below it, starting its
/// threads costs more than it gains.
const SGEMM_MIN: usize = 1 << 24;

/// The products of the matrices of `a` and `b` at each `batch` entry's offsets (in elements,
/// the third the output's), with the strides of their last two axes; `out_shape` ends `[M, N]`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn gemm_batched<T: Elem + 'static>(
    a: &Operand,
    b: &Operand,
    dst: &mut [T],
    out_shape: &[i32],
    batch: &[[isize; 3]],
    read_dst: bool,
    dst_scale: T,
    product_scale: T,
) -> Result<()> {
    let (xs, ys) = (host_slice::<T>(a)?, host_slice::<T>(b)?);
    let r = out_shape.len();
    let (m, n) = (out_shape[r - 2] as usize, out_shape[r - 1] as usize);
    let k = a.shape[a.shape.len() - 1] as usize;
    let (sa, sb) = (&a.data.layout.strides[a.shape.len() - 2..], &b.data.layout.strides[b.shape.len() - 2..]);
    if m == 0 || n == 0 {
        return Ok(());
    }
    // Large products use every thread inside gemm; many small ones run side by side.
    let big = m * n * k >= 1 << 18;
    let threads = rayon::current_num_threads();
    let run = |dst: &mut [T], [oa, ob, _]: [isize; 3], par: Parallelism| {
        // SAFETY: `dst` holds the m×n row-major block; the offsets and strides of `a` and `b`
        // come from their layouts, which keep every element of these operands inside their
        // buffers (`host_slice` returns the whole buffer), so every pointer gemm forms is in
        // bounds. The three buffers do not overlap: `dst` is a fresh allocation.
        unsafe {
            gemm::gemm(
                m,
                n,
                k,
                dst.as_mut_ptr(),
                1,
                n as isize,
                read_dst,
                xs.as_ptr().offset(oa),
                sa[1],
                sa[0],
                ys.as_ptr().offset(ob),
                sb[1],
                sb[0],
                dst_scale,
                product_scale,
                false,
                false,
                false,
                par,
            )
        }
    };
    if k == 0 {
        if read_dst {
            for v in dst.iter_mut() {
                *v = T::from_f64(v.to_f64() * dst_scale.to_f64());
            }
        } else {
            dst.fill(T::zeroed());
        }
        return Ok(());
    }
    let is_f32 = std::any::TypeId::of::<T>() == std::any::TypeId::of::<f32>();
    let strides = ([sa[0], sa[1]], [sb[0], sb[1]]);
    if let Some(form) = FewRows::form(strides.0, strides.1).filter(|_| is_f32 && m <= FEW_ROWS) {
        // SAFETY: T is f32 (checked above), so the casts keep the element type and length.
        let f = |s: &[T]| unsafe { std::slice::from_raw_parts(s.as_ptr() as *const f32, s.len()) };
        // SAFETY: as above, for the destination, borrowed mutably once.
        let dst = unsafe { std::slice::from_raw_parts_mut(dst.as_mut_ptr() as *mut f32, dst.len()) };
        let beta = read_dst.then(|| dst_scale.to_f64() as f32);
        let p = FewRows {
            a: f(xs),
            b: f(ys),
            m,
            n,
            k,
            sa: strides.0,
            sb: strides.1,
            form,
            alpha: product_scale.to_f64() as f32,
            beta,
        };
        p.run(dst, batch);
        return Ok(());
    }
    if is_f32 && m * n * k >= SGEMM_MIN && sgemm::available() {
        let beta = read_dst.then(|| dst_scale.to_f64() as f32);
        let alpha = product_scale.to_f64() as f32;
        for (chunk, &[oa, ob, _]) in dst.chunks_mut(m * n).zip(batch) {
            let a = sgemm::Mat { ptr: xs.as_ptr().wrapping_offset(oa) as *const f32, rs: sa[0], cs: sa[1] };
            let b = sgemm::Mat { ptr: ys.as_ptr().wrapping_offset(ob) as *const f32, rs: sb[0], cs: sb[1] };
            // SAFETY: T is f32 (checked above), so the casts keep the element type; the
            // operands' layouts keep every element they name inside their buffers, which stay
            // borrowed and unchanged for the call; `chunk` is this batch's m×n block of a fresh
            // buffer; k > 0 (the empty product returned above); AVX2 and FMA are present.
            unsafe {
                let c = chunk.as_mut_ptr() as *mut f32;
                sgemm::sgemm(sgemm::Product { m, n, k, a, b, c, ldc: n, alpha, beta }, threads)
            };
        }
        return Ok(());
    }
    if big || batch.len() == 1 {
        let par = if big { Parallelism::Rayon(threads) } else { Parallelism::None };
        for (chunk, &off) in dst.chunks_mut(m * n).zip(batch) {
            run(chunk, off, par);
        }
    } else {
        dst.par_chunks_mut(m * n).zip(batch.par_iter()).for_each(|(chunk, &off)| run(chunk, off, Parallelism::None));
    }
    Ok(())
}

/// Rows of `a` at most that take [`FewRows`].
const FEW_ROWS: usize = 8;

/// `f32` products of few rows (a decoding step's attention over its cache), without the packing
/// that a general product starts with and that costs more than such a product: each output is a
/// dot product of a row of `a` with a column of `b` laid out along `k` (`q·kᵀ`), or each output
/// row sums rows of `b` (`p·v`). `sa`: `a`'s strides (row, k); `sb`: `b`'s (k, column).
struct FewRows<'a> {
    a: &'a [f32],
    b: &'a [f32],
    m: usize,
    n: usize,
    k: usize,
    sa: [isize; 2],
    sb: [isize; 2],
    /// How `b` is read, from the strides ([`FewRows::form`]).
    form: Form,
    alpha: f32,
    beta: Option<f32>,
}

/// How [`FewRows`] reads `b`.
#[derive(Clone, Copy, PartialEq)]
enum Form {
    /// Columns of `b` and rows of `a` are contiguous: dot products.
    Dots,
    /// Rows of `b` are contiguous: sums of scaled rows.
    Rows,
}

impl FewRows<'_> {
    /// The form for these strides, if either fits (non-negative strides only).
    fn form(sa: [isize; 2], sb: [isize; 2]) -> Option<Form> {
        if sa.iter().chain(&sb).any(|&s| s < 0) {
            None
        } else if sb[0] == 1 && sa[1] == 1 {
            Some(Form::Dots)
        } else if sb[1] == 1 {
            Some(Form::Rows)
        } else {
            None
        }
    }

    /// Every batch (`[a, b, _]` offsets) into its `m × n` block of `dst`, in parallel when
    /// there is enough work to share.
    fn run(&self, dst: &mut [f32], batch: &[[isize; 3]]) {
        let block = self.m * self.n;
        let one = |i: usize, out: &mut [f32]| {
            crate::map::simd(few_rows_product, (self, batch[i][0] as usize, batch[i][1] as usize, out))
        };
        if batch.len() > 1 && block * self.k * batch.len() >= 1 << 16 {
            crate::pool::for_each_chunk(dst, block, &one);
        } else {
            dst.chunks_mut(block).enumerate().for_each(|(i, out)| one(i, out));
        }
    }

    #[inline(always)]
    fn product(&self, oa: usize, ob: usize, out: &mut [f32]) {
        let (k, n) = (self.k, self.n);
        let [ra, ka] = self.sa.map(|s| s as usize);
        let [kb, cb] = self.sb.map(|s| s as usize);
        let scaled = |o: &mut f32, v: f32| *o = self.alpha * v + self.beta.map_or(0.0, |b| b * *o);
        match self.form {
            Form::Dots => {
                for (i, row) in out.chunks_mut(n).enumerate() {
                    let x = &self.a[oa + i * ra..][..k];
                    for (j, o) in row.iter_mut().enumerate() {
                        scaled(o, dot(x, &self.b[ob + j * cb..][..k]));
                    }
                }
            }
            Form::Rows => {
                let mut acc = vec![0f32; n];
                for (i, row) in out.chunks_mut(n).enumerate() {
                    acc.fill(0.0);
                    for kk in 0..k {
                        let (x, y) = (self.a[oa + i * ra + kk * ka], &self.b[ob + kk * kb..][..n]);
                        acc.iter_mut().zip(y).for_each(|(a, &y)| *a += x * y);
                    }
                    row.iter_mut().zip(&acc).for_each(|(o, &v)| scaled(o, v));
                }
            }
        }
    }
}

/// One batch of a [`FewRows`] product, compiled for the widest vectors (`map::simd`).
#[inline(always)]
fn few_rows_product((p, oa, ob, out): (&FewRows, usize, usize, &mut [f32])) {
    p.product(oa, ob, out)
}

/// `Σ a·b` in sixteen independent lanes the compiler keeps in vector registers, summed as a
/// tree (a vector's halves, then theirs) rather than lane by lane.
#[inline(always)]
pub(crate) fn dot(a: &[f32], b: &[f32]) -> f32 {
    const L: usize = 16;
    let mut lanes = [0f32; L];
    let (ca, cb) = (a.chunks_exact(L), b.chunks_exact(L));
    let tail: f32 = ca.remainder().iter().zip(cb.remainder()).map(|(x, y)| x * y).sum();
    for (u, v) in ca.zip(cb) {
        for l in 0..L {
            lanes[l] += u[l] * v[l];
        }
    }
    let mut w = L;
    while w > 1 {
        w /= 2;
        for l in 0..w {
            lanes[l] += lanes[l + w];
        }
    }
    lanes[0] + tail
}

/// `C = A·B` (or `C += A·B` with `accumulate`) in `f32` for A `[m, k]` and B `[k, n]` given by
/// strides and C row-major at row stride `ldc`: `sgemm` where it runs and pays, else `gemm` on
/// rayon's threads.
///
/// # Safety
/// Every element the shapes and strides name is inside its buffer; C's rows overlap neither A
/// nor B and are not touched elsewhere during the call.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn product_f32(
    m: usize,
    n: usize,
    k: usize,
    a: sgemm::Mat,
    b: sgemm::Mat,
    c: *mut f32,
    ldc: usize,
    accumulate: bool,
) {
    if m == 0 || n == 0 || k == 0 {
        return;
    }
    if m * n * k >= SGEMM_MIN && sgemm::available() {
        let beta = accumulate.then_some(1.0);
        let p = sgemm::Product { m, n, k, a, b, c, ldc, alpha: 1.0, beta };
        // SAFETY: the caller's contract; AVX2 and FMA are present and k > 0.
        unsafe { sgemm::sgemm(p, rayon::current_num_threads()) };
        return;
    }
    let par = if m * n * k >= 1 << 18 { Parallelism::Rayon(rayon::current_num_threads()) } else { Parallelism::None };
    // SAFETY: the caller's contract.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            c,
            1,
            ldc as isize,
            accumulate,
            a.ptr,
            a.cs,
            a.rs,
            b.ptr,
            b.cs,
            b.rs,
            1.0f32,
            1.0f32,
            false,
            false,
            false,
            par,
        )
    }
}

/// Half-precision products: widen both operands to f32, multiply, round back.
fn via_f32<H: Elem + crate::elem::Float<Acc = f32>>(
    a: &Operand,
    b: &Operand,
    buf: &mut HostBuffer,
    out_shape: &[i32],
    read_dst: bool,
    dst_scale: f32,
    product_scale: f32,
) -> Result<()> {
    let widen = |x: &Operand| -> Result<Operand> {
        let mut o = Output { shape: x.shape.clone(), dtype: DType::F32, data: None };
        copy::astype(x.clone(), &mut o)?;
        let data = o.data.ok_or_else(|| internal("cast produced no output"))?;
        Ok(Operand { shape: x.shape.clone(), dtype: DType::F32, data, donated: false })
    };
    let (a32, b32) = (widen(a)?, widen(b)?);
    let mut acc: Vec<f32> = buf.as_slice::<H>().iter().map(|v| v.to_acc()).collect();
    let batch = batches(&a32, &b32, out_shape);
    gemm_batched::<f32>(&a32, &b32, &mut acc, out_shape, &batch, read_dst, dst_scale, product_scale)?;
    buf.as_mut_slice::<H>().par_iter_mut().zip(acc.par_iter()).for_each(|(o, &v)| *o = H::from_acc(v));
    Ok(())
}

/// Integer products: wrapping arithmetic in the element type.
fn naive<T: Num>(a: &Operand, b: &Operand, dst: &mut [T], out_shape: &[i32]) -> Result<()> {
    let (xs, ys) = (host_slice::<T>(a)?, host_slice::<T>(b)?);
    let r = out_shape.len();
    let (m, n) = (out_shape[r - 2] as usize, out_shape[r - 1] as usize);
    let k = a.shape[r - 1] as usize;
    let (sa, sb) = (&a.data.layout.strides, &b.data.layout.strides);
    for (chunk, [oa, ob, _]) in dst.chunks_mut((m * n).max(1)).zip(batches(a, b, out_shape)) {
        for i in 0..m {
            for j in 0..n {
                let mut acc = T::zero();
                for l in 0..k {
                    let x = xs[(oa + i as isize * sa[r - 2] + l as isize * sa[r - 1]) as usize];
                    let y = ys[(ob + l as isize * sb[r - 2] + j as isize * sb[r - 1]) as usize];
                    acc = Num::add(acc, Num::mul(x, y));
                }
                chunk[i * n + j] = acc;
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Both forms of [`FewRows`], with and without `beta`, against float64 loops over the same
    /// strides (a transposed cache's columns, a cache's rows, a broadcast batch).
    #[test]
    fn few_rows_match_float64() {
        let mut seed = 11u64;
        let mut next = move || {
            seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((seed >> 33) as f32 / u32::MAX as f32 - 0.25) * 4.0
        };
        for (m, n, k) in [(1, 1, 1), (1, 37, 64), (3, 200, 64), (8, 19, 33), (2, 64, 130)] {
            let a: Vec<f32> = (0..2 * m * k + 5).map(|_| next()).collect();
            let b: Vec<f32> = (0..2 * n * k + 3).map(|_| next()).collect();
            // Column j of b at j·k (dots), or row kk of b at kk·n (rows); a's rows at i·k.
            for (sb, form) in [([1, k as isize], Form::Dots), ([n as isize, 1], Form::Rows)] {
                let sa = [k as isize, 1];
                assert!(FewRows::form(sa, sb).is_some_and(|f| f == form || (n == 1 && k == 1)));
                for beta in [None, Some(0.5f32)] {
                    let batch = [[0, 0, 0], [(m * k) as isize, 0, 0], [3, (n * k) as isize, 0]];
                    let init: Vec<f32> = (0..batch.len() * m * n).map(|_| next()).collect();
                    let mut dst = init.clone();
                    FewRows { a: &a, b: &b, m, n, k, sa, sb, form, alpha: 0.75, beta }.run(&mut dst, &batch);
                    for (bi, &[oa, ob, _]) in batch.iter().enumerate() {
                        for i in 0..m {
                            for j in 0..n {
                                let at = |v: &[f32], o: isize, s: [isize; 2], r: usize, c: usize| {
                                    v[(o + r as isize * s[0] + c as isize * s[1]) as usize] as f64
                                };
                                let sum: f64 = (0..k).map(|kk| at(&a, oa, sa, i, kk) * at(&b, ob, sb, kk, j)).sum();
                                let o = bi * m * n + i * n + j;
                                let want = 0.75 * sum + beta.map_or(0.0, |b| b as f64 * init[o] as f64);
                                let tol =
                                    1e-5 * (1.0 + (0..k).map(|kk| at(&a, oa, sa, i, kk).abs() * 4.0).sum::<f64>());
                                assert!(
                                    (dst[o] as f64 - want).abs() <= tol,
                                    "{m}x{n}x{k} {bi} ({i},{j}): {} vs {want}",
                                    dst[o]
                                );
                            }
                        }
                    }
                }
            }
        }
    }
}
