//! Attention over a paged key-value cache, and writes into one: what continuous batching
//! serves from. A cache is a pool of blocks `[blocks, kv_heads, block_size, D]`; a sequence owns
//! the blocks its row of the block table names, in order, and its keys are the first
//! `length` positions of their concatenation.
//!
//! [`paged_attention`] is one primitive ([`FastOp::PagedAttention`]): a GPU kernel reads the
//! keys through the block table, and its composition (gathers and
//! [`scaled_dot_product_attention`]) is the CPU path and defines derivatives and batching.
//! [`paged_write`] is a scatter and [`paged_prefill`] runs through [`paged_attention`]. Indices
//! are clamped or skipped so that nothing reads or writes outside the cache.

use crate::array::Array;
use crate::dtype::DType;
use crate::ops::{self, invalid, propagate};
use crate::primitive::fast::check_attention;

use super::attention::{AttentionMask, AttentionOptions, scaled_dot_product_attention};
use super::{FastOp, PagedParams, paged_blocks, record};

/// Attention of the queries `q [B, Hq, L, D]` (the last `L` positions of each sequence) over
/// a paged cache: `k_cache [blocks, Hkv, block_size, D]`, `v_cache [blocks, Hkv, block_size,
/// Dv]`, `block_tables [B, max_blocks]` (block ids, integers) and `lengths [B]` (keys per
/// sequence, integers). Returns `[B, Hq, L, Dv]` in `q`'s dtype.
///
/// Causal at each sequence's end: query `i` sits at position `lengths[b] − L + i` and attends
/// keys up to it; `options.window` and `options.sinks` apply as in
/// [`scaled_dot_product_attention`]. A query before the first key (a sequence shorter than
/// `L`) gives zeros. Block ids outside `[0, blocks)` are clamped into it and lengths into
/// `[0, max_blocks · block_size]`, so no call reads outside the cache. Positions of a
/// sequence's last block past its length are read and weighted by zero, so they must hold
/// finite values (a cache made with `zeros` and filled by [`paged_write`] does). An array mask, a block
/// size that is not a power of two, mismatched shapes or non-integer tables give a failed
/// array naming the argument.
///
/// ```
/// use nuvec::{DType, array, fast, ops};
/// use nuvec::fast::AttentionOptions;
/// // Two blocks of 4 positions, one head of 8; the sequence uses block 1, then block 0.
/// let k = ops::arange(0.0, 64.0, 1.0).reshape([2, 1, 4, 8]) / 64.0;
/// let v = ops::ones(&[2, 1, 4, 8], DType::F32);
/// let q = ops::ones(&[1, 1, 1, 8], DType::F32);
/// let tables = array![1i32, 0].reshape([1, 2]);
/// let o = fast::paged_attention(&q, &k, &v, &tables, &array![6i32], 0.5, &AttentionOptions::default());
/// assert_eq!(o.shape(), &[1, 1, 1, 8]);
/// assert!((o.sum(..).item::<f32>().unwrap() - 8.0).abs() < 1e-5);
/// ```
#[track_caller]
pub fn paged_attention(
    q: &Array,
    k_cache: &Array,
    v_cache: &Array,
    block_tables: &Array,
    lengths: &Array,
    scale: f32,
    options: &AttentionOptions<'_>,
) -> Array {
    const OP: &str = "paged_attention";
    if let Some(f) = propagate(&[q, k_cache, v_cache, block_tables, lengths]) {
        return f;
    }
    if matches!(options.mask, AttentionMask::Array(_)) {
        return invalid(OP, "options: an array mask is not supported (the mask is causal at each sequence's end)");
    }
    let (qs, ks, vs) = (q.shape(), k_cache.shape(), v_cache.shape());
    if qs.len() != 4 || ks.len() != 4 || vs.len() != 4 {
        return invalid(OP, format!("q, k_cache and v_cache must be 4-D, got shapes {qs:?}, {ks:?} and {vs:?}"));
    }
    if ks[..3] != vs[..3] {
        return invalid(OP, format!("k_cache {ks:?} and v_cache {vs:?} must share blocks, heads and block size"));
    }
    let b = qs[0];
    let (blocks, hkv, bs) = (ks[0], ks[1], ks[2]);
    if bs <= 0 || bs & (bs - 1) != 0 {
        return invalid(OP, format!("the block size (k_cache's axis 2) must be a power of two, got {bs}"));
    }
    if blocks == 0 {
        return invalid(OP, "k_cache has no blocks");
    }
    if block_tables.ndim() != 2 || block_tables.shape()[0] != b || !block_tables.dtype().is_integer() {
        return invalid(
            OP,
            format!(
                "block_tables must be integers of shape [{b}, max_blocks], got {} of shape {:?}",
                block_tables.dtype(),
                block_tables.shape()
            ),
        );
    }
    if lengths.shape() != [b] || !lengths.dtype().is_integer() {
        return invalid(
            OP,
            format!("lengths must be integers of shape [{b}], got {} of shape {:?}", lengths.dtype(), lengths.shape()),
        );
    }
    if k_cache.dtype() != q.dtype() || v_cache.dtype() != q.dtype() {
        return invalid(
            OP,
            format!(
                "k_cache and v_cache must have q's dtype {}, got {} and {}",
                q.dtype(),
                k_cache.dtype(),
                v_cache.dtype()
            ),
        );
    }
    // The rest as the attention of each sequence's gathered keys [B, Hkv, capacity, D].
    let capacity = block_tables.shape()[1] * bs;
    let (k, v) = ([b, hkv, capacity, ks[3]], [b, hkv, capacity, vs[3]]);
    let sinks = options.sinks.map(|s| (s.shape(), s.dtype()));
    if let Err(e) = check_attention(qs, &k, &v, q.dtype(), None, sinks, options.window) {
        return Array::failed(OP, e);
    }
    let p = PagedParams {
        scale,
        window: options.window,
        sinks: options.sinks.is_some(),
        blocks: paged_blocks(b as i64 * hkv as i64, capacity, bs),
    };
    let mut inputs =
        vec![q.clone(), k_cache.clone(), v_cache.clone(), block_tables.astype(DType::I32), lengths.astype(DType::I32)];
    inputs.extend(options.sinks.cloned());
    record(FastOp::PagedAttention(p), inputs, 1).remove(0)
}

/// The composition of a recorded paged attention: each sequence's blocks gathered into one
/// run of keys, and attention under the mask of its length.
pub(super) fn composition(p: &PagedParams, inputs: &[Array]) -> Array {
    let [q, k_cache, v_cache, block_tables, lengths, ..] = inputs else {
        return invalid("paged_attention", "expected q, k_cache, v_cache, block_tables and lengths");
    };
    let (b, l) = (q.shape()[0], q.shape()[2]);
    let (blocks, hkv, bs) = (k_cache.shape()[0], k_cache.shape()[1], k_cache.shape()[2]);
    let max_blocks = block_tables.shape()[1];
    let lk = max_blocks * bs;
    // Each sequence's blocks, in order, as one run of keys [B, Hkv, max_blocks · bs, D].
    let ids = block_tables.clip(0, blocks - 1);
    let gather = |cache: &Array| {
        let d = cache.shape()[3];
        cache.take(&ids, 0).transpose(&[0, 2, 1, 3, 4]).reshape([b, hkv, lk, d])
    };
    let (k, v) = (gather(k_cache), gather(v_cache));
    // Query i of sequence s sits at lengths[s] − L + i; key j is attended when j < lengths[s],
    // j ≤ that position and, with a window, within it.
    let len = lengths.clip(0, lk).reshape([b, 1, 1, 1]);
    let qpos = &(&len - l) + &ops::arange(0, l, 1).reshape([1, 1, l, 1]);
    let key = ops::arange(0, lk, 1).reshape([1, 1, 1, lk]);
    let mut mask = key.less(&len).logical_and(key.less_equal(&qpos));
    if let Some(w) = p.window {
        mask = mask.logical_and(key.greater(&(&qpos - w)));
    }
    let mut opts = AttentionOptions::default().mask(&mask);
    if p.sinks {
        opts = opts.sinks(&inputs[5]);
    }
    let out = scaled_dot_product_attention(q, &k, &v, p.scale, &opts);
    // The composition averages the values for a query with no key: zeros instead.
    let attends = qpos.greater_equal(0).logical_and(len.greater(0));
    ops::where_(&attends, &out, 0.0).astype(out.dtype())
}

/// The cache `cache [blocks, H, block_size, D]` with the rows `new [T, H, D]` written at the
/// slots `slots [T]` (integers; slot `s` is position `s % block_size` of block
/// `s / block_size`). Slots outside the cache (negative, or past `blocks · block_size`) are
/// skipped; with a slot repeated, one of its rows wins. `new` is cast to the cache's dtype.
/// Mismatched shapes or non-integer slots give a failed array naming the argument.
///
/// ```
/// use nuvec::{DType, array, fast, ops};
/// let cache = ops::zeros(&[2, 1, 4, 2], DType::F32);
/// let new = array![1.0f32, 2.0, 3.0, 4.0].reshape([2, 1, 2]);
/// let out = fast::paged_write(&cache, &new, &array![5i32, 100]);
/// // Slot 5 is position 1 of block 1; slot 100 is outside and skipped.
/// let v: Vec<f32> = out.to_vec().unwrap();
/// assert_eq!(&v[8..12], &[0.0, 0.0, 1.0, 2.0]);
/// assert_eq!(v.iter().sum::<f32>(), 3.0);
/// ```
#[track_caller]
pub fn paged_write(cache: &Array, new: &Array, slots: &Array) -> Array {
    const OP: &str = "paged_write";
    if let Some(f) = propagate(&[cache, new, slots]) {
        return f;
    }
    let (cs, ns) = (cache.shape(), new.shape());
    if cs.len() != 4 || ns.len() != 3 || ns[1] != cs[1] || ns[2] != cs[3] {
        return invalid(
            OP,
            format!(
                "cache must be [blocks, H, block_size, D] and new [T, H, D] with the same H and D, got {cs:?} and {ns:?}"
            ),
        );
    }
    if slots.shape() != [ns[0]] || !slots.dtype().is_integer() {
        return invalid(
            OP,
            format!("slots must be integers of shape [{}], got {} of shape {:?}", ns[0], slots.dtype(), slots.shape()),
        );
    }
    let (blocks, h, bs, d) = (cs[0], cs[1], cs[2], cs[3]);
    let (t, rows) = (ns[0], blocks as i64 * bs as i64);
    // The cache viewed as one row per (block, head, position) — a view, no copy, so a donated
    // cache is written in place — and each slot's row for every head; a slot outside goes
    // past the end, where `put_along_axis` ignores it.
    let s = slots.astype(DType::I64).reshape([t, 1]);
    let inside = s.greater_equal(0).logical_and(s.less(rows));
    let heads = ops::arange(0, h, 1).astype(DType::I64).reshape([1, h]);
    let row = &(&(&(&s.floor_divide(bs as i64) * h as i64) + &heads) * bs as i64) + &s.remainder(bs as i64);
    let row = ops::where_(&inside, &row, rows * h as i64).reshape([t * h, 1]);
    let flat = cache.reshape([blocks * h * bs, d]);
    let updates = new.astype(cache.dtype()).reshape([t * h, d]);
    flat.put_along_axis(&row, &updates, 0).reshape([blocks, h, bs, d])
}

/// Causal attention of a ragged batch of new tokens over a paged cache that already holds
/// them (written with [`paged_write`]): chunked prefill and continuous batching. `q [T, Hq,
/// D]` packs the queries of `B` sequences back to back, sequence `b`'s being rows
/// `query_starts[b]..query_starts[b + 1]` (`query_starts [B + 1]`, integers, non-decreasing,
/// from 0 to `T`); they are the last positions of its `lengths[b]` keys, so each attends its
/// own earlier pages and the new tokens before it. Returns `[T, Hq, Dv]`; the options, the
/// cache and the clamping are [`paged_attention`]'s.
///
/// It runs as [`paged_attention`] of one query per token, `rows_per_chunk` tokens at a time
/// (each chunk gathers `rows_per_chunk` copies of the keys a sequence may attend, so this
/// bounds the memory).
///
/// ```
/// use nuvec::{DType, array, fast, ops};
/// use nuvec::fast::AttentionOptions;
/// let k = ops::arange(0.0, 64.0, 1.0).reshape([2, 1, 4, 8]) / 64.0;
/// let v = ops::ones(&[2, 1, 4, 8], DType::F32);
/// // Two sequences: 2 new tokens of a 6-key sequence (blocks 1, 0), then 1 of a 3-key one (block 0).
/// let q = ops::ones(&[3, 1, 8], DType::F32);
/// let tables = array![1i32, 0, 0, 0].reshape([2, 2]);
/// let o = fast::paged_prefill(&q, &k, &v, &tables, &array![6i32, 3], &array![0i32, 2, 3], 0.5, &AttentionOptions::default(), 64);
/// assert_eq!(o.shape(), &[3, 1, 8]);
/// ```
#[allow(clippy::too_many_arguments)]
#[track_caller]
pub fn paged_prefill(
    q: &Array,
    k_cache: &Array,
    v_cache: &Array,
    block_tables: &Array,
    lengths: &Array,
    query_starts: &Array,
    scale: f32,
    options: &AttentionOptions<'_>,
    rows_per_chunk: i32,
) -> Array {
    const OP: &str = "paged_prefill";
    if let Some(f) = propagate(&[q, k_cache, v_cache, block_tables, lengths, query_starts]) {
        return f;
    }
    if q.ndim() != 3 {
        return invalid(OP, format!("q must be [T, Hq, D], got shape {:?}", q.shape()));
    }
    let b = lengths.shape().first().copied().unwrap_or(0);
    if lengths.ndim() != 1 || query_starts.shape() != [b + 1] || !query_starts.dtype().is_integer() {
        return invalid(
            OP,
            format!(
                "query_starts must be integers of shape [{}] (one more than lengths {:?}), got {} of shape {:?}",
                b + 1,
                lengths.shape(),
                query_starts.dtype(),
                query_starts.shape()
            ),
        );
    }
    if rows_per_chunk <= 0 {
        return invalid(OP, format!("rows_per_chunk must be positive, got {rows_per_chunk}"));
    }
    let (t, hq, d) = (q.shape()[0], q.shape()[1], q.shape()[2]);
    let starts = query_starts.astype(DType::I32);
    let lengths = lengths.astype(DType::I32);
    // Where each sequence's new tokens end.
    let ends = starts.slice(&[1], &[b + 1], &[1]).reshape([1, b]);
    let mut outs = Vec::new();
    for t0 in (0..t).step_by(rows_per_chunk as usize) {
        let t1 = (t0 + rows_per_chunk).min(t);
        let tokens = ops::arange(t0, t1, 1);
        // Each token's sequence: how many sequences end at or before it.
        let seq = ends.less_equal(tokens.reshape([t1 - t0, 1])).astype(DType::I32).sum(-1).clip(0, b - 1);
        // Its position: the sequence's length less the new tokens after it.
        let end = ends.reshape([b]).take(&seq, 0);
        let len = &(&lengths.take(&seq, 0) - &(&end - &tokens)) + 1;
        let qc = q.slice(&[t0, 0, 0], &[t1, hq, d], &[1, 1, 1]).reshape([t1 - t0, hq, 1, d]);
        let tables = block_tables.take(&seq, 0);
        let o = paged_attention(&qc, k_cache, v_cache, &tables, &len, scale, options);
        let dv = o.shape().last().copied().unwrap_or(d);
        outs.push(o.reshape([t1 - t0, hq, dv]));
    }
    if outs.is_empty() {
        let dv = v_cache.shape().last().copied().unwrap_or(d);
        return ops::zeros([0, hq, dv], q.dtype());
    }
    ops::concatenate(&outs, 0)
}
