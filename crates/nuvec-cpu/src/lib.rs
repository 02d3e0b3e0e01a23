//! nuvec-cpu: the CPU backend. Every primitive runs on typed slices of host buffers, in
//! parallel with rayon, with SIMD chosen at run time (no `target-cpu=native` needed) and
//! products on the `gemm` crate.

// Public items of the libraries are documented; examples and tests need no crate docs.
#![warn(missing_docs)]

mod binary;
mod compiled;
mod copy;
pub mod elem;
mod fast;
mod gather;
mod map;
mod matmul;
mod pool;
pub mod quantize;
mod random;
mod reduce;
mod scan;
mod sgemm;
mod sort;
mod strided;
mod unary;
mod vmath;

use nuvec_core::backend::Backend;
use nuvec_core::device::{Device, DeviceKind, Stream};
use nuvec_core::primitive::Primitive;
use nuvec_core::storage::{HostBuffer, Operand, Output, Spec, Storage};
use nuvec_core::{DType, Error, Result};

/// The CPU backend.
#[derive(Debug, Default)]
pub struct CpuBackend;

impl CpuBackend {
    /// The backend.
    pub fn new() -> Self {
        CpuBackend
    }
}

pub(crate) fn unsupported(dtype: DType) -> Error {
    Error::Backend(format!("the CPU backend has no kernel for dtype {dtype}"))
}

pub(crate) fn internal(msg: impl Into<String>) -> Error {
    Error::Backend(format!("internal error in the CPU backend: {}", msg.into()))
}

/// The whole host buffer of an operand as elements of `T` (index it with the layout).
pub(crate) fn host_slice<T: bytemuck::Pod>(op: &Operand) -> Result<&[T]> {
    op.data.storage.host_buffer().map(|b| b.as_slice::<T>()).ok_or_else(|| internal("operand is not in host memory"))
}

fn take<const N: usize>(inputs: Vec<Operand>) -> Result<[Operand; N]> {
    let n = inputs.len();
    inputs.try_into().map_err(|_| internal(format!("expected {N} inputs, got {n}")))
}

impl Backend for CpuBackend {
    fn name(&self) -> &'static str {
        "cpu"
    }

    fn kind(&self) -> DeviceKind {
        DeviceKind::Cpu
    }

    fn is_available(&self, device: Device) -> bool {
        device == Device::cpu()
    }

    fn supports(&self, primitive: &Primitive, inputs: &[Spec], _outputs: &[Spec]) -> bool {
        match primitive {
            Primitive::Fast(op) => {
                // `fast::supports` checks the dtypes: floats, and the integer targets and offsets.
                nuvec_core::fast::fused_enabled_for(op) && fast::supports(op, inputs)
            }
            p => !p.is_view() && !matches!(p, Primitive::Custom(_) | Primitive::CustomKernel(_)),
        }
    }

    fn eval(&self, _stream: Stream, primitive: &Primitive, inputs: Vec<Operand>, outputs: &mut [Output]) -> Result<()> {
        let out = outputs.first_mut().ok_or_else(|| internal("no output"))?;
        match primitive {
            Primitive::Arange { start, step } => copy::arange(*start, *step, out),
            Primitive::Unary(op) => {
                let [x] = take(inputs)?;
                unary::eval(*op, x, out)
            }
            Primitive::Binary(op) => {
                let [a, b] = take(inputs)?;
                binary::eval(*op, a, b, out)
            }
            Primitive::Select => {
                let [c, a, b] = take(inputs)?;
                binary::select(c, a, b, out)
            }
            Primitive::AsType(_) => {
                let [x] = take(inputs)?;
                copy::astype(x, out)
            }
            Primitive::Copy | Primitive::Reshape(_) | Primitive::BitCast(_) => {
                let [x] = take(inputs)?;
                copy::copy(x, out)
            }
            Primitive::SliceUpdate { start, step, .. } => {
                let [src, update] = take(inputs)?;
                copy::slice_update(start, step, src, update, out)
            }
            Primitive::Concatenate { axis } => copy::concatenate(*axis, inputs, out),
            Primitive::Reduce { op, axes } => {
                let [x] = take(inputs)?;
                reduce::eval(*op, axes, x, out)
            }
            Primitive::ArgReduce { op, axis } => {
                let [x] = take(inputs)?;
                reduce::arg_reduce(*op, *axis, x, out)
            }
            Primitive::Scan { op, axis, reverse, inclusive } => {
                let [x] = take(inputs)?;
                scan::eval(*op, *axis, *reverse, *inclusive, x, out)
            }
            Primitive::Matmul => {
                let [a, b] = take(inputs)?;
                matmul::eval(a, b, None, 1.0, 0.0, out)
            }
            Primitive::AddMM { alpha, beta } => {
                let [a, b, c] = take(inputs)?;
                matmul::eval(a, b, Some(c), *alpha, *beta, out)
            }
            Primitive::Fast(op) => fast::eval(op, inputs, outputs),
            Primitive::Compiled(c) => compiled::eval(&c.0, inputs, outputs),
            Primitive::RandomBits { .. } => {
                let [keys] = take(inputs)?;
                random::random_bits(keys, out)
            }
            Primitive::Sort { op, axis } => {
                let [x] = take(inputs)?;
                sort::eval(*op, *axis, x, out)
            }
            Primitive::GatherAxis { axis } => {
                let [src, idx] = take(inputs)?;
                gather::gather_axis(*axis, src, idx, out)
            }
            Primitive::ScatterAxis { axis, reduce } => {
                let [src, idx, upd] = take(inputs)?;
                gather::scatter_axis(*axis, *reduce, src, idx, upd, out)
            }
            Primitive::Quantize { mode, group_size, bits } => {
                let [x] = take(inputs)?;
                quantize::quantize(*mode, *group_size, *bits, x, outputs)
            }
            Primitive::Dequantize { mode, group_size, bits, .. } => {
                quantize::dequantize(*mode, *group_size, *bits, inputs, out)
            }
            p => Err(internal(format!("{} is a view and runs in core", p.name()))),
        }
    }

    fn upload(&self, _device: Device, host: &HostBuffer) -> Result<Storage> {
        Ok(Storage::host(HostBuffer::from_bytes(host.bytes())?))
    }

    fn download(&self, storage: &Storage) -> Result<HostBuffer> {
        storage
            .host_buffer()
            .ok_or_else(|| internal("storage is not on the host"))
            .and_then(|b| HostBuffer::from_bytes(b.bytes()))
    }

    fn synchronize(&self, _stream: Stream) -> Result<()> {
        Ok(())
    }
}
