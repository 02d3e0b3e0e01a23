//! Neural-network building blocks on nuvec's arrays, as MLX's `mlx.nn` and `mlx.optimizers`.
//! So far: [`optim`] (optimizers, learning-rate schedules, gradient clipping), [`activations`]
//! and [`losses`].

#![warn(missing_docs)]

pub mod activations;
pub mod losses;
pub mod optim;
