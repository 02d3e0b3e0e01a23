//! Trees of arrays: what `eval` (and, later, the transforms) walk.

use std::collections::{BTreeMap, HashMap};

use crate::array::Array;

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
