//! safetensors: a JSON header of names, dtypes, shapes and byte ranges, then the bytes.

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::path::{Path, PathBuf};

use memmap2::Mmap;
use nuvec_core::storage::{Data, HostBuffer};
use nuvec_core::{Array, DType, Result};
use safetensors::tensor::{Metadata, TensorInfo};
use safetensors::{Dtype, SafeTensors, View};

use crate::io_error;

/// A safetensors file: the header is read on open (through a memory map, which checks it
/// against the file's length), each tensor when asked for, straight from the file into the
/// array's memory.
pub struct SafetensorsFile {
    path: PathBuf,
    file: File,
    /// Where the tensors' bytes start (after the 8-byte length and the header).
    start: usize,
    meta: Metadata,
    names: Vec<String>,
}

impl SafetensorsFile {
    /// Opens the file at `path` and reads its header; an error names the file and what is wrong
    /// (truncated, a bad header, ranges outside the file).
    pub fn open(path: impl AsRef<Path>) -> Result<SafetensorsFile> {
        let path = path.as_ref().to_path_buf();
        let file = File::open(&path).map_err(|e| io_error("load_safetensors", &path, e))?;
        // SAFETY: the map is read-only and dropped at the end of this function; a file truncated
        // by another process meanwhile is outside what any reader can guard against
        // (safetensors' own loaders map the same way).
        let map = unsafe { Mmap::map(&file) }.map_err(|e| io_error("load_safetensors", &path, e))?;
        // The header is checked against the file: its ranges must cover the bytes exactly.
        let (n, meta) = SafeTensors::read_metadata(&map)
            .map_err(|e| io_error("load_safetensors", &path, format!("not a whole safetensors file: {e}")))?;
        let start = 8 + n;
        let mut names: Vec<(usize, String)> =
            meta.tensors().iter().map(|(name, info)| (info.data_offsets.0, name.clone())).collect();
        names.sort();
        Ok(SafetensorsFile { path, file, start, meta, names: names.into_iter().map(|(_, n)| n).collect() })
    }

    /// The tensors' names, in the order of their bytes in the file.
    pub fn names(&self) -> Vec<&str> {
        self.names.iter().map(String::as_str).collect()
    }

    /// The header's free-form metadata (`__metadata__`), if any.
    pub fn metadata(&self) -> Option<&HashMap<String, String>> {
        self.meta.metadata().as_ref()
    }

    /// The shape and dtype of tensor `name`, without reading it.
    pub fn info(&self, name: &str) -> Result<(Vec<i32>, DType)> {
        let info = self.tensor_info(name)?;
        Ok((self.shape_of(name, info)?, self.dtype_of(name, info)?))
    }

    /// Tensor `name`, read from the file into a host array.
    pub fn get(&self, name: &str) -> Result<Array> {
        let info = self.tensor_info(name)?;
        let (shape, dtype) = (self.shape_of(name, info)?, self.dtype_of(name, info)?);
        let (a, b) = info.data_offsets;
        let want = shape.iter().map(|&d| d as usize).product::<usize>() * dtype.size();
        if b.checked_sub(a) != Some(want) {
            return Err(self.error(name, format!("bytes {a}..{b} for {want} of {dtype} {shape:?}")));
        }
        // One positional read into the array's own buffer: the disk's sequential speed, where
        // copying out of the map would fault its pages in one at a time.
        let mut buffer = HostBuffer::uninit(want).map_err(|e| self.error(name, e))?;
        read_at(&self.file, buffer.bytes_mut(), (self.start + a) as u64).map_err(|e| self.error(name, e))?;
        let data = Data::from_host_buffer(&shape, buffer);
        Ok(Array::from_data(shape, dtype, data))
    }

    /// Part `index` of `parts` equal parts of tensor `name` along `axis`, reading only that
    /// part's bytes: one range for the first axis, one per outer row for a later one (a rank
    /// of a tensor-parallel group loads its shard this way). An error names an axis out of
    /// range or a length that does not divide.
    pub fn get_part(&self, name: &str, axis: usize, parts: usize, index: usize) -> Result<Array> {
        let info = self.tensor_info(name)?;
        let (full, dtype) = (self.shape_of(name, info)?, self.dtype_of(name, info)?);
        let len = full
            .get(axis)
            .copied()
            .ok_or_else(|| self.error(name, format!("axis {axis} of a {}-dimensional tensor", full.len())))?
            as usize;
        if parts == 0 || index >= parts || !len.is_multiple_of(parts) {
            return Err(self.error(name, format!("axis {axis} ({len}) does not split into part {index} of {parts}")));
        }
        let mut shape = full.clone();
        shape[axis] = (len / parts) as i32;
        // The tensor as outer rows (axes before `axis`) of `row` bytes, of which `span` bytes
        // starting at `skip` are this part's.
        let inner: usize = full[axis + 1..].iter().map(|&d| d as usize).product::<usize>() * dtype.size();
        let outer: usize = full[..axis].iter().map(|&d| d as usize).product();
        let (row, span) = (len * inner, len / parts * inner);
        let skip = index * span;
        let (a, b) = info.data_offsets;
        if b.checked_sub(a) != Some(outer * row) {
            return Err(self.error(name, format!("bytes {a}..{b} for {} of {dtype} {full:?}", outer * row)));
        }
        let mut buffer = HostBuffer::uninit(outer * span).map_err(|e| self.error(name, e))?;
        for (o, chunk) in buffer.bytes_mut().chunks_mut(span.max(1)).enumerate().take(outer) {
            let at = self.start + a + o * row + skip;
            read_at(&self.file, chunk, at as u64).map_err(|e| self.error(name, e))?;
        }
        let data = Data::from_host_buffer(&shape, buffer);
        Ok(Array::from_data(shape, dtype, data))
    }

    /// Every tensor, by name.
    pub fn load_all(&self) -> Result<BTreeMap<String, Array>> {
        self.names.iter().map(|n| Ok((n.clone(), self.get(n)?))).collect()
    }

    fn tensor_info(&self, name: &str) -> Result<&TensorInfo> {
        self.meta.info(name).ok_or_else(|| self.error(name, "no tensor of that name"))
    }

    fn shape_of(&self, name: &str, info: &TensorInfo) -> Result<Vec<i32>> {
        info.shape
            .iter()
            .map(|&d| i32::try_from(d).map_err(|_| self.error(name, format!("dimension {d} is too large"))))
            .collect()
    }

    fn dtype_of(&self, name: &str, info: &TensorInfo) -> Result<DType> {
        dtype_from(info.dtype)
            .ok_or_else(|| self.error(name, format!("dtype {:?} has no nuvec equivalent", info.dtype)))
    }

    fn error(&self, name: &str, what: impl std::fmt::Display) -> nuvec_core::Error {
        io_error("load_safetensors", &self.path, format!("tensor '{name}': {what}"))
    }
}

/// Every tensor of the safetensors file at `path`, by name.
pub fn load_safetensors(path: impl AsRef<Path>) -> Result<BTreeMap<String, Array>> {
    SafetensorsFile::open(path)?.load_all()
}

/// Every tensor of a sharded checkpoint, by name, from its index (`model.safetensors.index.json`:
/// `weight_map` names each tensor's file, relative to the index). A tensor the index names but
/// its file lacks, or a file's tensor the index does not name, is an error.
pub fn load_safetensors_index(path: impl AsRef<Path>) -> Result<BTreeMap<String, Array>> {
    let path = path.as_ref();
    let fail = |what: String| io_error("load_safetensors_index", path, what);
    let by_file = safetensors_index(path)?;
    let dir = path.parent().unwrap_or(Path::new("."));
    // Shards are read side by side: a disk serves several streams faster than one.
    let shards: Vec<Result<Vec<(String, Array)>>> = std::thread::scope(|scope| {
        let jobs: Vec<_> = by_file
            .iter()
            .map(|(file, names)| {
                let (dir, fail) = (&dir, &fail);
                scope.spawn(move || {
                    let shard = SafetensorsFile::open(dir.join(file))?;
                    if let Some(extra) = shard.names().into_iter().find(|n| !names.iter().any(|m| m == n)) {
                        return Err(fail(format!("{file} holds tensor '{extra}', which the index does not name")));
                    }
                    names.iter().map(|n| Ok((n.to_string(), shard.get(n)?))).collect()
                })
            })
            .collect();
        jobs.into_iter().map(|j| j.join().unwrap_or_else(|_| Err(fail("a reading thread panicked".into())))).collect()
    });
    let mut out = BTreeMap::new();
    for shard in shards {
        out.extend(shard?);
    }
    Ok(out)
}

/// The shards a sharded checkpoint's index (`model.safetensors.index.json`) names: each file,
/// relative to the index's folder, with the tensors its `weight_map` puts there.
pub fn safetensors_index(path: impl AsRef<Path>) -> Result<BTreeMap<String, Vec<String>>> {
    let path = path.as_ref();
    let fail = |what: String| io_error("load_safetensors_index", path, what);
    let text = std::fs::read_to_string(path).map_err(|e| fail(e.to_string()))?;
    let json: serde_json::Value = serde_json::from_str(&text).map_err(|e| fail(e.to_string()))?;
    let map =
        json.get("weight_map").and_then(|m| m.as_object()).ok_or_else(|| fail("no \"weight_map\" object".into()))?;
    let mut by_file: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (name, file) in map {
        let file = file.as_str().ok_or_else(|| fail(format!("tensor '{name}': the file is not a string")))?;
        by_file.entry(file.to_string()).or_default().push(name.clone());
    }
    Ok(by_file)
}

/// Fills `buf` from `file` at byte `offset`.
#[cfg(unix)]
fn read_at(file: &File, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
    std::os::unix::fs::FileExt::read_exact_at(file, buf, offset)
}

/// Fills `buf` from `file` at byte `offset`.
#[cfg(windows)]
fn read_at(file: &File, mut buf: &mut [u8], mut offset: u64) -> std::io::Result<()> {
    while !buf.is_empty() {
        match std::os::windows::fs::FileExt::seek_read(file, buf, offset)? {
            0 => return Err(std::io::ErrorKind::UnexpectedEof.into()),
            n => {
                buf = &mut buf[n..];
                offset += n as u64;
            }
        }
    }
    Ok(())
}

/// Writes `tensors` (name, array) to a safetensors file at `path`, with optional free-form
/// `metadata`. The arrays are evaluated; names must be unique.
pub fn save_safetensors(
    path: impl AsRef<Path>,
    tensors: &[(&str, &Array)],
    metadata: Option<HashMap<String, String>>,
) -> Result<()> {
    let path = path.as_ref();
    let mut views = Vec::with_capacity(tensors.len());
    for (name, array) in tensors {
        let fail = |what: String| io_error("save_safetensors", path, format!("tensor '{name}': {what}"));
        let dtype = dtype_to(array.dtype())
            .ok_or_else(|| fail(format!("dtype {} has no safetensors equivalent", array.dtype())))?;
        let bytes = array.to_bytes().map_err(|e| fail(e.to_string()))?;
        let shape = array.shape().iter().map(|&d| d as usize).collect();
        views.push((name.to_string(), Tensor { dtype, shape, bytes }));
    }
    let mut seen = std::collections::HashSet::new();
    if let Some((name, _)) = views.iter().find(|(n, _)| !seen.insert(n.clone())) {
        return Err(io_error("save_safetensors", path, format!("tensor '{name}' is given twice")));
    }
    safetensors::serialize_to_file(views, metadata, path).map_err(|e| io_error("save_safetensors", path, e))
}

/// One tensor's bytes as safetensors' writer takes them.
struct Tensor {
    dtype: Dtype,
    shape: Vec<usize>,
    bytes: Vec<u8>,
}

impl View for Tensor {
    fn dtype(&self) -> Dtype {
        self.dtype
    }
    fn shape(&self) -> &[usize] {
        &self.shape
    }
    fn data(&self) -> Cow<'_, [u8]> {
        Cow::Borrowed(&self.bytes)
    }
    fn data_len(&self) -> usize {
        self.bytes.len()
    }
}

fn dtype_from(d: Dtype) -> Option<DType> {
    Some(match d {
        Dtype::BOOL => DType::Bool,
        Dtype::U8 => DType::U8,
        Dtype::U16 => DType::U16,
        Dtype::U32 => DType::U32,
        Dtype::U64 => DType::U64,
        Dtype::I8 => DType::I8,
        Dtype::I16 => DType::I16,
        Dtype::I32 => DType::I32,
        Dtype::I64 => DType::I64,
        Dtype::F16 => DType::F16,
        Dtype::BF16 => DType::BF16,
        Dtype::F32 => DType::F32,
        Dtype::F64 => DType::F64,
        Dtype::C64 => DType::Complex64,
        _ => return None,
    })
}

fn dtype_to(d: DType) -> Option<Dtype> {
    Some(match d {
        DType::Bool => Dtype::BOOL,
        DType::U8 => Dtype::U8,
        DType::U16 => Dtype::U16,
        DType::U32 => Dtype::U32,
        DType::U64 => Dtype::U64,
        DType::I8 => Dtype::I8,
        DType::I16 => Dtype::I16,
        DType::I32 => Dtype::I32,
        DType::I64 => Dtype::I64,
        DType::F16 => Dtype::F16,
        DType::BF16 => Dtype::BF16,
        DType::F32 => Dtype::F32,
        DType::F64 => Dtype::F64,
        DType::Complex64 => Dtype::C64,
        _ => return None,
    })
}
