//! Scans along one axis (`kernels/scan.cuh`): a block per contiguous line; other axes are moved
//! last by a copy first.

use std::sync::Arc;

use nuvec_core::primitive::ScanOp;
use nuvec_core::shape::row_major_strides;
use nuvec_core::storage::{Data, Layout, Operand, Output};
use nuvec_core::{DType, Result};

use crate::copy::copy_into;
use crate::driver::Gpu;
use crate::kernels::{Family, Source, ctype};
use crate::launch::{Arg, BLOCK, launch};
use crate::operand::{alloc, alloc_out, kernel, ptr_of};

/// Scans a module of `d` holds.
pub fn scan_ops(d: DType) -> Vec<ScanOp> {
    match d {
        DType::Complex64 => vec![],
        DType::Bool => vec![ScanOp::Prod, ScanOp::Max, ScanOp::Min],
        d if d.is_float() => vec![ScanOp::Sum, ScanOp::Prod, ScanOp::Max, ScanOp::Min, ScanOp::LogAddExp],
        _ => vec![ScanOp::Sum, ScanOp::Prod, ScanOp::Max, ScanOp::Min],
    }
}

/// The template argument of a scan.
fn scan_code(op: ScanOp) -> i32 {
    match op {
        ScanOp::Sum => 0,
        ScanOp::Prod => 1,
        ScanOp::Max => 2,
        ScanOp::Min => 3,
        ScanOp::LogAddExp => 6,
    }
}

/// The scan module of `d`: `scan_{op}` for each scan it holds.
pub(crate) fn source(d: DType) -> String {
    let mut s = Source::new(&["scan.cuh"]);
    let t = ctype(d);
    for op in scan_ops(d) {
        let (n, c) = (op.name(), scan_code(op));
        s.kernel(format!(
            "scan_{n}(const {t}* x, {t}* out, u64 lines, u64 len, int reverse, int inclusive) {{ scan_lines<{t}, {c}>(x, out, lines, len, reverse != 0, inclusive != 0); }}"
        ));
    }
    s.finish()
}

pub(crate) fn scan(
    gpu: &Arc<Gpu>,
    op: ScanOp,
    axis: usize,
    reverse: bool,
    inclusive: bool,
    x: Operand,
    out: &mut Output,
) -> Result<()> {
    let nd = x.shape.len();
    let len = x.shape[axis] as u64;
    let n = out.size() as u64;
    if n == 0 || len == 0 {
        alloc_out(gpu, out)?;
        return Ok(());
    }
    // Lines must be contiguous: move the axis last (a copy) when it is not already.
    let last = axis + 1 == nd;
    let perm: Vec<usize> = (0..nd).filter(|&a| a != axis).chain([axis]).collect();
    let moved_shape: Vec<i32> = perm.iter().map(|&a| x.shape[a]).collect();
    let (input, tmp_out_strides) = if last && x.data.layout.flags.row_contiguous {
        (x, None)
    } else {
        let (ptr, storage) = alloc(gpu, x.size(), x.dtype)?;
        let moved = Operand {
            shape: moved_shape.iter().copied().collect(),
            dtype: x.dtype,
            data: Data {
                storage: x.data.storage.clone(),
                layout: Layout::new(
                    &moved_shape,
                    perm.iter().map(|&a| x.data.layout.strides[a]).collect(),
                    x.data.layout.offset,
                ),
            },
            donated: false,
        };
        copy_into(gpu, &moved, ptr, &row_major_strides(&moved_shape))?;
        let out_strides = row_major_strides(&out.shape);
        let strides: Vec<isize> = perm.iter().map(|&a| out_strides[a]).collect();
        let op = Operand {
            shape: moved.shape.clone(),
            dtype: x.dtype,
            data: Data { storage, layout: Layout::row_major(&moved_shape) },
            donated: true,
        };
        (op, Some(strides))
    };
    let f = kernel(gpu, Family::Scan(input.dtype), &format!("scan_{}", op.name()))?;
    let lines = n / len;
    let grid = lines.min(65535 * 32) as u32;
    match tmp_out_strides {
        None => {
            let op_ptr = alloc_out(gpu, out)?;
            let args = vec![
                Arg::Ptr(ptr_of(&input)?),
                Arg::Ptr(op_ptr),
                Arg::U64(lines),
                Arg::U64(len),
                Arg::I32(reverse as i32),
                Arg::I32(inclusive as i32),
            ];
            launch(gpu, f, (grid, 1, 1), (BLOCK, 1, 1), 0, args)
        }
        Some(back) => {
            let (tp, tstore) = alloc(gpu, input.size(), input.dtype)?;
            let args = vec![
                Arg::Ptr(ptr_of(&input)?),
                Arg::Ptr(tp),
                Arg::U64(lines),
                Arg::U64(len),
                Arg::I32(reverse as i32),
                Arg::I32(inclusive as i32),
            ];
            launch(gpu, f, (grid, 1, 1), (BLOCK, 1, 1), 0, args)?;
            let scanned = Operand {
                shape: input.shape.clone(),
                dtype: input.dtype,
                data: Data { storage: tstore, layout: Layout::row_major(&input.shape) },
                donated: false,
            };
            let op_ptr = alloc_out(gpu, out)?;
            copy_into(gpu, &scanned, op_ptr, &back)
        }
    }
}
