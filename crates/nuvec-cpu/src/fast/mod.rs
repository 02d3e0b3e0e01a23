//! Fused CPU kernels of fast operations, one module per family: softmax and log-sum-exp in
//! `softmax`, the row norms in `norm`, RoPE in `rope`, SwiGLU in `swiglu`, cross entropy (loss,
//! derivative, both at once) in `cross_entropy`, one Adam update in `adam`, products with
//! quantized weights in `quantized_matmul`, attention for a few query rows and over paged caches
//! in `attention`, the gated delta rule in `gated_delta`, products of matrices picked by index
//! in `gather_mm`. Here: which ops and dtypes have a
//! kernel, the dispatch, and the row helpers they share. What they do not cover runs as the
//! operations' compositions.

mod adam;
mod attention;
mod cross_entropy;
mod gated_delta;
mod gather_mm;
mod norm;
mod quantized_matmul;
mod rope;
mod softmax;
mod swiglu;

use num_traits::{Float as _, Zero};
use nuvec_core::fast::{AttentionKernel, FastOp, QuantMatmulParams};
use nuvec_core::storage::{HostBuffer, Operand, Output, Spec};
use nuvec_core::{DType, Result};

use crate::copy;
use crate::elem::{AccFloat, Float};
use crate::strided::GRAIN;
use crate::{host_slice, internal};

/// Whether this backend has a kernel for `op` on these inputs (the first one floating).
pub fn supports(op: &FastOp, inputs: &[Spec]) -> bool {
    let Some(d) = inputs.first().map(|s| s.dtype).filter(|d| d.is_float()) else { return false };
    // Cross entropy's loss and its cotangent are in the accumulator type (`f64` for `f64`).
    let acc = if d == DType::F64 { DType::F64 } else { DType::F32 };
    let is = |i: usize, dtype: DType| inputs.get(i).is_some_and(|s| s.dtype == dtype);
    // One value per row of logits (the targets' shape): the composition broadcasts others.
    let per_row = |i: usize| inputs.get(i).zip(inputs.get(1)).is_some_and(|(s, t)| s.shape == t.shape);
    let indices = |i: usize| is(i, DType::I32) || is(i, DType::U32);
    // x in the product's dtype; for affine the scales and biases too, or for `float32`
    // products both in a half dtype (converted as the kernels read them).
    let quantized = |p: &QuantMatmulParams| {
        let half = |h: DType| d == DType::F32 && matches!(h, DType::F16 | DType::BF16) && is(2, h) && is(3, h);
        let affine = || (is(2, d) && is(3, d)) || inputs.get(2).is_some_and(|s| half(s.dtype));
        quantized_matmul::supports(p.dtype) && d == p.dtype && (!p.mode.has_biases() || affine())
    };
    match op {
        FastOp::Softmax | FastOp::LogSumExp => true,
        // One dtype for every input, the output's: mixed dtypes take the composition.
        FastOp::RmsNorm { .. } | FastOp::AddRmsNorm { .. } | FastOp::LayerNorm { .. } | FastOp::SwiGlu => {
            inputs.iter().all(|s| s.dtype == d)
        }
        FastOp::CrossEntropy => is(1, DType::I32),
        FastOp::CrossEntropyVjp => is(1, DType::I32) && is(2, acc) && is(3, acc) && per_row(2) && per_row(3),
        FastOp::CrossEntropyWithGrad => is(1, DType::I32) && is(2, acc) && per_row(2),
        FastOp::Rope(_) => is(1, DType::I32) && inputs.get(2).is_none_or(|f| f.dtype == DType::F32),
        FastOp::AdamStep(_) => inputs.iter().all(|s| s.dtype == d),
        FastOp::Attention(p) => {
            matches!(p.kernel, AttentionKernel::Vector { .. }) && inputs.len() == 3 && attention::supports(p, d)
        }
        FastOp::PagedAttention(p) => {
            inputs.len() == 5
                && attention::supports_paged(p, d)
                && is(1, d)
                && is(2, d)
                && is(3, DType::I32)
                && is(4, DType::I32)
        }
        FastOp::QuantizedMatmul(p) => quantized(p),
        // Every dtype the rule admits: inputs are read as `f32`, as the composition casts them.
        FastOp::GatedDelta(p) => inputs.len() == 6 + p.masked as usize,
        // Both stacks in one dtype; 32-bit indices (what `ops::gather_mm` records).
        FastOp::GatherMm => is(1, d) && indices(2) && indices(3),
        FastOp::GatherQmm(p) => {
            let n = inputs.len();
            n >= 5 && quantized(p) && indices(n - 2) && indices(n - 1)
        }
        _ => false,
    }
}

/// Runs `op` fused on row-major copies of its inputs (the inputs themselves when dense).
pub fn eval(op: &FastOp, inputs: Vec<Operand>, outputs: &mut [Output]) -> Result<()> {
    match op {
        // Keys and values are read in place (a cache's buffer, sliced; a paged pool).
        FastOp::Attention(p) => return attention::eval(p, inputs, outputs),
        FastOp::PagedAttention(p) => return attention::eval_paged(p, inputs, outputs),
        // Stacks of experts are read in place, never copied.
        FastOp::GatherMm => return gather_mm::gather_mm(inputs, outputs),
        FastOp::GatherQmm(p) => return gather_mm::gather_qmm(p, inputs, outputs),
        _ => {}
    }
    let inputs: Vec<Operand> = inputs.into_iter().map(copy::row_major).collect::<Result<_>>()?;
    if inputs.is_empty() {
        return Err(internal("fast op without input"));
    }
    match op {
        FastOp::Softmax | FastOp::LogSumExp => softmax::eval(op, &inputs, outputs),
        FastOp::CrossEntropy | FastOp::CrossEntropyVjp | FastOp::CrossEntropyWithGrad => {
            cross_entropy::eval(op, &inputs, outputs)
        }
        FastOp::Rope(p) => rope::eval(p, &inputs, outputs),
        FastOp::SwiGlu => swiglu::eval(&inputs, outputs),
        FastOp::AdamStep(a) => adam::eval(a, &inputs, outputs),
        FastOp::QuantizedMatmul(p) => quantized_matmul::eval(p, &inputs, outputs),
        FastOp::GatedDelta(p) => gated_delta::eval(p, &inputs, outputs),
        _ => norm::eval(op, &inputs, outputs),
    }
}

/// The elements of a row-major operand.
pub(crate) fn elems<T: bytemuck::Pod>(x: &Operand) -> Result<&[T]> {
    let start = x.data.layout.offset;
    host_slice::<T>(x)?.get(start..start + x.size()).ok_or_else(|| internal("operand shorter than its shape"))
}

/// An output buffer of `out`'s size in `T`.
pub(crate) fn buffer<T: bytemuck::Pod>(out: &Output) -> Result<HostBuffer> {
    HostBuffer::uninit(out.size() * size_of::<T>())
}

/// Rows per task: about `GRAIN` elements.
pub(crate) fn rows_per_task(len: usize) -> usize {
    (GRAIN / len.max(1)).max(1)
}

const L: usize = 16;

/// Row maximum, NaN propagating.
#[inline(always)]
pub(crate) fn row_max<T: Float>(x: &[T]) -> T::Acc {
    let low = T::lowest().to_acc();
    let pick = |m: T::Acc, v: T::Acc| if v > m || v.is_nan() { v } else { m };
    let mut lanes = [low; L];
    let mut chunks = x.chunks_exact(L);
    for c in &mut chunks {
        for i in 0..L {
            lanes[i] = pick(lanes[i], c[i].to_acc());
        }
    }
    chunks.remainder().iter().map(|v| v.to_acc()).chain(lanes).fold(low, pick)
}

/// `Σ f(v)` over a row, in `L` independent lanes the compiler keeps in vector registers.
#[inline(always)]
pub(crate) fn lane_sum<T: Float>(x: &[T], f: impl Fn(T::Acc) -> T::Acc) -> T::Acc {
    let mut lanes = [T::Acc::zero(); L];
    let mut chunks = x.chunks_exact(L);
    for c in &mut chunks {
        for i in 0..L {
            lanes[i] = lanes[i] + f(c[i].to_acc());
        }
    }
    let tail = chunks.remainder().iter().fold(T::Acc::zero(), |a, v| a + f(v.to_acc()));
    lanes.into_iter().fold(tail, |a, b| a + b)
}

/// `sum(exp(x - m))`, writing each exponential to `o` (as `store` makes it an element of `o`).
/// The sum is [`lane_sum`]'s, bit for bit.
#[inline(always)]
pub(crate) fn exp_sum_store<T: Float, U>(x: &[T], m: T::Acc, o: &mut [U], store: impl Fn(T::Acc) -> U) -> T::Acc {
    let mut lanes = [T::Acc::zero(); L];
    let mut chunks = x.chunks_exact(L);
    let mut outs = o.chunks_exact_mut(L);
    for (c, o) in (&mut chunks).zip(&mut outs) {
        for i in 0..L {
            let e = (c[i].to_acc() - m).vexp();
            o[i] = store(e);
            lanes[i] = lanes[i] + e;
        }
    }
    let mut tail = T::Acc::zero();
    for (v, o) in chunks.remainder().iter().zip(outs.into_remainder()) {
        let e = (v.to_acc() - m).vexp();
        *o = store(e);
        tail = tail + e;
    }
    lanes.into_iter().fold(tail, |a, b| a + b)
}

/// Operands, outputs and runs of fast ops for the kernels' unit tests.
#[cfg(test)]
pub(crate) mod testing {
    use nuvec_core::DType;
    use nuvec_core::backend::Backend;
    use nuvec_core::fast::FastOp;
    use nuvec_core::primitive::Primitive;
    use nuvec_core::storage::{Data, HostBuffer, Operand, Output, Spec};

    use crate::CpuBackend;
    use crate::elem::Elem;

    pub(crate) fn operand<E: Elem>(shape: &[i32], values: &[E]) -> Operand {
        let buf = HostBuffer::from_bytes(bytemuck::cast_slice(values)).unwrap();
        Operand { shape: shape.into(), dtype: E::DTYPE, data: Data::from_host_buffer(shape, buf), donated: false }
    }

    pub(crate) fn output(shape: &[i32], dtype: DType) -> Output {
        Output { shape: shape.into(), dtype, data: None }
    }

    pub(crate) fn values<E: Elem>(o: &Output) -> Vec<E> {
        let data = o.data.as_ref().expect("an output");
        data.storage.host_buffer().expect("host memory").as_slice::<E>().to_vec()
    }

    /// Deterministic values in `[lo, hi)`.
    pub(crate) fn sample(n: usize, seed: u64, lo: f64, hi: f64) -> Vec<f64> {
        let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        (0..n)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                lo + (hi - lo) * (s >> 11) as f64 / (1u64 << 53) as f64
            })
            .collect()
    }

    /// Whether the backend runs `op` on these inputs fused.
    pub(crate) fn fused(op: &FastOp, inputs: &[Operand]) -> bool {
        let specs: Vec<Spec> = inputs.iter().map(|o| Spec { shape: o.shape.clone(), dtype: o.dtype }).collect();
        CpuBackend.supports(&Primitive::Fast(op.clone()), &specs, &[])
    }

    /// Runs `op` with the fast kernels, checking that the backend takes it.
    pub(crate) fn run(op: FastOp, inputs: Vec<Operand>, mut outs: Vec<Output>) -> Vec<Output> {
        assert!(fused(&op, &inputs), "{} is fused", op.name());
        super::eval(&op, inputs, &mut outs).expect("the kernel runs");
        outs
    }
}
