//! Sorting and selection: `sort`, `argsort`, `partition`, `argpartition`, `topk`.
//!
//! MLX's order: ascending, NaN last, stable (equal elements keep their index order); indices are
//! `uint32`. `axis = None` works on the flattened array.

use crate::array::Array;
use crate::primitive::{Primitive, SortOp};

use super::{axis_or_fail, invalid, propagate};

/// The input (flattened when `axis` is `None`) and the normalised axis, or a failed array.
#[track_caller]
fn prepare(op: &'static str, x: &Array, axis: Option<i32>) -> Result<(Array, usize), Array> {
    if let Some(f) = propagate(&[x]) {
        return Err(f);
    }
    let (x, axis) = match axis {
        Some(a) => (x.clone(), a),
        None => (x.reshape([-1]), 0),
    };
    let ax = axis_or_fail(op, axis, x.ndim())?;
    Ok((x, ax))
}

/// A rank `kth` (negative counts from the end) normalised for an axis of `len`, or a failed
/// array naming `op`.
#[track_caller]
fn kth_or_fail(op: &'static str, kth: i32, x: &Array, axis: usize) -> Result<usize, Array> {
    let len = x.shape()[axis];
    let k = if kth < 0 { kth as i64 + len as i64 } else { kth as i64 };
    if (0..len as i64).contains(&k) {
        Ok(k as usize)
    } else {
        Err(invalid(op, format!("kth {kth} is out of range for axis {axis} of shape {:?}", x.shape())))
    }
}

#[track_caller]
fn sort_impl(indices: bool, x: &Array, axis: Option<i32>) -> Array {
    let op = if indices { SortOp::ArgSort } else { SortOp::Sort };
    match prepare(op.name(), x, axis) {
        Ok((x, ax)) => Array::from_op(op.name(), Primitive::Sort { op, axis: ax }, vec![x]),
        Err(f) => f,
    }
}

#[track_caller]
fn partition_impl(indices: bool, x: &Array, kth: i32, axis: Option<i32>) -> Array {
    let name = if indices { "argpartition" } else { "partition" };
    let (x, ax) = match prepare(name, x, axis) {
        Ok(p) => p,
        Err(f) => return f,
    };
    let k = match kth_or_fail(name, kth, &x, ax) {
        Ok(k) => k,
        Err(f) => return f,
    };
    let op = if indices { SortOp::ArgPartition(k) } else { SortOp::Partition(k) };
    Array::from_op(name, Primitive::Sort { op, axis: ax }, vec![x])
}

impl Array {
    /// The elements sorted in ascending order along `axis` (`None`: the flattened array), NaN
    /// last, equal elements in their original order.
    ///
    /// ```
    /// use nuvec::array;
    /// let x = array![[3.0, f32::NAN, 1.0], [2.0, 0.0, -1.0]];
    /// assert_eq!(x.sort(-1).to_vec::<f32>().unwrap()[..2], [1.0, 3.0]);
    /// assert_eq!(x.sort(None).to_vec::<f32>().unwrap()[..5], [-1.0, 0.0, 1.0, 2.0, 3.0]);
    /// ```
    #[track_caller]
    pub fn sort(&self, axis: impl Into<Option<i32>>) -> Array {
        sort_impl(false, self, axis.into())
    }

    /// The indices (`uint32`) that sort the elements along `axis` (`None`: the flattened
    /// array); ties keep index order, NaN last.
    ///
    /// ```
    /// use nuvec::array;
    /// assert_eq!(array![3, 1, 2, 1].argsort(0).to_vec::<u32>().unwrap(), vec![1, 3, 2, 0]);
    /// ```
    #[track_caller]
    pub fn argsort(&self, axis: impl Into<Option<i32>>) -> Array {
        sort_impl(true, self, axis.into())
    }

    /// The elements rearranged along `axis` so that position `kth` (negative: from the end)
    /// holds the element of that rank, with no greater element before it and no smaller one
    /// after it. The order within each side is unspecified (as in MLX).
    ///
    /// ```
    /// use nuvec::array;
    /// let p = array![5, 1, 4, 2, 3].partition(2, None).to_vec::<i32>().unwrap();
    /// assert_eq!(p[2], 3);
    /// assert!(p[..2].iter().all(|&v| v <= 3) && p[3..].iter().all(|&v| v >= 3));
    /// ```
    #[track_caller]
    pub fn partition(&self, kth: i32, axis: impl Into<Option<i32>>) -> Array {
        partition_impl(false, self, kth, axis.into())
    }

    /// The indices (`uint32`) of [`Array::partition`]: position `kth` holds the index of the
    /// element of rank `kth` (ties ranked by index).
    #[track_caller]
    pub fn argpartition(&self, kth: i32, axis: impl Into<Option<i32>>) -> Array {
        partition_impl(true, self, kth, axis.into())
    }

    /// The `k` largest elements along `axis` (`None`: of the flattened array), in unspecified
    /// order, as MLX (which takes the last `k` of a partition at rank `len - k`; `k == len`
    /// returns the input unchanged). Sort the result for a defined order.
    ///
    /// ```
    /// use nuvec::array;
    /// let mut top = array![5, 1, 9, 2, 7].topk(2, 0).to_vec::<i32>().unwrap();
    /// top.sort();
    /// assert_eq!(top, vec![7, 9]);
    /// ```
    #[track_caller]
    pub fn topk(&self, k: i32, axis: impl Into<Option<i32>>) -> Array {
        let (x, ax) = match prepare("topk", self, axis.into()) {
            Ok(p) => p,
            Err(f) => return f,
        };
        let len = x.shape()[ax];
        if k < 0 || k > len {
            return invalid("topk", format!("k {k} is out of range for axis {ax} of shape {:?}", x.shape()));
        }
        if k == len {
            return x;
        }
        // MLX partitions at rank -k: rank 0 when k is 0 (and the slice below is empty).
        let op = SortOp::Partition(if k == 0 { 0 } else { (len - k) as usize });
        let part = Array::from_op("topk", Primitive::Sort { op, axis: ax }, vec![x]);
        if part.is_failed() {
            return part;
        }
        let mut start = vec![0; part.ndim()];
        start[ax] = len - k;
        part.slice(&start, part.shape(), &[])
    }
}

/// Sorted along `axis` (`None`: flattened). See [`Array::sort`].
#[track_caller]
pub fn sort(x: &Array, axis: impl Into<Option<i32>>) -> Array {
    sort_impl(false, x, axis.into())
}

/// Indices that sort along `axis`. See [`Array::argsort`].
#[track_caller]
pub fn argsort(x: &Array, axis: impl Into<Option<i32>>) -> Array {
    sort_impl(true, x, axis.into())
}

/// Partitioned around rank `kth` along `axis`. See [`Array::partition`].
#[track_caller]
pub fn partition(x: &Array, kth: i32, axis: impl Into<Option<i32>>) -> Array {
    partition_impl(false, x, kth, axis.into())
}

/// Indices of the partition around rank `kth`. See [`Array::argpartition`].
#[track_caller]
pub fn argpartition(x: &Array, kth: i32, axis: impl Into<Option<i32>>) -> Array {
    partition_impl(true, x, kth, axis.into())
}

/// The `k` largest elements along `axis`. See [`Array::topk`].
#[track_caller]
pub fn topk(x: &Array, k: i32, axis: impl Into<Option<i32>>) -> Array {
    x.topk(k, axis)
}
