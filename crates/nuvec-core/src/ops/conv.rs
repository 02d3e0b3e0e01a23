//! Convolutions, channels last as MLX: `conv1d`, `conv2d`, `conv3d` and `conv_general`.
//!
//! They are compositions of existing operations, so their derivatives, batching rules and
//! backends come for free: the input is dilated and padded, each kernel offset selects a strided
//! window of it (a view), and the windows meet the weight in one matrix product. Depthwise
//! convolutions (one channel per group, as the short convolution of Gated DeltaNet) skip the
//! product: they are a multiply-add of the `K` shifted windows with the kernel taps.

use crate::array::Array;
use crate::dtype::{DType, promote_types};
use crate::error::OpErrorKind;

use super::{invalid, propagate, stack};

/// Options of [`conv_general`]. Each list holds one value per spatial axis, or one value for
/// all of them; an empty list means the default (stride 1, padding 0, dilations 1).
///
/// ```
/// use nuvec::ops::{self, ConvOptions};
/// // A causal depthwise convolution: pad K-1 steps on the left only.
/// let x = ops::ones([1, 6, 4], nuvec::DType::F32);
/// let w = ops::ones([4, 3, 1], nuvec::DType::F32);
/// let opts = ConvOptions { padding_lo: vec![2], groups: 4, ..Default::default() };
/// let y = ops::conv_general(&x, &w, &opts);
/// assert_eq!(y.shape(), &[1, 6, 4]);
/// assert_eq!(y.to_vec::<f32>().unwrap()[..8], [1.0, 1.0, 1.0, 1.0, 2.0, 2.0, 2.0, 2.0]);
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConvOptions {
    /// Step of the kernel over the (dilated, padded) input.
    pub stride: Vec<i32>,
    /// Zeros added before each spatial axis (a negative value crops instead).
    pub padding_lo: Vec<i32>,
    /// Zeros added after each spatial axis (a negative value crops instead).
    pub padding_hi: Vec<i32>,
    /// Spacing between kernel taps.
    pub kernel_dilation: Vec<i32>,
    /// Spacing between input elements (zeros are inserted between them).
    pub input_dilation: Vec<i32>,
    /// Input channel groups; `C_in` and `C_out` must both be multiples of it.
    pub groups: i32,
    /// Flip the kernel's spatial axes (a true convolution rather than a correlation).
    pub flip: bool,
}

impl Default for ConvOptions {
    fn default() -> Self {
        ConvOptions {
            stride: Vec::new(),
            padding_lo: Vec::new(),
            padding_hi: Vec::new(),
            kernel_dilation: Vec::new(),
            input_dilation: Vec::new(),
            groups: 1,
            flip: false,
        }
    }
}

/// A per-axis argument of [`conv2d`] and [`conv3d`]: one `i32` for every spatial axis, or an
/// array or tuple with one value per axis.
pub trait ConvParam<const N: usize> {
    /// The value for each spatial axis.
    fn per_axis(self) -> [i32; N];
}

impl<const N: usize> ConvParam<N> for i32 {
    fn per_axis(self) -> [i32; N] {
        [self; N]
    }
}

impl<const N: usize> ConvParam<N> for [i32; N] {
    fn per_axis(self) -> [i32; N] {
        self
    }
}

impl ConvParam<2> for (i32, i32) {
    fn per_axis(self) -> [i32; 2] {
        [self.0, self.1]
    }
}

impl ConvParam<3> for (i32, i32, i32) {
    fn per_axis(self) -> [i32; 3] {
        [self.0, self.1, self.2]
    }
}

/// 1-d convolution (a cross-correlation, as MLX): `input [N, L, C_in]`, `weight
/// [C_out, K, C_in / groups]`, symmetric zero `padding`, giving `[N, L_out, C_out]` with
/// `L_out = (L + 2·padding − dilation·(K − 1) − 1) / stride + 1`. Floating dtypes only; the
/// two dtypes promote.
///
/// ```
/// use nuvec::{array, ops};
/// let x = array![[[1.0], [2.0], [3.0], [4.0]]]; // [1, 4, 1]
/// let w = array![[[1.0], [10.0]]]; // [1, 2, 1]
/// let y = ops::conv1d(&x, &w, 1, 0, 1, 1);
/// assert_eq!(y.to_vec::<f32>().unwrap(), vec![21.0, 32.0, 43.0]);
/// ```
#[track_caller]
pub fn conv1d(input: &Array, weight: &Array, stride: i32, padding: i32, dilation: i32, groups: i32) -> Array {
    conv_nd("conv1d", 1, input, weight, &symmetric(&[stride], &[padding], &[dilation], groups))
}

/// 2-d convolution: `input [N, H, W, C_in]`, `weight [C_out, KH, KW, C_in / groups]`, giving
/// `[N, H_out, W_out, C_out]`. `stride`, `padding` and `dilation` take one value for both axes
/// or a pair.
///
/// ```
/// use nuvec::{DType, ops};
/// let x = ops::ones([2, 5, 5, 3], DType::F32);
/// let w = ops::ones([8, 3, 3, 3], DType::F32);
/// let y = ops::conv2d(&x, &w, (1, 2), 1, 1, 1);
/// assert_eq!(y.shape(), &[2, 5, 3, 8]);
/// ```
#[track_caller]
pub fn conv2d(
    input: &Array,
    weight: &Array,
    stride: impl ConvParam<2>,
    padding: impl ConvParam<2>,
    dilation: impl ConvParam<2>,
    groups: i32,
) -> Array {
    let opts = symmetric(&stride.per_axis(), &padding.per_axis(), &dilation.per_axis(), groups);
    conv_nd("conv2d", 2, input, weight, &opts)
}

/// 3-d convolution: `input [N, D, H, W, C_in]`, `weight [C_out, KD, KH, KW, C_in / groups]`.
#[track_caller]
pub fn conv3d(
    input: &Array,
    weight: &Array,
    stride: impl ConvParam<3>,
    padding: impl ConvParam<3>,
    dilation: impl ConvParam<3>,
    groups: i32,
) -> Array {
    let opts = symmetric(&stride.per_axis(), &padding.per_axis(), &dilation.per_axis(), groups);
    conv_nd("conv3d", 3, input, weight, &opts)
}

/// Convolution over 1 to 3 spatial axes with every option of MLX's `conv_general`: separate
/// low and high padding, kernel and input dilation, groups and kernel flip. `input` is
/// `[N, ..., C_in]` and `weight` `[C_out, ..., C_in / groups]`.
#[track_caller]
pub fn conv_general(input: &Array, weight: &Array, options: &ConvOptions) -> Array {
    if let Some(f) = propagate(&[input, weight]) {
        return f;
    }
    let spatial = input.ndim().saturating_sub(2);
    conv_nd("conv_general", spatial, input, weight, options)
}

impl Array {
    /// 1-d convolution with `weight` (see [`conv1d`]).
    #[track_caller]
    pub fn conv1d(&self, weight: &Array, stride: i32, padding: i32, dilation: i32, groups: i32) -> Array {
        conv1d(self, weight, stride, padding, dilation, groups)
    }

    /// 2-d convolution with `weight` (see [`conv2d`]).
    #[track_caller]
    pub fn conv2d(
        &self,
        weight: &Array,
        stride: impl ConvParam<2>,
        padding: impl ConvParam<2>,
        dilation: impl ConvParam<2>,
        groups: i32,
    ) -> Array {
        conv2d(self, weight, stride, padding, dilation, groups)
    }
}

fn symmetric(stride: &[i32], padding: &[i32], dilation: &[i32], groups: i32) -> ConvOptions {
    ConvOptions {
        stride: stride.to_vec(),
        padding_lo: padding.to_vec(),
        padding_hi: padding.to_vec(),
        kernel_dilation: dilation.to_vec(),
        input_dilation: Vec::new(),
        groups,
        flip: false,
    }
}

/// The checked geometry of one convolution.
struct Plan {
    dtype: DType,
    stride: Vec<i32>,
    lo: Vec<i32>,
    hi: Vec<i32>,
    kdil: Vec<i32>,
    idil: Vec<i32>,
    groups: i32,
    kernel: Vec<i32>,
    out: Vec<i32>,
}

/// `values` spread over `d` axes: empty gives `default`, one value repeats.
#[track_caller]
fn per_axis(op: &'static str, name: &str, values: &[i32], d: usize, default: i32) -> Result<Vec<i32>, Array> {
    match values.len() {
        0 => Ok(vec![default; d]),
        1 => Ok(vec![values[0]; d]),
        n if n == d => Ok(values.to_vec()),
        n => Err(invalid(op, format!("{name} has {n} values for {d} spatial axes"))),
    }
}

#[track_caller]
fn plan(op: &'static str, d: usize, x: &Array, w: &Array, o: &ConvOptions) -> Result<Plan, Array> {
    if !(1..=3).contains(&d) || x.ndim() != d + 2 {
        return Err(invalid(
            op,
            format!(
                "input must be [N, ..., C_in] with {} spatial axes, got shape {:?}",
                if (1..=3).contains(&d) { d.to_string() } else { "1 to 3".into() },
                x.shape()
            ),
        ));
    }
    if w.ndim() != d + 2 {
        return Err(invalid(
            op,
            format!("weight must be [C_out, ..., C_in / groups] with {d} spatial axes, got shape {:?}", w.shape()),
        ));
    }
    for a in [x, w] {
        if !a.dtype().is_float() {
            return Err(Array::failed(op, OpErrorKind::UnsupportedDType(a.dtype())));
        }
    }
    let stride = per_axis(op, "stride", &o.stride, d, 1)?;
    let lo = per_axis(op, "padding_lo", &o.padding_lo, d, 0)?;
    let hi = per_axis(op, "padding_hi", &o.padding_hi, d, 0)?;
    let kdil = per_axis(op, "kernel_dilation", &o.kernel_dilation, d, 1)?;
    let idil = per_axis(op, "input_dilation", &o.input_dilation, d, 1)?;
    for (name, v) in [("stride", &stride), ("kernel_dilation", &kdil), ("input_dilation", &idil)] {
        if v.iter().any(|&s| s < 1) {
            return Err(invalid(op, format!("{name} must be positive, got {v:?}")));
        }
    }
    let (c_in, c_out, cg) = (x.shape()[d + 1], w.shape()[0], w.shape()[d + 1]);
    let groups = o.groups;
    if groups < 1 {
        return Err(invalid(op, format!("groups must be positive, got {groups}")));
    }
    if c_in % groups != 0 || cg as i64 * groups as i64 != c_in as i64 {
        return Err(invalid(
            op,
            format!(
                "weight {:?} with {groups} group(s) expects {} input channels per group, but the input {:?} has {c_in} channels",
                w.shape(),
                cg,
                x.shape()
            ),
        ));
    }
    if c_out % groups != 0 {
        return Err(invalid(op, format!("{c_out} output channels are not divisible by {groups} groups")));
    }
    let kernel: Vec<i32> = w.shape()[1..=d].to_vec();
    let mut out = Vec::with_capacity(d);
    for i in 0..d {
        let size = x.shape()[i + 1] as i64;
        let dilated = if size == 0 { 0 } else { (size - 1) * idil[i] as i64 + 1 };
        let padded = dilated + lo[i] as i64 + hi[i] as i64;
        let span = (kernel[i] as i64 - 1) * kdil[i] as i64 + 1;
        if kernel[i] < 1 || padded < span {
            return Err(invalid(
                op,
                format!(
                    "spatial axis {} of the input {:?} is {padded} after dilation and padding, shorter than the \
                     dilated kernel ({span}) of the weight {:?}",
                    i + 1,
                    x.shape(),
                    w.shape()
                ),
            ));
        }
        let o = (padded - span) / stride[i] as i64 + 1;
        out.push(super::dim_or_fail(op, o, || vec![o])?);
    }
    let dtype = promote_types(x.dtype(), w.dtype());
    Ok(Plan { dtype, stride, lo, hi, kdil, idil, groups, kernel, out })
}

/// Inserts `k − 1` zeros between neighbours along `axis`.
fn dilate(x: &Array, axis: usize, k: i32) -> Array {
    let n = x.shape()[axis];
    if k == 1 || n <= 1 {
        return x.clone();
    }
    let mut widths = vec![(0, 0); x.ndim() + 1];
    widths[axis + 1] = (0, k - 1);
    let mut merged = x.shape().to_vec();
    merged[axis] = n * k;
    let spread = x.expand_dims(axis as i32 + 1).pad(&widths, 0).reshape(merged);
    let mut stop = spread.shape().to_vec();
    stop[axis] = (n - 1) * k + 1;
    spread.slice(&vec![0; x.ndim()], &stop, &[])
}

#[track_caller]
fn conv_nd(op: &'static str, d: usize, x: &Array, w: &Array, o: &ConvOptions) -> Array {
    if let Some(f) = propagate(&[x, w]) {
        return f;
    }
    let p = match plan(op, d, x, w, o) {
        Ok(p) => p,
        Err(f) => return f,
    };
    let mut x = x.astype(p.dtype);
    let mut w = w.astype(p.dtype);
    for i in 0..d {
        x = dilate(&x, i + 1, p.idil[i]);
    }
    // Positive padding adds zeros, negative padding crops.
    let mut widths = vec![(0, 0); d + 2];
    for i in 0..d {
        widths[i + 1] = (p.lo[i].max(0), p.hi[i].max(0));
    }
    if widths.iter().any(|&(a, b)| a > 0 || b > 0) {
        x = x.pad(&widths, 0);
    }
    if p.lo.iter().chain(&p.hi).any(|&v| v < 0) {
        let mut start = vec![0; d + 2];
        let mut stop = x.shape().to_vec();
        for i in 0..d {
            start[i + 1] = (-p.lo[i]).max(0);
            stop[i + 1] -= (-p.hi[i]).max(0);
        }
        x = x.slice(&start, &stop, &[]);
    }
    if o.flip {
        let start: Vec<i32> =
            w.shape().iter().enumerate().map(|(i, &s)| if (1..=d).contains(&i) { s - 1 } else { 0 }).collect();
        let stop: Vec<i32> =
            w.shape().iter().enumerate().map(|(i, &s)| if (1..=d).contains(&i) { -s - 1 } else { s }).collect();
        let steps: Vec<i32> = (0..d + 2).map(|i| if (1..=d).contains(&i) { -1 } else { 1 }).collect();
        w = w.slice(&start, &stop, &steps);
    }

    let (n, c_in, c_out) = (x.shape()[0], x.shape()[d + 1], w.shape()[0]);
    let taps: i32 = p.kernel.iter().product();
    let window = |x: &Array, offset: &[i32]| -> Array {
        let mut start = vec![0; d + 2];
        let mut stop = x.shape().to_vec();
        let mut step = vec![1; d + 2];
        for i in 0..d {
            start[i + 1] = offset[i] * p.kdil[i];
            stop[i + 1] = start[i + 1] + (p.out[i] - 1) * p.stride[i] + 1;
            step[i + 1] = p.stride[i];
        }
        x.slice(&start, &stop, &step)
    };
    let offsets: Vec<Vec<i32>> = (0..taps)
        .map(|mut t| {
            let mut k = vec![0; d];
            for i in (0..d).rev() {
                k[i] = t % p.kernel[i];
                t /= p.kernel[i];
            }
            k
        })
        .collect();
    let mut out_shape = vec![n];
    out_shape.extend_from_slice(&p.out);
    out_shape.push(c_out);

    if p.groups == c_in && c_out == c_in {
        // Depthwise: each output channel sees one input channel, so a product would be all
        // padding. Half types accumulate in f32.
        let acc = if p.dtype.is_half() { DType::F32 } else { p.dtype };
        let xa = x.astype(acc);
        let taps_by_channel = w.astype(acc).reshape([c_out, taps]).t();
        let mut y: Option<Array> = None;
        for (t, k) in offsets.iter().enumerate() {
            let tap = taps_by_channel.slice(&[t as i32, 0], &[t as i32 + 1, c_out], &[]).reshape([c_out]);
            let term = window(&xa, k) * &tap;
            y = Some(match y {
                None => term,
                Some(s) => s + term,
            });
        }
        return y.expect("a kernel has at least one tap").astype(p.dtype);
    }

    let windows: Vec<Array> = offsets.iter().map(|k| window(&x, k)).collect();
    let patches = if windows.len() == 1 { windows[0].expand_dims(d as i32 + 1) } else { stack(&windows, d as i32 + 1) };
    let m: i32 = n * p.out.iter().product::<i32>();
    let (g, cg, cog) = (p.groups, c_in / p.groups, c_out / p.groups);
    let y = if g == 1 {
        patches.reshape([m, taps * c_in]).matmul(&w.reshape([c_out, taps * c_in]).t())
    } else {
        let a = patches.reshape([m, taps, g, cg]).transpose(&[2, 0, 1, 3]).reshape([g, m, taps * cg]);
        let b = w.reshape([g, cog, taps * cg]).transpose(&[0, 2, 1]);
        a.matmul(&b).transpose(&[1, 0, 2])
    };
    y.reshape(out_shape)
}
