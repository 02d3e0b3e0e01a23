//! Walking strided layouts: the iteration every kernel's general path shares.
//!
//! Axes are collapsed where every operand is contiguous across them, so the inner loop runs
//! over the longest run of elements with fixed strides.

/// Rows of a collapsed iteration over `K` operands: `count` rows of `inner` elements; row `r`
/// starts at `offsets(r)` and steps by `inner_strides` within the row.
pub struct Rows<const K: usize> {
    outer_shape: Vec<usize>,
    outer_strides: Vec<[isize; K]>,
    base: [isize; K],
    /// Elements per row.
    pub inner: usize,
    /// Stride of each operand within a row.
    pub inner_strides: [isize; K],
    /// Number of rows.
    pub count: usize,
}

impl<const K: usize> Rows<K> {
    /// The rows of `shape` for operands with `strides` starting at `base` (element offsets).
    pub fn new(shape: &[i32], strides: [&[isize]; K], base: [usize; K]) -> Self {
        // Keep axes of size > 1, then merge neighbours that are contiguous for every operand.
        let mut dims: Vec<(usize, [isize; K])> = Vec::new();
        for (i, &d) in shape.iter().enumerate() {
            if d == 1 {
                continue;
            }
            let s: [isize; K] = std::array::from_fn(|k| strides[k][i]);
            if let Some((pd, ps)) = dims.last_mut()
                && (0..K).all(|k| ps[k] == s[k] * d as isize)
            {
                *pd *= d as usize;
                *ps = s;
                continue;
            }
            dims.push((d as usize, s));
        }
        let base = base.map(|b| b as isize);
        if shape.contains(&0) {
            return Rows {
                outer_shape: vec![],
                outer_strides: vec![],
                base,
                inner: 0,
                inner_strides: [0; K],
                count: 0,
            };
        }
        let (inner, inner_strides) = dims.pop().unwrap_or((1, [0; K]));
        let count = dims.iter().map(|d| d.0).product();
        Rows {
            outer_shape: dims.iter().map(|d| d.0).collect(),
            outer_strides: dims.iter().map(|d| d.1).collect(),
            base,
            inner,
            inner_strides,
            count,
        }
    }

    /// Start offsets of row `r`.
    pub fn offsets(&self, mut r: usize) -> [isize; K] {
        let mut off = self.base;
        for i in (0..self.outer_shape.len()).rev() {
            let d = self.outer_shape[i];
            let idx = (r % d) as isize;
            r /= d;
            for (o, &st) in off.iter_mut().zip(&self.outer_strides[i]) {
                *o += idx * st;
            }
        }
        off
    }

    /// Calls `f(row, offsets)` for rows `start..end` in order.
    pub fn for_each(&self, start: usize, end: usize, mut f: impl FnMut(usize, [isize; K])) {
        if start >= end {
            return;
        }
        let n = self.outer_shape.len();
        let mut idx = vec![0usize; n];
        let mut rem = start;
        for i in (0..n).rev() {
            idx[i] = rem % self.outer_shape[i];
            rem /= self.outer_shape[i];
        }
        let mut off = self.offsets(start);
        for r in start..end {
            f(r, off);
            // Odometer step.
            for i in (0..n).rev() {
                idx[i] += 1;
                for (o, &st) in off.iter_mut().zip(&self.outer_strides[i]) {
                    *o += st;
                }
                if idx[i] < self.outer_shape[i] {
                    break;
                }
                for (o, &st) in off.iter_mut().zip(&self.outer_strides[i]) {
                    *o -= st * self.outer_shape[i] as isize;
                }
                idx[i] = 0;
            }
        }
    }
}

impl<const K: usize> Rows<K> {
    /// Calls `f(offsets)` for elements `start..end` (row-major order over all rows).
    pub fn for_each_element(&self, start: usize, end: usize, mut f: impl FnMut([isize; K])) {
        let inner = self.inner.max(1);
        if start >= end || self.count == 0 {
            return;
        }
        let (first_row, last_row) = (start / inner, (end - 1) / inner);
        self.for_each(first_row, last_row + 1, |r, off| {
            let lo = if r == first_row { start % inner } else { 0 };
            let hi = if r == last_row { (end - 1) % inner + 1 } else { inner };
            for j in lo..hi {
                let o: [isize; K] = std::array::from_fn(|k| off[k] + j as isize * self.inner_strides[k]);
                f(o);
            }
        });
    }
}

/// Number of elements a rayon task should handle at least.
pub const GRAIN: usize = 1 << 15;

/// Calls `f(i, chunk)` in parallel for chunk `i` of `chunk` elements of `out`.
///
/// Generic over the element type only in a thin wrapper: the rayon splitting behind it is
/// compiled once for every kernel instead of once per kernel and element type.
#[inline(always)]
pub fn par_chunks<U: bytemuck::Pod + Send>(out: &mut [U], chunk: usize, f: &(dyn Fn(usize, &mut [U]) + Sync)) {
    par_byte_chunks(bytemuck::cast_slice_mut(out), chunk.max(1) * size_of::<U>(), &|i, c| {
        f(i, bytemuck::cast_slice_mut(c))
    });
}

#[inline(never)]
fn par_byte_chunks(out: &mut [u8], chunk: usize, f: &(dyn Fn(usize, &mut [u8]) + Sync)) {
    use rayon::prelude::*;
    if out.len() <= chunk {
        if !out.is_empty() {
            f(0, out);
        }
        return;
    }
    out.par_chunks_mut(chunk.max(1)).enumerate().for_each(|(i, c)| f(i, c));
}

/// A row kernel of [`par_rows`]: the destination rows and their start offsets.
pub type RowKernel<'a, U, const K: usize> = dyn Fn(&mut [U], &[[isize; K]]) + Sync + 'a;

/// Rows of a strided walk handed to a row kernel at once.
const BATCH: usize = 64;

/// Walks `rows` into the row-major `out` in parallel: calls `f(dst, offsets)` for batches of
/// consecutive rows, `dst` holding those rows of `out` (`rows.inner` elements each) and
/// `offsets` their start offsets.
///
/// The walk and the rayon splitting are compiled once per operand count; only the row kernel
/// `f` is generic over the element types.
#[inline(always)]
pub fn par_rows<U: bytemuck::Pod + Send, const K: usize>(rows: &Rows<K>, out: &mut [U], f: &RowKernel<'_, U, K>) {
    par_byte_rows(rows, bytemuck::cast_slice_mut(out), size_of::<U>(), &|d, offs| f(bytemuck::cast_slice_mut(d), offs));
}

#[inline(never)]
fn par_byte_rows<const K: usize>(rows: &Rows<K>, out: &mut [u8], elem: usize, f: &RowKernel<'_, u8, K>) {
    let row_bytes = rows.inner * elem;
    if rows.count == 0 || row_bytes == 0 {
        return;
    }
    let per = rows_per_chunk(rows.inner);
    par_byte_chunks(out, per * row_bytes, &|c, chunk| {
        let start = c * per;
        let end = (start + per).min(rows.count);
        let mut offs = [[0isize; K]; BATCH];
        let (mut filled, mut first) = (0, start);
        rows.for_each(start, end, |r, off| {
            offs[filled] = off;
            filled += 1;
            if filled == BATCH || r + 1 == end {
                let lo = (first - start) * row_bytes;
                f(&mut chunk[lo..lo + filled * row_bytes], &offs[..filled]);
                first = r + 1;
                filled = 0;
            }
        });
    });
}

/// Rows per parallel chunk for rows of `inner` elements.
pub fn rows_per_chunk(inner: usize) -> usize {
    (GRAIN / inner.max(1)).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn collapses_contiguous_axes() {
        let rows = Rows::new(&[2, 3, 4], [&[12, 4, 1]], [0]);
        assert_eq!((rows.count, rows.inner), (1, 24));
        let rows = Rows::new(&[2, 3], [&[1, 2], &[3, 1]], [0, 0]);
        assert_eq!((rows.count, rows.inner), (2, 3));
        let mut seen = vec![];
        rows.for_each(0, 2, |r, o| seen.push((r, o)));
        assert_eq!(seen, vec![(0, [0, 0]), (1, [1, 3])]);
        assert_eq!(rows.offsets(1), [1, 3]);
    }
}
