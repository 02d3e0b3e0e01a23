//! `x.i(index)`, MLX's `x[index]`, and `x.at(index).set(v)` / `.add(v)` / ..., MLX's
//! `x[index] = v` and `x.at[index].add(v)`, as functional updates.
//!
//! An index is one [`Index`] or a tuple of them: integers (negative count from the end), Rust
//! ranges (`1..4`, `..`, `2..`, `(..).step(-1)`), [`Ellipsis`], [`NewAxis`] and integer arrays.
//! Without arrays the result is a view (a slice and a reshape). Integer arrays index by
//! NumPy's advanced-indexing rules, as MLX does: they broadcast together (integers count as
//! arrays then), and the broadcast dimensions replace the indexed axes where those are
//! adjacent in the index, or go first when something separates them.

use std::ops::{Range, RangeFrom, RangeFull, RangeInclusive, RangeTo, RangeToInclusive};

use crate::array::{Array, ScalarOrArray};
use crate::error::OpErrorKind;
use crate::primitive::view::normalize_slice;
use crate::primitive::{Primitive, ScatterReduce};

use super::gather::scatter_general;
use super::{invalid, propagate};

/// One entry of an index.
#[derive(Clone, Debug)]
pub enum Index {
    /// One position (negative counts from the end); the axis goes away.
    Int(i64),
    /// `start..stop` by `step` with Python's rules (missing ends cover the axis, bounds clamp).
    Slice {
        /// First position, or the start of the axis in the step's direction.
        start: Option<i64>,
        /// End (exclusive), or the end of the axis in the step's direction.
        stop: Option<i64>,
        /// Step (non-zero).
        step: i64,
    },
    /// As many full slices as the other entries leave axes (at most one per index).
    Ellipsis,
    /// A new axis of size 1.
    NewAxis,
    /// Positions given by an integer array (advanced indexing).
    Array(Array),
}

/// `...` in an index.
#[derive(Clone, Copy, Debug)]
pub struct Ellipsis;

/// `None` (`np.newaxis`) in an index.
#[derive(Clone, Copy, Debug)]
pub struct NewAxis;

/// A value usable as one entry of an index.
pub trait IntoIndexEntry {
    /// The entry.
    fn into_entry(self) -> Index;
}

/// A value usable as a whole index: one entry or a tuple of entries (or a `Vec<Index>`).
pub trait IntoIndex {
    /// The entries.
    fn into_index(self) -> Vec<Index>;
}

impl IntoIndexEntry for Index {
    fn into_entry(self) -> Index {
        self
    }
}
impl IntoIndexEntry for Ellipsis {
    fn into_entry(self) -> Index {
        Index::Ellipsis
    }
}
impl IntoIndexEntry for NewAxis {
    fn into_entry(self) -> Index {
        Index::NewAxis
    }
}
impl IntoIndexEntry for Array {
    fn into_entry(self) -> Index {
        Index::Array(self)
    }
}
impl IntoIndexEntry for &Array {
    fn into_entry(self) -> Index {
        Index::Array(self.clone())
    }
}
macro_rules! int_entry {
    ($($t:ty),*) => {$(
        impl IntoIndexEntry for $t {
            fn into_entry(self) -> Index { Index::Int(self as i64) }
        }
    )*};
}
int_entry!(i32, i64, usize, isize, u32);

fn slice(start: Option<i32>, stop: Option<i32>, step: i32) -> Index {
    Index::Slice { start: start.map(i64::from), stop: stop.map(i64::from), step: step as i64 }
}

impl IntoIndexEntry for Range<i32> {
    fn into_entry(self) -> Index {
        slice(Some(self.start), Some(self.end), 1)
    }
}
impl IntoIndexEntry for RangeFrom<i32> {
    fn into_entry(self) -> Index {
        slice(Some(self.start), None, 1)
    }
}
impl IntoIndexEntry for RangeTo<i32> {
    fn into_entry(self) -> Index {
        slice(None, Some(self.end), 1)
    }
}
impl IntoIndexEntry for RangeFull {
    fn into_entry(self) -> Index {
        slice(None, None, 1)
    }
}
impl IntoIndexEntry for RangeInclusive<i32> {
    fn into_entry(self) -> Index {
        let (a, b) = self.into_inner();
        // `a..=-1` reaches the end of the axis.
        Index::Slice { start: Some(a as i64), stop: (b != -1).then_some(b as i64 + 1), step: 1 }
    }
}
impl IntoIndexEntry for RangeToInclusive<i32> {
    fn into_entry(self) -> Index {
        Index::Slice { start: None, stop: (self.end != -1).then_some(self.end as i64 + 1), step: 1 }
    }
}

/// `.step(k)` on a range: the slice with that step, as Python's `start:stop:k`.
///
/// ```
/// use nuvec::{ops, IndexStep};
/// let x = ops::arange(0, 10, 1);
/// assert_eq!(x.i((1..8).step(3)).to_vec::<i32>().unwrap(), vec![1, 4, 7]);
/// assert_eq!(x.i((..).step(-4)).to_vec::<i32>().unwrap(), vec![9, 5, 1]);
/// ```
pub trait IndexStep {
    /// The slice with step `k`.
    fn step(self, k: i32) -> Index;
}
macro_rules! range_step {
    ($($t:ty),*) => {$(
        impl IndexStep for $t {
            fn step(self, k: i32) -> Index {
                match self.into_entry() {
                    Index::Slice { start, stop, .. } => Index::Slice { start, stop, step: k as i64 },
                    other => other,
                }
            }
        }
    )*};
}
range_step!(Range<i32>, RangeFrom<i32>, RangeTo<i32>, RangeFull, RangeInclusive<i32>, RangeToInclusive<i32>);

impl<T: IntoIndexEntry> IntoIndex for T {
    fn into_index(self) -> Vec<Index> {
        vec![self.into_entry()]
    }
}
impl IntoIndex for Vec<Index> {
    fn into_index(self) -> Vec<Index> {
        self
    }
}
impl IntoIndex for () {
    fn into_index(self) -> Vec<Index> {
        vec![]
    }
}
macro_rules! tuple_index {
    ($($name:ident),+) => {
        impl<$($name: IntoIndexEntry),+> IntoIndex for ($($name,)+) {
            #[allow(non_snake_case)]
            fn into_index(self) -> Vec<Index> {
                let ($($name,)+) = self;
                vec![$($name.into_entry()),+]
            }
        }
    };
}
tuple_index!(A);
tuple_index!(A, B);
tuple_index!(A, B, C);
tuple_index!(A, B, C, D);
tuple_index!(A, B, C, D, E);
tuple_index!(A, B, C, D, E, F);
tuple_index!(A, B, C, D, E, F, G);
tuple_index!(A, B, C, D, E, F, G, H);

/// A dimension of an indexing result.
#[derive(Clone, Copy, PartialEq)]
enum Dim {
    /// The broadcast shape of the array indices.
    Broadcast,
    /// A sliced axis of the source.
    Axis(usize),
    /// A new axis of size 1.
    New,
}

/// How an index applies to an array: one window over every axis, then array indices on some
/// axes, then the result's dimensions in order.
struct Plan {
    start: Vec<i32>,
    stop: Vec<i32>,
    step: Vec<i32>,
    /// `(axis, indices)` of array (and, with arrays, integer) entries.
    advanced: Vec<(usize, Array)>,
    /// Axes removed by integer entries when there are no arrays.
    dropped: Vec<usize>,
    order: Vec<Dim>,
}

impl Plan {
    #[track_caller]
    /// `ints_as_arrays`: integers beside arrays count as arrays (MLX's reads, NumPy's rule);
    /// MLX's updates keep them as plain indices.
    fn new(op: &'static str, x: &Array, entries: Vec<Index>, ints_as_arrays: bool) -> Result<Plan, Array> {
        let ndim = x.ndim();
        let ellipses = entries.iter().filter(|e| matches!(e, Index::Ellipsis)).count();
        if ellipses > 1 {
            return Err(Array::failed(op, OpErrorKind::InvalidIndex("an index can only have one ellipsis".into())));
        }
        let consuming = entries.iter().filter(|e| !matches!(e, Index::Ellipsis | Index::NewAxis)).count();
        if consuming > ndim {
            return Err(Array::failed(
                op,
                OpErrorKind::InvalidIndex(format!("{consuming} indices for an array of {ndim} dimensions")),
            ));
        }
        let full = || Index::Slice { start: None, stop: None, step: 1 };
        let mut expanded = Vec::with_capacity(entries.len() + ndim);
        let mut had_ellipsis = false;
        for e in entries {
            if matches!(e, Index::Ellipsis) {
                expanded.extend((0..ndim - consuming).map(|_| full()));
                had_ellipsis = true;
            } else {
                expanded.push(e);
            }
        }
        if !had_ellipsis {
            expanded.extend((0..ndim - consuming).map(|_| full()));
        }
        let has_array = ints_as_arrays && expanded.iter().any(|e| matches!(e, Index::Array(_)));
        let (mut start, mut stop, mut step) = (vec![0; ndim], x.shape().to_vec(), vec![1; ndim]);
        let mut advanced = Vec::new();
        let mut dropped = Vec::new();
        let mut order = Vec::new();
        let mut adv_positions = Vec::new();
        let mut first_at: Option<usize> = None;
        let mut axis = 0;
        for (pos, e) in expanded.into_iter().enumerate() {
            match e {
                Index::NewAxis => order.push(Dim::New),
                Index::Ellipsis => {}
                Index::Slice { start: s0, stop: s1, step: k } => {
                    let Ok(k) = i32::try_from(k) else {
                        return Err(invalid(op, format!("slice step {k} is out of range")));
                    };
                    if k == 0 {
                        return Err(invalid(op, "slice step cannot be zero"));
                    }
                    let clamp = |v: i64| v.clamp(i32::MIN as i64 + 1, i32::MAX as i64) as i32;
                    let (a, b) = normalize_slice(s0.map(clamp), s1.map(clamp), k, x.shape()[axis]);
                    (start[axis], stop[axis], step[axis]) = (a, b, k);
                    order.push(Dim::Axis(axis));
                    axis += 1;
                }
                Index::Int(i) => {
                    let n = x.shape()[axis] as i64;
                    let j = if i < 0 { i + n } else { i };
                    if !(0..n).contains(&j) {
                        return Err(Array::failed(
                            op,
                            OpErrorKind::InvalidIndex(format!("index {i} is out of range for axis {axis} of size {n}")),
                        ));
                    }
                    if has_array {
                        advanced.push((axis, Array::from(j as i32)));
                        adv_positions.push(pos);
                        first_at.get_or_insert(order.len());
                    } else {
                        (start[axis], stop[axis]) = (j as i32, j as i32 + 1);
                        dropped.push(axis);
                    }
                    axis += 1;
                }
                Index::Array(a) => {
                    if let Some(f) = propagate(&[&a]) {
                        return Err(f);
                    }
                    if !a.dtype().is_integer() || a.dtype() == crate::dtype::DType::Bool {
                        return Err(invalid(op, format!("array indices must be integers, got {}", a.dtype())));
                    }
                    advanced.push((axis, a));
                    adv_positions.push(pos);
                    first_at.get_or_insert(order.len());
                    axis += 1;
                }
            }
        }
        if !advanced.is_empty() {
            let adjacent = adv_positions.windows(2).all(|w| w[1] == w[0] + 1);
            let at = if adjacent { first_at.unwrap_or(0) } else { 0 };
            order.insert(at, Dim::Broadcast);
        }
        Ok(Plan { start, stop, step, advanced, dropped, order })
    }

    /// The sliced view (the bounds are already normalised, so the primitive is recorded as is).
    fn window(&self, x: &Array) -> Array {
        let p = Primitive::Slice { start: self.start.clone(), stop: self.stop.clone(), step: self.step.clone() };
        Array::from_op("index", p, vec![x.clone()])
    }

    /// The result of indexing `x`.
    #[track_caller]
    fn get(&self, x: &Array) -> Array {
        let w = self.window(x);
        if self.advanced.is_empty() {
            let shape: Vec<i32> = self
                .order
                .iter()
                .map(|d| match d {
                    Dim::Axis(a) => w.shape()[*a],
                    _ => 1,
                })
                .collect();
            return w.reshape(shape);
        }
        let (z, nb) = self.gather(&w);
        self.arrange(&z, nb, &w)
    }

    /// `[broadcast..., sliced axes...]` of the window, and the broadcast rank.
    #[track_caller]
    fn gather(&self, w: &Array) -> (Array, usize) {
        let (z, nb) = self.gather_all(w);
        // Integer entries kept as plain indices leave size-1 axes to drop.
        let rest: Vec<usize> = (0..w.ndim()).filter(|d| !self.advanced.iter().any(|(a, _)| a == d)).collect();
        let drop: Vec<usize> =
            rest.iter().enumerate().filter(|(_, d)| self.dropped.contains(d)).map(|(p, _)| nb + p).collect();
        (if z.is_failed() || drop.is_empty() { z } else { z.squeeze_axes(&drop) }, nb)
    }

    /// `[broadcast..., non-array axes of the window...]`, and the broadcast rank.
    #[track_caller]
    fn gather_all(&self, w: &Array) -> (Array, usize) {
        if let [(axis, idx)] = &self.advanced[..] {
            // One array: a take, then its dimensions moved to the front.
            let t = w.take(idx, *axis as i32);
            let nb = idx.ndim();
            let mut perm: Vec<i32> = (*axis as i32..(*axis + nb) as i32).collect();
            perm.extend((0..*axis as i32).chain((*axis + nb) as i32..t.ndim() as i32));
            return (t.transpose(&perm), nb);
        }
        let indices: Vec<Array> = self.advanced.iter().map(|(_, a)| a.clone()).collect();
        let axes: Vec<i32> = self.advanced.iter().map(|(a, _)| *a as i32).collect();
        let sizes: Vec<i32> =
            (0..w.ndim()).map(|d| if self.advanced.iter().any(|(a, _)| *a == d) { 1 } else { w.shape()[d] }).collect();
        let g = super::gather(w, &indices, &axes, &sizes);
        let nb = g.ndim().saturating_sub(w.ndim());
        let squeeze: Vec<usize> = self.advanced.iter().map(|(a, _)| nb + a).collect();
        (if g.is_failed() { g } else { g.squeeze_axes(&squeeze) }, nb)
    }

    /// The dimensions in `order`, from `[broadcast..., sliced axes...]`.
    fn arrange(&self, z: &Array, nb: usize, w: &Array) -> Array {
        if z.is_failed() {
            return z.clone();
        }
        let sliced = self.sliced_axes(w);
        let mut perm = Vec::new();
        let mut shape = Vec::new();
        for d in &self.order {
            match d {
                Dim::Broadcast => {
                    perm.extend(0..nb as i32);
                    shape.extend_from_slice(&z.shape()[..nb]);
                }
                Dim::Axis(a) => {
                    let p = nb + sliced.iter().position(|s| s == a).unwrap_or(0);
                    perm.push(p as i32);
                    shape.push(z.shape()[p]);
                }
                Dim::New => shape.push(1),
            }
        }
        z.transpose(&perm).reshape(shape)
    }

    fn sliced_axes(&self, w: &Array) -> Vec<usize> {
        (0..w.ndim()).filter(|d| !self.advanced.iter().any(|(a, _)| a == d) && !self.dropped.contains(d)).collect()
    }

    /// `x` with the indexed elements combined with `value` by `reduce`.
    #[track_caller]
    fn update(&self, op: &'static str, x: &Array, value: Array, reduce: ScatterReduce) -> Array {
        let target = self.get(x);
        if let Some(f) = propagate(&[&target]) {
            return f;
        }
        let mut v = value.astype(x.dtype());
        // MLX lets the value carry extra leading dimensions of size 1.
        while v.ndim() > target.ndim() && v.shape()[0] == 1 {
            v = v.squeeze_axes(&[0]);
        }
        let v = match crate::shape::broadcast_shapes(v.shape(), target.shape()) {
            Ok(s) if s[..] == target.shape()[..] => v.broadcast_to(target.shape()),
            _ => {
                return Array::failed(
                    op,
                    OpErrorKind::ShapeMismatch { lhs: v.shape().to_vec(), rhs: target.shape().to_vec() },
                );
            }
        };
        let w = self.window(x);
        let new_window = if self.advanced.is_empty() {
            let v = v.reshape(w.shape());
            match reduce {
                ScatterReduce::None => v,
                ScatterReduce::Sum => &w + v,
                ScatterReduce::Prod => &w * v,
                ScatterReduce::Max => w.maximum(v),
                ScatterReduce::Min => w.minimum(v),
            }
        } else {
            // Back to [broadcast..., window axes...] with size 1 on the indexed axes.
            let sliced = self.sliced_axes(&w);
            let nb = target.ndim() - self.order.iter().filter(|d| !matches!(d, Dim::Broadcast)).count();
            let mut perm = vec![0i32; nb + sliced.len()];
            let mut at = 0usize;
            let mut no_new = Vec::new();
            for d in &self.order {
                match d {
                    Dim::Broadcast => {
                        for (slot, p) in perm[..nb].iter_mut().zip(at..) {
                            *slot = p as i32;
                        }
                        no_new.extend((at..at + nb).map(|p| p as i32));
                        at += nb;
                    }
                    Dim::Axis(a) => {
                        let p = sliced.iter().position(|s| s == a).unwrap_or(0);
                        perm[nb + p] = at as i32;
                        no_new.push(at as i32);
                        at += 1;
                    }
                    Dim::New => at += 1,
                }
            }
            // Drop the new axes, then reorder.
            let kept: Vec<i32> = no_new.iter().map(|&p| target.shape()[p as usize]).collect();
            let mut pos_in_kept = vec![0i32; target.ndim()];
            for (k, &p) in no_new.iter().enumerate() {
                pos_in_kept[p as usize] = k as i32;
            }
            let perm: Vec<i32> = perm.iter().map(|&p| pos_in_kept[p as usize]).collect();
            let mut u = v.reshape(kept).transpose(&perm);
            let mut ushape: Vec<i32> = u.shape()[..nb].to_vec();
            for d in 0..w.ndim() {
                ushape.push(if self.advanced.iter().any(|(a, _)| *a == d) { 1 } else { w.shape()[d] });
            }
            u = u.reshape(ushape);
            let indices: Vec<Array> = self.advanced.iter().map(|(_, a)| a.clone()).collect();
            let axes: Vec<i32> = self.advanced.iter().map(|(a, _)| *a as i32).collect();
            scatter_general(op, reduce, &w, &indices, &u, &axes)
        };
        if self.start.iter().all(|&s| s == 0) && self.step.iter().all(|&s| s == 1) && self.stop[..] == x.shape()[..] {
            new_window
        } else {
            let p =
                Primitive::SliceUpdate { start: self.start.clone(), stop: self.stop.clone(), step: self.step.clone() };
            Array::from_op(op, p, vec![x.clone(), new_window])
        }
    }
}

impl Array {
    /// `self[index]` as in MLX: a view for integers, ranges, `..`, [`Ellipsis`] and [`NewAxis`];
    /// a gather when the index holds integer arrays. An integer outside its axis gives a failed
    /// array; array indices outside their axis clamp to its ends (see [`Array::take`]).
    ///
    /// ```
    /// use nuvec::{array, ops, Ellipsis, NewAxis};
    /// let x = ops::arange(0, 24, 1).reshape([2, 3, 4]);
    /// assert_eq!(x.i(1).shape(), &[3, 4]);
    /// assert_eq!(x.i((.., -1, 1..3)).to_vec::<i32>().unwrap(), vec![9, 10, 21, 22]);
    /// assert_eq!(x.i((Ellipsis, NewAxis)).shape(), &[2, 3, 4, 1]);
    /// assert_eq!(x.i((0, &array![2, 0], &array![1, 3])).to_vec::<i32>().unwrap(), vec![9, 3]);
    /// assert!(x.i(2).is_failed());
    /// ```
    #[track_caller]
    pub fn i(&self, index: impl IntoIndex) -> Array {
        if let Some(f) = propagate(&[self]) {
            return f;
        }
        match Plan::new("index", self, index.into_index(), true) {
            Ok(p) => p.get(self),
            Err(f) => f,
        }
    }

    /// The elements `index` selects, for a functional update: `x.at(i).set(v)` is MLX's
    /// `x[i] = v` and `x.at(i).add(v)` MLX's `x.at[i].add(v)` (repeated indices accumulate).
    ///
    /// ```
    /// use nuvec::{array, ops, DType};
    /// let x = ops::zeros([4], DType::F32);
    /// let y = x.at(&array![0, 2, 2]).add(1.0);
    /// assert_eq!(y.to_vec::<f32>().unwrap(), vec![1.0, 0.0, 2.0, 0.0]);
    /// assert_eq!(y.at(1..3).set(7.0).to_vec::<f32>().unwrap(), vec![1.0, 7.0, 7.0, 0.0]);
    /// ```
    pub fn at(&self, index: impl IntoIndex) -> At {
        At { x: self.clone(), index: index.into_index() }
    }
}

/// Indexed elements of an array awaiting a functional update (see [`Array::at`]).
#[derive(Clone, Debug)]
pub struct At {
    x: Array,
    index: Vec<Index>,
}

impl At {
    #[track_caller]
    fn apply(self, op: &'static str, value: ScalarOrArray, reduce: ScatterReduce) -> Array {
        let value = match value {
            ScalarOrArray::Scalar(s) => Array::scalar(s, self.x.dtype()),
            ScalarOrArray::Array(a) => a,
        };
        if let Some(f) = propagate(&[&self.x, &value]) {
            return f;
        }
        match Plan::new(op, &self.x, self.index, false) {
            Ok(p) => p.update(op, &self.x, value, reduce),
            Err(f) => f,
        }
    }

    /// The array with the indexed elements replaced by `value` (broadcast to them).
    #[track_caller]
    pub fn set(self, value: impl Into<ScalarOrArray>) -> Array {
        self.apply("at.set", value.into(), ScatterReduce::None)
    }

    /// The array with `value` added to the indexed elements.
    // Named after MLX's `x.at(idx).add(v)`; it consumes an index view, not an `Add` operand.
    #[allow(clippy::should_implement_trait)]
    #[track_caller]
    pub fn add(self, value: impl Into<ScalarOrArray>) -> Array {
        self.apply("at.add", value.into(), ScatterReduce::Sum)
    }

    /// The array with `value` subtracted from the indexed elements.
    #[track_caller]
    pub fn subtract(self, value: impl Into<ScalarOrArray>) -> Array {
        let v = match value.into() {
            ScalarOrArray::Scalar(s) => Array::scalar(s, self.x.dtype()),
            ScalarOrArray::Array(a) => a,
        };
        self.apply("at.subtract", v.negative().into(), ScatterReduce::Sum)
    }

    /// The indexed elements multiplied by `value`.
    #[track_caller]
    pub fn multiply(self, value: impl Into<ScalarOrArray>) -> Array {
        self.apply("at.multiply", value.into(), ScatterReduce::Prod)
    }

    /// The indexed elements replaced by their maximum with `value`.
    #[track_caller]
    pub fn maximum(self, value: impl Into<ScalarOrArray>) -> Array {
        self.apply("at.maximum", value.into(), ScatterReduce::Max)
    }

    /// The indexed elements replaced by their minimum with `value`.
    #[track_caller]
    pub fn minimum(self, value: impl Into<ScalarOrArray>) -> Array {
        self.apply("at.minimum", value.into(), ScatterReduce::Min)
    }
}
