//! Key-value caches: one per attention layer, holding the keys and values of the positions
//! attention can still see.

use nuvec::{Array, ops};

/// Positions are added to a cache's buffers this many at a time, so that decoding grows them
/// rarely (mlx-lm's step).
pub const STEP: i32 = 256;

/// A recurrent cache ([`KvCache::recurrent`]) keeps the state after every step of a forward pass
/// of at most this many positions, so that [`KvCache::trim`] can take back any of them (a
/// speculative step's rejected tokens); after a longer pass it cannot go back.
pub const ROLLBACK_STEPS: i32 = 16;

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
    /// Every row's first new position is 0 ([`Positions::fresh`]): attention reads the step's
    /// own keys, causal, not the caches.
    pub fresh: bool,
    /// The step's real tokens per row (`[B]`, `int32`), the rest of each row padding at its
    /// end ([`Positions::with_valid`]); `None`: every token is real. Attention needs no such
    /// count (pads' keys lie past the row's length), but a recurrent layer keeps the pads out
    /// of its state.
    pub valid: Option<Array>,
    /// The pool rows the step's keys go to, by the rows' blocks: caches whose rows were set
    /// together ([`KvCache::set_rows_of`]) compute them once per step.
    slots: std::cell::RefCell<Vec<(SlotsKey, Array)>>,
}

/// What a paged write's pool rows depend on: the rows' blocks (their version), the pool's
/// blocks, heads and block size, and the new positions per row.
type SlotsKey = (u64, i32, i32, i32, i32);

impl Positions {
    /// The positions `start [B]` and `lengths [B]` (`int32`, on the device).
    pub fn new(start: Array, lengths: Array) -> Positions {
        let b = start.shape().first().copied().unwrap_or(1);
        let tables = ops::arange(0, b, 1).astype(nuvec::DType::I32).reshape([b, 1]);
        Positions { start, lengths, tables, fresh: false, valid: None, slots: Default::default() }
    }

    /// The positions of rows with `valid [B]` real tokens each (`int32`), padded at their end
    /// to the step's length.
    pub fn with_valid(mut self, valid: Array) -> Positions {
        self.valid = Some(valid);
        self
    }

    /// The positions of prompts' first tokens: every row starts at 0 (rows shorter than the
    /// step padded at their end), so attention is causal over the step's keys alone, without
    /// reading the caches it writes.
    pub fn fresh(mut self) -> Positions {
        self.fresh = true;
        self
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
/// windowed ([`KvCache::window`]). Paged ([`KvCache::paged`]): positions in blocks of a pool
/// that grows by whole blocks, read through a block table by `paged_attention`. Recurrent
/// ([`KvCache::recurrent`], mlx-lm's `ArraysCache` of a linear-attention layer): no keys or
/// values, but the layer's convolution window and recurrent state, and the states of its
/// latest steps for [`KvCache::trim`].
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
    /// Paged: `keys` and `values` are the pools `[blocks, H, block_size, D]`.
    pages: Option<Pages>,
    /// Recurrent: the state in place of keys and values.
    recurrent: Option<Box<Recurrent>>,
}

/// A recurrent cache's state: the convolution's inputs at the last `K − 1` positions
/// (`[B, K − 1, C]`), the delta rule's state (`[B, Hv, Dv, Dk]`, `float32`), and the latest
/// forward passes that can be taken back, oldest first.
#[derive(Clone, Debug, Default)]
struct Recurrent {
    window: Option<Array>,
    state: Option<Array>,
    passes: Vec<Pass>,
    /// Positions kept restorable at least, over several passes ([`KvCache::keep_steps`]); the
    /// latest pass is kept whatever its length. 0: nothing is kept, so nothing can be taken
    /// back (each step's state costs as much as the state itself).
    depth: i32,
}

/// One forward pass of a recurrent cache, kept so that [`KvCache::trim`] can go back into it:
/// the state it started from, its convolution inputs `[B, K − 1 + T, C]` (the window before,
/// then its positions'), the state after each of its steps `[B, T, Hv, Dv, Dk]` (`None` for a
/// single step: the state after it is the cache's), and how many of its steps are still held.
#[derive(Clone, Debug)]
struct Pass {
    before: Array,
    inputs: Array,
    states: Option<Array>,
    len: i32,
}

/// A paged cache's bookkeeping: the block size, each row's blocks in position order, the
/// pool's blocks no row holds (highest first, so the lowest is taken next), and the rows'
/// block table on the device (`[B, pool blocks]`, `int32`; unused entries 0). A shared pool
/// ([`KvCache::paged_shared`]) has its rows set by its owner, at most `shared` blocks, and
/// `dirty` rows the table does not show yet.
#[derive(Clone, Debug, Default)]
struct Pages {
    block_size: i32,
    rows: Vec<Vec<i32>>,
    free: Vec<i32>,
    table: Option<Array>,
    shared: Option<i32>,
    dirty: bool,
    /// Rows set together with other caches' ([`KvCache::set_rows_of`]) share a version (0:
    /// none).
    version: u64,
    /// The table is as wide as the longest row, not the pool: a lent view
    /// ([`KvCache::lend`]), which no recorded step replays, so attention gathers only the
    /// blocks its rows hold.
    narrow: bool,
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

    /// An empty paged cache: keys and values in blocks of `block_size` positions (a power of
    /// two) of one pool per layer, the pool doubling when its free blocks run out, each row's
    /// blocks listed in a block table; attention reads it with
    /// [`nuvec::fast::paged_attention`]. Writes go straight into the pool (a scatter, as
    /// [`nuvec::fast::paged_write`]), so decoding records as a graph as over contiguous
    /// caches.
    pub fn paged(block_size: i32) -> KvCache {
        let pages = Pages { block_size: block_size.max(1), ..Pages::default() };
        KvCache { pages: Some(pages), ..KvCache::default() }
    }

    /// An empty paged cache whose blocks its owner hands out (a [`crate::blocks::BlockPool`]
    /// of `capacity` blocks shared by many requests): each row's blocks are set with
    /// [`KvCache::set_rows`], and the pool grows (doubling, at most to `capacity` blocks) to
    /// hold the highest block a row names.
    pub fn paged_shared(block_size: i32, capacity: i32) -> KvCache {
        let pages = Pages { block_size: block_size.max(1), shared: Some(capacity.max(1)), ..Pages::default() };
        KvCache { pages: Some(pages), ..KvCache::default() }
    }

    /// The rows of a shared paged cache: each row's blocks in position order, and the positions
    /// the longest row holds. Nothing happens to other caches.
    pub fn set_rows(&mut self, rows: Vec<Vec<i32>>, offset: i32) {
        if let Some(p) = self.pages.as_mut().filter(|p| p.shared.is_some()) {
            (p.rows, p.dirty, p.version, self.offset) = (rows, true, 0, offset);
        }
    }

    /// [`KvCache::set_rows`] of every cache in `caches` (a model's layers) to the same rows,
    /// which a step's writes then locate once for all of them.
    pub fn set_rows_of(caches: &mut [KvCache], rows: &[Vec<i32>], offset: i32) {
        static VERSION: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
        let version = VERSION.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        for c in caches {
            c.set_rows(rows.to_vec(), offset);
            if let Some(p) = c.pages.as_mut() {
                p.version = version;
            }
        }
    }

    /// A shared paged cache of the rows `rows` holding `offset` positions, over this cache's
    /// pool, which moves to it (so that writes through it stay in place) until
    /// [`KvCache::restore`] takes it back: prompts prefilled into the pool a running batch
    /// reads. Its block table is as wide as its longest row, so every position written must
    /// lie in its rows' blocks.
    pub fn lend(&mut self, rows: Vec<Vec<i32>>, offset: i32) -> KvCache {
        let Some(p) = self.pages.as_ref().filter(|p| p.shared.is_some()) else { return self.clone() };
        let pages =
            Pages { block_size: p.block_size, rows, shared: p.shared, dirty: true, narrow: true, ..Pages::default() };
        KvCache { keys: self.keys.take(), values: self.values.take(), offset, pages: Some(pages), ..KvCache::default() }
    }

    /// Takes back the pool [`KvCache::lend`] moved to `from` (as `from` left it, perhaps
    /// grown); the block table is refreshed when next needed.
    pub fn restore(&mut self, from: KvCache) {
        (self.keys, self.values) = (from.keys, from.values);
        if let Some(p) = self.pages.as_mut() {
            p.dirty = true;
        }
    }

    /// The block size of a paged cache.
    pub fn block_size(&self) -> Option<i32> {
        self.pages.as_ref().map(|p| p.block_size)
    }

    /// A paged cache's block table on the device (`[B, pool blocks]`), once it holds keys.
    pub fn page_table(&self) -> Option<&Array> {
        self.pages.as_ref().and_then(|p| p.table.as_ref())
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
    /// `L = 1`). A paged cache returns its pools (attention reads them through
    /// [`KvCache::page_table`]).
    pub fn update_and_fetch(&mut self, keys: &Array, values: &Array) -> (Array, Array) {
        if let Some(failed) = self.no_keys("KvCache::update_and_fetch") {
            return (failed.clone(), failed);
        }
        if self.pages.is_some() {
            // Every row at the host-held position: the pools (attention reads them paged).
            let start = Array::from_slice(&vec![self.offset; keys.shape()[0] as usize], [keys.shape()[0]]);
            return self.write_pages(keys, values, &start, None);
        }
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
    /// nothing else holds the buffers. A paged cache writes through its block table instead.
    /// Rotating and quantized caches keep their positions on the host: failed arrays.
    pub fn update_at(&mut self, keys: &Array, values: &Array, at: &Positions) -> (Array, Array) {
        if let Some(failed) = self.no_keys("KvCache::update_at") {
            return (failed.clone(), failed);
        }
        if self.max_size.is_some() || self.quantized.is_some() {
            let why = "positions on the device need contiguous or paged caches, not rotating or quantized ones";
            let failed = Array::failed("KvCache::update_at", nuvec::OpErrorKind::InvalidArgument(why.into()));
            return (failed.clone(), failed);
        }
        if self.pages.is_some() {
            return self.write_pages(keys, values, &at.start, Some(at));
        }
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

    /// [`KvCache::update_at`] for a joined projection `qkv [B, L, Hq + 2·Hkv, D]` whose query
    /// and key heads `rope` rotates in the same operation as the writes
    /// ([`Rope::kv_write`](crate::rope::Rope::kv_write), or
    /// [`Rope::kv_write_rows`](crate::rope::Rope::kv_write_rows) through a paged cache's block
    /// table): the rotated queries `[B, Hq, L, D]` and the caches (a paged cache's pools);
    /// `None` (nothing written) for a rotating or quantized cache, a paged cache's first
    /// positions (`at.fresh`: attention reads the step's own keys), or a rotation that operation
    /// does not do.
    pub fn rope_update_at(
        &mut self,
        qkv: &Array,
        q_heads: i32,
        rope: &crate::rope::Rope,
        at: &Positions,
    ) -> Option<(Array, Array, Array)> {
        if self.max_size.is_some() || self.quantized.is_some() || self.recurrent.is_some() || !rope.writes_kv() {
            return None;
        }
        let s = qkv.shape().to_vec();
        let (b, len, kv, d) = (s[0], s[1], (s[2] - q_heads) / 2, s[3]);
        // Shapes and dtype of the new keys and values, for growing the buffers.
        let like = ops::zeros([b, kv, len, d], qkv.dtype());
        if self.pages.is_some() {
            if at.fresh {
                return None;
            }
            let rows = match self.page_rows(b, len, kv, &at.start, Some(at), (&like, &like)) {
                Ok(rows) => rows.reshape([b, len, kv]),
                Err(e) => {
                    let failed = Array::from_error(e);
                    return Some((failed.clone(), failed.clone(), failed));
                }
            };
            // The old pools are dropped before evaluation, so the writes happen in place.
            let (k, v) = (self.keys.take().expect("taken blocks"), self.values.take().expect("taken blocks"));
            let Some((q, k, v)) = rope.kv_write_rows(qkv, q_heads, (&k, &v), &at.start, &rows) else {
                (self.keys, self.values) = (Some(k), Some(v));
                return None;
            };
            (self.keys, self.values) = (Some(k.clone()), Some(v.clone()));
            self.offset += len;
            return Some((q, k, v));
        }
        let capacity = self.keys.as_ref().map_or(0, |k| k.shape()[2]);
        let needed = (self.offset + len).max(capacity).max(STEP);
        let target = (needed as u32).next_power_of_two() as i32;
        if target != capacity {
            self.reserve(&like, &like, target, target);
        }
        // The old buffers are dropped before evaluation, so the writes happen in place.
        let (k, v) = (self.keys.take().expect("reserved"), self.values.take().expect("reserved"));
        let Some((q, k, v)) = rope.kv_write(qkv, q_heads, &k, &v, &at.start) else {
            (self.keys, self.values) = (Some(k), Some(v));
            return None;
        };
        (self.keys, self.values) = (Some(k.clone()), Some(v.clone()));
        self.offset += len;
        Some((q, k, v))
    }

    /// Writes `keys [B, H, L, Dk]` and `values [B, H, L, Dv]` of a paged cache at the positions
    /// `start[b]..start[b] + L` (on the device) through its block table, taking blocks first;
    /// returns the pools.
    fn write_pages(&mut self, keys: &Array, values: &Array, start: &Array, at: Option<&Positions>) -> (Array, Array) {
        let (b, h, len) = (keys.shape()[0], keys.shape()[1], keys.shape()[2]);
        let row = match self.page_rows(b, len, h, start, at, (keys, values)) {
            Ok(row) => row,
            Err(e) => {
                let failed = Array::from_error(e);
                return (failed.clone(), failed);
            }
        };
        let put = |pool: &mut Option<Array>, new: &Array| {
            let old = pool.take().expect("taken blocks");
            let s = old.shape().to_vec();
            let rows = new.transpose(&[0, 2, 1, 3]).reshape([b * len * h, s[3]]).astype(old.dtype());
            // The old pool is dropped before evaluation, so the write happens in place.
            let flat = old.reshape([s[0] * s[1] * s[2], s[3]]);
            *pool = Some(flat.put_along_axis(&row, &rows, 0).reshape(s));
        };
        put(&mut self.keys, keys);
        put(&mut self.values, values);
        self.offset += len;
        (self.keys.clone().expect("written"), self.values.clone().expect("written"))
    }

    /// The blocks for `b` rows' positions `start[b]..start[b] + len` of a paged cache, taken
    /// (the pool made or grown as `like`, keys and values, say), and the index of each of
    /// those positions' `h` heads in the pool seen as `[blocks · H · block_size, D]`, in
    /// `[b · len · h, 1]` order (row, position, head). Keys and values share it, and with `at`
    /// every layer of a step does (its memo).
    fn page_rows(
        &mut self,
        b: i32,
        len: i32,
        h: i32,
        start: &Array,
        at: Option<&Positions>,
        like: (&Array, &Array),
    ) -> nuvec::Result<Array> {
        self.take_blocks(b, self.offset + len, Some(like))?;
        let pages = self.pages.as_ref().expect("paged");
        let (bs, table) = (pages.block_size, pages.table.clone().expect("taken blocks"));
        // The table's blocks cover every position written.
        let key = (pages.version, table.shape()[1], h, bs, len);
        let memo = at.filter(|_| pages.version != 0);
        let known = memo.and_then(|at| at.slots.borrow().iter().find(|(k, _)| *k == key).map(|(_, r)| r.clone()));
        let row = known.unwrap_or_else(|| {
            let pos =
                &start.reshape([b, 1, 1]).astype(nuvec::DType::I32) + &ops::arange(0, len, 1).reshape([1, len, 1]);
            let block = table.take_along_axis(&pos.floor_divide(bs).reshape([b, len]), 1).reshape([b, len, 1]);
            let head = ops::arange(0, h, 1).reshape([1, 1, h]);
            let row = (&(&(&(&block * h) + &head) * bs) + &pos.remainder(bs)).reshape([b * len * h, 1]);
            if let Some(at) = memo {
                at.slots.borrow_mut().push((key, row.clone()));
            }
            row
        });
        Ok(row)
    }

    /// Gives each of `b` rows of a paged cache the blocks of `positions` positions, the pool
    /// growing (doubling) when too few are free, and refreshes the block table on the device
    /// (in place while the pool keeps its size). A new pool takes its heads and dtypes from
    /// `like` (keys and values); without them only an existing pool grows. Returns whether the
    /// pool or the table moved (a recorded step must record again).
    fn take_blocks(&mut self, b: i32, positions: i32, like: Option<(&Array, &Array)>) -> nuvec::Result<bool> {
        let Some(pages) = self.pages.as_mut() else { return Ok(false) };
        let bs = pages.block_size;
        let need = ((positions + bs - 1) / bs) as usize;
        if pages.rows.len() < b as usize {
            pages.rows.resize(b as usize, Vec::new());
        }
        let rows = &mut pages.rows[..b as usize];
        let held = self.keys.as_ref().map_or(0, |k| k.shape()[0]);
        // A shared pool's rows are given: it only grows to hold the highest block they name.
        let (missing, short) = match pages.shared {
            Some(_) => {
                let top = rows.iter().flatten().max().map_or(0, |&m| m + 1);
                (0, (top > held).then(|| (top - held) as usize))
            }
            None => {
                let missing: usize = rows.iter().map(|r| need.saturating_sub(r.len())).sum();
                (missing, (missing > pages.free.len()).then(|| missing - pages.free.len()))
            }
        };
        let mut moved = false;
        if let Some(short) = short {
            let like = match (&self.keys, &self.values, like) {
                (Some(k), Some(v), _) => (k.clone(), v.clone()),
                (_, _, Some((k, v))) => (k.clone(), v.clone()),
                _ => return Ok(true),
            };
            let wanted = held as usize + short;
            let mut target = (wanted.next_power_of_two().max(2 * held as usize).max(4)) as i32;
            if let Some(cap) = pages.shared {
                target = target.min(cap).max(wanted as i32);
            }
            let grow = |pool: Option<&Array>, like: &Array| {
                let s = like.shape();
                let more = ops::zeros([target - held, s[1], bs, s[3]], like.dtype());
                match pool {
                    Some(p) => ops::concatenate(&[p.clone(), more], 0),
                    None => more,
                }
            };
            self.keys = Some(grow(self.keys.as_ref(), &like.0));
            self.values = Some(grow(self.values.as_ref(), &like.1));
            if pages.shared.is_none() {
                pages.free = (held..target).rev().chain(pages.free.iter().copied()).collect();
            }
            moved = true;
        }
        let rows = &mut pages.rows[..b as usize];
        for r in rows.iter_mut().filter(|_| pages.shared.is_none()) {
            while r.len() < need {
                r.push(pages.free.pop().expect("blocks were made free"));
            }
        }
        let pool = self.keys.as_ref().map_or(0, |k| k.shape()[0]);
        let n = match pages.narrow {
            true => rows.iter().map(Vec::len).max().unwrap_or(0).max(1) as i32,
            false => pool,
        };
        let same_shape = pages.table.as_ref().is_some_and(|t| t.shape() == [b, n]);
        if missing == 0 && same_shape && !pages.dirty {
            return Ok(moved);
        }
        pages.dirty = false;
        let version = pages.version;
        if let Some(table) = shared_table(version, b, n) {
            let same = pages.table.as_ref().is_some_and(|t| t.is(&table));
            pages.table = Some(table);
            return Ok(moved || !same);
        }
        let mut host = vec![0i32; (b * n) as usize];
        for (i, r) in rows.iter().enumerate() {
            host[i * n as usize..][..r.len()].copy_from_slice(r);
        }
        let host = Array::from_slice(&host, [b, n]);
        if nuvec::default_device().is_cpu() {
            // Nothing records there: a fresh table.
            share_table(version, b, n, &host);
            pages.table = Some(host);
            return Ok(true);
        }
        if !same_shape {
            // A dense buffer of its own, which later refreshes rewrite in place.
            let table = ops::zeros([b, n], nuvec::DType::I32).contiguous();
            nuvec::eval(std::slice::from_ref(&table))?;
            pages.table = Some(table);
            moved = true;
        }
        let table = pages.table.as_ref().expect("made above");
        nuvec::transforms::write_into(table, &host)?;
        share_table(version, b, n, table);
        Ok(moved)
    }

    /// Before a recorded step writes positions `< positions` of `b` rows: a paged cache takes
    /// the blocks they need. Whether its buffers moved (the step must record again).
    pub(crate) fn prepare(&mut self, b: i32, positions: i32) -> nuvec::Result<bool> {
        self.take_blocks(b, positions, None)
    }

    /// Positions a recorded step can write without the cache growing: a contiguous cache's
    /// capacity; unbounded for a paged one, whose blocks [`KvCache::prepare`] takes.
    pub(crate) fn capacity(&self) -> i32 {
        match (&self.pages, &self.keys) {
            (Some(_), _) => i32::MAX,
            _ if self.recurrent.is_some() => i32::MAX,
            (None, Some(k)) => k.shape()[2],
            (None, None) => 0,
        }
    }

    /// One cache of `rows.len()` rows from contiguous caches of one row each, their buffers
    /// padded to the largest capacity: for decoding several sequences together through
    /// [`KvCache::update_at`], whose positions say where each row's next key goes (each row
    /// keeps its own length; the result counts the longest).
    pub fn stack(rows: &[KvCache]) -> KvCache {
        if let Some(bs) = rows.first().and_then(KvCache::block_size) {
            return KvCache::stack_pages(rows, bs);
        }
        if rows.first().is_some_and(KvCache::is_recurrent) {
            return KvCache::stack_recurrent(rows);
        }
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

    /// [`KvCache::stack`] of paged caches: their pools one after the other, each row's blocks
    /// renumbered into the joined pool (the table is made again when next needed).
    fn stack_pages(rows: &[KvCache], bs: i32) -> KvCache {
        let mut pages = Pages { block_size: bs, ..Pages::default() };
        let mut base = 0;
        for c in rows {
            let p = c.pages.as_ref().filter(|p| p.block_size == bs);
            pages.rows.extend(
                p.map_or(vec![Vec::new()], |p| p.rows.clone())
                    .into_iter()
                    .map(|r| r.into_iter().map(|id| id + base).collect::<Vec<i32>>()),
            );
            pages.free.extend(p.map_or(Vec::new(), |p| p.free.iter().map(|id| id + base).collect()));
            base += c.keys.as_ref().map_or(0, |k| k.shape()[0]);
        }
        pages.free.sort_unstable_by(|a, b| b.cmp(a));
        let join = |get: &dyn Fn(&KvCache) -> Option<&Array>| -> Option<Array> {
            let parts: Vec<Array> = rows.iter().filter_map(|c| get(c).cloned()).collect();
            (!parts.is_empty()).then(|| ops::concatenate(&parts, 0))
        };
        KvCache {
            keys: join(&|c| c.keys.as_ref()),
            values: join(&|c| c.values.as_ref()),
            offset: rows.iter().map(|c| c.offset).max().unwrap_or(0),
            pages: Some(pages),
            ..KvCache::default()
        }
    }

    /// Rows `rows` of a cache of several rows, in that order, counting `offset` positions
    /// (the longest kept row's length): a batch that sequences leave ([`KvCache::stack`] joins
    /// them). A paged cache's blocks held by the rows left out go back to its free blocks; the
    /// result shares the pool, which is written in place, so `self` must not be used after.
    pub fn select(&self, rows: &[i32], offset: i32) -> KvCache {
        if let Some(p) = &self.pages {
            let mut pages = Pages { block_size: p.block_size, free: p.free.clone(), ..Pages::default() };
            pages.rows = rows.iter().filter_map(|&r| p.rows.get(r as usize).cloned()).collect();
            for (i, held) in p.rows.iter().enumerate() {
                if !rows.contains(&(i as i32)) {
                    pages.free.extend(held);
                }
            }
            pages.free.sort_unstable_by(|a, b| b.cmp(a));
            return KvCache {
                keys: self.keys.clone(),
                values: self.values.clone(),
                offset,
                pages: Some(pages),
                ..KvCache::default()
            };
        }
        let index = Array::from_slice(rows, [rows.len() as i32]);
        let take = |a: &Array| a.take(&index, 0);
        if let Some(r) = &self.recurrent {
            // The passes are the batch's: the rows taken cannot go back into them.
            let r = Recurrent {
                window: r.window.as_ref().map(take),
                state: r.state.as_ref().map(take),
                passes: Vec::new(),
                depth: r.depth,
            };
            return KvCache { recurrent: Some(Box::new(r)), offset, ..KvCache::default() };
        }
        KvCache {
            keys: self.keys.as_ref().map(take),
            values: self.values.as_ref().map(take),
            packed: self.packed.iter().map(take).collect(),
            offset,
            ..self.clone()
        }
    }

    /// The cache with a contiguous buffer's capacity cut to the power of two (at least
    /// [`STEP`]) that holds its positions: a row taken out of a batch keeps the batch's
    /// capacity otherwise. Other kinds come back as they are.
    pub fn compact(&self) -> KvCache {
        if self.pages.is_some() || self.max_size.is_some() || self.quantized.is_some() || self.recurrent.is_some() {
            return self.clone();
        }
        let cap = ((self.offset.max(STEP)) as u32).next_power_of_two() as i32;
        let cut = |a: &Array| if a.shape()[2] > cap { window(a, 0, cap) } else { a.clone() };
        KvCache { keys: self.keys.as_ref().map(cut), values: self.values.as_ref().map(cut), ..self.clone() }
    }

    /// Counts `n` more positions as held (a recorded step wrote them on the device).
    pub(crate) fn advance(&mut self, n: i32) {
        self.offset += n;
    }

    /// Drops the last `n` positions (a rejected speculative draft, a prompt that shares only a
    /// prefix); returns how many went. A rotating cache holding fewer positions than it has
    /// seen cannot (0); nor can a recurrent one whose kept steps do not reach back `n`
    /// positions ([`ROLLBACK_STEPS`]).
    pub fn trim(&mut self, n: i32) -> i32 {
        if self.recurrent.is_some() {
            return self.trim_recurrent(n);
        }
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
        if let Some(r) = &self.recurrent {
            let mut c = KvCache::recurrent();
            c.keep_steps(r.depth);
            return c;
        }
        match self.block_size() {
            Some(bs) => KvCache::paged(bs),
            None => {
                KvCache { max_size: self.max_size, keep: self.keep, quantized: self.quantized, ..KvCache::default() }
            }
        }
    }

    /// The arrays the cache holds, to evaluate with a step's output.
    pub fn arrays(&self) -> Vec<Array> {
        let recurrent = self.recurrent.iter().flat_map(|r| r.window.iter().chain(r.state.iter()));
        self.keys.iter().chain(self.values.iter()).chain(&self.packed).chain(recurrent).cloned().collect()
    }

    /// A failed array naming `op` when this cache holds no keys and values (a recurrent one).
    fn no_keys(&self, op: &'static str) -> Option<Array> {
        let why = "a recurrent cache (a linear-attention layer's) holds no keys and values";
        self.recurrent.is_some().then(|| Array::failed(op, nuvec::OpErrorKind::InvalidArgument(why.into())))
    }
}

/// Recurrent caches: a linear-attention layer's state in place of keys and values.
impl KvCache {
    /// An empty recurrent cache, for a linear-attention layer (Gated DeltaNet): its
    /// convolution window and recurrent state, set by [`KvCache::update_recurrent`]. It keeps
    /// nothing to go back to, so [`KvCache::trim`] takes nothing back until
    /// [`KvCache::keep_steps`] asks it to (speculative decoding does).
    pub fn recurrent() -> KvCache {
        KvCache { recurrent: Some(Box::default()), ..KvCache::default() }
    }

    /// Whether this is a recurrent cache ([`KvCache::recurrent`]).
    pub fn is_recurrent(&self) -> bool {
        self.recurrent.is_some()
    }

    /// A recurrent cache's convolution window `[B, K − 1, C]` and state `[B, Hv, Dv, Dk]`,
    /// once a forward pass has set them.
    pub fn recurrent_state(&self) -> Option<(Array, Array)> {
        let r = self.recurrent.as_ref()?;
        Some((r.window.clone()?, r.state.clone()?))
    }

    /// [`KvCache::recurrent_state`], handed over: the cache keeps neither, so that the pass
    /// that follows may write both in place (where nothing else holds them) and a recorded
    /// decode step reads and writes the same buffers on every launch. Give the window back
    /// through [`KvCache::update_recurrent`]'s `held`.
    pub fn take_recurrent_state(&mut self) -> Option<(Array, Array)> {
        let r = self.recurrent.as_mut()?;
        if r.window.is_none() || r.state.is_none() {
            return None;
        }
        Some((r.window.take()?, r.state.take()?))
    }

    /// Keeps the last `steps` positions of a recurrent cache restorable by [`KvCache::trim`]:
    /// the whole of its latest forward pass (of at most [`ROLLBACK_STEPS`]; a verified
    /// proposal), and earlier passes until they hold `steps` positions (a draft model's
    /// single-token steps, several of which a rejected proposal takes back). 0 keeps nothing.
    /// Other kinds ignore it.
    pub fn keep_steps(&mut self, steps: i32) {
        if let Some(r) = &mut self.recurrent {
            r.depth = steps.max(0);
            if r.depth == 0 {
                r.passes.clear();
            }
        }
    }

    /// Whether a forward pass should give this cache every step's state: a recurrent cache
    /// asked to keep positions ([`KvCache::keep_steps`]).
    pub fn keeps_steps(&self) -> bool {
        self.recurrent.as_ref().is_some_and(|r| r.depth > 0)
    }

    /// Takes a linear-attention layer's forward pass of `len` positions into a recurrent cache:
    /// `inputs [B, K − 1 + len, C]` are its convolution's inputs (the window held before, then
    /// the new positions'), `before` the recurrent state it started from, and `states` the
    /// state after each step `[B, len, Hv, Dv, Dk]`, which [`KvCache::trim`] can go back
    /// into, or the last state alone `[B, Hv, Dv, Dk]` (trim can then go back only before a
    /// single step). With `valid [B]` (rows padded at their end,
    /// [`Positions::with_valid`]) each row's window ends at its last real position, and the
    /// pass cannot be taken back. `held`, the window taken by
    /// [`KvCache::take_recurrent_state`], takes the new window in place where nothing else
    /// holds it. Other kinds of cache are left alone.
    pub fn update_recurrent(
        &mut self,
        inputs: &Array,
        len: i32,
        before: &Array,
        states: &Array,
        valid: Option<&Array>,
        held: Option<Array>,
    ) {
        let Some(r) = self.recurrent.as_mut() else { return };
        if inputs.ndim() != 3 {
            // A failed pass: its error is the state, for whoever evaluates it next.
            (r.window, r.state) = (Some(inputs.clone()), Some(inputs.clone()));
            r.passes.clear();
            self.offset += len;
            return;
        }
        let s = inputs.shape().to_vec();
        let (b, width, c) = (s[0], s[1], s[2]);
        let keep = width - len;
        let window = match valid {
            Some(v) => {
                let at = &v.astype(nuvec::DType::I32).reshape([b, 1])
                    + &ops::arange(0, keep, 1).astype(nuvec::DType::I32).reshape([1, keep]);
                inputs.take_along_axis(&at.reshape([b, keep, 1]).broadcast_to([b, keep, c]), 1)
            }
            None => {
                let new = inputs.slice(&[0, len, 0], &[b, width, c], &[1, 1, 1]);
                match held {
                    // Written over the window held before (its buffer, where it was the
                    // only handle), read by the pass's convolution first.
                    Some(w) if w.shape() == [b, keep, c] && w.dtype() == inputs.dtype() => {
                        w.slice_update(&new, &[0, 0, 0], &[b, keep, c], &[1, 1, 1])
                    }
                    // A copy of its own: a view would hold the whole pass's inputs.
                    _ => new.contiguous(),
                }
            }
        };
        let stepwise = states.ndim() == 5;
        let state = if stepwise { step(states, len - 1) } else { states.clone() };
        let pass = (r.depth > 0 && valid.is_none() && (stepwise || len == 1)).then(|| Pass {
            before: before.clone(),
            inputs: inputs.clone(),
            states: stepwise.then(|| states.clone()),
            len,
        });
        (r.window, r.state) = (Some(window), Some(state));
        match pass {
            Some(p) => {
                r.passes.push(p);
                // The oldest passes go once the newer ones hold the positions kept.
                while r.passes.len() > 1 && r.passes[1..].iter().map(|p| p.len).sum::<i32>() >= r.depth {
                    r.passes.remove(0);
                }
            }
            None => r.passes.clear(),
        }
        self.offset += len;
    }

    /// [`KvCache::trim`] of a recurrent cache: back into its kept passes, or nothing (0).
    fn trim_recurrent(&mut self, n: i32) -> i32 {
        let r = self.recurrent.as_mut().expect("a recurrent cache");
        let held: i32 = r.passes.iter().map(|p| p.len).sum();
        if n <= 0 || n > held.min(self.offset) {
            return 0;
        }
        let mut left = n;
        while left > 0 {
            let p = r.passes.last_mut().expect("the kept passes hold n positions");
            let steps = p.states.as_ref().map_or(1, |s| s.shape()[1]);
            let keep = p.inputs.shape()[1] - steps;
            // Steps of this pass that stay.
            let j = p.len - left.min(p.len);
            left -= p.len - j;
            r.state = Some(match (&p.states, j) {
                (Some(states), j) if j > 0 => step(states, j - 1),
                _ => p.before.clone(),
            });
            let s = p.inputs.shape().to_vec();
            r.window = Some(p.inputs.slice(&[0, j, 0], &[s[0], j + keep, s[2]], &[1, 1, 1]));
            if j == 0 {
                r.passes.pop();
            } else {
                p.len = j;
            }
        }
        self.offset -= n;
        n
    }

    /// [`KvCache::stack`] of recurrent caches: their windows and states joined by rows (a
    /// cache that has seen nothing gives a row of zeros).
    fn stack_recurrent(rows: &[KvCache]) -> KvCache {
        let like = rows.iter().find_map(KvCache::recurrent_state);
        let join = |pick: fn((Array, Array)) -> Array| -> Option<Array> {
            let like = pick(like.clone()?);
            let s = like.shape().to_vec();
            if s.is_empty() {
                // A failed state: its error goes on.
                return Some(like);
            }
            let zero = || ops::zeros_like(&like.slice(&vec![0; s.len()], &[&[1], &s[1..]].concat(), &vec![1; s.len()]));
            let parts: Vec<Array> = rows.iter().map(|c| c.recurrent_state().map_or_else(zero, pick)).collect();
            Some(ops::concatenate(&parts, 0))
        };
        let depth = rows.iter().filter_map(|c| c.recurrent.as_ref()).map(|r| r.depth).max().unwrap_or(0);
        let r = Recurrent { window: join(|(w, _)| w), state: join(|(_, s)| s), passes: Vec::new(), depth };
        KvCache {
            recurrent: Some(Box::new(r)),
            offset: rows.iter().map(|c| c.offset).max().unwrap_or(0),
            ..KvCache::default()
        }
    }
}

/// The state after step `j` of `states [B, T, Hv, Dv, Dk]`.
fn step(states: &Array, j: i32) -> Array {
    let s = states.shape().to_vec();
    states.slice(&[0, j, 0, 0, 0], &[s[0], j + 1, s[2], s[3], s[4]], &[1, 1, 1, 1, 1]).squeeze(1)
}

thread_local! {
    /// The block table last refreshed for rows set together ([`KvCache::set_rows_of`]), by
    /// version and shape: a model's other layers take the same device array rather than
    /// each build and upload a `[B, pool blocks]` table of its own.
    static SHARED_TABLE: std::cell::RefCell<Option<(u64, i32, i32, Array)>> = const { std::cell::RefCell::new(None) };
}

/// The table [`share_table`] kept for rows of `version` (not 0) and shape `[b, n]`.
fn shared_table(version: u64, b: i32, n: i32) -> Option<Array> {
    if version == 0 {
        return None;
    }
    SHARED_TABLE
        .with(|s| s.borrow().as_ref().filter(|(v, sb, sn, _)| (*v, *sb, *sn) == (version, b, n)).map(|e| e.3.clone()))
}

/// Keeps `table` for the other caches of rows `version` (not 0).
fn share_table(version: u64, b: i32, n: i32, table: &Array) {
    if version != 0 {
        SHARED_TABLE.with(|s| *s.borrow_mut() = Some((version, b, n, table.clone())));
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
