//! Quantize and dequantize in MLX's formats, bit for bit with MLX's CPU results.
//!
//! Affine quantization computes in `f32` whatever the weight dtype (as MLX's CPU kernel
//! does). The FP modes follow MLX's composition step by step: each step computes in `f32`
//! (`f64` for `f64` weights) and rounds to the weight dtype, so the chosen codes match even
//! where that rounding moves a value across a rounding boundary.

use nuvec_core::Result;
use nuvec_core::primitive::QuantMode;
use nuvec_core::storage::{Data, HostBuffer, Operand, Output};
use rayon::prelude::*;

use crate::elem::{Cast, Float};
use crate::{copy, for_float, host_slice, internal};

/// The E2M1 values by code (bit 3 is the sign), in MLX's order.
const FP4: [f32; 16] = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0];

/// Rounds an `f32` to the nearest E4M3 code (ties to even), saturating at ±448.
pub fn to_fp8(f: f32) -> u8 {
    const FP8_MAX: u32 = 543 << 21;
    const DENORM: u32 = 141 << 23;
    let mut bits = f.to_bits();
    let sign = bits & 0x8000_0000;
    bits ^= sign;
    let code = if bits >= FP8_MAX {
        0x7E
    } else if bits < (121 << 23) {
        // Subnormal range: adding 2^-6 * 2^? aligns the mantissa so the FPU rounds it.
        (f32::from_bits(bits) + f32::from_bits(DENORM)).to_bits().wrapping_sub(DENORM) as u8
    } else {
        let odd = (bits >> 20) & 1;
        (bits.wrapping_add((7u32.wrapping_sub(127) << 23).wrapping_add(0x7FFFF)).wrapping_add(odd) >> 20) as u8
    };
    code | (sign >> 24) as u8
}

/// The value of an E4M3 code (0x7F and 0xFF are NaN).
pub fn from_fp8(x: u8) -> f32 {
    if x & 0x7F == 0x7F {
        return f32::NAN;
    }
    let v = half::f16::from_bits(((x & 127) as u16) << 7).to_f32() * 256.0;
    if x & 128 != 0 { -v } else { v }
}

fn dense<T: bytemuck::Pod>(x: &Operand) -> Result<&[T]> {
    let start = x.data.layout.offset;
    Ok(&host_slice::<T>(x)?[start..start + x.size()])
}

fn finish(out: &mut Output, buf: HostBuffer) {
    out.data = Some(Data::from_host_buffer(&out.shape, buf));
}

/// Writes `bits`-bit values into a little-endian bit stream of words.
fn pack(values: impl Iterator<Item = u32>, bits: u32, words: &mut [u32]) {
    let (mut acc, mut filled, mut at) = (0u64, 0u32, 0usize);
    for v in values {
        acc |= (v as u64) << filled;
        filled += bits;
        if filled >= 32 {
            words[at] = acc as u32;
            at += 1;
            acc >>= 32;
            filled -= 32;
        }
    }
}

/// Every `BITS`-bit value of whole words (`BITS` dividing 32), in order, handed to `put(i, v)`.
#[inline(always)]
fn words_of<const BITS: u32>(words: &[u32], mut put: impl FnMut(usize, u32)) {
    let per = (32 / BITS) as usize;
    for (w, &word) in words.iter().enumerate() {
        for e in 0..per {
            put(w * per + e, (word >> (e as u32 * BITS)) & ((1u32 << BITS) - 1));
        }
    }
}

/// Reads value `i` of a little-endian bit stream of `bits`-bit values.
#[inline(always)]
fn unpack(words: &[u32], i: usize, bits: u32) -> u32 {
    let bit = i * bits as usize;
    let (w, s) = (bit / 32, (bit % 32) as u32);
    let lo = (words[w] as u64) >> s;
    let v = if s + bits > 32 { lo | ((words[w + 1] as u64) << (32 - s)) } else { lo };
    (v & ((1u64 << bits) - 1)) as u32
}

/// `Quantize`: fills the packed weights, the scales and (affine) the biases.
pub fn quantize(mode: QuantMode, group_size: i32, bits: i32, x: Operand, outputs: &mut [Output]) -> Result<()> {
    let x = copy::row_major(x)?;
    for_float!(x.dtype, T => quantize_typed::<T>(mode, group_size as usize, bits as u32, &x, outputs))
}

fn quantize_typed<T: Float>(mode: QuantMode, gs: usize, bits: u32, x: &Operand, outputs: &mut [Output]) -> Result<()> {
    let w = dense::<T>(x)?;
    let groups = w.len() / gs;
    let wpg = gs * bits as usize / 32;
    let mut wq = HostBuffer::uninit(groups * wpg * 4)?;
    let scale_size = if mode == QuantMode::Affine { size_of::<T>() } else { 1 };
    let mut scales = HostBuffer::uninit(groups * scale_size)?;
    let mut biases = HostBuffer::uninit(if mode.has_biases() { groups * size_of::<T>() } else { 0 })?;
    let packed = wq.as_mut_slice::<u32>();
    if gs > 0 && groups > 0 {
        match mode {
            QuantMode::Affine => {
                let (s, b) = (scales.as_mut_slice::<T>(), biases.as_mut_slice::<T>());
                packed
                    .par_chunks_mut(wpg)
                    .zip(s.par_iter_mut().zip(b.par_iter_mut()))
                    .zip(w.par_chunks(gs))
                    .for_each(|((words, (s, b)), g)| affine_group(g, bits, words, s, b));
            }
            _ => {
                let s = scales.as_mut_slice::<u8>();
                packed
                    .par_chunks_mut(wpg)
                    .zip(s.par_iter_mut())
                    .zip(w.par_chunks(gs))
                    .for_each(|((words, s), g)| fp_group(mode, g, words, s));
            }
        }
    }
    let mut outs = outputs.iter_mut();
    let mut next = || outs.next().ok_or_else(|| internal("quantize: missing output"));
    finish(next()?, wq);
    finish(next()?, scales);
    if mode.has_biases() {
        finish(next()?, biases);
    }
    Ok(())
}

/// One affine group, in `f32` like MLX: the scale snaps so that the edge of larger magnitude
/// is a level (the bias), which makes 0 exactly representable when it lies in the range.
fn affine_group<T: Float>(g: &[T], bits: u32, words: &mut [u32], scale_out: &mut T, bias_out: &mut T) {
    let n_bins = ((1u32 << bits) - 1) as f32;
    let vals = || g.iter().map(|v| v.to_f64() as f32);
    let (mut w_min, mut w_max) = (f32::INFINITY, f32::NEG_INFINITY);
    for v in vals() {
        // std::max / std::min semantics: the first argument wins unless the second beats it.
        if w_max < v {
            w_max = v;
        }
        if v < w_min {
            w_min = v;
        }
    }
    let mask = w_min.abs() > w_max.abs();
    let mut scale = (w_max - w_min) / n_bins;
    if scale < 1e-7 {
        scale = 1e-7;
    }
    if !mask {
        scale = -scale;
    }
    let edge = if mask { w_min } else { w_max };
    let q0 = (edge / scale).round_ties_even();
    let mut bias = 0.0f32;
    if q0 != 0.0 {
        scale = edge / q0;
        bias = edge;
    }
    let q = vals().map(|v| {
        let mut q = ((v - bias) / scale).round_ties_even();
        if q < 0.0 {
            q = 0.0;
        }
        if n_bins < q {
            q = n_bins;
        }
        q as u32
    });
    pack(q, bits, words);
    *scale_out = T::from_f32(scale);
    *bias_out = T::from_f32(bias);
}

/// Rounds an accumulator value to `T` and widens it back (one step of MLX's composition).
#[inline(always)]
fn rt<T: Float>(v: T::Acc) -> T::Acc {
    T::from_acc(v).to_acc()
}

/// One group of an FP mode, following MLX's composition (each step rounded to `T`).
fn fp_group<T: Float>(mode: QuantMode, g: &[T], words: &mut [u32], scale_out: &mut u8) {
    use num_traits::{Float as _, Zero};
    let acc = |v: f64| T::Acc::from_f64(v);
    let maxval = acc(if mode == QuantMode::Mxfp8 { 448.0 } else { 6.0 });
    let mut amax = T::Acc::neg_infinity();
    for v in g {
        let a = v.to_acc().abs();
        if amax < a {
            amax = a;
        }
    }
    let s = rt::<T>(amax / maxval);
    // The value each element is divided by, and whether the FP4 code search runs in T
    // (mxfp4: T - T) or in the accumulator (nvfp4: its quotient is promoted to f32 first).
    let (div, search_in_t) = if mode == QuantMode::Nvfp4 {
        let code = to_fp8(s.to_f64() as f32);
        *scale_out = code;
        (rt::<T>(acc(from_fp8(code) as f64)), false)
    } else {
        // The smallest power of two at least `s` (MLX 0.32 rounds the E8M0 scale up).
        let e: i32 = if s == T::Acc::zero() { 0 } else { ceil_log2(s.to_f64()) };
        *scale_out = e.wrapping_add(127) as u8;
        (rt::<T>(acc(2f64.powi(e))), true)
    };
    let q = g.iter().map(|v| {
        let x = rt::<T>(v.to_acc() / div);
        if mode == QuantMode::Mxfp8 {
            return to_fp8(x.to_f64() as f32) as u32;
        }
        let dist = |j: usize| {
            let d = x - acc(FP4[j] as f64);
            if search_in_t { rt::<T>(d).abs() } else { d.abs() }
        };
        let (mut best, mut idx) = (dist(0), 0u32);
        for j in 1..16 {
            let d = dist(j);
            if d < best {
                best = d;
                idx = j as u32;
            }
        }
        idx
    });
    pack(q, if mode == QuantMode::Mxfp8 { 8 } else { 4 }, words);
}

/// `ceil(log2(x))` exactly, for a positive normal `x`.
fn ceil_log2(x: f64) -> i32 {
    let b = x.to_bits();
    let exp = ((b >> 52) & 0x7FF) as i32 - 1023;
    exp + ((b & ((1u64 << 52) - 1)) != 0) as i32
}

/// `Dequantize`: inputs `(w, scales[, biases])`; the output dtype is `out.dtype`.
pub fn dequantize(mode: QuantMode, group_size: i32, bits: i32, inputs: Vec<Operand>, out: &mut Output) -> Result<()> {
    let inputs = inputs.into_iter().map(copy::row_major).collect::<Result<Vec<_>>>()?;
    for_float!(out.dtype, T => dequantize_typed::<T>(mode, group_size as usize, bits as u32, &inputs, out))
}

fn dequantize_typed<T: Float>(mode: QuantMode, gs: usize, bits: u32, x: &[Operand], out: &mut Output) -> Result<()> {
    let packed = Packed::<T>::new(mode, gs, bits, x)?;
    let n = out.size();
    let mut buf = HostBuffer::uninit(n * size_of::<T>())?;
    if n > 0 && gs > 0 {
        let o = buf.as_mut_slice::<T>();
        o.par_chunks_mut(gs).enumerate().for_each(|(i, o)| packed.group(i, |j, v| o[j] = v));
    }
    out.data = Some(Data::from_host_buffer(&out.shape, buf));
    Ok(())
}

/// Packed weights with their scales (and biases), read one group at a time: what `dequantize`
/// writes out and `quantized_matmul` consumes a few rows at a time.
pub(crate) struct Packed<'a, T> {
    mode: QuantMode,
    gs: usize,
    bits: u32,
    words: &'a [u32],
    scales: Scales<'a, T>,
}

enum Scales<'a, T> {
    /// Affine: a scale and a bias per group, in the weight's dtype.
    Affine(&'a [T], &'a [T]),
    /// The FP modes: an E8M0 (MX) or E4M3 (NV) code per group.
    Codes(&'a [u8]),
}

impl<'a, T: Float> Packed<'a, T> {
    /// Reads row-major inputs `[w, scales, biases?]`.
    pub(crate) fn new(mode: QuantMode, gs: usize, bits: u32, x: &'a [Operand]) -> Result<Self> {
        let scales = match (mode, x) {
            (QuantMode::Affine, [_, s, b, ..]) => Scales::Affine(dense::<T>(s)?, dense::<T>(b)?),
            (QuantMode::Affine, _) => return Err(internal("affine dequantization without biases")),
            (_, [_, s, ..]) => Scales::Codes(dense::<u8>(s)?),
            _ => return Err(internal("dequantization without scales")),
        };
        Ok(Packed { mode, gs, bits, words: dense::<u32>(&x[0])?, scales })
    }

    /// Affine weights from the packed words of row-major `w` and scales and biases in `T`.
    pub(crate) fn affine(gs: usize, bits: u32, w: &'a Operand, scales: &'a [T], biases: &'a [T]) -> Result<Self> {
        let scales = Scales::Affine(scales, biases);
        Ok(Packed { mode: QuantMode::Affine, gs, bits, words: dense::<u32>(w)?, scales })
    }

    /// Group `i`'s values, as the dequantization rounds them to `T`, handed to `put(j, v)`.
    #[inline(always)]
    pub(crate) fn group(&self, i: usize, mut put: impl FnMut(usize, T)) {
        let wpg = self.gs * self.bits as usize / 32;
        let words = &self.words[i * wpg..(i + 1) * wpg];
        match self.scales {
            Scales::Affine(s, b) => {
                let (s, b) = (s[i].to_acc(), b[i].to_acc());
                let level = |q: u32| T::from_acc(rt::<T>(T::Acc::from_u64(q as u64) * s) + b);
                // Widths that divide a word unpack word by word, with constant shifts.
                match self.bits {
                    2 => words_of::<2>(words, |j, q| put(j, level(q))),
                    4 => words_of::<4>(words, |j, q| put(j, level(q))),
                    8 => words_of::<8>(words, |j, q| put(j, level(q))),
                    bits => (0..self.gs).for_each(|j| put(j, level(unpack(words, j, bits)))),
                }
            }
            Scales::Codes(s) => {
                let scale = if self.mode == QuantMode::Nvfp4 {
                    rt::<T>(T::Acc::from_f32(from_fp8(s[i])))
                } else {
                    rt::<T>(T::Acc::from_f64(2f64.powi(s[i] as i32 - 127)))
                };
                for j in 0..self.gs {
                    let v = if self.mode == QuantMode::Mxfp8 {
                        rt::<T>(T::Acc::from_f32(from_fp8(unpack(words, j, 8) as u8)))
                    } else {
                        T::Acc::from_f32(FP4[unpack(words, j, 4) as usize])
                    };
                    put(j, T::from_acc(v * scale));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fp8_round_trips_every_code() {
        for c in 0..=255u8 {
            if c & 0x7F == 0x7F {
                assert!(from_fp8(c).is_nan());
                continue;
            }
            let v = from_fp8(c);
            let back = to_fp8(v);
            // -0 and +0 are distinct codes with equal values.
            assert!(back == c || (v == 0.0 && back & 0x7F == 0), "code {c:#x} -> {v} -> {back:#x}");
        }
    }

    #[test]
    fn bit_stream_round_trips() {
        for bits in [2u32, 3, 4, 5, 6, 8] {
            let vals: Vec<u32> = (0..64u32).map(|i| (i * 7 + 3) % (1 << bits)).collect();
            let mut words = vec![0u32; 64 * bits as usize / 32];
            pack(vals.iter().copied(), bits, &mut words);
            let back: Vec<u32> = (0..64).map(|i| unpack(&words, i, bits)).collect();
            assert_eq!(back, vals, "bits {bits}");
        }
    }
}
