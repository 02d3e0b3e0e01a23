//! Neural-network building blocks on nuvec's arrays, as MLX's `mlx.nn` and `mlx.optimizers`:
//! [`Module`]s whose parameters form a tree with MLX's dotted names ([`module!`] makes a struct
//! of layers one), [`layers`], [`activations`], [`losses`], [`value_and_grad`] over a module's
//! trainable parameters, [`init`]ializers, [`quantize()`] over a model, and [`optim`]
//! (optimizers, learning-rate schedules, gradient clipping).

#![warn(missing_docs)]

pub mod activations;
pub mod distributed;
pub mod init;
pub mod layers;
pub mod losses;
pub mod module;
pub mod optim;
pub mod quantize;

pub use distributed::{ShardedEmbedding, ShardedLinear, Sharding, gather_features, shard_embedding, shard_linear};
pub use layers::{
    Conv1d, Conv2d, Dropout, Embedding, Layer, LayerNorm, Linear, MultiHeadAttention, QuantizedEmbedding,
    QuantizedLinear, RmsNorm, Rope, Sequential,
};
pub use module::{Module, Param, Params, join, value_and_grad};
pub use quantize::{QuantSpec, Quantized, quantize, quantize_with};
