//! Binary maps and `where` (`kernels/binary.cuh`): a contiguous vectorised kernel (both
//! operands dense alike, or one a scalar) and a strided one per op and input dtype.

use std::sync::Arc;

use cudarc::driver::sys::CUdeviceptr;
use nuvec_core::primitive::BinaryOp;
use nuvec_core::primitive::elementwise::widened_pair;
use nuvec_core::storage::{Data, Layout, Operand, Output};
use nuvec_core::{DType, Result};

use crate::driver::Gpu;
use crate::kernels::{Family, Source, ctype};
use crate::launch::{Arg, Dims};
use crate::operand::{
    Cost, aligned, alloc, alloc_out, dense, dense_output, kernel, launch_1d, launch_map, ptr_of, row_major, scalar_like,
};

/// Whether the binary module of `d` has `op` (the ops core sends with inputs of dtype `d`).
pub fn has_binary(op: BinaryOp, d: DType) -> bool {
    op.compute_dtype(d) == Some(d) && !(d == DType::Complex64 && op == BinaryOp::ArcTan2)
}

/// The module of input dtype `d`: `binary_{op}_c` (`mode` 0: both dense, 1: `a` a scalar, 2:
/// `b` a scalar) and `binary_{op}_s` for each op it has.
pub(crate) fn source(d: DType) -> String {
    let mut s = Source::new(&["binary.cuh"]);
    let t = ctype(d);
    for op in BinaryOp::ALL.into_iter().filter(|&op| has_binary(op, d)) {
        let (n, u) = (op.name(), ctype(op.output_dtype(d)));
        s.map_kernel(bounded(op), format!(
            "binary_{n}_c(const {t}* a, const {t}* b, {u}* out, u64 n, int mode) {{ binary_contig<{t}, {u}>(a, b, out, n, mode, Bin_{n}()); }}"
        ));
        s.kernel(format!(
            "binary_{n}_s(const {t}* a, const {t}* b, {u}* out, u64 n, Dims d) {{ binary_strided<{t}, {u}>(a, b, out, n, d, Bin_{n}()); }}"
        ));
    }
    s.finish()
}

/// The module of half-precision dtype `h` beside float32: `binary_{op}_{hf,fh}_{c,s}` (the
/// half operand first or second; contiguous with binary_contig's modes, or strided) for each
/// op float32 has.
pub(crate) fn widened_source(h: DType) -> String {
    let mut s = Source::new(&["binary.cuh"]);
    let t = ctype(h);
    for op in BinaryOp::ALL.into_iter().filter(|&op| has_binary(op, DType::F32)) {
        let (n, u) = (op.name(), ctype(op.output_dtype(DType::F32)));
        for (order, ta, tb) in [("hf", t, "float"), ("fh", "float", t)] {
            s.map_kernel(bounded(op), format!(
                "binary_{n}_{order}_c(const {ta}* a, const {tb}* b, {u}* out, u64 n, int mode) {{ binary_widened_contig<{ta}, {tb}, {u}>(a, b, out, n, mode, Bin_{n}()); }}"
            ));
            s.kernel(format!(
                "binary_{n}_{order}_s(const {ta}* a, const {tb}* b, {u}* out, u64 n, Dims d) {{ binary_widened_strided<{ta}, {tb}, {u}>(a, b, out, n, d, Bin_{n}()); }}"
            ));
        }
    }
    s.finish()
}

/// The `where` module of value dtype `d`.
pub(crate) fn select_source(d: DType) -> String {
    let mut s = Source::new(&["binary.cuh"]);
    let t = ctype(d);
    s.kernel(format!(
        "select_s(const bool* c, const {t}* a, const {t}* b, {t}* out, u64 n, Dims d) {{ select_strided<{t}>(c, a, b, out, n, d); }}"
    ));
    s.map_kernel(false, format!(
        "select_c(const bool* c, const {t}* a, const {t}* b, {t}* out, u64 n, int scalars) {{ select_contig<{t}>(c, a, b, out, n, scalars); }}"
    ));
    s.finish()
}

/// Whether the GPU has `op` for operands of dtypes `a` and `b`.
pub fn has_binary_pair(op: BinaryOp, a: DType, b: DType) -> bool {
    if a == b { has_binary(op, a) } else { widened_pair(a, b).is_some_and(|d| has_binary(op, d)) }
}

/// How a binary map's operands sit: `Some((mode, lead))` when the contiguous kernel can run
/// (mode 0: both dense alike, 1: `a` a scalar, 2: `b` a scalar; `lead` the dense operand).
fn flat_mode<'a>(a: &'a Operand, b: &'a Operand) -> Option<(i32, &'a Operand)> {
    let (sa, sb) = (scalar_like(a), scalar_like(b));
    match (dense(a) && !sa, dense(b) && !sb) {
        (true, true) if a.data.layout.strides == b.data.layout.strides => Some((0, a)),
        (true, false) if sb => Some((2, a)),
        (false, true) if sa => Some((1, b)),
        _ => None,
    }
}

/// A binary map of a widened pair: the half-precision operand is widened as it is loaded.
fn binary_widened(gpu: &Arc<Gpu>, op: BinaryOp, a: Operand, b: Operand, out: &mut Output) -> Result<()> {
    let n = out.size() as u64;
    let (half, order) = if a.dtype == DType::F32 { (b.dtype, "fh") } else { (a.dtype, "hf") };
    let family = Family::BinaryWidened(half);
    let name = op.name();
    let (ap, bp) = (ptr_of(&a)?, ptr_of(&b)?);
    if let Some((mode, lead)) = flat_mode(&a, &b)
        && aligned(&[ap, bp])
    {
        let layout = Layout::new(&out.shape, lead.data.layout.strides.clone(), 0);
        let (op_ptr, storage) = alloc(gpu, out.size(), out.dtype)?;
        out.data = Some(Data { storage, layout });
        let f = kernel(gpu, family, &format!("binary_{name}_{order}_c"))?;
        let args = vec![Arg::Ptr(ap), Arg::Ptr(bp), Arg::Ptr(op_ptr), Arg::U64(n), Arg::I32(mode)];
        return launch_map(gpu, f, n, 4, cost(op), args);
    }
    let op_ptr = alloc_out(gpu, out)?;
    let d = Dims::new(&out.shape, &[&a.data.layout.strides, &b.data.layout.strides])?;
    let f = kernel(gpu, family, &format!("binary_{name}_{order}_s"))?;
    let args = vec![Arg::Ptr(ap), Arg::Ptr(bp), Arg::Ptr(op_ptr), Arg::U64(n), Arg::Dims(Box::new(d))];
    launch_1d(gpu, f, n, 1, args)
}

/// Whether the contiguous kernel of `op` is bounded to 32 registers (kernels.rs's
/// `map_kernel`): the light ones but the divisions, whose IEEE slow path needs more.
fn bounded(op: BinaryOp) -> bool {
    cost(op) == Cost::Light && !matches!(op, BinaryOp::Divide | BinaryOp::FloorDivide)
}

/// How a contiguous binary map is launched: libdevice's functions and the remainder capped, the
/// rest light.
fn cost(op: BinaryOp) -> Cost {
    use BinaryOp::*;
    match op {
        Power | LogAddExp | ArcTan2 | Remainder => Cost::Heavy,
        _ => Cost::Light,
    }
}

pub(crate) fn binary(gpu: &Arc<Gpu>, op: BinaryOp, a: Operand, b: Operand, out: &mut Output) -> Result<()> {
    let n = out.size() as u64;
    if n == 0 {
        alloc_out(gpu, out)?;
        return Ok(());
    }
    if a.dtype != b.dtype {
        return binary_widened(gpu, op, a, b, out);
    }
    let family = Family::Binary(a.dtype);
    let name = op.name();
    let (ap, bp) = (ptr_of(&a)?, ptr_of(&b)?);
    if let Some((mode, lead)) = flat_mode(&a, &b) {
        // Write in place into a donated input of the output's type.
        let donor = [&a, &b].into_iter().find(|o| {
            o.writable()
                && o.dtype == out.dtype
                && dense(o)
                && !scalar_like(o)
                && o.data.layout.strides == lead.data.layout.strides
        });
        let op_ptr = match donor {
            Some(d) => dense_output(gpu, d, out)?,
            None => {
                let layout = Layout::new(&out.shape, lead.data.layout.strides.clone(), 0);
                let (ptr, storage) = alloc(gpu, out.size(), out.dtype)?;
                out.data = Some(Data { storage, layout });
                ptr
            }
        };
        let vec_ptrs: Vec<CUdeviceptr> = match mode {
            0 => vec![ap, bp, op_ptr],
            1 => vec![bp, op_ptr],
            _ => vec![ap, op_ptr],
        };
        if aligned(&vec_ptrs) {
            let f = kernel(gpu, family, &format!("binary_{name}_c"))?;
            let per = (16 / a.dtype.size()).max(1) as u64;
            let args = vec![Arg::Ptr(ap), Arg::Ptr(bp), Arg::Ptr(op_ptr), Arg::U64(n), Arg::I32(mode)];
            return launch_map(gpu, f, n, per, cost(op), args);
        }
        let strides = match mode {
            0 => [1, 1],
            1 => [0, 1],
            _ => [1, 0],
        };
        let d = Dims::flat(n, &strides);
        let f = kernel(gpu, family, &format!("binary_{name}_s"))?;
        let args = vec![Arg::Ptr(ap), Arg::Ptr(bp), Arg::Ptr(op_ptr), Arg::U64(n), Arg::Dims(Box::new(d))];
        return launch_1d(gpu, f, n, 1, args);
    }
    // A transposed operand (a dense buffer read across its rows) goes through the tiled copy
    // first: the strided walk would read it a few bytes per row.
    if transposed(&a) || transposed(&b) {
        let a = if transposed(&a) { row_major(gpu, a)? } else { a };
        let b = if transposed(&b) { row_major(gpu, b)? } else { b };
        return binary(gpu, op, a, b, out);
    }
    let op_ptr = alloc_out(gpu, out)?;
    let d = Dims::new(&out.shape, &[&a.data.layout.strides, &b.data.layout.strides])?;
    let f = kernel(gpu, family, &format!("binary_{name}_s"))?;
    let args = vec![Arg::Ptr(ap), Arg::Ptr(bp), Arg::Ptr(op_ptr), Arg::U64(n), Arg::Dims(Box::new(d))];
    launch_1d(gpu, f, n, 1, args)
}

/// Whether `x` is a dense buffer whose innermost axis is not its contiguous one.
fn transposed(x: &Operand) -> bool {
    dense(x) && !scalar_like(x) && !x.data.layout.flags.row_contiguous && x.data.layout.strides.last() != Some(&1)
}

pub(crate) fn select(gpu: &Arc<Gpu>, c: Operand, a: Operand, b: Operand, out: &mut Output) -> Result<()> {
    let n = out.size() as u64;
    if n == 0 {
        alloc_out(gpu, out)?;
        return Ok(());
    }
    // Dense operands laid out alike, or scalars: the vectorised kernel, in the dense layout.
    let ops = [&c, &a, &b];
    if let Some(lead) = ops.iter().find(|o| dense(o) && !scalar_like(o)) {
        let strides = &lead.data.layout.strides;
        let ptrs = [ptr_of(&c)?, ptr_of(&a)?, ptr_of(&b)?];
        let vectors: Vec<CUdeviceptr> = (0..3).filter(|&k| !scalar_like(ops[k])).map(|k| ptrs[k]).collect();
        if ops.iter().all(|o| scalar_like(o) || (dense(o) && &o.data.layout.strides == strides)) && aligned(&vectors) {
            let scalars = (0..3).filter(|&k| scalar_like(ops[k])).fold(0, |m, k| m | 1 << k);
            let (ptr, storage) = alloc(gpu, out.size(), out.dtype)?;
            out.data = Some(Data { storage, layout: Layout::new(&out.shape, strides.clone(), 0) });
            let f = kernel(gpu, Family::Select(a.dtype), "select_c")?;
            let per = (16 / a.dtype.size()).max(1) as u64;
            let [cp, ap, bp] = ptrs;
            let args = vec![Arg::Ptr(cp), Arg::Ptr(ap), Arg::Ptr(bp), Arg::Ptr(ptr), Arg::U64(n), Arg::I32(scalars)];
            return launch_map(gpu, f, n, per, Cost::Light, args);
        }
    }
    let op_ptr = alloc_out(gpu, out)?;
    let d = Dims::new(&out.shape, &[&c.data.layout.strides, &a.data.layout.strides, &b.data.layout.strides])?;
    let f = kernel(gpu, Family::Select(a.dtype), "select_s")?;
    let args = vec![
        Arg::Ptr(ptr_of(&c)?),
        Arg::Ptr(ptr_of(&a)?),
        Arg::Ptr(ptr_of(&b)?),
        Arg::Ptr(op_ptr),
        Arg::U64(n),
        Arg::Dims(Box::new(d)),
    ];
    launch_1d(gpu, f, n, 1, args)
}
