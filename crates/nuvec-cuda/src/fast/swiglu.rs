//! SwiGLU and its derivative (`kernels/swiglu.cuh`): element-wise, one 16-byte vector per
//! thread.

use nuvec_core::fast::FastOp;
use nuvec_core::storage::Operand;
use nuvec_core::{DType, Result};

use crate::driver::Gpu;
use crate::kernels::{Family, Source, ctype};
use crate::launch::{Arg, BLOCK, launch_dependent};
use crate::operand::{internal, kernel, ptr_of};

/// The module of `d`: `swiglu` and `swiglu_vjp`.
pub(crate) fn source(d: DType) -> String {
    let mut s = Source::new(&["swiglu.cuh"]);
    let t = ctype(d);
    s.kernel(format!(
        "swiglu(const {t}* gate, const {t}* up, {t}* out, u64 n) {{ swiglu_elems<{t}>(gate, up, out, n); }}"
    ));
    s.kernel(format!(
        "swiglu_vjp(const {t}* gate, const {t}* up, const {t}* g, {t}* dgate, {t}* dup, u64 n) {{ swiglu_vjp_elems<{t}>(gate, up, g, dgate, dup, n); }}"
    ));
    s.finish()
}

/// Blocks of `BLOCK` threads for an element-wise kernel over `n` elements of `d`, one 16-byte
/// vector per thread: the whole array in one pass (the kernels' grid-stride loops then run
/// once where the pointers are 16-byte aligned; otherwise their scalar loops take it all).
/// Measured faster than a grid capped per SM (see bench/results/).
fn vector_grid(d: DType, n: u64) -> u32 {
    n.div_ceil((16 / d.size()) as u64).div_ceil(BLOCK as u64).clamp(1, i32::MAX as u64) as u32
}

/// SwiGLU (inputs: gate, up) or its derivative (gate, up, cotangent; outputs: the gate's and
/// up's cotangents).
pub(crate) fn eval(gpu: &Gpu, op: &FastOp, inputs: &[Operand], out_ptrs: &[u64]) -> Result<()> {
    let x = &inputs[0];
    let (d, n) = (x.dtype, x.size() as u64);
    match op {
        FastOp::SwiGluVjp => {
            let f = kernel(gpu, Family::Swiglu(d), "swiglu_vjp")?;
            let ptrs = [ptr_of(x)?, ptr_of(&inputs[1])?, ptr_of(&inputs[2])?, out_ptrs[0], out_ptrs[1]];
            let mut args: Vec<Arg> = ptrs.map(Arg::Ptr).into();
            args.push(Arg::U64(n));
            launch_dependent(gpu, f, vector_grid(d, n), (BLOCK, 1), 1, args)
        }
        FastOp::SwiGlu => {
            let f = kernel(gpu, Family::Swiglu(d), "swiglu")?;
            let args = vec![Arg::Ptr(ptr_of(x)?), Arg::Ptr(ptr_of(&inputs[1])?), Arg::Ptr(out_ptrs[0]), Arg::U64(n)];
            launch_dependent(gpu, f, vector_grid(d, n), (BLOCK, 1), 1, args)
        }
        _ => Err(internal(format!("no SwiGLU kernel for {}", op.name()))),
    }
}
