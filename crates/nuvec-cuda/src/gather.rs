//! Gathers and scatters along one axis (`kernels/gather.cuh`): one thread per index.

use std::sync::Arc;

use nuvec_core::shape::row_major_strides;
use nuvec_core::storage::{Operand, Output};
use nuvec_core::{DType, Result};

use crate::driver::Gpu;
use crate::kernels::{Family, Source, ctype};
use crate::launch::{Arg, Dims};
use crate::operand::{alloc_out, buffer_ptr, internal, kernel, launch_1d, ptr_of};

/// Index dtypes the gather kernels take.
pub const INDEX_DTYPES: [DType; 8] =
    [DType::I8, DType::I16, DType::I32, DType::I64, DType::U8, DType::U16, DType::U32, DType::U64];

/// Whether scatters with a reduction (sum, product, max, min) have a kernel for `d`.
pub fn has_scatter_reduce(d: DType) -> bool {
    !matches!(d, DType::Bool | DType::Complex64)
}

/// The module of element dtype `d`: for each index dtype, `gather_{i}`, `scatter_none_{i}` and
/// where `d` has them the reducing scatters `scatter_{sum,prod,max,min}_{i}`.
pub(crate) fn source(d: DType) -> String {
    let mut s = Source::new(&["gather.cuh"]);
    let t = ctype(d);
    for idt in INDEX_DTYPES {
        let (i, n) = (ctype(idt), idt.name());
        let args = "u64 n, i64 axis_n, i64 axis_stride, Dims d";
        s.kernel(format!(
            "gather_{n}(const {t}* src, const {i}* idx, {t}* out, {args}) {{ gather_axis<{t}, {i}>(src, idx, out, n, axis_n, axis_stride, d); }}"
        ));
        s.kernel(format!(
            "scatter_none_{n}(const {i}* idx, const {t}* upd, {t}* out, {args}) {{ scatter_set<{t}, {i}>(idx, upd, out, n, axis_n, axis_stride, d); }}"
        ));
        if has_scatter_reduce(d) {
            for (r, f) in [("sum", "ScSum"), ("prod", "ScProd"), ("max", "ScMax"), ("min", "ScMin")] {
                s.kernel(format!(
                    "scatter_{r}_{n}(const {i}* idx, const {t}* upd, {t}* out, {args}) {{ scatter_reduce<{t}, {i}>(idx, upd, out, n, axis_n, axis_stride, d, {f}<{t}>()); }}"
                ));
            }
        }
    }
    s.finish()
}

/// Strides with the indexed axis zeroed: the offset of an element's line.
fn without_axis(strides: &[isize], axis: usize) -> Vec<isize> {
    let mut s = strides.to_vec();
    s[axis] = 0;
    s
}

pub(crate) fn gather_axis(gpu: &Arc<Gpu>, axis: usize, src: Operand, idx: Operand, out: &mut Output) -> Result<()> {
    let n = out.size() as u64;
    let op = alloc_out(gpu, out)?;
    if n == 0 {
        return Ok(());
    }
    let src_strides = without_axis(&src.data.layout.strides, axis);
    let d = Dims::new(&out.shape, &[&idx.data.layout.strides, &src_strides])?;
    let f = kernel(gpu, Family::Gather(src.dtype), &format!("gather_{}", idx.dtype.name()))?;
    let (axis_n, axis_stride) = (src.shape[axis] as i64, src.data.layout.strides[axis] as i64);
    launch_1d(
        gpu,
        f,
        n,
        1,
        vec![
            Arg::Ptr(ptr_of(&src)?),
            Arg::Ptr(ptr_of(&idx)?),
            Arg::Ptr(op),
            Arg::U64(n),
            Arg::I64(axis_n),
            Arg::I64(axis_stride),
            Arg::Dims(Box::new(d)),
        ],
    )
}

pub(crate) fn scatter_axis(
    gpu: &Arc<Gpu>,
    axis: usize,
    reduce: nuvec_core::primitive::ScatterReduce,
    src: Operand,
    idx: Operand,
    upd: Operand,
    out: &mut Output,
) -> Result<()> {
    use nuvec_core::primitive::ScatterReduce as R;
    // Into the source's own buffer when it was handed over row-major and unshared.
    let base = if src.writable() && src.data.layout.flags.row_contiguous {
        let p = ptr_of(&src)?;
        out.data = Some(src.data.clone());
        p
    } else {
        crate::copy::copy(gpu, src, out)?;
        let data = out.data.as_ref().ok_or_else(|| internal("copy gave no output"))?;
        buffer_ptr(&data.storage)?
    };
    let n = idx.size() as u64;
    if n == 0 {
        return Ok(());
    }
    let out_strides = row_major_strides(&out.shape);
    let dst = without_axis(&out_strides, axis);
    let d = Dims::new(&idx.shape, &[&idx.data.layout.strides, &upd.data.layout.strides, &dst])?;
    let r = match reduce {
        R::None => "none",
        R::Sum => "sum",
        R::Prod => "prod",
        R::Max => "max",
        R::Min => "min",
    };
    let f = kernel(gpu, Family::Gather(upd.dtype), &format!("scatter_{r}_{}", idx.dtype.name()))?;
    launch_1d(
        gpu,
        f,
        n,
        1,
        vec![
            Arg::Ptr(ptr_of(&idx)?),
            Arg::Ptr(ptr_of(&upd)?),
            Arg::Ptr(base),
            Arg::U64(n),
            Arg::I64(out.shape[axis] as i64),
            Arg::I64(out_strides[axis] as i64),
            Arg::Dims(Box::new(d)),
        ],
    )
}
