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
    match out.dtype {
        DType::F32 => gemm_batched::<f32>(&a, &b, buf.as_mut_slice(), &out.shape, read_dst, beta, alpha)?,
        DType::F64 => gemm_batched::<f64>(&a, &b, buf.as_mut_slice(), &out.shape, read_dst, beta as f64, alpha as f64)?,
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

fn gemm_batched<T: Elem + 'static>(
    a: &Operand,
    b: &Operand,
    dst: &mut [T],
    out_shape: &[i32],
    read_dst: bool,
    dst_scale: T,
    product_scale: T,
) -> Result<()> {
    let (xs, ys) = (host_slice::<T>(a)?, host_slice::<T>(b)?);
    let r = out_shape.len();
    let (m, n) = (out_shape[r - 2] as usize, out_shape[r - 1] as usize);
    let k = a.shape[r - 1] as usize;
    let (sa, sb) = (&a.data.layout.strides, &b.data.layout.strides);
    let batch = batches(a, b, out_shape);
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
                sa[r - 1],
                sa[r - 2],
                ys.as_ptr().offset(ob),
                sb[r - 1],
                sb[r - 2],
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
    if std::any::TypeId::of::<T>() == std::any::TypeId::of::<f32>() && m * n * k >= SGEMM_MIN && sgemm::available() {
        let beta = read_dst.then(|| dst_scale.to_f64() as f32);
        let alpha = product_scale.to_f64() as f32;
        for (chunk, &[oa, ob, _]) in dst.chunks_mut(m * n).zip(&batch) {
            let a = sgemm::Mat { ptr: xs.as_ptr().wrapping_offset(oa) as *const f32, rs: sa[r - 2], cs: sa[r - 1] };
            let b = sgemm::Mat { ptr: ys.as_ptr().wrapping_offset(ob) as *const f32, rs: sb[r - 2], cs: sb[r - 1] };
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
        for (chunk, &off) in dst.chunks_mut(m * n).zip(&batch) {
            run(chunk, off, par);
        }
    } else {
        dst.par_chunks_mut(m * n).zip(batch.par_iter()).for_each(|(chunk, &off)| run(chunk, off, Parallelism::None));
    }
    Ok(())
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
    gemm_batched::<f32>(&a32, &b32, &mut acc, out_shape, read_dst, dst_scale, product_scale)?;
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
