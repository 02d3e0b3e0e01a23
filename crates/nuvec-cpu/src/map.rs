//! Element-wise maps over one, two or three operands: the shared driver of unary, binary,
//! select and cast kernels.
//!
//! Operands that share one dense layout (or are broadcast scalars) run as a flat loop over the
//! buffer, split across threads and compiled for the best SIMD level at run time; the output
//! keeps that layout, and a donated input is written in place. Anything else walks the
//! strided layouts into a row-major output.
//!
//! Only the loops over elements are generic over the element types and the operation; the
//! parallel splitting and the strided walk behind them (`strided::par_chunks`,
//! `strided::par_rows`) are compiled once, which keeps the hundreds of dtype and operation
//! instances of these maps cheap to compile.

use std::any::TypeId;
use std::sync::Arc;

use crate::elem::Elem;
use crate::strided::{GRAIN, Rows, par_chunks, par_rows};
use crate::{host_slice, internal};
use nuvec_core::Result;
use nuvec_core::storage::{Data, HostBuffer, Layout, Operand, Output};

/// How one operand is read in the flat path.
#[derive(Clone, Copy)]
enum Flat {
    /// One value for every element.
    Scalar,
    /// Element `i` of the dense range.
    Dense,
}

/// The common dense layout of the operands, if they have one.
fn flat_plan(ops: &[&Operand]) -> Option<(Vec<Flat>, Option<Layout>)> {
    let mut layout: Option<&Layout> = None;
    let mut plan = Vec::with_capacity(ops.len());
    for op in ops {
        let l = &op.data.layout;
        if op.size() > 1 && l.strides.iter().all(|&s| s == 0) {
            plan.push(Flat::Scalar);
            continue;
        }
        if op.size() <= 1 {
            plan.push(Flat::Scalar);
            continue;
        }
        if !l.flags.contiguous {
            return None;
        }
        match layout {
            None => layout = Some(l),
            Some(first) if first.strides == l.strides => {}
            Some(_) => return None,
        }
        plan.push(Flat::Dense);
    }
    // The output keeps the operands' strides, at offset 0.
    Some((plan, layout.map(|l| Layout { strides: l.strides.clone(), offset: 0, flags: l.flags })))
}

/// The dense range of `op`'s elements as a slice (its whole span for a flat operand).
fn dense<T: Elem>(op: &Operand, n: usize) -> Result<&[T]> {
    let s = host_slice::<T>(op)?;
    let start = op.data.layout.offset;
    s.get(start..start + n).ok_or_else(|| internal("operand shorter than its layout"))
}

/// The single value of a scalar-like operand.
fn scalar<T: Elem>(op: &Operand) -> Result<T> {
    let s = host_slice::<T>(op)?;
    s.get(op.data.layout.offset).copied().ok_or_else(|| internal("empty scalar operand"))
}

/// Whether `A` and `U` are one element type. The in-place paths sit behind `const { same() }`,
/// known when a map is instantiated, so that maps between different types do not compile them.
const fn same<A: Elem, U: Elem>() -> bool {
    A::DTYPE as u8 == U::DTYPE as u8
}

/// Runs `kernel(args)` compiled for AVX2 and FMA when this CPU has them.
///
/// `kernel` must be a named `#[inline(always)]` function, not a closure: a closure's body is
/// optimised for the baseline target before it could be inlined into the feature-enabled frame,
/// so its loops stay scalar.
#[inline(always)]
pub fn simd<A, R>(kernel: impl FnOnce(A) -> R, args: A) -> R {
    #[cfg(target_arch = "x86_64")]
    if has_x86_v3() {
        // SAFETY: the features `x86_v3` enables were detected on this CPU.
        return unsafe { x86_v3(kernel, args) };
    }
    kernel(args)
}

/// Defines `$simd(args)`: `$kernel(args)` compiled with `x86_v3`'s features where the CPU has
/// them. The kernel is called directly inside a `#[target_feature]` function; through
/// [`simd`]'s generic `FnOnce` some kernels (attention's, the RMS norm) stayed on the
/// baseline target (SSE).
macro_rules! simd_kernel {
    ($simd:ident => $kernel:ident($args:ty)) => {
        fn $simd(args: $args) {
            #[cfg(target_arch = "x86_64")]
            {
                #[target_feature(enable = "avx,avx2,fma,f16c")]
                unsafe fn v3(args: $args) {
                    $kernel(args)
                }
                if $crate::map::has_x86_v3() {
                    // SAFETY: the features were detected on this CPU.
                    return unsafe { v3(args) };
                }
            }
            $kernel(args)
        }
    };
    ($simd:ident => $kernel:ident<$t:ident: $bound:path>($args:ty)) => {
        #[allow(clippy::type_complexity)]
        fn $simd<$t: $bound>(args: $args) {
            #[cfg(target_arch = "x86_64")]
            {
                #[target_feature(enable = "avx,avx2,fma,f16c")]
                #[allow(clippy::type_complexity)]
                unsafe fn v3<$t: $bound>(args: $args) {
                    $kernel(args)
                }
                if $crate::map::has_x86_v3() {
                    // SAFETY: the features were detected on this CPU.
                    return unsafe { v3(args) };
                }
            }
            $kernel(args)
        }
    };
}
pub(crate) use simd_kernel;

/// Whether this CPU has the features `x86_v3` enables (AVX2, FMA, F16C).
#[cfg(target_arch = "x86_64")]
pub(crate) fn has_x86_v3() -> bool {
    std::is_x86_feature_detected!("avx2")
        && std::is_x86_feature_detected!("fma")
        && std::is_x86_feature_detected!("f16c")
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx,avx2,fma,f16c")]
unsafe fn x86_v3<A, R>(kernel: impl FnOnce(A) -> R, args: A) -> R {
    kernel(args)
}

/// Rows at least this long take the contiguous kernels below when every operand steps by 1 or 0
/// within a row (broadcast rows and columns, slices of whole rows); shorter rows keep the
/// strided walk, whose per-row cost is lower.
const CONTIGUOUS_ROW: usize = 16;

/// Whether a strided walk's rows are contiguous or broadcast in every input: inner strides of
/// 1 or 0 and rows of at least [`CONTIGUOUS_ROW`] elements.
fn contiguous_rows<const K: usize>(rows: &Rows<K>) -> bool {
    rows.inner >= CONTIGUOUS_ROW && rows.inner_strides[1..].iter().all(|&s| s == 0 || s == 1)
}

/// One row of an operand for the contiguous kernels: `n` elements from `at`, or the one there
/// when it is broadcast along the row (`DENSE` false).
#[inline(always)]
fn run_of<T, const DENSE: bool>(xs: &[T], at: isize, n: usize) -> &[T] {
    &xs[at as usize..at as usize + if DENSE { n } else { 1 }]
}

/// `o = f(x, y)` over a row of operands each contiguous (`DA`, `DB`) or one broadcast value.
#[inline(always)]
fn row2<A: Elem, B: Elem, U: Elem, F: Fn(A, B) -> U, const DA: bool, const DB: bool>(
    (o, x, y, f): (&mut [U], &[A], &[B], F),
) {
    for (i, o) in o.iter_mut().enumerate() {
        *o = f(x[if DA { i } else { 0 }], y[if DB { i } else { 0 }]);
    }
}

/// `o = f(x, y, z)` over a row of operands each contiguous or one broadcast value.
#[inline(always)]
fn row3<A: Elem, B: Elem, C: Elem, U: Elem, F: Fn(A, B, C) -> U, const DA: bool, const DB: bool, const DC: bool>(
    (o, x, y, z, f): (&mut [U], &[A], &[B], &[C], F),
) {
    for (i, o) in o.iter_mut().enumerate() {
        *o = f(x[if DA { i } else { 0 }], y[if DB { i } else { 0 }], z[if DC { i } else { 0 }]);
    }
}

/// The strided walk of `map2` with contiguous or broadcast rows, each row one vectorised loop.
fn rows2<A: Elem, B: Elem, U: Elem, const DA: bool, const DB: bool>(
    rows: &Rows<3>,
    dst: &mut [U],
    xs: &[A],
    ys: &[B],
    f: impl Fn(A, B) -> U + Sync + Send + Copy,
) {
    let inner = rows.inner;
    par_rows(rows, dst, &|dst, offs| {
        for (o, off) in dst.chunks_mut(inner).zip(offs) {
            let (x, y) = (run_of::<A, DA>(xs, off[1], inner), run_of::<B, DB>(ys, off[2], inner));
            simd(row2::<A, B, U, _, DA, DB>, (o, x, y, f));
        }
    });
}

/// The strided walk of `map3` with contiguous or broadcast rows.
fn rows3<A: Elem, B: Elem, C: Elem, U: Elem, const DA: bool, const DB: bool, const DC: bool>(
    rows: &Rows<4>,
    dst: &mut [U],
    (xs, ys, zs): (&[A], &[B], &[C]),
    f: impl Fn(A, B, C) -> U + Sync + Send + Copy,
) {
    let inner = rows.inner;
    par_rows(rows, dst, &|dst, offs| {
        for (o, off) in dst.chunks_mut(inner).zip(offs) {
            let x = run_of::<A, DA>(xs, off[1], inner);
            let (y, z) = (run_of::<B, DB>(ys, off[2], inner), run_of::<C, DC>(zs, off[3], inner));
            simd(row3::<A, B, C, U, _, DA, DB, DC>, (o, x, y, z, f));
        }
    });
}

/// `v = f(v)` over a slice whose element type is the output's.
#[inline(always)]
fn map_in_place<A: Elem, U: Elem, F: Fn(A) -> U>((c, f): (&mut [A], F)) {
    for v in c.iter_mut() {
        *v = bytemuck::cast::<U, A>(f(*v));
    }
}

/// `o = f(a)` elementwise.
#[inline(always)]
fn map_slice<A: Elem, U: Elem, F: Fn(A) -> U>((o, a, f): (&mut [U], &[A], F)) {
    for (o, &a) in o.iter_mut().zip(a) {
        *o = f(a);
    }
}

/// `o = f(x, y)` elementwise.
#[inline(always)]
fn zip_slice<A: Elem, B: Elem, U: Elem, F: Fn(A, B) -> U>((o, x, y, f): (&mut [U], &[A], &[B], F)) {
    for ((o, &x), &y) in o.iter_mut().zip(x).zip(y) {
        *o = f(x, y);
    }
}

/// `x = f(x, y)` elementwise, `x` holding the output's type.
#[inline(always)]
fn zip_in_place<D: Elem, S: Elem, U: Elem, F: Fn(D, S) -> U>((x, y, f): (&mut [D], &[S], F)) {
    for (x, &y) in x.iter_mut().zip(y) {
        *x = bytemuck::cast::<U, D>(f(*x, y));
    }
}

/// `out[i] = f(x[i])`.
pub fn map1<A: Elem, U: Elem>(x: Operand, out: &mut Output, f: impl Fn(A) -> U + Sync + Send + Copy) -> Result<()> {
    let n = out.size();
    if n == 0 {
        return empty::<U>(out);
    }
    if let Some((plan, layout)) = flat_plan(&[&x]) {
        let layout = layout.unwrap_or_else(|| Layout::row_major(&out.shape));
        if let Flat::Scalar = plan[0] {
            let v = f(scalar::<A>(&x)?);
            return fill(out, v);
        }
        // In place: the only holder of the input gave its buffer.
        if const { same::<A, U>() } && x.donated && TypeId::of::<A>() == TypeId::of::<U>() {
            let start = x.data.layout.offset;
            let mut data = x.data.clone();
            drop(x);
            if let Some(buf) = Arc::get_mut(&mut data.storage).and_then(|s| s.host_buffer_mut()) {
                let s = &mut buf.as_mut_slice::<A>()[start..start + n];
                par_chunks(s, GRAIN, &|_, c| simd(map_in_place, (c, f)));
                out.data = Some(data);
                return Ok(());
            }
            return flat1(
                &Operand { shape: out.shape.clone(), dtype: A::DTYPE, data, donated: false },
                n,
                layout,
                out,
                f,
            );
        }
        return flat1(&x, n, layout, out, f);
    }
    let mut buf = HostBuffer::uninit(n * size_of::<U>())?;
    let xs = host_slice::<A>(&x)?;
    let out_strides = nuvec_core::shape::row_major_strides(&out.shape);
    let rows = Rows::new(&out.shape, [&out_strides, &x.data.layout.strides], [0, x.data.layout.offset]);
    let (inner, s) = (rows.inner, rows.inner_strides[1]);
    par_rows(&rows, buf.as_mut_slice::<U>(), &|dst, offs| {
        for (dst, off) in dst.chunks_mut(inner).zip(offs) {
            let mut p = off[1];
            for d in dst.iter_mut() {
                *d = f(xs[p as usize]);
                p += s;
            }
        }
    });
    out.data = Some(Data::from_host_buffer(&out.shape, buf));
    Ok(())
}

fn flat1<A: Elem, U: Elem>(
    x: &Operand,
    n: usize,
    layout: Layout,
    out: &mut Output,
    f: impl Fn(A) -> U + Sync + Send + Copy,
) -> Result<()> {
    let xs = dense::<A>(x, n)?;
    let mut buf = HostBuffer::uninit(n * size_of::<U>())?;
    par_chunks(buf.as_mut_slice::<U>(), GRAIN, &|i, o| {
        let a = &xs[i * GRAIN..i * GRAIN + o.len()];
        simd(map_slice, (o, a, f))
    });
    out.data = Some(Data { storage: Arc::new(nuvec_core::storage::Storage::host(buf)), layout });
    Ok(())
}

/// An output with no elements.
pub fn empty<U: Elem>(out: &mut Output) -> Result<()> {
    out.data = Some(Data::from_host_buffer(&out.shape, HostBuffer::uninit(0)?));
    let _ = size_of::<U>();
    Ok(())
}

/// An output of `n` copies of `v` (row-major).
pub fn fill<U: Elem>(out: &mut Output, v: U) -> Result<()> {
    let n = out.size();
    let mut buf = HostBuffer::uninit(n * size_of::<U>())?;
    par_chunks(buf.as_mut_slice::<U>(), GRAIN, &|_, c| c.fill(v));
    out.data = Some(Data::from_host_buffer(&out.shape, buf));
    Ok(())
}

/// `out[i] = f(a[i], b[i])`.
pub fn map2<A: Elem, B: Elem, U: Elem>(
    a: Operand,
    b: Operand,
    out: &mut Output,
    f: impl Fn(A, B) -> U + Sync + Send + Copy,
) -> Result<()> {
    let n = out.size();
    if n == 0 {
        return empty::<U>(out);
    }
    if let Some((plan, layout)) = flat_plan(&[&a, &b]) {
        let layout = layout.unwrap_or_else(|| Layout::row_major(&out.shape));
        return match (plan[0], plan[1]) {
            (Flat::Scalar, Flat::Scalar) => fill(out, f(scalar::<A>(&a)?, scalar::<B>(&b)?)),
            (Flat::Dense, Flat::Scalar) => {
                let bv = scalar::<B>(&b)?;
                map1::<A, U>(a, out, move |x| f(x, bv))
            }
            (Flat::Scalar, Flat::Dense) => {
                let av = scalar::<A>(&a)?;
                map1::<B, U>(b, out, move |y| f(av, y))
            }
            (Flat::Dense, Flat::Dense) => flat2(a, b, n, layout, out, f),
        };
    }
    let mut buf = HostBuffer::uninit(n * size_of::<U>())?;
    let (xs, ys) = (host_slice::<A>(&a)?, host_slice::<B>(&b)?);
    let out_strides = nuvec_core::shape::row_major_strides(&out.shape);
    let rows = Rows::new(
        &out.shape,
        [&out_strides, &a.data.layout.strides, &b.data.layout.strides],
        [0, a.data.layout.offset, b.data.layout.offset],
    );
    if contiguous_rows(&rows) {
        let dst = buf.as_mut_slice::<U>();
        match (rows.inner_strides[1] == 1, rows.inner_strides[2] == 1) {
            (true, true) => rows2::<A, B, U, true, true>(&rows, dst, xs, ys, f),
            (true, false) => rows2::<A, B, U, true, false>(&rows, dst, xs, ys, f),
            (false, true) => rows2::<A, B, U, false, true>(&rows, dst, xs, ys, f),
            (false, false) => rows2::<A, B, U, false, false>(&rows, dst, xs, ys, f),
        }
        out.data = Some(Data::from_host_buffer(&out.shape, buf));
        return Ok(());
    }
    let (inner, sa, sb) = (rows.inner, rows.inner_strides[1], rows.inner_strides[2]);
    par_rows(&rows, buf.as_mut_slice::<U>(), &|dst, offs| {
        for (dst, off) in dst.chunks_mut(inner).zip(offs) {
            let (mut pa, mut pb) = (off[1], off[2]);
            for d in dst.iter_mut() {
                *d = f(xs[pa as usize], ys[pb as usize]);
                pa += sa;
                pb += sb;
            }
        }
    });
    out.data = Some(Data::from_host_buffer(&out.shape, buf));
    Ok(())
}

fn flat2<A: Elem, B: Elem, U: Elem>(
    a: Operand,
    b: Operand,
    n: usize,
    layout: Layout,
    out: &mut Output,
    f: impl Fn(A, B) -> U + Sync + Send + Copy,
) -> Result<()> {
    // Write in place into an input that was donated and has the output's type.
    let (a, b) = if const { same::<A, U>() } {
        match in_place(a, &b, n, out, f)? {
            None => return Ok(()),
            Some(a) => (a, b),
        }
    } else {
        (a, b)
    };
    let (b, a) = if const { same::<B, U>() } {
        match in_place(b, &a, n, out, move |y: B, x: A| f(x, y))? {
            None => return Ok(()),
            Some(b) => (b, a),
        }
    } else {
        (b, a)
    };
    let (xs, ys) = (dense::<A>(&a, n)?, dense::<B>(&b, n)?);
    let mut buf = HostBuffer::uninit(n * size_of::<U>())?;
    par_chunks(buf.as_mut_slice::<U>(), GRAIN, &|i, o| {
        let (x, y) = (&xs[i * GRAIN..i * GRAIN + o.len()], &ys[i * GRAIN..i * GRAIN + o.len()]);
        simd(zip_slice, (o, x, y, f))
    });
    out.data = Some(Data { storage: Arc::new(nuvec_core::storage::Storage::host(buf)), layout });
    Ok(())
}

/// `dst[i] = f(dst[i], src[i])` in `dst`'s buffer when `dst` was donated and holds the output
/// type; gives `dst` back otherwise.
fn in_place<D: Elem, S: Elem, U: Elem>(
    dst: Operand,
    src: &Operand,
    n: usize,
    out: &mut Output,
    f: impl Fn(D, S) -> U + Sync + Send + Copy,
) -> Result<Option<Operand>> {
    if !dst.donated || TypeId::of::<D>() != TypeId::of::<U>() {
        return Ok(Some(dst));
    }
    let ys = dense::<S>(src, n)?;
    let start = dst.data.layout.offset;
    let mut data = dst.data.clone();
    drop(dst);
    let Some(buf) = Arc::get_mut(&mut data.storage).and_then(|s| s.host_buffer_mut()) else {
        return Ok(Some(Operand { shape: out.shape.clone(), dtype: D::DTYPE, data, donated: false }));
    };
    let xs = &mut buf.as_mut_slice::<D>()[start..start + n];
    par_chunks(xs, GRAIN, &|i, x| {
        let y = &ys[i * GRAIN..i * GRAIN + x.len()];
        simd(zip_in_place, (x, y, f))
    });
    out.data = Some(data);
    Ok(None)
}

/// `out[i] = f(a[i], b[i], c[i])` (select); strided walk into a row-major output.
pub fn map3<A: Elem, B: Elem, C: Elem, U: Elem>(
    a: Operand,
    b: Operand,
    c: Operand,
    out: &mut Output,
    f: impl Fn(A, B, C) -> U + Sync + Send + Copy,
) -> Result<()> {
    let n = out.size();
    let mut buf = HostBuffer::uninit(n * size_of::<U>())?;
    let (xs, ys, zs) = (host_slice::<A>(&a)?, host_slice::<B>(&b)?, host_slice::<C>(&c)?);
    let out_strides = nuvec_core::shape::row_major_strides(&out.shape);
    let rows = Rows::new(
        &out.shape,
        [&out_strides, &a.data.layout.strides, &b.data.layout.strides, &c.data.layout.strides],
        [0, a.data.layout.offset, b.data.layout.offset, c.data.layout.offset],
    );
    if contiguous_rows(&rows) {
        let (dst, ops) = (buf.as_mut_slice::<U>(), (xs, ys, zs));
        let s = rows.inner_strides;
        match (s[1] == 1, s[2] == 1, s[3] == 1) {
            (true, true, true) => rows3::<A, B, C, U, true, true, true>(&rows, dst, ops, f),
            (true, true, false) => rows3::<A, B, C, U, true, true, false>(&rows, dst, ops, f),
            (true, false, true) => rows3::<A, B, C, U, true, false, true>(&rows, dst, ops, f),
            (true, false, false) => rows3::<A, B, C, U, true, false, false>(&rows, dst, ops, f),
            (false, true, true) => rows3::<A, B, C, U, false, true, true>(&rows, dst, ops, f),
            (false, true, false) => rows3::<A, B, C, U, false, true, false>(&rows, dst, ops, f),
            (false, false, true) => rows3::<A, B, C, U, false, false, true>(&rows, dst, ops, f),
            (false, false, false) => rows3::<A, B, C, U, false, false, false>(&rows, dst, ops, f),
        }
        out.data = Some(Data::from_host_buffer(&out.shape, buf));
        return Ok(());
    }
    let (inner, s) = (rows.inner, rows.inner_strides);
    par_rows(&rows, buf.as_mut_slice::<U>(), &|dst, offs| {
        for (dst, off) in dst.chunks_mut(inner).zip(offs) {
            let (mut pa, mut pb, mut pc) = (off[1], off[2], off[3]);
            for d in dst.iter_mut() {
                *d = f(xs[pa as usize], ys[pb as usize], zs[pc as usize]);
                pa += s[1];
                pb += s[2];
                pc += s[3];
            }
        }
    });
    out.data = Some(Data::from_host_buffer(&out.shape, buf));
    Ok(())
}
