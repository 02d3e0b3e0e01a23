//! Key-value caches: one per attention layer, holding the keys and values of the positions
//! attention can still see.

use nuvec::{Array, ops};

/// Positions are added to a cache's buffers this many at a time, so that decoding grows them
/// rarely (mlx-lm's step).
pub const STEP: i32 = 256;

/// A step's positions held on the device, so that a recorded decode step
/// ([`crate::graph::DecodeGraph`]) reads new ones in place: each row's first new position
/// (`start [B]`, `int32`) and its number of keys once the step's are added (`lengths [B]`).
#[derive(Clone, Debug)]
pub struct Positions {
    /// The first new position of each row.
    pub start: Array,
    /// Keys per row after the step.
    pub lengths: Array,
    /// The block table of attention over [`KvCache::update_at`]'s buffers: row `b` reads
    /// block `b` (`[B, 1]`, `int32`), made once per step for every layer.
    pub tables: Array,
}

impl Positions {
    /// The positions `start [B]` and `lengths [B]` (`int32`, on the device).
    pub fn new(start: Array, lengths: Array) -> Positions {
        let b = start.shape().first().copied().unwrap_or(1);
        Positions { start, lengths, tables: ops::arange(0, b, 1).astype(nuvec::DType::I32).reshape([b, 1]) }
    }

    /// The positions of `[2, B]` rows: the starts, then the lengths (views, no copy).
    pub fn rows(both: &Array) -> Positions {
        let b = both.shape()[1];
        let row = |i: i32| both.slice(&[i, 0], &[i + 1, b], &[1, 1]).reshape([b]);
        Positions::new(row(0), row(1))
    }
}

/// A layer's cache: `[B, H, capacity, D]` key and value buffers grown by [`STEP`] positions.
///
/// Contiguous ([`KvCache::new`], mlx-lm's `KVCache`): every position, in order. Rotating
/// ([`KvCache::rotating`], mlx-lm's `RotatingKVCache`): at most `max_size` positions, the first
/// `keep` of them kept forever and the rest overwritten oldest first; attention over it is
/// windowed ([`KvCache::window`]).
#[derive(Clone, Debug, Default)]
pub struct KvCache {
    keys: Option<Array>,
    values: Option<Array>,
    offset: i32,
    /// Rotating: the most positions held, and how many at the start are never overwritten.
    max_size: Option<i32>,
    keep: i32,
    /// Rotating: the buffer slot the next position goes to.
    idx: i32,
    /// Quantized: the group size and bits, and the packed keys' and values' weights, scales
    /// and biases (six buffers, grown as `keys` would be).
    quantized: Option<(i32, i32)>,
    packed: Vec<Array>,
}

impl KvCache {
    /// An empty contiguous cache.
    pub fn new() -> KvCache {
        KvCache::default()
    }

    /// An empty rotating cache of at most `max_size` positions, the first `keep` kept.
    pub fn rotating(max_size: i32, keep: i32) -> KvCache {
        KvCache { max_size: Some(max_size.max(1)), keep: keep.clamp(0, max_size.max(1) - 1), ..KvCache::default() }
    }

    /// An empty cache that keeps keys and values quantized (MLX's affine mode, `bits` bits in
    /// groups of `group_size` along the head dimension, which must divide it), as mlx-lm's
    /// `QuantizedKVCache`: about `16 / bits` times less memory for bf16 models, the keys and
    /// values dequantized when attention reads them.
    pub fn quantized(group_size: i32, bits: i32) -> KvCache {
        KvCache { quantized: Some((group_size, bits)), ..KvCache::default() }
    }

    /// The group size and bits of a quantized cache.
    pub fn quantization(&self) -> Option<(i32, i32)> {
        self.quantized
    }

    /// Positions seen so far (the next position's index).
    pub fn offset(&self) -> i32 {
        self.offset
    }

    /// The attention window a rotating cache implies (each query sees at most this many keys).
    pub fn window(&self) -> Option<i32> {
        self.max_size
    }

    /// Appends `keys [B, H, L, Dk]` and `values [B, H, L, Dv]` and returns the keys and values
    /// attention sees: every position so far, or for a rotating cache the window's (in time
    /// order when `L > 1`; in buffer order, which attention of one query does not mind, when
    /// `L = 1`).
    pub fn update_and_fetch(&mut self, keys: &Array, values: &Array) -> (Array, Array) {
        match (self.max_size, self.quantized) {
            (_, Some((group, bits))) => self.append_quantized(keys, values, group, bits),
            (Some(max), None) if keys.shape()[2] == 1 => self.rotate_one(keys, values, max),
            (Some(max), None) => self.rotate_many(keys, values, max),
            (None, None) => self.append(keys, values),
        }
    }

    /// Appends to a quantized cache: the new positions packed, written into the six buffers
    /// (grown by [`STEP`] positions), and every position so far dequantized in `keys`' dtype.
    fn append_quantized(&mut self, keys: &Array, values: &Array, group: i32, bits: i32) -> (Array, Array) {
        let (prev, len) = (self.offset, keys.shape()[2]);
        let pack = |x: &Array| -> Vec<Array> {
            let (q, scales, biases) = ops::quantize(x, group, bits, "affine");
            vec![q, scales, biases.unwrap_or_default()]
        };
        let new: Vec<Array> = pack(keys).into_iter().chain(pack(values)).collect();
        // Bad parameters (a group that does not divide the heads) fail the step, not the cache.
        if let Some(bad) = new.iter().find(|a| a.is_failed()) {
            return (bad.clone(), bad.clone());
        }
        let capacity = self.packed.first().map_or(0, |a| a.shape()[2]);
        if self.packed.is_empty() || prev + len > capacity {
            let target = (prev + len + STEP - 1) / STEP * STEP;
            let held = prev.min(capacity);
            self.packed = new.iter().enumerate().map(|(i, n)| grown(self.packed.get(i), n, held, target)).collect();
        }
        for (buffer, n) in self.packed.iter_mut().zip(&new) {
            *buffer = written(std::mem::take(buffer), n, prev);
        }
        self.offset += len;
        let end = self.offset;
        let read = |p: &[Array]| {
            let [q, scales, biases] = [0, 1, 2].map(|i| window(&p[i], 0, end));
            ops::dequantize(&q, &scales, Some(&biases), group, bits, "affine", keys.dtype())
        };
        (read(&self.packed[..3]), read(&self.packed[3..]))
    }

    fn append(&mut self, keys: &Array, values: &Array) -> (Array, Array) {
        let (prev, len) = (self.offset, keys.shape()[2]);
        self.reserve(keys, values, prev + len, i32::MAX);
        self.offset += len;
        self.write(keys, values, prev);
        self.fetch(self.offset)
    }

    /// Grows the buffers to hold `needed` positions (whole steps, at most `cap`), keeping the
    /// first `offset` filled ones.
    fn reserve(&mut self, keys: &Array, values: &Array, needed: i32, cap: i32) {
        let capacity = self.keys.as_ref().map_or(0, |k| k.shape()[2]);
        if self.keys.is_some() && needed <= capacity {
            return;
        }
        let target = ((needed + STEP - 1) / STEP).saturating_mul(STEP).min(cap).max(needed.min(cap));
        let held = self.offset.min(capacity);
        self.keys = Some(grown(self.keys.as_ref(), keys, held, target));
        self.values = Some(grown(self.values.as_ref(), values, held, target));
    }

    /// Writes `keys` and `values` at buffer position `at`.
    fn write(&mut self, keys: &Array, values: &Array, at: i32) {
        let put = |buffer: &mut Option<Array>, new: &Array| {
            *buffer = Some(written(buffer.take().expect("reserved before writing"), new, at));
        };
        put(&mut self.keys, keys);
        put(&mut self.values, values);
    }

    fn fetch(&self, end: i32) -> (Array, Array) {
        let (k, v) = (self.keys.as_ref().expect("written"), self.values.as_ref().expect("written"));
        (window(k, 0, end), window(v, 0, end))
    }

    /// One position into a rotating cache: the next slot, wrapping past the kept ones.
    fn rotate_one(&mut self, keys: &Array, values: &Array, max: i32) -> (Array, Array) {
        // After a prefill the buffer, in time order, may hold more: keep its newest `max`.
        let capacity = self.keys.as_ref().map_or(0, |k| k.shape()[2]);
        if capacity > max {
            let trim = |b: &mut Option<Array>| {
                let old = b.take().expect("capacity > 0");
                *b = Some(ops::concatenate(
                    &[window(&old, 0, self.keep), window(&old, capacity - (max - self.keep), capacity)],
                    2,
                ));
            };
            trim(&mut self.keys);
            trim(&mut self.values);
            self.idx = max;
        }
        self.reserve(keys, values, (self.idx + 1).min(max), max);
        if self.idx >= max {
            self.idx = self.keep;
        }
        self.write(keys, values, self.idx);
        self.idx += 1;
        self.offset += 1;
        self.fetch(self.offset.min(max))
    }

    /// Several positions into a rotating cache: the buffer in time order, trimmed to the
    /// `max − 1` positions the first new query may see, then the new ones.
    fn rotate_many(&mut self, keys: &Array, values: &Array, max: i32) -> (Array, Array) {
        let len = keys.shape()[2];
        let held = self.offset.min(self.keys.as_ref().map_or(0, |k| k.shape()[2]));
        let ordered = |buffer: &Option<Array>| -> Option<Array> {
            let b = buffer.as_ref()?;
            if held == 0 {
                return None;
            }
            let b = window(b, 0, held);
            // Slots keep..idx hold the newest positions once the buffer has wrapped.
            let b = if self.idx < held && self.idx > self.keep {
                let parts = [window(&b, 0, self.keep), window(&b, self.idx, held), window(&b, self.keep, self.idx)];
                ops::concatenate(&parts, 2)
            } else {
                b
            };
            let drop = (held - (max - 1)).max(0);
            Some(if drop > 0 {
                ops::concatenate(&[window(&b, 0, self.keep), window(&b, self.keep + drop, held)], 2)
            } else {
                b
            })
        };
        let join = |old: Option<Array>, new: &Array| match old {
            Some(o) => ops::concatenate(&[o, new.clone()], 2),
            None => new.clone(),
        };
        let k = join(ordered(&self.keys), keys);
        let v = join(ordered(&self.values), values);
        self.idx = k.shape()[2];
        self.offset += len;
        self.keys = Some(k.clone());
        self.values = Some(v.clone());
        (k, v)
    }

    /// Writes `keys [B, H, L, Dk]` and `values [B, H, L, Dv]` at the device-held positions
    /// `at.start` and returns the whole buffers `[B, H, capacity, D]`, for attention bounded
    /// by `at.lengths` ([`nuvec::fast::paged_attention`] with one block per row). The
    /// capacity is a power of two (at least [`STEP`]) that grows, keeping what is held, only
    /// when the host-side count says the positions will not fit; the write is in place when
    /// nothing else holds the buffers. Contiguous caches only (not rotating ones).
    pub fn update_at(&mut self, keys: &Array, values: &Array, at: &Positions) -> (Array, Array) {
        let s = keys.shape().to_vec();
        let (b, h, len) = (s[0], s[1], s[2]);
        let capacity = self.keys.as_ref().map_or(0, |k| k.shape()[2]);
        let needed = (self.offset + len).max(capacity).max(STEP);
        let target = (needed as u32).next_power_of_two() as i32;
        if target != capacity {
            self.reserve(keys, values, target, target);
        }
        let mut idx = at.start.reshape([b, 1, 1, 1]);
        if len > 1 {
            idx = &idx + &ops::arange(0, len, 1).reshape([1, 1, len, 1]);
        }
        let put = |buffer: &mut Option<Array>, new: &Array| {
            let old = buffer.take().expect("reserved before writing");
            let idx = idx.broadcast_to([b, h, len, new.shape()[3]]);
            // The old buffer is dropped before evaluation, so the write happens in place.
            *buffer = Some(old.put_along_axis(&idx, new, 2));
        };
        put(&mut self.keys, keys);
        put(&mut self.values, values);
        self.offset += len;
        (self.keys.clone().expect("written"), self.values.clone().expect("written"))
    }

    /// One cache of `rows.len()` rows from contiguous caches of one row each, their buffers
    /// padded to the largest capacity: for decoding several sequences together through
    /// [`KvCache::update_at`], whose positions say where each row's next key goes (each row
    /// keeps its own length; the result counts the longest).
    pub fn stack(rows: &[KvCache]) -> KvCache {
        let capacity = rows.iter().filter_map(|c| c.keys.as_ref()).map(|k| k.shape()[2]).max().unwrap_or(0);
        let pad = |b: &Array| match b.shape()[2] {
            held if held == capacity => b.clone(),
            held => grown(Some(b), b, held, capacity),
        };
        let join = |get: &dyn Fn(&KvCache) -> Option<&Array>| -> Option<Array> {
            let parts: Option<Vec<Array>> = rows.iter().map(|c| get(c).map(pad)).collect();
            parts.map(|p| ops::concatenate(&p, 0))
        };
        KvCache {
            keys: join(&|c| c.keys.as_ref()),
            values: join(&|c| c.values.as_ref()),
            offset: rows.iter().map(|c| c.offset).max().unwrap_or(0),
            ..KvCache::default()
        }
    }

    /// Counts `n` more positions as held (a recorded step wrote them on the device).
    pub(crate) fn advance(&mut self, n: i32) {
        self.offset += n;
    }

    /// Drops the last `n` positions (a rejected speculative draft, a prompt that shares only a
    /// prefix); returns how many went. A rotating cache holding fewer positions than it has
    /// seen cannot (0).
    pub fn trim(&mut self, n: i32) -> i32 {
        if self.max_size.is_some() && self.offset != self.idx {
            return 0;
        }
        let n = n.clamp(0, self.offset);
        self.offset -= n;
        if self.max_size.is_some() {
            self.idx -= n;
        }
        n
    }

    /// An empty cache of the same kind.
    pub fn emptied(&self) -> KvCache {
        KvCache { max_size: self.max_size, keep: self.keep, quantized: self.quantized, ..KvCache::default() }
    }

    /// The arrays the cache holds, to evaluate with a step's output.
    pub fn arrays(&self) -> Vec<Array> {
        self.keys.iter().chain(self.values.iter()).chain(&self.packed).cloned().collect()
    }
}

/// A `[B, H, target, D]` buffer shaped as `like` otherwise: the first `held` positions of
/// `old`, then zeros.
fn grown(old: Option<&Array>, like: &Array, held: i32, target: i32) -> Array {
    let s = like.shape();
    let more = ops::zeros([s[0], s[1], target - held, s[3]], like.dtype());
    match old {
        Some(old) if held > 0 => ops::concatenate(&[window(old, 0, held), more], 2),
        _ => more,
    }
}

/// `buffer` with `new [B, H, L, D]` written at positions `at..at + L`; in place when the
/// caller handed over its only reference (it is dropped before evaluation).
fn written(buffer: Array, new: &Array, at: i32) -> Array {
    let s = buffer.shape().to_vec();
    let len = new.shape()[2];
    buffer.slice_update(new, &[0, 0, at, 0], &[s[0], s[1], at + len, s[3]], &[1, 1, 1, 1])
}

/// Positions `start..end` of a `[B, H, L, D]` buffer.
fn window(x: &Array, start: i32, end: i32) -> Array {
    let s = x.shape();
    x.slice(&[0, 0, start, 0], &[s[0], s[1], end, s[3]], &[1, 1, 1, 1])
}
