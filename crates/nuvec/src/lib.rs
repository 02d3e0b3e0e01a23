//! nuvec: MLX's programming model in pure Rust, for NVIDIA GPUs and CPUs.
//!
//! Arrays are lazy: operations record a graph, and nothing runs until a result is needed
//! (`eval`, `item`, `to_vec`). Operations never return `Result`; a bad call gives a failed
//! array whose error surfaces at those boundaries.
//!
//! ```
//! use nuvec::{array, ops as mx};
//! let x = array![[1.0, 2.0], [3.0, 4.0]];
//! let y = mx::softmax(&x.matmul(&x.t()), -1);
//! assert_eq!(y.shape(), &[2, 2]);
//! let rows: Vec<f32> = y.sum(-1).to_vec().unwrap();
//! assert!(rows.iter().all(|r| (r - 1.0).abs() < 1e-6));
//! ```

// Public items of the libraries are documented; examples and tests need no crate docs.
#![warn(missing_docs)]
#![deny(unsafe_code)]

use std::sync::Arc;

pub use nuvec_core::{
    Array, ArrayLiteral, At, Axes, Category, Complex64, DType, Device, DeviceKind, Element, Ellipsis, Error, Index,
    IndexStep, IntoIndex, IntoIndexEntry, IntoShape, Leaves, NewAxis, OpErrorKind, Result, Scalar, ScalarOrArray,
    ScanOptions, Shape, Stream, VarOptions, array, async_eval, bf16, default_device, default_stream, eval, f16, fast,
    ops, promote_types, random, transforms, tree_map, tree_map_with, with_stream,
};

/// Files: safetensors (memory-mapped, sharded), `.npy`, `.npz` and GGUF (the `nuvec-io` crate).
pub mod io {
    pub use nuvec_io::*;
}
pub use nuvec_io::{load, load_gguf, load_npy, load_npz, load_safetensors, save_npz, save_safetensors};

/// Collectives over a group of ranks (threads or processes), as MLX's `mx.distributed` (the
/// `nuvec-distributed` crate).
pub mod distributed {
    pub use nuvec_distributed::*;
}

/// Optimizers, learning-rate schedules and gradient clipping, as MLX's `mlx.optimizers` (the
/// `nuvec-nn` crate).
pub mod optim {
    pub use nuvec_nn::optim::*;
}

/// Neural networks, as MLX's `mlx.nn`: modules, layers, activations, losses (the `nuvec-nn`
/// crate).
pub mod nn {
    pub use nuvec_nn::activations::*;
    pub use nuvec_nn::{
        Conv1d, Conv2d, Dropout, Embedding, Layer, LayerNorm, Linear, Module, MultiHeadAttention, Param, Params,
        QuantSpec, Quantized, QuantizedEmbedding, QuantizedLinear, RmsNorm, Rope, Sequential, ShardedEmbedding,
        ShardedLinear, Sharding, gather_features, init, join, losses, module, quantize, quantize_with, shard_embedding,
        shard_linear, value_and_grad,
    };
}

/// Writes `array` to a `.npy` file, as MLX's `mx.save`.
pub use nuvec_io::save_npy as save;

/// Reads a `NUVEC_DEVICE` value (`cpu`, `gpu`, `gpu:N`, any case) without touching the environment.
pub use nuvec_core::device::parse_device_env;

pub use nuvec_core::transforms::{
    CompileOptions, Tree, checkpoint, compile, compile_with, custom_function, disable_compile, enable_compile, grad,
    grad_args, jvp, value_and_grad, value_and_grad_args, vjp, vmap,
};

/// Graph internals for backends, compilers and tools (no stability promise).
pub mod graph {
    pub use nuvec_core::backend::{Backend, backend_for, is_available, unavailable_reason};
    pub use nuvec_core::primitive::*;
    pub use nuvec_core::storage::{Data, Layout, Operand, Output, Spec, Storage};
}

/// Memory held by arrays, and limits on it.
///
/// An allocation the system refuses, or one past a limit, fails the operation that needed it
/// (an [`Error::OutOfMemory`](crate::Error::OutOfMemory) naming the operation and the bytes)
/// instead of aborting the process; other arrays are unaffected.
///
/// ```
/// use nuvec::{memory, ops::zeros, DType};
/// let old = memory::set_limit(1 << 20); // 1 MiB of arrays, on the host and each GPU
/// let big = zeros([1024, 1024], DType::F32).exp(); // needs 4 MiB
/// let err = big.eval().unwrap_err();
/// assert!(err.to_string().contains("could not allocate 4194304 bytes (4.0 MiB)"), "{err}");
/// memory::set_limit(old);
/// assert!(zeros([1024, 1024], DType::F32).exp().eval().is_ok());
/// ```
pub mod memory {
    pub use nuvec_core::storage::{
        MemoryStats, host_memory, reset_host_peak, set_host_cache_limit, set_host_memory_limit,
    };

    /// Sets one hard limit on the bytes arrays may hold, on the host and on each usable GPU
    /// (see [`set_host_memory_limit`] and [`crate::cuda::set_memory_limit`] for one of them);
    /// returns the previous host limit. `usize::MAX` removes the limit.
    pub fn set_limit(bytes: usize) -> usize {
        for gpu in 0..nuvec_cuda::device_count() {
            // A GPU that cannot start has no memory to limit.
            let _ = nuvec_cuda::set_memory_limit(gpu as u32, bytes);
        }
        set_host_memory_limit(bytes)
    }
}

/// The CPU backend.
pub mod cpu {
    pub use nuvec_cpu::CpuBackend;
}

/// The CUDA backend: availability, device facts, memory controls.
///
/// ```
/// // Never panics, with or without a GPU.
/// let usable = nuvec::cuda::is_available();
/// assert_eq!(usable, nuvec::cuda::unavailable_reason().is_none());
/// ```
pub mod cuda {
    pub use nuvec_cuda::{
        CudaBackend, DeviceInfo, clear_cache, compile_all, device_count, device_info, is_available, memory, reset_peak,
        set_cache_limit, set_memory_limit, synchronize, unavailable_reason,
    };
    // Custom kernels (`fast::CudaKernel`): the generated source of a call, build counters and an
    // uncached compile check.
    pub use nuvec_cuda::{
        BuildCounts, CUSTOM_KERNEL_PRELUDE, GeneratedKernel, InputParams, builds, compile_custom_kernel,
        generate_custom_kernel,
    };
    // NCCL communicators, which `distributed`'s groups use for GPU arrays.
    pub use nuvec_cuda::nccl;
    // Compiled element-wise programs (`compile`'s fused kernels): the generated source.
    pub use nuvec_cuda::{InputArrangement, generate_compiled_kernel};
}

/// The backends of this build, handed to core's registry (its one link-time hook).
#[allow(unsafe_code)]
#[unsafe(no_mangle)]
fn __nuvec_backends_v1() -> Vec<Arc<dyn nuvec_core::backend::Backend>> {
    vec![Arc::new(nuvec_cpu::CpuBackend::new()), Arc::new(nuvec_cuda::CudaBackend::new())]
}
