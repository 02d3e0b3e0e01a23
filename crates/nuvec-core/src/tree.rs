//! Trees of arrays: structures `eval` walks for their leaves ([`Leaves`]), and that the
//! transforms also rebuild, so arguments and results come back in the shape they came in
//! ([`Tree`]: `Array`, tuples, `Vec`, `Option`, fixed arrays, `HashMap`/`BTreeMap<String, _>`).

use std::collections::{BTreeMap, HashMap};

use crate::array::Array;
use crate::error::Result;

/// A structure holding arrays: `Array`, references, slices, `Vec`, `Option`, tuples (up to 8)
/// and `HashMap`/`BTreeMap<String, _>`.
pub trait Leaves {
    /// Appends the arrays in a fixed order.
    fn collect_leaves(&self, out: &mut Vec<Array>);
}

impl Leaves for Array {
    fn collect_leaves(&self, out: &mut Vec<Array>) {
        out.push(self.clone());
    }
}

impl<T: Leaves + ?Sized> Leaves for &T {
    fn collect_leaves(&self, out: &mut Vec<Array>) {
        (**self).collect_leaves(out)
    }
}

impl<T: Leaves> Leaves for [T] {
    fn collect_leaves(&self, out: &mut Vec<Array>) {
        self.iter().for_each(|x| x.collect_leaves(out))
    }
}

impl<T: Leaves, const N: usize> Leaves for [T; N] {
    fn collect_leaves(&self, out: &mut Vec<Array>) {
        self.iter().for_each(|x| x.collect_leaves(out))
    }
}

impl<T: Leaves> Leaves for Vec<T> {
    fn collect_leaves(&self, out: &mut Vec<Array>) {
        self.iter().for_each(|x| x.collect_leaves(out))
    }
}

impl<T: Leaves> Leaves for Option<T> {
    fn collect_leaves(&self, out: &mut Vec<Array>) {
        if let Some(x) = self {
            x.collect_leaves(out)
        }
    }
}

impl<T: Leaves> Leaves for BTreeMap<String, T> {
    fn collect_leaves(&self, out: &mut Vec<Array>) {
        self.values().for_each(|x| x.collect_leaves(out))
    }
}

impl<T: Leaves> Leaves for HashMap<String, T> {
    fn collect_leaves(&self, out: &mut Vec<Array>) {
        // Sorted keys: the order of leaves must not depend on hashing.
        let mut keys: Vec<&String> = self.keys().collect();
        keys.sort();
        keys.into_iter().for_each(|k| self[k].collect_leaves(out))
    }
}

impl Leaves for () {
    fn collect_leaves(&self, _out: &mut Vec<Array>) {}
}

macro_rules! tuple_leaves {
    ($($name:ident),+) => {
        impl<$($name: Leaves),+> Leaves for ($($name,)+) {
            #[allow(non_snake_case)]
            fn collect_leaves(&self, out: &mut Vec<Array>) {
                let ($($name,)+) = self;
                $($name.collect_leaves(out);)+
            }
        }
    };
}
tuple_leaves!(A);
tuple_leaves!(A, B);
tuple_leaves!(A, B, C);
tuple_leaves!(A, B, C, D);
tuple_leaves!(A, B, C, D, E);
tuple_leaves!(A, B, C, D, E, F);
tuple_leaves!(A, B, C, D, E, F, G);
tuple_leaves!(A, B, C, D, E, F, G, H);

/// A structure of arrays that can be flattened to its leaves and rebuilt with new leaves.
pub trait Tree: Leaves + Sized {
    /// A copy of this structure with its leaves taken, in order, from `leaves`.
    fn rebuild(&self, leaves: &mut std::vec::IntoIter<Array>) -> Self;

    /// The leaves, in order.
    fn flatten(&self) -> Vec<Array> {
        let mut v = Vec::new();
        self.collect_leaves(&mut v);
        v
    }

    /// A copy of this structure holding `leaves` (as many as it has leaves).
    fn with_leaves(&self, leaves: Vec<Array>) -> Self {
        self.rebuild(&mut leaves.into_iter())
    }
}

impl Tree for Array {
    fn rebuild(&self, leaves: &mut std::vec::IntoIter<Array>) -> Self {
        leaves.next().unwrap_or_else(|| {
            Array::from_error(crate::error::Error::InvalidArgument("tree rebuilt from too few leaves".into()))
        })
    }
}

impl<T: Tree> Tree for Vec<T> {
    fn rebuild(&self, leaves: &mut std::vec::IntoIter<Array>) -> Self {
        self.iter().map(|x| x.rebuild(leaves)).collect()
    }
}

impl<T: Tree, const N: usize> Tree for [T; N] {
    fn rebuild(&self, leaves: &mut std::vec::IntoIter<Array>) -> Self {
        std::array::from_fn(|i| self[i].rebuild(leaves))
    }
}

impl<T: Tree> Tree for Option<T> {
    fn rebuild(&self, leaves: &mut std::vec::IntoIter<Array>) -> Self {
        self.as_ref().map(|x| x.rebuild(leaves))
    }
}

impl<T: Tree> Tree for BTreeMap<String, T> {
    fn rebuild(&self, leaves: &mut std::vec::IntoIter<Array>) -> Self {
        self.iter().map(|(k, v)| (k.clone(), v.rebuild(leaves))).collect()
    }
}

impl<T: Tree> Tree for HashMap<String, T> {
    fn rebuild(&self, leaves: &mut std::vec::IntoIter<Array>) -> Self {
        // Leaves are ordered by sorted key (see `Leaves`).
        let mut keys: Vec<&String> = self.keys().collect();
        keys.sort();
        keys.into_iter().map(|k| (k.clone(), self[k].rebuild(leaves))).collect()
    }
}

impl Tree for () {
    fn rebuild(&self, _leaves: &mut std::vec::IntoIter<Array>) -> Self {}
}

macro_rules! tuple_tree {
    ($($name:ident),+) => {
        impl<$($name: Tree),+> Tree for ($($name,)+) {
            #[allow(non_snake_case)]
            fn rebuild(&self, leaves: &mut std::vec::IntoIter<Array>) -> Self {
                let ($($name,)+) = self;
                ($($name.rebuild(leaves),)+)
            }
        }
    };
}
tuple_tree!(A);
tuple_tree!(A, B);
tuple_tree!(A, B, C);
tuple_tree!(A, B, C, D);
tuple_tree!(A, B, C, D, E);
tuple_tree!(A, B, C, D, E, F);
tuple_tree!(A, B, C, D, E, F, G);
tuple_tree!(A, B, C, D, E, F, G, H);

/// What a transformed closure may return: a value, or a `Result` of one.
pub trait IntoResult {
    /// The value.
    type Ok;
    /// The value, or the error.
    fn into_result(self) -> Result<Self::Ok>;
}

impl<T: Tree> IntoResult for T {
    type Ok = T;
    fn into_result(self) -> Result<T> {
        Ok(self)
    }
}

impl<T: Tree> IntoResult for Result<T> {
    type Ok = T;
    fn into_result(self) -> Result<T> {
        self
    }
}

/// What `value_and_grad` differentiates: a loss, or a loss with auxiliary outputs (returned
/// without gradients).
pub trait GradOutput: Tree {
    /// The scalar to differentiate.
    fn loss(&self) -> &Array;
}

impl GradOutput for Array {
    fn loss(&self) -> &Array {
        self
    }
}

impl<A: Tree> GradOutput for (Array, A) {
    fn loss(&self) -> &Array {
        &self.0
    }
}

/// `tree` with `f` applied to each leaf: an optimizer's update, a cast of every parameter.
///
/// ```
/// use nuvec::{array, tree_map, Array};
/// let params = (array![1.0, 2.0], vec![array![3.0]]);
/// let halved: (Array, Vec<Array>) = tree_map(&params, |p| p * 0.5);
/// assert_eq!(halved.1[0].item::<f32>().unwrap(), 1.5);
/// ```
pub fn tree_map<T: Tree>(tree: &T, f: impl FnMut(&Array) -> Array) -> T {
    tree.with_leaves(tree.flatten().iter().map(f).collect())
}

/// `tree` with each leaf replaced by `f(leaf, matching leaves of others)`, MLX's
/// `tree_map(fn, tree, *rest)`: the trees are walked together in leaf order. A tree of another
/// leaf count makes every leaf a failed array saying so.
///
/// ```
/// use nuvec::{array, tree_map_with, Array};
/// let params = vec![array![1.0, 2.0], array![3.0]];
/// let grads = vec![array![0.5, 0.5], array![1.0]];
/// // One step of gradient descent with learning rate 0.1.
/// let next = tree_map_with(&params, &[&grads], |p, r| p - &r[0] * 0.1);
/// assert_eq!(next[0].to_vec::<f32>().unwrap(), vec![0.95, 1.95]);
/// ```
pub fn tree_map_with<T: Tree>(tree: &T, others: &[&T], mut f: impl FnMut(&Array, &[Array]) -> Array) -> T {
    let leaves = tree.flatten();
    let others: Vec<Vec<Array>> = others.iter().map(|t| t.flatten()).collect();
    if let Some(bad) = others.iter().find(|o| o.len() != leaves.len()) {
        let e = crate::error::Error::InvalidArgument(format!(
            "tree_map: the trees differ: {} leaves and {} leaves",
            leaves.len(),
            bad.len()
        ));
        return tree.with_leaves(leaves.iter().map(|_| Array::from_error(e.clone())).collect());
    }
    let mapped = (0..leaves.len())
        .map(|i| {
            let rest: Vec<Array> = others.iter().map(|o| o[i].clone()).collect();
            f(&leaves[i], &rest)
        })
        .collect();
    tree.with_leaves(mapped)
}
