//! Random bits: one block of bytes per key, filled in MLX's threefry layout.

use nuvec_core::primitive::random::fill_key_bytes;
use nuvec_core::storage::{Data, HostBuffer, Operand, Output};
use nuvec_core::{DType, Result};
use rayon::prelude::*;

use crate::strided::Rows;
use crate::{host_slice, internal};

pub fn random_bits(keys: Operand, out: &mut Output) -> Result<()> {
    if keys.dtype != DType::U32 {
        return Err(internal("random bits need uint32 keys"));
    }
    let ks = host_slice::<u32>(&keys)?;
    let n_keys = keys.size() / 2;
    let bytes = out.size() * out.dtype.size();
    let mut buf = HostBuffer::uninit(bytes)?;
    if n_keys > 0 && bytes > 0 {
        // Key i's words lie at offsets(i) and offsets(i) + the stride of the last axis.
        let layout = &keys.data.layout;
        let rank = keys.shape.len();
        let step = layout.strides[rank - 1];
        let rows = Rows::new(&keys.shape[..rank - 1], [&layout.strides[..rank - 1]], [layout.offset]);
        let offsets: Vec<isize> = {
            let mut v = Vec::with_capacity(n_keys);
            rows.for_each_element(0, n_keys, |o| v.push(o[0]));
            v
        };
        let per_key = bytes / n_keys;
        buf.bytes_mut().par_chunks_mut(per_key).zip(offsets.par_iter()).for_each(|(block, &o)| {
            let key = [ks[o as usize], ks[(o + step) as usize]];
            fill_key_bytes(key, block);
        });
    }
    out.data = Some(Data::from_host_buffer(&out.shape, buf));
    Ok(())
}
