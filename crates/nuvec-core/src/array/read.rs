//! Reading values back to the host.

use crate::array::Array;
use crate::dtype::Element;
use crate::error::{Error, Result};
use crate::storage::{Data, internal};

impl Array {
    /// The elements in row-major order. Evaluates the array; `T` must be the array's dtype:
    /// reading as another type fails with a message saying which `astype` to call (a silent
    /// conversion would hide a dtype the program did not mean to have).
    ///
    /// ```
    /// use nuvec::array;
    /// assert_eq!(array![[1, 2], [3, 4]].t().to_vec::<i32>().unwrap(), vec![1, 3, 2, 4]);
    /// ```
    #[track_caller]
    pub fn to_vec<T: Element>(&self) -> Result<Vec<T>> {
        self.check_element::<T>("to_vec")?;
        let bytes = self.to_bytes()?;
        Ok(T::from_bytes(&bytes))
    }

    /// The single element of a one-element array. Evaluates the array; `T` must be its dtype,
    /// as for [`Array::to_vec`].
    ///
    /// ```
    /// use nuvec::{array, DType};
    /// let mean = array![1.0, 2.0].mean(..); // float32
    /// assert_eq!(mean.item::<f32>().unwrap(), 1.5);
    /// let err = mean.item::<f64>().unwrap_err();
    /// assert!(err.to_string().contains("call astype(DType::F64) first"), "{err}");
    /// assert_eq!(mean.astype(DType::F64).item::<f64>().unwrap(), 1.5);
    /// ```
    #[track_caller]
    pub fn item<T: Element>(&self) -> Result<T> {
        self.check_element::<T>("item")?;
        if self.size() != 1 {
            return Err(Error::misuse(
                "item",
                std::panic::Location::caller(),
                format!("it needs an array of one element, this one has shape {:?}", self.shape()),
            ));
        }
        let v = T::from_bytes(&self.to_bytes()?);
        v.into_iter().next().ok_or_else(|| internal("item of an empty read"))
    }

    /// The elements' bytes in row-major order (native endian). Evaluates the array.
    pub fn to_bytes(&self) -> Result<Vec<u8>> {
        let data = self.data()?;
        row_major_bytes(&data, self.shape(), self.itemsize())
    }

    #[track_caller]
    fn check_element<T: Element>(&self, op: &'static str) -> Result<()> {
        if let Some(e) = self.error() {
            return Err(e);
        }
        if T::DTYPE != self.dtype() {
            return Err(Error::misuse(
                op,
                std::panic::Location::caller(),
                format!(
                    "cannot read an array of {} as {}: call astype(DType::{:?}) first",
                    self.dtype(),
                    T::DTYPE,
                    T::DTYPE
                ),
            ));
        }
        Ok(())
    }
}

/// Gathers the elements of `data` (any layout, any device) into row-major host bytes.
pub(crate) fn row_major_bytes(data: &Data, shape: &[i32], itemsize: usize) -> Result<Vec<u8>> {
    let storage = data.storage.read_to_host()?;
    let src = storage.host_buffer().ok_or_else(|| internal("host copy is not on the host"))?.bytes();
    let n = crate::shape::elem_count(shape);
    let layout = &data.layout;
    if layout.flags.row_contiguous {
        let start = layout.offset * itemsize;
        return Ok(src[start..start + n * itemsize].to_vec());
    }
    let mut out = Vec::with_capacity(n * itemsize);
    let mut idx = vec![0i32; shape.len()];
    for _ in 0..n {
        let mut off = layout.offset as isize;
        for (i, &k) in idx.iter().enumerate() {
            off += k as isize * layout.strides[i];
        }
        let at = off as usize * itemsize;
        out.extend_from_slice(&src[at..at + itemsize]);
        for ax in (0..shape.len()).rev() {
            idx[ax] += 1;
            if idx[ax] < shape[ax] {
                break;
            }
            idx[ax] = 0;
        }
    }
    Ok(out)
}
