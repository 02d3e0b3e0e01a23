//! Random numbers with MLX's keys: threefry2x32 counter-based bits, bit for bit as MLX 0.32
//! draws them, and the distributions MLX builds on them.
//!
//! Every function takes an optional key. With a key the result depends on the key only; without
//! one, the function splits this thread's default key sequence ([`seed`] restarts it), as
//! MLX's global key does.
//!
//! ```
//! use nuvec::{DType, random};
//! let k = random::key(42);
//! let [k1, k2] = random::split_n::<2>(&k);
//! let x = random::normal([2, 3], DType::F32, 0.0, 1.0, Some(&k1));
//! let i = random::randint(0, 10, [4], DType::I32, Some(&k2));
//! assert_eq!(x.shape(), &[2, 3]);
//! assert_eq!(i.shape(), &[4]);
//!
//! random::seed(7);
//! let a: Vec<f32> = random::uniform(0.0, 1.0, [3], DType::F32, None).to_vec().unwrap();
//! random::seed(7);
//! let b: Vec<f32> = random::uniform(0.0, 1.0, [3], DType::F32, None).to_vec().unwrap();
//! assert_eq!(a, b);
//! ```

mod key;
mod sample;

pub use key::{bits, key, next_key, seed, sequence_key, set_sequence_key, split, split_n, split2};
pub use sample::{
    bernoulli, categorical, categorical_samples, categorical_shape, gumbel, laplace, normal, permutation,
    permutation_of, randint, truncated_normal, uniform,
};
