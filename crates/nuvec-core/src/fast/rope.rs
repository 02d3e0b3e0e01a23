//! Rotary position embeddings, as MLX's `mx.fast.rope`.
//!
//! `x` is `[B, ..., T, D]`; its first `dims` features are rotated in pairs — the two halves
//! `(x[i], x[i + dims/2])`, or neighbours `(x[2i], x[2i+1])` when `traditional` — by the angle
//! `(offset + t) · scale · θᵢ` with `θᵢ = base^(−2i/dims)` or `1 / freqs[i]`. The rest pass
//! through. The inverse rotation (`forward = false`) is the derivative.

use super::{FastOp, RopeParams};
use crate::array::Array;
use crate::dtype::DType;
use crate::error::OpErrorKind;
use crate::ops;

fn invalid(msg: String) -> OpErrorKind {
    OpErrorKind::InvalidArgument(msg)
}

/// `x[..., start:stop:step]`.
fn last_axis(x: &Array, start: i32, stop: i32, step: i32) -> Array {
    let nd = x.ndim();
    let mut lo = vec![0; nd];
    let mut hi: Vec<i32> = x.shape().to_vec();
    let mut st = vec![1; nd];
    (lo[nd - 1], hi[nd - 1], st[nd - 1]) = (start, stop, step);
    x.slice(&lo, &hi, &st)
}

/// Angles `[..., T, dims/2]` in `float32`: positions `(offset + t) · scale` times `θᵢ`.
fn angles(p: &RopeParams, shape: &[i32], offset: &Array, freqs: Option<&Array>) -> Array {
    let nd = shape.len();
    let (t, half) = (shape[nd - 2], p.dims / 2);
    let inv_freq = match (p.base, freqs) {
        (Some(base), _) => (ops::arange(0, half, 1).astype(DType::F32) * (-(base.ln()) / half as f32)).exp(),
        (None, Some(f)) => f.astype(DType::F32).reciprocal(),
        (None, None) => return Array::failed("rope", invalid("rope: neither base nor freqs".into())),
    };
    let steps = ops::arange(0, t, 1).astype(DType::F32);
    let off = offset.astype(DType::F32);
    let pos = if offset.ndim() == 0 {
        steps + off
    } else {
        // One offset per batch row: [B, 1, ..., 1] + [T] broadcasts to [B, 1, ..., T].
        let mut s = vec![1; nd - 1];
        s[0] = shape[0];
        off.reshape(s) + steps
    };
    (pos * p.scale).expand_dims(-1) * inv_freq
}

pub(super) fn composition(p: &RopeParams, x: &Array, offset: &Array, freqs: Option<&Array>) -> Array {
    let shape = x.shape().to_vec();
    let (d, dims, half) = (shape[shape.len() - 1], p.dims, p.dims / 2);
    let theta = angles(p, &shape, offset, freqs);
    let (c, s) = (theta.cos(), if p.forward { theta.sin() } else { -theta.sin() });
    let xf = if x.dtype() == DType::F64 { x.clone() } else { x.astype(DType::F32) };
    let (x1, x2) = if p.traditional {
        (last_axis(&xf, 0, dims, 2), last_axis(&xf, 1, dims, 2))
    } else {
        (last_axis(&xf, 0, half, 1), last_axis(&xf, half, dims, 1))
    };
    let o1 = &x1 * &c - &x2 * &s;
    let o2 = &x1 * &s + &x2 * &c;
    let rotated = if p.traditional {
        let mut s = shape.clone();
        *s.last_mut().expect("rope inputs are at least 3-D") = dims;
        ops::stack(&[o1, o2], -1).reshape(s)
    } else {
        ops::concatenate(&[o1, o2], -1)
    };
    let out = if dims < d { ops::concatenate(&[rotated, last_axis(&xf, dims, d, 1)], -1) } else { rotated };
    out.astype(x.dtype())
}

/// Rotary position embedding of `x` (`[B, ..., T, D]`), as MLX's `mx.fast.rope`: the first
/// `dims` features of position `t` rotate by `(offset + t) · scale · θᵢ`, with
/// `θᵢ = base^(−2i/dims)` (`base`) or `1 / freqs[i]` (`freqs`, exactly one of the two).
/// `offset` is an integer scalar or one offset per batch row (`[B]`). `traditional` rotates
/// neighbouring pairs instead of the two halves.
///
/// ```
/// use nuvec::{array, fast, Array};
/// // One head, two positions, D = 2: position 1 with base 1 rotates by 1 radian.
/// let x = array![[[1.0f32, 0.0], [1.0, 0.0]]].reshape([1, 1, 2, 2]);
/// let y = fast::rope(&x, 2, false, Some(1.0), 1.0, &Array::from(0), None);
/// let v: Vec<f32> = y.to_vec().unwrap();
/// assert_eq!(&v[..2], &[1.0, 0.0]);
/// assert!((v[2] - 1f32.cos()).abs() < 1e-6 && (v[3] - 1f32.sin()).abs() < 1e-6);
/// // Odd dims are refused, naming the argument.
/// let bad = fast::rope(&x, 1, false, Some(1.0), 1.0, &Array::from(0), None);
/// assert!(bad.check().unwrap_err().to_string().contains("dims"));
/// ```
#[track_caller]
pub fn rope<'a>(
    x: &Array,
    dims: i32,
    traditional: bool,
    base: Option<f32>,
    scale: f32,
    offset: &Array,
    freqs: impl Into<Option<&'a Array>>,
) -> Array {
    let freqs = freqs.into();
    if base.is_some() == freqs.is_some() {
        return Array::failed("rope", invalid("rope: exactly one of base and freqs must be given".into()));
    }
    let offset = if offset.dtype().is_integer() && offset.dtype() != DType::I32 {
        offset.astype(DType::I32)
    } else {
        offset.clone()
    };
    let mut inputs = vec![x.clone(), offset];
    // Frequencies are float32 whatever their dtype (as MLX).
    inputs.extend(freqs.map(|f| if f.dtype().is_float() { f.astype(DType::F32) } else { f.clone() }));
    let p = RopeParams { dims, traditional, base, scale, forward: true };
    super::record(FastOp::Rope(p), inputs, 1).remove(0)
}

/// `rope_kv_write`'s composition: the rotation of the query and key heads, the writes.
pub(super) fn kv_write_composition(p: &RopeParams, q_heads: i32, rows: bool, inputs: &[Array]) -> Vec<Array> {
    let (qkv, k_cache, v_cache, start) = (&inputs[0], &inputs[1], &inputs[2], &inputs[3]);
    let s = qkv.shape();
    let (b, l, h, d) = (s[0], s[1], s[2], s[3]);
    let kv = (h - q_heads) / 2;
    let heads =
        |from: i32, n: i32| qkv.slice(&[0, 0, from, 0], &[b, l, from + n, d], &[1, 1, 1, 1]).transpose(&[0, 2, 1, 3]);
    let freqs = inputs.get(4 + rows as usize);
    let rotated = match freqs {
        Some(f) => rope(&heads(0, q_heads + kv), p.dims, p.traditional, None, p.scale, start, f),
        None => rope(&heads(0, q_heads + kv), p.dims, p.traditional, p.base, p.scale, start, None),
    };
    let part = |from: i32, n: i32| rotated.slice(&[0, from, 0, 0], &[b, from + n, l, d], &[1, 1, 1, 1]);
    if rows {
        // Row (b, l, h) of each pool, seen as [rows, D], takes head h of position l of row b.
        let at = inputs[4].reshape([b * l * kv, 1]).broadcast_to([b * l * kv, d]);
        let write = |pool: &Array, x: Array| {
            let n = pool.size() as i32 / d;
            let x = x.transpose(&[0, 2, 1, 3]).reshape([b * l * kv, d]);
            pool.reshape([n, d]).put_along_axis(&at, x, 0).reshape(pool.shape().to_vec())
        };
        return vec![part(0, q_heads), write(k_cache, part(q_heads, kv)), write(v_cache, heads(q_heads + kv, kv))];
    }
    let at = &start.reshape([b, 1, 1, 1]) + &crate::ops::arange(0, l, 1).reshape([1, 1, l, 1]);
    let at = at.broadcast_to([b, kv, l, d]);
    let k = k_cache.put_along_axis(&at, part(q_heads, kv), 2);
    let v = v_cache.put_along_axis(&at, heads(q_heads + kv, kv), 2);
    vec![part(0, q_heads), k, v]
}

/// A decoding step's RoPE and cache writes in one operation: `qkv [B, L, Hq + 2·Hkv, D]` holds
/// the query, key and value heads of `L` new positions (a joined projection's output); the
/// query and key heads are rotated at positions `start[b] + l` (as [`rope`] with a per-row
/// offset), the keys and values written into `k_cache` and `v_cache` (`[B, Hkv, S, D]`) at
/// those positions. Returns the rotated queries `[B, Hq, L, D]` and the updated caches, written
/// in place when the caches' buffers are not otherwise referenced. `base` or `freqs` as in
/// [`rope`]. Positions must lie inside the caches.
///
/// ```
/// use nuvec::{Array, DType, fast, ops};
/// let qkv = ops::arange(0, 16, 1).astype(DType::F32).reshape([1, 1, 4, 4]); // 2 query heads
/// let cache = ops::zeros([1, 1, 3, 4], DType::F32);
/// let start = Array::from_slice(&[2], [1]);
/// let (q, k, v) = fast::rope_kv_write(&qkv, 2, &cache, &cache, &start, 4, false, Some(1e4), 1.0, None);
/// let want = fast::rope(&qkv.slice(&[0, 0, 0, 0], &[1, 1, 2, 4], &[1; 4]).transpose(&[0, 2, 1, 3]), 4, false, Some(1e4), 1.0, &start, None);
/// assert_eq!(q.to_vec::<f32>().unwrap(), want.to_vec::<f32>().unwrap());
/// assert_eq!(&v.to_vec::<f32>().unwrap()[8..], &[12.0, 13.0, 14.0, 15.0]);
/// assert_eq!(&k.to_vec::<f32>().unwrap()[..8], &[0.0; 8]);
/// ```
#[allow(clippy::too_many_arguments)]
#[track_caller]
pub fn rope_kv_write<'a>(
    qkv: &Array,
    q_heads: i32,
    k_cache: &Array,
    v_cache: &Array,
    start: &Array,
    dims: i32,
    traditional: bool,
    base: Option<f32>,
    scale: f32,
    freqs: impl Into<Option<&'a Array>>,
) -> (Array, Array, Array) {
    let rope = RopeParams { dims, traditional, base, scale, forward: true };
    record_kv_write(rope, q_heads, [qkv, k_cache, v_cache, start], None, freqs.into())
}

/// [`rope_kv_write`] into pools of rows, as a paged KV cache's: the rotated key and the value of
/// head `h` of position `l` of row `b` go to row `rows[b, l, h]` of `k_pool` and `v_pool` seen as
/// `[rows, D]` (any shape whose last axis is `D`); the rotation's positions are still
/// `start[b] + l`. `rows` is `int32 [B, L, Hkv]`, each inside the pools. Returns the rotated
/// queries and the pools, written in place when not otherwise referenced.
///
/// ```
/// use nuvec::{Array, DType, fast, ops};
/// let qkv = ops::arange(0, 16, 1).astype(DType::F32).reshape([1, 1, 4, 4]); // 2 query heads
/// let pool = ops::zeros([2, 1, 2, 4], DType::F32); // 2 blocks of 2 positions
/// let (start, rows) = (Array::from_slice(&[5], [1]), Array::from_slice(&[3], [1, 1, 1]));
/// let (_, _, v) =
///     fast::rope_kv_write_rows(&qkv, 2, &pool, &pool, &start, &rows, 4, false, Some(1e4), 1.0, None);
/// assert_eq!(&v.to_vec::<f32>().unwrap()[12..], &[12.0, 13.0, 14.0, 15.0]);
/// ```
#[allow(clippy::too_many_arguments)]
#[track_caller]
pub fn rope_kv_write_rows<'a>(
    qkv: &Array,
    q_heads: i32,
    k_pool: &Array,
    v_pool: &Array,
    start: &Array,
    rows: &Array,
    dims: i32,
    traditional: bool,
    base: Option<f32>,
    scale: f32,
    freqs: impl Into<Option<&'a Array>>,
) -> (Array, Array, Array) {
    let rope = RopeParams { dims, traditional, base, scale, forward: true };
    record_kv_write(rope, q_heads, [qkv, k_pool, v_pool, start], Some(rows), freqs.into())
}

/// Records [`rope_kv_write`] (without `rows`) or [`rope_kv_write_rows`]: positions and rows as
/// int32, frequencies as float32 (as MLX), exactly one of `base` and `freqs`.
fn record_kv_write(
    rope: RopeParams,
    q_heads: i32,
    [qkv, k, v, start]: [&Array; 4],
    rows: Option<&Array>,
    freqs: Option<&Array>,
) -> (Array, Array, Array) {
    let name = if rows.is_some() { "rope_kv_write_rows" } else { "rope_kv_write" };
    if rope.base.is_some() == freqs.is_some() {
        let f = Array::failed(name, invalid(format!("{name}: exactly one of base and freqs must be given")));
        return (f.clone(), f.clone(), f);
    }
    let int32 =
        |a: &Array| if a.dtype().is_integer() && a.dtype() != DType::I32 { a.astype(DType::I32) } else { a.clone() };
    let mut inputs = vec![qkv.clone(), k.clone(), v.clone(), int32(start)];
    inputs.extend(rows.map(int32));
    inputs.extend(freqs.map(|f| if f.dtype().is_float() { f.astype(DType::F32) } else { f.clone() }));
    let op = FastOp::RopeKvWrite { rope, q_heads, rows: rows.is_some() };
    let mut out = super::record(op, inputs, 3).into_iter();
    let mut next = || out.next().expect("three outputs");
    (next(), next(), next())
}
