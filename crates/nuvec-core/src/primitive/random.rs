//! Random bits: MLX's threefry2x32 counter-based generator, its byte layout, and the shape,
//! derivative and batching rules of the `RandomBits` primitive.
//!
//! The functions here are the reference every backend reproduces bit for bit: the CPU kernel
//! calls them, and the CUDA kernel (`kernels/random.cuh`) writes the same bytes.

use crate::array::Array;
use crate::dtype::DType;
use crate::error::OpErrorKind;
use crate::shape::Shape;
use crate::storage::Spec;

use super::Primitive;

/// The unsigned dtype of random bits `width` bytes wide (1, 2 or 4).
pub fn bits_dtype(width: usize) -> Option<DType> {
    match width {
        1 => Some(DType::U8),
        2 => Some(DType::U16),
        4 => Some(DType::U32),
        _ => None,
    }
}

/// Output shape of `RandomBits { shape, width }` on keys `[..., 2]`: one block of `shape` per
/// key, so the keys' leading axes come first.
pub fn random_bits_spec(keys: &Spec, shape: &[i32], width: usize) -> Result<Spec, OpErrorKind> {
    let dtype = bits_dtype(width)
        .ok_or_else(|| OpErrorKind::InvalidArgument(format!("the bit width must be 1, 2 or 4 bytes, got {width}")))?;
    if keys.dtype != DType::U32 {
        return Err(OpErrorKind::InvalidArgument(format!("keys must be uint32, got {}", keys.dtype)));
    }
    if keys.shape.last() != Some(&2) {
        return Err(OpErrorKind::InvalidArgument(format!(
            "keys must have shape [..., 2], got {:?}",
            keys.shape.to_vec()
        )));
    }
    let mut out: Shape = keys.shape[..keys.shape.len() - 1].into();
    out.extend_from_slice(shape);
    crate::shape::check_shape(&out)?;
    Ok(Spec { shape: out, dtype })
}

/// The threefry2x32 block function (20 rounds) of `count` under `key`, as MLX and JAX define it.
pub fn threefry2x32(key: [u32; 2], count: [u32; 2]) -> [u32; 2] {
    const ROTATIONS: [[u32; 4]; 2] = [[13, 15, 26, 6], [17, 29, 16, 24]];
    let ks = [key[0], key[1], key[0] ^ key[1] ^ 0x1BD1_1BDA];
    let (mut x, mut y) = (count[0].wrapping_add(ks[0]), count[1].wrapping_add(ks[1]));
    for i in 0..5 {
        for r in ROTATIONS[i % 2] {
            x = x.wrapping_add(y);
            y = y.rotate_left(r) ^ x;
        }
        x = x.wrapping_add(ks[(i + 1) % 3]);
        y = y.wrapping_add(ks[(i + 2) % 3]).wrapping_add(i as u32 + 1);
    }
    [x, y]
}

/// Fills `out` (the bytes drawn from one key) in MLX's layout.
///
/// The bytes are read as `w = ceil(len / 4)` little-endian words split into a first half of
/// `h = w / 2` words and the rest. Counter `(j, j + h + odd)` gives words `j` and `j + h + odd`
/// for `j < h`; when `w` is odd, the middle word `h` is the first half of counter `(h, 0)`. The
/// last word is cut to the bytes that remain. So every element of a draw depends on its size,
/// and a draw of `n` elements is not a prefix of a draw of `n + 1`: both match MLX.
pub fn fill_key_bytes(key: [u32; 2], out: &mut [u8]) {
    let len = out.len();
    let words = len.div_ceil(4);
    let (half, odd) = (words / 2, words % 2);
    let mut put = |word: usize, v: u32| {
        let start = 4 * word;
        let end = (start + 4).min(len);
        out[start..end].copy_from_slice(&v.to_le_bytes()[..end - start]);
    };
    for j in 0..half {
        let [a, b] = threefry2x32(key, [j as u32, (j + half + odd) as u32]);
        put(j, a);
        put(j + half + odd, b);
    }
    if odd == 1 {
        put(half, threefry2x32(key, [half as u32, 0])[0]);
    }
}

/// The batching rule: keys batched on axis 0 draw one block per key, which is the same
/// primitive on the batched keys (its output puts the keys' axes first).
pub(crate) fn random_bits_vmap(prim: &Primitive, keys: &Array) -> Array {
    Array::from_op("random_bits", prim.clone(), vec![keys.clone()])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn threefry_known_answer() {
        // The Random123 known-answer vectors for threefry2x32 with 20 rounds.
        assert_eq!(threefry2x32([0, 0], [0, 0]), [0x6b20_0159, 0x99ba_4efe]);
        assert_eq!(threefry2x32([u32::MAX, u32::MAX], [u32::MAX, u32::MAX]), [0x1cb9_96fc, 0xbb00_2be7]);
        assert_eq!(threefry2x32([0x1319_8a2e, 0x0370_7344], [0x243f_6a88, 0x85a3_08d3]), [0xc492_3a9c, 0x483d_f7a0]);
    }

    #[test]
    fn layout_of_odd_sizes() {
        let key = [7, 11];
        // Two words: one counter pair (0, 1).
        let mut two = [0u8; 8];
        fill_key_bytes(key, &mut two);
        let [a, b] = threefry2x32(key, [0, 1]);
        assert_eq!(two[..4], a.to_le_bytes());
        assert_eq!(two[4..], b.to_le_bytes());
        // Three bytes: one word cut short, from counter (0, 0).
        let mut three = [0u8; 3];
        fill_key_bytes(key, &mut three);
        assert_eq!(three[..], threefry2x32(key, [0, 0])[0].to_le_bytes()[..3]);
        // Five words: pairs (0, 3), (1, 4) and the middle word from (2, 0).
        let mut five = [0u8; 18];
        fill_key_bytes(key, &mut five);
        let word = |i: usize| u32::from_le_bytes(five[4 * i..4 * i + 4].try_into().unwrap());
        assert_eq!([word(0), word(3)], threefry2x32(key, [0, 3]));
        assert_eq!(word(2), threefry2x32(key, [2, 0])[0]);
        assert_eq!(five[16..], threefry2x32(key, [1, 4])[1].to_le_bytes()[..2]);
    }
}
