//! NumPy's `.npy` (a magic string, a Python-literal header with `descr`, `fortran_order` and
//! `shape`, then the bytes) and `.npz` (a zip archive of `.npy` members, stored or deflated).

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::path::Path;

use nuvec_core::{Array, DType, Error, Result};

use crate::io_error;

const MAGIC: &[u8] = b"\x93NUMPY";

/// The array in the `.npy` file at `path`.
pub fn load_npy(path: impl AsRef<Path>) -> Result<Array> {
    let path = path.as_ref();
    let bytes = std::fs::read(path).map_err(|e| io_error("load_npy", path, e))?;
    parse(&bytes).map_err(|what| io_error("load_npy", path, what))
}

/// Writes `array` to a `.npy` file at `path` (format 1.0, little-endian, C order).
pub fn save_npy(path: impl AsRef<Path>, array: &Array) -> Result<()> {
    let path = path.as_ref();
    let bytes = encode(array).map_err(|what| io_error("save_npy", path, what))?;
    std::fs::write(path, bytes).map_err(|e| io_error("save_npy", path, e))
}

/// Every array of the `.npz` file at `path`, by name (the member's name less `.npy`).
pub fn load_npz(path: impl AsRef<Path>) -> Result<BTreeMap<String, Array>> {
    let path = path.as_ref();
    let fail = |what: String| io_error("load_npz", path, what);
    let file = std::fs::File::open(path).map_err(|e| fail(e.to_string()))?;
    let mut zip = zip::ZipArchive::new(file).map_err(|e| fail(e.to_string()))?;
    let mut out = BTreeMap::new();
    for i in 0..zip.len() {
        let mut member = zip.by_index(i).map_err(|e| fail(e.to_string()))?;
        let name = member.name().strip_suffix(".npy").unwrap_or(member.name()).to_string();
        let mut bytes = Vec::with_capacity(member.size() as usize);
        member.read_to_end(&mut bytes).map_err(|e| fail(format!("array '{name}': {e}")))?;
        let array = parse(&bytes).map_err(|what| fail(format!("array '{name}': {what}")))?;
        out.insert(name, array);
    }
    Ok(out)
}

/// Writes `arrays` (name, array) to a `.npz` file at `path`, each member deflated when
/// `compressed` (NumPy's `savez_compressed`), else stored (`savez`).
pub fn save_npz(path: impl AsRef<Path>, arrays: &[(&str, &Array)], compressed: bool) -> Result<()> {
    let path = path.as_ref();
    let fail = |what: String| io_error("save_npz", path, what);
    let file = std::fs::File::create(path).map_err(|e| fail(e.to_string()))?;
    let mut zip = zip::ZipWriter::new(file);
    let method = if compressed { zip::CompressionMethod::Deflated } else { zip::CompressionMethod::Stored };
    let options = zip::write::SimpleFileOptions::default().compression_method(method).large_file(true);
    for (name, array) in arrays {
        let bytes = encode(array).map_err(|what| fail(format!("array '{name}': {what}")))?;
        zip.start_file(format!("{name}.npy"), options).map_err(|e| fail(format!("array '{name}': {e}")))?;
        zip.write_all(&bytes).map_err(|e| fail(format!("array '{name}': {e}")))?;
    }
    zip.finish().map_err(|e| fail(e.to_string()))?;
    Ok(())
}

/// NumPy's type string for a dtype (little-endian).
fn descr(d: DType) -> Option<&'static str> {
    Some(match d {
        DType::Bool => "|b1",
        DType::U8 => "|u1",
        DType::I8 => "|i1",
        DType::U16 => "<u2",
        DType::U32 => "<u4",
        DType::U64 => "<u8",
        DType::I16 => "<i2",
        DType::I32 => "<i4",
        DType::I64 => "<i8",
        DType::F16 => "<f2",
        DType::F32 => "<f4",
        DType::F64 => "<f8",
        DType::Complex64 => "<c8",
        _ => return None,
    })
}

/// The dtype of a NumPy type string and whether its bytes are big-endian.
fn dtype_of(descr: &str) -> Option<(DType, bool)> {
    let (order, code) = descr.split_at(1);
    let big = match order {
        "<" | "|" | "=" => false,
        ">" => true,
        _ => return None,
    };
    let d = DType::ALL.into_iter().find(|&d| self::descr(d).is_some_and(|s| &s[1..] == code))?;
    Some((d, big && d.size() > 1))
}

fn encode(array: &Array) -> std::result::Result<Vec<u8>, String> {
    let d = descr(array.dtype())
        .ok_or_else(|| format!("dtype {} has no NumPy equivalent (cast it first)", array.dtype()))?;
    let data = array.to_bytes().map_err(|e: Error| e.to_string())?;
    let dims: Vec<String> = array.shape().iter().map(|n| n.to_string()).collect();
    let shape = match dims.len() {
        1 => format!("({},)", dims[0]),
        _ => format!("({})", dims.join(", ")),
    };
    let mut header = format!("{{'descr': '{d}', 'fortran_order': False, 'shape': {shape}, }}");
    // Magic, version, length, header and its newline: a multiple of 64 bytes.
    let used = MAGIC.len() + 4 + header.len() + 1;
    header.push_str(&" ".repeat(used.next_multiple_of(64) - used));
    header.push('\n');
    let mut out = Vec::with_capacity(MAGIC.len() + 4 + header.len() + data.len());
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&[1, 0]);
    out.extend_from_slice(&(header.len() as u16).to_le_bytes());
    out.extend_from_slice(header.as_bytes());
    out.extend_from_slice(&data);
    Ok(out)
}

fn parse(bytes: &[u8]) -> std::result::Result<Array, String> {
    if bytes.len() < 10 || &bytes[..6] != MAGIC {
        return Err("not a .npy file (no magic string)".into());
    }
    let (len, at) = match bytes[6] {
        1 => (u16::from_le_bytes([bytes[8], bytes[9]]) as usize, 10),
        2 | 3 if bytes.len() >= 12 => (u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]) as usize, 12),
        v => return Err(format!("format version {v} is not supported")),
    };
    let header = bytes.get(at..at + len).ok_or("truncated header")?;
    let header = std::str::from_utf8(header).map_err(|_| "the header is not text")?;
    let descr = value_of(header, "descr")
        .and_then(|v| v.strip_prefix('\'')?.split('\'').next())
        .ok_or("the header has no 'descr'")?;
    let (dtype, big) = dtype_of(descr).ok_or_else(|| format!("dtype '{descr}' is not supported"))?;
    let fortran = match value_of(header, "fortran_order").map(|v| v.split([',', '}']).next().unwrap_or("").trim()) {
        Some("True") => true,
        Some("False") => false,
        _ => return Err("the header has no 'fortran_order'".into()),
    };
    let shape_text = value_of(header, "shape")
        .and_then(|v| v.strip_prefix('(')?.split(')').next())
        .ok_or("the header has no 'shape'")?;
    let shape = shape_text
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| s.parse::<i32>().map_err(|_| format!("bad dimension '{s}' in the shape")))
        .collect::<std::result::Result<Vec<i32>, String>>()?;
    let count: usize = shape.iter().map(|&n| n.max(0) as usize).product();
    let need = count.checked_mul(dtype.size()).ok_or("the shape is too large")?;
    let mut data = bytes.get(at + len..).ok_or("truncated data")?.to_vec();
    if data.len() < need {
        return Err(format!("truncated data: {need} bytes needed, {} present", data.len()));
    }
    data.truncate(need);
    if big {
        // Each element's bytes reversed (complex: each part's).
        let part = if dtype == DType::Complex64 { 4 } else { dtype.size() };
        data.chunks_exact_mut(part).for_each(<[u8]>::reverse);
    }
    let array = if fortran {
        // Column-major: the reversed shape in row-major order, then its axes reversed.
        let reversed: Vec<i32> = shape.iter().rev().copied().collect();
        let axes: Vec<i32> = (0..shape.len() as i32).rev().collect();
        Array::from_raw_bytes(&data, reversed, dtype).transpose(&axes)
    } else {
        Array::from_raw_bytes(&data, shape, dtype)
    };
    match array.error() {
        Some(e) => Err(e.to_string()),
        None => Ok(array),
    }
}

/// The text after `'key':` in a header dict.
fn value_of<'a>(header: &'a str, key: &str) -> Option<&'a str> {
    let at = header.find(&format!("'{key}'"))? + key.len() + 2;
    Some(header[at..].trim_start().strip_prefix(':')?.trim_start())
}
