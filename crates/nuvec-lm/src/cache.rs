//! Key-value caches: one per attention layer, holding the keys and values of every position
//! seen so far.

use nuvec::{Array, ops};

/// Positions are added to a cache's buffers this many at a time, so that decoding grows them
/// rarely (mlx-lm's step).
pub const STEP: i32 = 256;

/// A contiguous cache: `[B, H, capacity, D]` buffers grown by [`STEP`] positions, of which
/// the first `offset` are filled (mlx-lm's `KVCache`).
#[derive(Clone, Debug, Default)]
pub struct KvCache {
    keys: Option<Array>,
    values: Option<Array>,
    offset: i32,
}

impl KvCache {
    /// An empty cache.
    pub fn new() -> KvCache {
        KvCache::default()
    }

    /// Positions held.
    pub fn offset(&self) -> i32 {
        self.offset
    }

    /// Appends `keys [B, H, L, Dk]` and `values [B, H, L, Dv]` and returns every position's
    /// keys and values so far (views of the buffers).
    pub fn update_and_fetch(&mut self, keys: &Array, values: &Array) -> (Array, Array) {
        let prev = self.offset;
        let len = keys.shape()[2];
        let capacity = self.keys.as_ref().map_or(0, |k| k.shape()[2]);
        if self.keys.is_none() || prev + len > capacity {
            let grow = (len + STEP - 1) / STEP * STEP;
            let more = |x: &Array| {
                let s = x.shape();
                ops::zeros([s[0], s[1], grow, s[3]], x.dtype())
            };
            let (k_more, v_more) = (more(keys), more(values));
            let extend = |old: Option<&Array>, more: Array| match old {
                Some(old) if prev > 0 => ops::concatenate(&[window(old, 0, prev), more], 2),
                _ => more,
            };
            self.keys = Some(extend(self.keys.as_ref(), k_more));
            self.values = Some(extend(self.values.as_ref(), v_more));
        }
        self.offset += len;
        let end = self.offset;
        let write = |buffer: &mut Option<Array>, new: &Array| {
            let old = buffer.take().expect("the buffers exist after growing");
            let s = old.shape().to_vec();
            // The old buffer is dropped before evaluation, so the update happens in place.
            *buffer = Some(old.slice_update(new, &[0, 0, prev, 0], &[s[0], s[1], end, s[3]], &[1, 1, 1, 1]));
        };
        write(&mut self.keys, keys);
        write(&mut self.values, values);
        let (k, v) = (self.keys.as_ref().expect("grown"), self.values.as_ref().expect("grown"));
        (window(k, 0, end), window(v, 0, end))
    }

    /// Drops the last `n` positions (a rejected speculative draft); returns how many went.
    pub fn trim(&mut self, n: i32) -> i32 {
        let n = n.clamp(0, self.offset);
        self.offset -= n;
        n
    }

    /// The filled keys and values (`None` while empty).
    pub fn state(&self) -> Option<(Array, Array)> {
        match (&self.keys, &self.values) {
            (Some(k), Some(v)) if self.offset > 0 => Some((window(k, 0, self.offset), window(v, 0, self.offset))),
            _ => None,
        }
    }

    /// The arrays the cache holds, to evaluate with a step's output.
    pub fn arrays(&self) -> Vec<Array> {
        self.keys.iter().chain(self.values.iter()).cloned().collect()
    }
}

/// Positions `start..end` of a `[B, H, L, D]` buffer.
fn window(x: &Array, start: i32, end: i32) -> Array {
    let s = x.shape();
    x.slice(&[0, 0, start, 0], &[s[0], s[1], end, s[3]], &[1, 1, 1, 1])
}
