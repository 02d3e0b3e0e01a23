//! Reductions (`sum`, `max`, `mean`, `var`, `logsumexp`, ...), arg-reductions, softmax and
//! scans.

use crate::array::Array;
use crate::dtype::DType;
use crate::fast::FastOp;
use crate::primitive::{ArgReduceOp, Primitive, ReduceOp, ScanOp};
use crate::shape::Axes;

use super::{axes_or_fail, axis_or_fail, invalid, propagate};

/// Options of `var` and `std`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct VarOptions {
    /// Delta degrees of freedom: the divisor is `n − ddof`.
    pub ddof: i32,
    /// Keep reduced axes with size 1.
    pub keepdims: bool,
}

/// Options of the scans (`cumsum`, ...).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ScanOptions {
    /// Accumulate from the end of the axis.
    pub reverse: bool,
    /// Element `i` leaves out input `i` (the first output is the identity).
    pub exclusive: bool,
}

#[track_caller]
fn reduce(op: ReduceOp, x: &Array, axes: &dyn Axes, keepdims: bool) -> Array {
    if let Some(f) = propagate(&[x]) {
        return f;
    }
    let axes = match axes_or_fail(op.name(), &axes.axes(x.ndim()), x.ndim()) {
        Ok(a) => a,
        Err(f) => return f,
    };
    // No axes: the input itself, dtype included (MLX); `all`/`any` still give booleans.
    if axes.is_empty() {
        return if matches!(op, ReduceOp::And | ReduceOp::Or) { x.astype(DType::Bool) } else { x.clone() };
    }
    let dtype = match op {
        ReduceOp::And | ReduceOp::Or => DType::Bool,
        _ => op.compute_dtype(x.dtype()),
    };
    if matches!(op, ReduceOp::Max | ReduceOp::Min) && axes.iter().any(|&a| x.shape()[a] == 0) {
        return invalid(op.name(), format!("cannot {}-reduce an empty axis of shape {:?}", op.name(), x.shape()));
    }
    let x = x.astype(dtype);
    let out = Array::from_op(op.name(), Primitive::Reduce { op, axes: axes.clone() }, vec![x]);
    if keepdims { out } else { out.squeeze_axes(&axes) }
}

macro_rules! reductions {
    ($($name:ident, $keep:ident => $op:ident, $doc:literal;)*) => {
        impl Array {$(
            #[doc = $doc]
            #[doc = ""]
            #[doc = "`axes`: an axis, a list, `..` for all, `1..` for a tail."]
            #[track_caller]
            pub fn $name(&self, axes: impl Axes) -> Array { reduce(ReduceOp::$op, self, &axes, false) }
            #[doc = $doc]
            #[doc = " Reduced axes stay with size 1."]
            #[track_caller]
            pub fn $keep(&self, axes: impl Axes) -> Array { reduce(ReduceOp::$op, self, &axes, true) }
        )*}
        $(
            #[doc = $doc]
            #[track_caller]
            pub fn $name(x: &Array, axes: impl Axes, keepdims: bool) -> Array {
                reduce(ReduceOp::$op, x, &axes, keepdims)
            }
        )*
    };
}

reductions! {
    sum, sum_keepdims => Sum, "Sum over `axes` (booleans and small integers sum in 32 bits).";
    prod, prod_keepdims => Prod, "Product over `axes`.";
    max, max_keepdims => Max, "Maximum over `axes` (NaN propagates).";
    min, min_keepdims => Min, "Minimum over `axes` (NaN propagates).";
    all, all_keepdims => And, "Whether every element over `axes` is non-zero.";
    any, any_keepdims => Or, "Whether some element over `axes` is non-zero.";
}

fn count(x: &Array, axes: &[usize]) -> f64 {
    axes.iter().map(|&a| x.shape()[a] as f64).product()
}

impl Array {
    /// Mean over `axes` (integers average in `float32`).
    ///
    /// ```
    /// use nuvec::array;
    /// assert_eq!(array![[1, 2], [3, 4]].mean(0).to_vec::<f32>().unwrap(), vec![2.0, 3.0]);
    /// ```
    #[track_caller]
    pub fn mean(&self, axes: impl Axes) -> Array {
        self.mean_impl(&axes, false)
    }

    /// Mean over `axes`, kept with size 1.
    #[track_caller]
    pub fn mean_keepdims(&self, axes: impl Axes) -> Array {
        self.mean_impl(&axes, true)
    }

    #[track_caller]
    fn mean_impl(&self, axes: &dyn Axes, keepdims: bool) -> Array {
        if let Some(f) = propagate(&[self]) {
            return f;
        }
        let list = match axes_or_fail("mean", &axes.axes(self.ndim()), self.ndim()) {
            Ok(a) => a,
            Err(f) => return f,
        };
        let dtype = self.dtype().at_least_float();
        let n = count(self, &list);
        reduce(ReduceOp::Sum, self, axes, keepdims).astype(dtype) * (1.0 / n)
    }

    /// Variance over `axes` with `options.ddof` and `options.keepdims`.
    #[track_caller]
    pub fn var_with(&self, axes: impl Axes, options: VarOptions) -> Array {
        self.var_named("var", &axes, options)
    }

    #[track_caller]
    fn var_named(&self, op: &'static str, axes: &dyn Axes, options: VarOptions) -> Array {
        if let Some(f) = propagate(&[self]) {
            return f;
        }
        let list = match axes_or_fail(op, &axes.axes(self.ndim()), self.ndim()) {
            Ok(a) => a,
            Err(f) => return f,
        };
        let x = self.astype(self.dtype().at_least_float());
        let mu = x.mean_keepdims(list.iter().map(|&a| a as i32).collect::<Vec<_>>());
        let d = &x - &mu;
        let sq = if x.dtype() == DType::Complex64 { d.abs().square() } else { d.square() };
        let divisor = (count(self, &list) - options.ddof as f64).max(0.0);
        reduce(ReduceOp::Sum, &sq, axes, options.keepdims) * (1.0 / divisor)
    }

    /// Variance over `axes` (divisor `n`).
    #[track_caller]
    pub fn var(&self, axes: impl Axes) -> Array {
        self.var_with(axes, VarOptions::default())
    }

    /// Standard deviation over `axes` with `options.ddof` and `options.keepdims`.
    #[track_caller]
    pub fn std_with(&self, axes: impl Axes, options: VarOptions) -> Array {
        self.var_named("std", &axes, options).sqrt()
    }

    /// Standard deviation over `axes`.
    #[track_caller]
    pub fn std(&self, axes: impl Axes) -> Array {
        self.std_with(axes, VarOptions::default())
    }

    /// `log(sum(exp(x)))` over `axes`, computed without overflow (`float32` accumulation).
    #[track_caller]
    pub fn logsumexp(&self, axes: impl Axes) -> Array {
        self.logsumexp_impl(&axes, false)
    }

    /// `logsumexp` kept with size 1 on the reduced axes.
    #[track_caller]
    pub fn logsumexp_keepdims(&self, axes: impl Axes) -> Array {
        self.logsumexp_impl(&axes, true)
    }

    #[track_caller]
    fn logsumexp_impl(&self, axes: &dyn Axes, keepdims: bool) -> Array {
        if let Some(f) = propagate(&[self]) {
            return f;
        }
        let list = match axes_or_fail("logsumexp", &axes.axes(self.ndim()), self.ndim()) {
            Ok(a) => a,
            Err(f) => return f,
        };
        let x = self.astype(self.dtype().at_least_float());
        if list.is_empty() {
            return x;
        }
        // The fused primitive reduces the last axis: move the reduced axes there, merged.
        let (moved, kept_shape) = move_to_last(&x, &list);
        let out = Array::from_op("logsumexp", Primitive::Fast(FastOp::LogSumExp), vec![moved]);
        let mut shape = kept_shape;
        if keepdims {
            let mut full: Vec<i32> = x.shape().to_vec();
            list.iter().for_each(|&a| full[a] = 1);
            shape = full;
        }
        out.reshape(shape)
    }

    /// Softmax over `axes`: `exp(x − max) / sum(exp(x − max))`, statistics in `float32` for
    /// half precision.
    ///
    /// ```
    /// use nuvec::array;
    /// let p = array![[1.0, 2.0, 3.0]].softmax(-1);
    /// let total: f32 = p.to_vec::<f32>().unwrap().iter().sum();
    /// assert!((total - 1.0).abs() < 1e-6);
    /// ```
    #[track_caller]
    pub fn softmax(&self, axes: impl Axes) -> Array {
        if let Some(f) = propagate(&[self]) {
            return f;
        }
        let list = match axes_or_fail("softmax", &axes.axes(self.ndim()), self.ndim()) {
            Ok(a) => a,
            Err(f) => return f,
        };
        let x = self.astype(self.dtype().at_least_float());
        if list.is_empty() || x.size() == 0 {
            return if list.is_empty() { x.ones_like() } else { x };
        }
        if list == [x.ndim() - 1] {
            return Array::from_op("softmax", Primitive::Fast(FastOp::Softmax), vec![x]);
        }
        let (moved, _) = move_to_last(&x, &list);
        let out = Array::from_op("softmax", Primitive::Fast(FastOp::Softmax), vec![moved]);
        // Undo the move: split the merged axis, then put every axis back.
        let keep: Vec<usize> = (0..x.ndim()).filter(|a| !list.contains(a)).collect();
        let mut split: Vec<i32> = keep.iter().map(|&a| x.shape()[a]).collect();
        split.extend(list.iter().map(|&a| x.shape()[a]));
        let order: Vec<usize> = keep.iter().chain(list.iter()).copied().collect();
        let mut inverse = vec![0i32; order.len()];
        for (i, &a) in order.iter().enumerate() {
            inverse[a] = i as i32;
        }
        out.reshape(split).transpose(&inverse)
    }

    /// Index of the first maximum along `axis` (`None`: of the flattened array), as `uint32`.
    #[track_caller]
    pub fn argmax(&self, axis: impl Into<Option<i32>>) -> Array {
        arg_reduce(ArgReduceOp::ArgMax, self, axis.into(), false)
    }

    /// `argmax` keeping the axis with size 1.
    #[track_caller]
    pub fn argmax_keepdims(&self, axis: impl Into<Option<i32>>) -> Array {
        arg_reduce(ArgReduceOp::ArgMax, self, axis.into(), true)
    }

    /// Index of the first minimum along `axis` (`None`: of the flattened array), as `uint32`.
    #[track_caller]
    pub fn argmin(&self, axis: impl Into<Option<i32>>) -> Array {
        arg_reduce(ArgReduceOp::ArgMin, self, axis.into(), false)
    }

    /// `argmin` keeping the axis with size 1.
    #[track_caller]
    pub fn argmin_keepdims(&self, axis: impl Into<Option<i32>>) -> Array {
        arg_reduce(ArgReduceOp::ArgMin, self, axis.into(), true)
    }
}

/// Transposes `list` (sorted axes) to the end and merges them: returns the array and the shape
/// of the axes that stay.
fn move_to_last(x: &Array, list: &[usize]) -> (Array, Vec<i32>) {
    let keep: Vec<usize> = (0..x.ndim()).filter(|a| !list.contains(a)).collect();
    let perm: Vec<i32> = keep.iter().chain(list.iter()).map(|&a| a as i32).collect();
    let kept_shape: Vec<i32> = keep.iter().map(|&a| x.shape()[a]).collect();
    let mut merged = kept_shape.clone();
    merged.push(list.iter().map(|&a| x.shape()[a]).product());
    (x.transpose(&perm).reshape(merged), kept_shape)
}

#[track_caller]
fn arg_reduce(op: ArgReduceOp, x: &Array, axis: Option<i32>, keepdims: bool) -> Array {
    if let Some(f) = propagate(&[x]) {
        return f;
    }
    let (x, axis) = match axis {
        Some(a) => (x.clone(), a),
        None => (x.reshape([-1]), 0),
    };
    let ax = match axis_or_fail(op.name(), axis, x.ndim()) {
        Ok(a) => a,
        Err(f) => return f,
    };
    if x.shape()[ax] == 0 {
        return invalid(op.name(), format!("cannot {} over an empty axis of shape {:?}", op.name(), x.shape()));
    }
    let out = Array::from_op(op.name(), Primitive::ArgReduce { op, axis: ax }, vec![x]);
    if keepdims { out } else { out.squeeze_axes(&[ax]) }
}

#[track_caller]
fn scan(op: ScanOp, x: &Array, axis: Option<i32>, options: ScanOptions) -> Array {
    if let Some(f) = propagate(&[x]) {
        return f;
    }
    let (x, axis) = match axis {
        Some(a) => (x.clone(), a),
        None => (x.reshape([-1]), 0),
    };
    let ax = match axis_or_fail(op.name(), axis, x.ndim()) {
        Ok(a) => a,
        Err(f) => return f,
    };
    let x = x.astype(op.compute_dtype(x.dtype()));
    let prim = Primitive::Scan { op, axis: ax, reverse: options.reverse, inclusive: !options.exclusive };
    Array::from_op(op.name(), prim, vec![x])
}

macro_rules! scans {
    ($($name:ident, $with:ident => $op:ident, $doc:literal;)*) => {
        impl Array {$(
            #[doc = $doc]
            #[doc = ""]
            #[doc = "`axis`: `None` scans the flattened array."]
            #[track_caller]
            pub fn $name(&self, axis: impl Into<Option<i32>>) -> Array {
                scan(ScanOp::$op, self, axis.into(), ScanOptions::default())
            }
            #[doc = $doc]
            #[doc = " With `reverse` / `exclusive` options."]
            #[track_caller]
            pub fn $with(&self, axis: impl Into<Option<i32>>, options: ScanOptions) -> Array {
                scan(ScanOp::$op, self, axis.into(), options)
            }
        )*}
        $(
            #[doc = $doc]
            #[track_caller]
            pub fn $name(x: &Array, axis: impl Into<Option<i32>>, options: ScanOptions) -> Array {
                scan(ScanOp::$op, x, axis.into(), options)
            }
        )*
    };
}

scans! {
    cumsum, cumsum_with => Sum, "Running sum along `axis`.";
    cumprod, cumprod_with => Prod, "Running product along `axis`.";
    cummax, cummax_with => Max, "Running maximum along `axis`.";
    cummin, cummin_with => Min, "Running minimum along `axis`.";
    logcumsumexp, logcumsumexp_with => LogAddExp, "Running `log(sum(exp(x)))` along `axis`.";
}

/// Mean over `axes`.
#[track_caller]
pub fn mean(x: &Array, axes: impl Axes, keepdims: bool) -> Array {
    x.mean_impl(&axes, keepdims)
}

/// Variance over `axes` with `ddof`.
#[track_caller]
pub fn var(x: &Array, axes: impl Axes, keepdims: bool, ddof: i32) -> Array {
    x.var_with(axes, VarOptions { ddof, keepdims })
}

/// Standard deviation over `axes` with `ddof`.
#[track_caller]
pub fn std(x: &Array, axes: impl Axes, keepdims: bool, ddof: i32) -> Array {
    x.std_with(axes, VarOptions { ddof, keepdims })
}

/// `log(sum(exp(x)))` over `axes`.
#[track_caller]
pub fn logsumexp(x: &Array, axes: impl Axes, keepdims: bool) -> Array {
    x.logsumexp_impl(&axes, keepdims)
}

/// Softmax over `axes`.
#[track_caller]
pub fn softmax(x: &Array, axes: impl Axes) -> Array {
    x.softmax(axes)
}

/// Index of the first maximum along `axis`.
#[track_caller]
pub fn argmax(x: &Array, axis: impl Into<Option<i32>>, keepdims: bool) -> Array {
    arg_reduce(ArgReduceOp::ArgMax, x, axis.into(), keepdims)
}

/// Index of the first minimum along `axis`.
#[track_caller]
pub fn argmin(x: &Array, axis: impl Into<Option<i32>>, keepdims: bool) -> Array {
    arg_reduce(ArgReduceOp::ArgMin, x, axis.into(), keepdims)
}
