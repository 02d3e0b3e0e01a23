//! Keys: making them, splitting them, drawing raw bits from them, and the per-thread default
//! key sequence that functions called without a key draw from.

use std::cell::Cell;
use std::time::{SystemTime, UNIX_EPOCH};

use crate::array::Array;
use crate::dtype::DType;
use crate::error::{Error, OpErrorKind, Result};
use crate::primitive::Primitive;
use crate::primitive::random::{bits_dtype, fill_key_bytes};
use crate::shape::IntoShape;

thread_local! {
    /// This thread's default key, as host words (splitting it needs no graph).
    static SEQUENCE: Cell<[u32; 2]> = Cell::new(key_words(time_seed()));
}

/// A seed from the clock (as MLX seeds its default key), mixed with a per-thread counter so
/// threads started in the same tick still draw different numbers.
fn time_seed() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static THREADS: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(0);
    nanos ^ THREADS.fetch_add(1, Ordering::Relaxed).wrapping_mul(0x9E37_79B9_7F4A_7C15)
}

fn key_words(seed: u64) -> [u32; 2] {
    [(seed >> 32) as u32, seed as u32]
}

fn key_array(words: [u32; 2]) -> Array {
    Array::from_slice(&words, [2])
}

/// The two halves of `split(key)` computed on the host: `(carry, sub)`.
fn split_words(key: [u32; 2]) -> ([u32; 2], [u32; 2]) {
    let mut bytes = [0u8; 16];
    fill_key_bytes(key, &mut bytes);
    let w = |i: usize| u32::from_le_bytes(bytes[4 * i..4 * i + 4].try_into().unwrap_or_default());
    ([w(0), w(1)], [w(2), w(3)])
}

/// A PRNG key from a seed: `uint32[2]` holding the seed's high and low 32 bits.
///
/// ```
/// use nuvec::random;
/// let k = random::key(5);
/// assert_eq!(k.to_vec::<u32>().unwrap(), vec![0, 5]);
/// let a: Vec<f32> = random::uniform(0.0, 1.0, [4], nuvec::DType::F32, Some(&k)).to_vec().unwrap();
/// let b: Vec<f32> = random::uniform(0.0, 1.0, [4], nuvec::DType::F32, Some(&k)).to_vec().unwrap();
/// assert_eq!(a, b); // the same key gives the same numbers
/// ```
pub fn key(seed: u64) -> Array {
    key_array(key_words(seed))
}

/// Seeds this thread's default key sequence (MLX's `mx.random.seed`).
pub fn seed(seed: u64) {
    SEQUENCE.with(|s| s.set(key_words(seed)));
}

/// The next key of this thread's default sequence: the sequence's key is split in two, the
/// first half is kept for the next call and the second returned (MLX's `KeySequence::next`).
/// Every random function called without a key draws its key here.
pub fn next_key() -> Array {
    let sub = SEQUENCE.with(|s| {
        let (carry, sub) = split_words(s.get());
        s.set(carry);
        sub
    });
    key_array(sub)
}

/// The current key of this thread's default sequence (what the next call splits).
pub fn sequence_key() -> Array {
    key_array(SEQUENCE.with(Cell::get))
}

/// Replaces the key of this thread's default sequence, so the draws that follow repeat the
/// ones that followed when `key` was current (see [`sequence_key`]).
pub fn set_sequence_key(key: &Array) -> Result<()> {
    if let Err(f) = checked_key("set_sequence_key", Some(key)) {
        return Err(f.error().unwrap_or_else(|| Error::InvalidArgument("bad key".into())));
    }
    let v = key.to_vec::<u32>()?;
    SEQUENCE.with(|s| s.set([v[0], v[1]]));
    Ok(())
}

/// The key to draw with: the given one when it is a `uint32[2]` array, else a failed array
/// naming `op`; the next key of the default sequence when none is given.
#[track_caller]
pub(crate) fn checked_key(op: &'static str, key: Option<&Array>) -> std::result::Result<Array, Array> {
    let Some(k) = key else { return Ok(next_key()) };
    if let Some(e) = k.error() {
        return Err(Array::from_error(e));
    }
    if k.dtype() != DType::U32 || k.shape() != [2] {
        return Err(Array::failed(
            op,
            OpErrorKind::InvalidArgument(format!(
                "key must be a uint32 array of shape [2], got {} of shape {:?}",
                k.dtype(),
                k.shape()
            )),
        ));
    }
    Ok(k.clone())
}

/// Records `RandomBits` on a checked key.
#[track_caller]
pub(crate) fn bits_from(op: &'static str, shape: impl IntoShape, width: usize, key: &Array) -> Array {
    let shape = match shape.into_shape() {
        Ok(s) => s,
        Err(bad) => return Array::failed(op, OpErrorKind::InvalidShape(bad)),
    };
    if let Err(kind) = crate::shape::check_shape(&shape) {
        return Array::failed(op, kind);
    }
    if bits_dtype(width).is_none() {
        return Array::failed(
            op,
            OpErrorKind::InvalidArgument(format!("the bit width must be 1, 2 or 4 bytes, got {width}")),
        );
    }
    Array::from_op(op, Primitive::RandomBits { shape, width }, vec![key.clone()])
}

/// Random bits of `shape`, `width` bytes each (1, 2 or 4: `uint8`, `uint16` or `uint32`),
/// bit for bit as MLX draws them from `key` (or from the default sequence).
///
/// ```
/// use nuvec::random;
/// let k = random::key(0);
/// let b = random::bits([3], 4, Some(&k));
/// assert_eq!(b.dtype(), nuvec::DType::U32);
/// assert!(random::bits([3], 3, Some(&k)).is_failed());
/// ```
#[track_caller]
pub fn bits(shape: impl IntoShape, width: i32, key: Option<&Array>) -> Array {
    let key = match checked_key("bits", key) {
        Ok(k) => k,
        Err(f) => return f,
    };
    bits_from("bits", shape, usize::try_from(width).unwrap_or(0), &key)
}

/// `num` new keys from `key`, as a `uint32[num, 2]` array (MLX's `split(key, num)`).
///
/// ```
/// use nuvec::random;
/// let keys = random::split(&random::key(1), 3);
/// assert_eq!(keys.shape(), &[3, 2]);
/// ```
#[track_caller]
pub fn split(key: &Array, num: i32) -> Array {
    let key = match checked_key("split", Some(key)) {
        Ok(k) => k,
        Err(f) => return f,
    };
    if num < 0 {
        return Array::failed("split", OpErrorKind::InvalidArgument(format!("num must be non-negative, got {num}")));
    }
    bits_from("split", [num, 2], 4, &key)
}

/// The two keys of `split(key, 2)`, as a pair.
#[track_caller]
pub fn split2(key: &Array) -> (Array, Array) {
    let both = split(key, 2);
    if both.is_failed() {
        return (both.clone(), both);
    }
    (both.slice(&[0, 0], &[1, 2], &[1, 1]).reshape([2]), both.slice(&[1, 0], &[2, 2], &[1, 1]).reshape([2]))
}

/// `N` keys split from `key`.
#[track_caller]
pub fn split_n<const N: usize>(key: &Array) -> [Array; N] {
    let all = split(key, N as i32);
    std::array::from_fn(|i| {
        if all.is_failed() { all.clone() } else { all.slice(&[i as i32, 0], &[i as i32 + 1, 2], &[1, 1]).reshape([2]) }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_split_matches_the_layout() {
        // split(key) draws four words; the pairs are counters (0, 2) and (1, 3).
        let k = [3, 9];
        let (carry, sub) = split_words(k);
        let [a0, b0] = crate::primitive::random::threefry2x32(k, [0, 2]);
        let [a1, b1] = crate::primitive::random::threefry2x32(k, [1, 3]);
        assert_eq!(carry, [a0, a1]);
        assert_eq!(sub, [b0, b1]);
    }
}
