//! Products of matrices picked by index (`gather_mm`, `gather_qmm`), as mixture-of-experts
//! layers call them: each output's matrices are read where they are in their stacks, so a
//! stack of experts is never copied (the composition takes the picked ones first).

use half::{bf16, f16};
use nuvec_core::fast::QuantMatmulParams;
use nuvec_core::storage::{Data, HostBuffer, Layout, Operand, Output};
use nuvec_core::{DType, Result};

use super::{elems, quantized_matmul};
use crate::elem::Float;
use crate::gather::{gathered, with_index};
use crate::matmul::gemm_batched;
use crate::{copy, internal, unsupported};

/// Each output's matrix of a stack of `n`, with a gather's index rules.
fn picks(idx: Operand, n: i32) -> Result<Vec<usize>> {
    let idx = copy::row_major(idx)?;
    let start = idx.data.layout.offset as isize;
    with_index(&idx, |at| Ok((0..idx.size() as isize).map(|j| gathered(at(start + j), n as i64) as usize).collect()))
}

/// Matrix `i` of a stack `[E, R, C]` (any strides) as an operand of its own, in place.
fn matrix(x: &Operand, i: usize) -> Operand {
    let l = &x.data.layout;
    let offset = (l.offset as isize + i as isize * l.strides[0]) as usize;
    let shape = x.shape[1..].to_vec();
    let layout = Layout::new(&shape, l.strides[1..].into(), offset);
    Operand {
        shape: shape.as_slice().into(),
        dtype: x.dtype,
        data: Data { storage: x.data.storage.clone(), layout },
        donated: false,
    }
}

/// `[a [Ba, M, K], b [Bb, K, N], lhs [B], rhs [B]]` to `[B, M, N]`: output `i` is
/// `a[lhs[i]] · b[rhs[i]]`. `a` and `b` may have any strides (`b` is often a transposed view
/// of `[E, N, K]` weights).
pub(super) fn gather_mm(mut inputs: Vec<Operand>, outputs: &mut [Output]) -> Result<()> {
    let out = outputs.first_mut().ok_or_else(|| internal("gather_mm without an output"))?;
    let (rhs, lhs) = (inputs.pop(), inputs.pop());
    let (Some(lhs), Some(rhs), [a, b]) = (lhs, rhs, &mut inputs[..]) else {
        return Err(internal("gather_mm takes four inputs"));
    };
    let (li, ri) = (picks(lhs, a.shape[0])?, picks(rhs, b.shape[0])?);
    let mut buf = HostBuffer::uninit(out.size() * out.dtype.size())?;
    if !buf.is_empty() {
        match out.dtype {
            DType::F32 => product::<f32>(a, b, &li, &ri, buf.as_mut_slice(), &out.shape)?,
            DType::F64 => product::<f64>(a, b, &li, &ri, buf.as_mut_slice(), &out.shape)?,
            DType::F16 => widened::<f16>(a, b, &li, &ri, &mut buf, &out.shape)?,
            DType::BF16 => widened::<bf16>(a, b, &li, &ri, &mut buf, &out.shape)?,
            d => return Err(unsupported(d)),
        }
    }
    out.data = Some(Data::from_host_buffer(&out.shape, buf));
    Ok(())
}

/// The products into `dst` (`out_shape` `[B, M, N]`, row-major), each at its picks' offsets.
fn product<T: crate::elem::Elem + num_traits::One + 'static>(
    a: &Operand,
    b: &Operand,
    li: &[usize],
    ri: &[usize],
    dst: &mut [T],
    out_shape: &[i32],
) -> Result<()> {
    let (la, lb) = (&a.data.layout, &b.data.layout);
    let block = (out_shape[1] * out_shape[2]) as usize;
    let batch: Vec<[isize; 3]> = (li.iter().zip(ri).enumerate())
        .map(|(i, (&l, &r))| {
            let oa = la.offset as isize + l as isize * la.strides[0];
            [oa, lb.offset as isize + r as isize * lb.strides[0], (i * block) as isize]
        })
        .collect();
    gemm_batched::<T>(a, b, dst, out_shape, &batch, false, T::zeroed(), T::one())
}

/// Half-precision products in `f32`: only the picked matrices are widened, once each.
fn widened<H: Float<Acc = f32> + bytemuck::Pod>(
    a: &Operand,
    b: &Operand,
    li: &[usize],
    ri: &[usize],
    buf: &mut HostBuffer,
    out_shape: &[i32],
) -> Result<()> {
    let (a32, li) = widen_picked(a, li)?;
    let (b32, ri) = widen_picked(b, ri)?;
    let mut acc = vec![0f32; buf.as_slice::<H>().len()];
    product::<f32>(&a32, &b32, &li, &ri, &mut acc, out_shape)?;
    buf.as_mut_slice::<H>().iter_mut().zip(&acc).for_each(|(o, &v)| *o = H::from_acc(v));
    Ok(())
}

/// The distinct matrices `picks` names, widened to an `f32` stack, and each pick's place in it.
/// Each keeps its dense layout (a transposed matrix stays column-major, the order its elements
/// are stored in, which is the fast one to read).
fn widen_picked(x: &Operand, picks: &[usize]) -> Result<(Operand, Vec<usize>)> {
    let mut order: Vec<usize> = picks.to_vec();
    order.sort_unstable();
    order.dedup();
    let (rows, cols) = (x.shape[1], x.shape[2]);
    let per = (rows * cols) as usize;
    let mut stack = HostBuffer::uninit(order.len() * per * 4)?;
    let mut strides = vec![cols as isize, 1];
    for (slot, &p) in order.iter().enumerate() {
        let mut o = Output { shape: [rows, cols].as_slice().into(), dtype: DType::F32, data: None };
        copy::astype(matrix(x, p), &mut o)?;
        let data = o.data.ok_or_else(|| internal("cast produced no output"))?;
        strides = data.layout.strides.to_vec();
        let cast = Operand { shape: o.shape, dtype: DType::F32, data, donated: false };
        stack.as_mut_slice::<f32>()[slot * per..(slot + 1) * per].copy_from_slice(elems::<f32>(&cast)?);
    }
    let shape = [order.len() as i32, rows, cols];
    let layout = Layout::new(&shape, vec![per as isize, strides[0], strides[1]].into(), 0);
    let storage = Data::from_host_buffer(&shape, stack).storage;
    let operand =
        Operand { shape: shape.as_slice().into(), dtype: DType::F32, data: Data { storage, layout }, donated: false };
    let places = picks.iter().map(|p| order.binary_search(p).unwrap_or(0)).collect();
    Ok((operand, places))
}

/// `[x [Bx, M, K], w, scales, biases?, lhs [B], rhs [B]]` (weights stacked `[E, ...]`, row-major)
/// to `[B, M, N]`: output `i` is `quantized_matmul(x[lhs[i]], w[rhs[i]], ...)`, each through the
/// quantized product's kernel on the picked expert's slices of the stacks.
pub(super) fn gather_qmm(p: &QuantMatmulParams, mut inputs: Vec<Operand>, outputs: &mut [Output]) -> Result<()> {
    let out = outputs.first_mut().ok_or_else(|| internal("gather_qmm without an output"))?;
    let (rhs, lhs) = (inputs.pop(), inputs.pop());
    let (Some(lhs), Some(rhs)) = (lhs, rhs) else { return Err(internal("gather_qmm takes index inputs")) };
    let inputs: Vec<Operand> = inputs.into_iter().map(copy::row_major).collect::<Result<_>>()?;
    let (li, ri) = (picks(lhs, inputs[0].shape[0])?, picks(rhs, inputs[1].shape[0])?);
    let item = out.size() / li.len().max(1) * out.dtype.size();
    let mut buf = HostBuffer::uninit(out.size() * out.dtype.size())?;
    for (i, (&l, &r)) in li.iter().zip(&ri).enumerate() {
        let mut picked = vec![matrix(&inputs[0], l)];
        picked.extend(inputs[1..].iter().map(|w| matrix(w, r)));
        let mut one = [Output { shape: out.shape[1..].into(), dtype: out.dtype, data: None }];
        quantized_matmul::eval(p, &picked, &mut one)?;
        let data = one[0].data.take().ok_or_else(|| internal("quantized_matmul produced no output"))?;
        let host = data.storage.host_buffer().ok_or_else(|| internal("product not on the host"))?;
        buf.as_mut_slice::<u8>()[i * item..(i + 1) * item].copy_from_slice(&host.as_slice::<u8>()[..item]);
    }
    out.data = Some(Data::from_host_buffer(&out.shape, buf));
    Ok(())
}

#[cfg(test)]
mod tests {
    use half::bf16;
    use nuvec_core::DType;
    use nuvec_core::fast::FastOp;
    use nuvec_core::storage::Layout;

    use super::super::testing::{operand, output, run, sample, values};

    /// `a [2, 3, 5] · b[e]`, with `b` a transposed view of `[4, 6, 5]` (as `SwitchLinear` passes
    /// its weights) and indices that wrap (-1) or clamp (9), against the products in f64.
    fn check(dtype: DType) {
        let (ba, m, k, e, n) = (2usize, 3usize, 5usize, 4usize, 6usize);
        let av = sample(ba * m * k, 1, -1.0, 1.0);
        let bv = sample(e * n * k, 2, -1.0, 1.0);
        let (li, ri) = ([1i32, 0, -1, 1], [3i32, -1, 9, 0]);
        let (lp, rp) = ([1usize, 0, 1, 1], [3usize, 3, 3, 0]);
        let cast = |v: &[f64]| -> Vec<u8> {
            match dtype {
                DType::F32 => bytemuck::cast_slice(&v.iter().map(|&x| x as f32).collect::<Vec<_>>()).to_vec(),
                _ => bytemuck::cast_slice(&v.iter().map(|&x| bf16::from_f64(x)).collect::<Vec<_>>()).to_vec(),
            }
        };
        let rounded = |v: &[f64]| -> Vec<f64> {
            v.iter().map(|&x| if dtype == DType::F32 { x as f32 as f64 } else { bf16::from_f64(x).to_f64() }).collect()
        };
        let (ar, br) = (rounded(&av), rounded(&bv));
        let mut a = operand::<u8>(&[(ba * m * k * dtype.size()) as i32], &cast(&av));
        a.shape = [ba as i32, m as i32, k as i32].as_slice().into();
        a.dtype = dtype;
        a.data.layout = Layout::row_major(&a.shape);
        let mut b = operand::<u8>(&[(e * n * k * dtype.size()) as i32], &cast(&bv));
        b.shape = [e as i32, k as i32, n as i32].as_slice().into();
        b.dtype = dtype;
        b.data.layout = Layout::new(&b.shape, vec![(n * k) as isize, 1, k as isize].into(), 0);
        let inputs = vec![a, b, operand(&[4], &li), operand(&[4], &ri)];
        let out = run(FastOp::GatherMm, inputs, vec![output(&[4, m as i32, n as i32], dtype)]);
        let got: Vec<f64> = match dtype {
            DType::F32 => values::<f32>(&out[0]).iter().map(|&v| v as f64).collect(),
            _ => values::<bf16>(&out[0]).iter().map(|v| v.to_f64()).collect(),
        };
        for (i, (&l, &r)) in lp.iter().zip(&rp).enumerate() {
            for row in 0..m {
                for col in 0..n {
                    let want: f64 = (0..k).map(|c| ar[(l * m + row) * k + c] * br[(r * n + col) * k + c]).sum();
                    let g = got[(i * m + row) * n + col];
                    let tol = if dtype == DType::F32 { 1e-5 } else { 2e-2 };
                    assert!(
                        (g - want).abs() <= tol * want.abs().max(1.0),
                        "{dtype} [{i}, {row}, {col}]: {g} vs {want}"
                    );
                }
            }
        }
    }

    #[test]
    fn picked_matrices_are_read_in_place_with_take_s_index_rules() {
        check(DType::F32);
        check(DType::BF16);
    }
}
