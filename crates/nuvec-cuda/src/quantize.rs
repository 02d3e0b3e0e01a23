//! Affine quantize and dequantize on the GPU (the FP modes run on the CPU).

use std::sync::Arc;

use nuvec_core::primitive::{Primitive, QuantMode};
use nuvec_core::storage::{Operand, Output, Spec};
use nuvec_core::{DType, Result};

use crate::driver::Gpu;
use crate::kernels::{Family, Source, ctype};
use crate::launch::{Arg, BLOCK, grid_for, launch};
use crate::operand::{alloc_out, internal, kernel, ptr_of, row_major};

/// The weight dtypes the kernels are built for.
pub(crate) const KERNEL_DTYPES: [DType; 3] = [DType::F16, DType::BF16, DType::F32];

/// Whether a kernel covers this quantize or dequantize.
pub(crate) fn supports(p: &Primitive, inputs: &[Spec]) -> bool {
    match p {
        Primitive::Quantize { mode: QuantMode::Affine, .. } => {
            inputs.first().is_some_and(|w| KERNEL_DTYPES.contains(&w.dtype))
        }
        Primitive::Dequantize { mode: QuantMode::Affine, dtype, .. } => KERNEL_DTYPES.contains(dtype),
        _ => false,
    }
}

/// The module of weight dtype `d`: `affine_quantize` and `affine_dequantize_b{bits}`.
pub(crate) fn source(d: DType) -> String {
    let mut s = Source::new(&["quantize.cuh"]);
    let t = ctype(d);
    s.kernel(format!(
        "affine_quantize(const {t}* w, u32* out, {t}* scales, {t}* biases, u64 groups, int bits, int group_size) {{ affine_quantize<{t}>(w, out, scales, biases, groups, bits, group_size); }}"
    ));
    for bits in [2, 3, 4, 5, 6, 8] {
        s.kernel(format!(
            "affine_dequantize_b{bits}(const u32* w, const {t}* scales, const {t}* biases, {t}* out, u64 n, int group_size) {{ affine_dequantize_chunks<{t}, {bits}>(w, scales, biases, out, n, group_size); }}"
        ));
    }
    s.finish()
}

fn launch_over(gpu: &Arc<Gpu>, f: cudarc::driver::sys::CUfunction, n: u64, args: Vec<Arg>) -> Result<()> {
    if n == 0 {
        return Ok(());
    }
    launch(gpu, f, (grid_for(gpu, n, BLOCK as u64), 1, 1), (BLOCK, 1, 1), 0, args)
}

/// `Quantize` (affine): one thread per group.
pub(crate) fn quantize(gpu: &Arc<Gpu>, group_size: i32, bits: i32, w: Operand, outputs: &mut [Output]) -> Result<()> {
    let w = row_major(gpu, w)?;
    let [packed, scales, biases] = outputs else {
        return Err(internal("affine quantize needs three outputs"));
    };
    let (pp, sp, bp) = (alloc_out(gpu, packed)?, alloc_out(gpu, scales)?, alloc_out(gpu, biases)?);
    let groups = scales.size() as u64;
    let f = kernel(gpu, Family::Quantize(w.dtype), "affine_quantize")?;
    let args = vec![
        Arg::Ptr(ptr_of(&w)?),
        Arg::Ptr(pp),
        Arg::Ptr(sp),
        Arg::Ptr(bp),
        Arg::U64(groups),
        Arg::I32(bits),
        Arg::I32(group_size),
    ];
    launch_over(gpu, f, groups, args)
}

/// `Dequantize` (affine): one thread per 8 levels.
pub(crate) fn dequantize(
    gpu: &Arc<Gpu>,
    group_size: i32,
    bits: i32,
    inputs: [Operand; 3],
    out: &mut Output,
) -> Result<()> {
    let [w, s, b] = inputs;
    let (w, s, b) = (row_major(gpu, w)?, row_major(gpu, s)?, row_major(gpu, b)?);
    let op = alloc_out(gpu, out)?;
    let n = out.size() as u64;
    let f = kernel(gpu, Family::Quantize(out.dtype), &format!("affine_dequantize_b{bits}"))?;
    let args = vec![
        Arg::Ptr(ptr_of(&w)?),
        Arg::Ptr(ptr_of(&s)?),
        Arg::Ptr(ptr_of(&b)?),
        Arg::Ptr(op),
        Arg::U64(n),
        Arg::I32(group_size),
    ];
    // One thread per 8 levels (rows are whole groups of at least 32).
    launch_over(gpu, f, n / 8, args)
}
