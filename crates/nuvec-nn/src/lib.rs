//! Neural-network building blocks on nuvec's arrays, as MLX's `mlx.nn` and `mlx.optimizers`.
//! So far: [`optim`], the optimizers, learning-rate schedules and gradient clipping.

#![warn(missing_docs)]

pub mod optim;
