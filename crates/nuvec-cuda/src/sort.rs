//! Sorts and partitions along one axis (`kernels/sort.cuh`): a shared-memory bitonic network per
//! row for rows up to [`BLOCK_MAX`] elements, a global-memory network (one launch per stage)
//! for longer ones. Partitions are full sorts, which satisfy the partition property.
//!
//! The input is read in place through its strides; the output is written row after row, so its
//! layout has the sorted axis last in memory (the strides say so), as on the CPU.

use std::sync::Arc;

use nuvec_core::primitive::SortOp;
use nuvec_core::shape::row_major_strides;
use nuvec_core::storage::{Data, Layout, Operand, Output};
use nuvec_core::{DType, Result};

use crate::driver::Gpu;
use crate::kernels::{Family, Source, ctype};
use crate::launch::{Arg, BLOCK, Dims, grid_for, launch};
use crate::operand::{alloc, kernel, ptr_of};

/// Longest row sorted in shared memory (`SORT_BLOCK_MAX` of `sort.cuh`): 4096 pairs of an
/// 8-byte value and a 4-byte index fill the 48 KiB a block gets without opting in.
pub(crate) const BLOCK_MAX: usize = 4096;

/// Longest row the backend sorts at all (its padded length and indices stay within `u32`, and
/// the scratch within reason); longer rows run on the CPU.
pub(crate) const GLOBAL_MAX: usize = 1 << 26;

/// Whether the GPU sorts rows of `len` elements.
pub(crate) fn supports(len: usize) -> bool {
    len <= GLOBAL_MAX
}

/// The module of `d`: the shared-memory network (`sort_block_{vals,idx}`) and the stages of the
/// global-memory one.
pub(crate) fn source(d: DType) -> String {
    let mut s = Source::new(&["sort.cuh"]);
    let t = ctype(d);
    for (suffix, indices) in [("vals", false), ("idx", true)] {
        s.kernel(format!(
            "sort_block_{suffix}(const {t}* x, void* out, u64 rows, u32 len, u32 p, i64 axis_stride, Dims d) {{ sort_block<{t}, {indices}>(x, out, rows, len, p, axis_stride, d); }}"
        ));
        s.kernel(format!(
            "sort_global_write_{suffix}(const {t}* keys, const u32* idx, void* out, u64 rows, u32 len, u32 p) {{ sort_global_write<{t}, {indices}>(keys, idx, out, rows, len, p); }}"
        ));
    }
    s.kernel(format!(
        "sort_global_init(const {t}* x, {t}* keys, u32* idx, u64 rows, u32 len, u32 p, i64 axis_stride, Dims d) {{ sort_global_init<{t}>(x, keys, idx, rows, len, p, axis_stride, d); }}"
    ));
    s.kernel(format!(
        "sort_global_step({t}* keys, u32* idx, u64 rows, u32 len, u32 p, u32 k, u32 j) {{ sort_global_step<{t}>(keys, idx, rows, len, p, k, j); }}"
    ));
    s.finish()
}

pub(crate) fn sort(gpu: &Arc<Gpu>, op: SortOp, axis: usize, x: Operand, out: &mut Output) -> Result<()> {
    let nd = x.shape.len();
    let len = x.shape[axis] as usize;
    let n = out.size();
    let perm: Vec<usize> = (0..nd).filter(|&a| a != axis).chain([axis]).collect();
    let moved_shape: Vec<i32> = perm.iter().map(|&a| x.shape[a]).collect();
    let moved_strides = row_major_strides(&moved_shape);
    let mut strides = vec![0isize; nd];
    for (i, &a) in perm.iter().enumerate() {
        strides[a] = moved_strides[i];
    }
    let (op_ptr, storage) = alloc(gpu, n, out.dtype)?;
    out.data = Some(Data { storage, layout: Layout::new(&out.shape, strides.into_iter().collect(), 0) });
    if n == 0 || len == 0 {
        return Ok(());
    }
    let rows = (n / len) as u64;
    let kept_shape: Vec<i32> = moved_shape[..nd - 1].to_vec();
    let kept_strides: Vec<isize> = perm[..nd - 1].iter().map(|&a| x.data.layout.strides[a]).collect();
    let d = Dims::new(&kept_shape, &[&kept_strides])?;
    let axis_stride = x.data.layout.strides[axis] as i64;
    let xp = ptr_of(&x)?;
    let family = Family::Sort(x.dtype);
    let suffix = if op.returns_indices() { "idx" } else { "vals" };
    let p = len.next_power_of_two().max(32);
    let (len32, p32) = (len as u32 as i32, p as u32 as i32);
    if p <= BLOCK_MAX {
        let threads = (p / 2).clamp(32, 512) as u32;
        let shared = (p * (x.dtype.size() + 4)) as u32;
        let f = kernel(gpu, family, &format!("sort_block_{suffix}"))?;
        let grid = rows.min(1 << 20) as u32;
        let args = vec![
            Arg::Ptr(xp),
            Arg::Ptr(op_ptr),
            Arg::U64(rows),
            Arg::I32(len32),
            Arg::I32(p32),
            Arg::I64(axis_stride),
            Arg::Dims(Box::new(d)),
        ];
        return launch(gpu, f, (grid, 1, 1), (threads, 1, 1), shared, args);
    }
    // Scratch rows of the padded length; released (stream-ordered) once the launches are queued.
    let total = rows * p as u64;
    let (kp, _keys) = alloc(gpu, total as usize, x.dtype)?;
    let (ip, _idx) = alloc(gpu, total as usize, DType::U32)?;
    let grid = grid_for(gpu, total, BLOCK as u64);
    let init = kernel(gpu, family, "sort_global_init")?;
    let args = vec![
        Arg::Ptr(xp),
        Arg::Ptr(kp),
        Arg::Ptr(ip),
        Arg::U64(rows),
        Arg::I32(len32),
        Arg::I32(p32),
        Arg::I64(axis_stride),
        Arg::Dims(Box::new(d)),
    ];
    launch(gpu, init, (grid, 1, 1), (BLOCK, 1, 1), 0, args)?;
    let step = kernel(gpu, family, "sort_global_step")?;
    let mut k = 2usize;
    while k <= p {
        let mut j = k / 2;
        while j > 0 {
            let args = vec![
                Arg::Ptr(kp),
                Arg::Ptr(ip),
                Arg::U64(rows),
                Arg::I32(len32),
                Arg::I32(p32),
                Arg::I32(k as u32 as i32),
                Arg::I32(j as u32 as i32),
            ];
            launch(gpu, step, (grid, 1, 1), (BLOCK, 1, 1), 0, args)?;
            j /= 2;
        }
        k *= 2;
    }
    let write = kernel(gpu, family, &format!("sort_global_write_{suffix}"))?;
    let grid = grid_for(gpu, n as u64, BLOCK as u64);
    let args = vec![Arg::Ptr(kp), Arg::Ptr(ip), Arg::Ptr(op_ptr), Arg::U64(rows), Arg::I32(len32), Arg::I32(p32)];
    launch(gpu, write, (grid, 1, 1), (BLOCK, 1, 1), 0, args)
}
