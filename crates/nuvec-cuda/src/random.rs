//! Random bits (`kernels/random.cuh`): Threefry, one thread per key and counter pair.

use std::sync::Arc;

use nuvec_core::Result;
use nuvec_core::storage::{Operand, Output};

use crate::driver::Gpu;
use crate::kernels::Family;
use crate::launch::Arg;
use crate::operand::{alloc_out, kernel, launch_1d, ptr_of, row_major};

/// The module: the kernel is self-contained; its source is the module (it includes common.cuh).
pub(crate) fn source() -> String {
    include_str!("../kernels/random.cuh").to_string() + "\n"
}

/// Random bits: one thread per key and counter pair (`kernels/random.cuh`).
pub(crate) fn random_bits(gpu: &Arc<Gpu>, keys: Operand, out: &mut Output) -> Result<()> {
    let op = alloc_out(gpu, out)?;
    let n_keys = keys.size() / 2;
    let bytes = out.size() * out.dtype.size();
    if n_keys == 0 || bytes == 0 {
        return Ok(());
    }
    let keys = row_major(gpu, keys)?;
    let per_key = bytes / n_keys;
    let pairs = per_key.div_ceil(4).div_ceil(2);
    let f = kernel(gpu, Family::Random, "random_bits")?;
    let args = vec![Arg::Ptr(ptr_of(&keys)?), Arg::Ptr(op), Arg::U64(n_keys as u64), Arg::U64(per_key as u64)];
    launch_1d(gpu, f, (n_keys * pairs) as u64, 1, args)
}
