//! GGUF (llama.cpp's format): a header of typed metadata and tensor descriptions, then the
//! tensors' bytes, aligned. Quantized tensors (ggml's block formats) are dequantized to
//! float32 here; F32, F16 and BF16 tensors keep their dtype.

use std::collections::BTreeMap;
use std::fs::File;
use std::path::{Path, PathBuf};

use memmap2::Mmap;
use nuvec_core::{Array, DType, Result, f16};

use crate::io_error;

/// A metadata value of a GGUF file.
#[derive(Clone, Debug, PartialEq)]
pub enum GgufValue {
    /// `uint8`.
    U8(u8),
    /// `int8`.
    I8(i8),
    /// `uint16`.
    U16(u16),
    /// `int16`.
    I16(i16),
    /// `uint32`.
    U32(u32),
    /// `int32`.
    I32(i32),
    /// `float32`.
    F32(f32),
    /// `bool`.
    Bool(bool),
    /// A UTF-8 string.
    String(String),
    /// An array of values of one type.
    Array(Vec<GgufValue>),
    /// `uint64`.
    U64(u64),
    /// `int64`.
    I64(i64),
    /// `float64`.
    F64(f64),
}

impl GgufValue {
    /// The value as an unsigned integer, when it is a non-negative integer.
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            GgufValue::U8(v) => Some(v as u64),
            GgufValue::U16(v) => Some(v as u64),
            GgufValue::U32(v) => Some(v as u64),
            GgufValue::U64(v) => Some(v),
            GgufValue::I8(v) => u64::try_from(v).ok(),
            GgufValue::I16(v) => u64::try_from(v).ok(),
            GgufValue::I32(v) => u64::try_from(v).ok(),
            GgufValue::I64(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }

    /// The value as a float, when it is a number.
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            GgufValue::F32(v) => Some(v as f64),
            GgufValue::F64(v) => Some(v),
            GgufValue::I8(v) => Some(v as f64),
            GgufValue::I16(v) => Some(v as f64),
            GgufValue::I32(v) => Some(v as f64),
            GgufValue::I64(v) => Some(v as f64),
            _ => self.as_u64().map(|v| v as f64),
        }
    }

    /// The value as a string, when it is one.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            GgufValue::String(s) => Some(s),
            _ => None,
        }
    }
}

/// One tensor's description in a GGUF file.
#[derive(Clone, Debug)]
pub struct GgufTensor {
    /// Its name.
    pub name: String,
    /// Its shape, outermost first (GGUF lists dimensions innermost first).
    pub shape: Vec<i32>,
    /// ggml's type number (0 F32, 1 F16, 2 Q4_0, 3 Q4_1, 6 Q5_0, 7 Q5_1, 8 Q8_0, 10 Q2_K,
    /// 11 Q3_K, 12 Q4_K, 13 Q5_K, 14 Q6_K, 30 BF16, ...).
    pub ggml_type: u32,
    /// Where its bytes start, from the start of the data section.
    pub offset: u64,
}

/// ggml element types this reader knows: (number, name, elements per block, bytes per block).
const TYPES: [(u32, &str, usize, usize); 13] = [
    (0, "F32", 1, 4),
    (1, "F16", 1, 2),
    (2, "Q4_0", 32, 18),
    (3, "Q4_1", 32, 20),
    (6, "Q5_0", 32, 22),
    (7, "Q5_1", 32, 24),
    (8, "Q8_0", 32, 34),
    (10, "Q2_K", 256, 84),
    (11, "Q3_K", 256, 110),
    (12, "Q4_K", 256, 144),
    (13, "Q5_K", 256, 176),
    (14, "Q6_K", 256, 210),
    (30, "BF16", 1, 2),
];

/// A GGUF file, memory-mapped: metadata and tensor descriptions read on open, a tensor when
/// asked for.
pub struct GgufFile {
    path: PathBuf,
    map: Mmap,
    version: u32,
    metadata: BTreeMap<String, GgufValue>,
    tensors: Vec<GgufTensor>,
    data: usize,
}

impl GgufFile {
    /// Maps the file at `path` and reads its header; an error names the file and what is wrong.
    pub fn open(path: impl AsRef<Path>) -> Result<GgufFile> {
        let path = path.as_ref().to_path_buf();
        let file = File::open(&path).map_err(|e| io_error("load_gguf", &path, e))?;
        // SAFETY: the map is read-only and lives with `self` (as `SafetensorsFile`'s).
        let map = unsafe { Mmap::map(&file) }.map_err(|e| io_error("load_gguf", &path, e))?;
        let mut r = Reader { bytes: &map, at: 0 };
        let header = (|| -> std::result::Result<_, String> {
            if r.take(4)? != b"GGUF" {
                return Err("not a GGUF file (no magic)".into());
            }
            let version = r.u32()?;
            if !(2..=3).contains(&version) {
                return Err(format!("GGUF version {version} is not supported (2 and 3 are)"));
            }
            let (tensors, kvs) = (r.u64()?, r.u64()?);
            let mut metadata = BTreeMap::new();
            for _ in 0..kvs {
                let key = r.string()?;
                let ty = r.u32()?;
                let value = r.value(ty).map_err(|e| format!("metadata '{key}': {e}"))?;
                metadata.insert(key, value);
            }
            let mut infos = Vec::new();
            for _ in 0..tensors {
                let name = r.string()?;
                let dims = r.u32()?;
                if dims > 8 {
                    return Err(format!("tensor '{name}': {dims} dimensions"));
                }
                let mut shape = Vec::new();
                for _ in 0..dims {
                    let d = r.u64()?;
                    shape.push(i32::try_from(d).map_err(|_| format!("tensor '{name}': dimension {d} is too large"))?);
                }
                shape.reverse();
                let ggml_type = r.u32()?;
                let offset = r.u64()?;
                infos.push(GgufTensor { name, shape, ggml_type, offset });
            }
            let align = metadata.get("general.alignment").and_then(GgufValue::as_u64).unwrap_or(32).max(1) as usize;
            Ok((version, metadata, infos, r.at.next_multiple_of(align)))
        })();
        let (version, metadata, tensors, data) = header.map_err(|e| io_error("load_gguf", &path, e))?;
        Ok(GgufFile { path, map, version, metadata, tensors, data })
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The format's version (2 or 3).
    pub fn version(&self) -> u32 {
        self.version
    }

    /// The metadata, by key (`general.architecture`, `tokenizer.ggml.tokens`, ...).
    pub fn metadata(&self) -> &BTreeMap<String, GgufValue> {
        &self.metadata
    }

    /// The tensors' descriptions, in the file's order.
    pub fn tensors(&self) -> &[GgufTensor] {
        &self.tensors
    }

    /// Tensor `name`: F32, F16 and BF16 as they are, quantized types dequantized to float32.
    pub fn get(&self, name: &str) -> Result<Array> {
        let (t, src, n, block_bytes) = self.bytes(name)?;
        let array = match t.ggml_type {
            0 => Array::from_raw_bytes(src, t.shape.clone(), DType::F32),
            1 => Array::from_raw_bytes(src, t.shape.clone(), DType::F16),
            30 => Array::from_raw_bytes(src, t.shape.clone(), DType::BF16),
            ty => Array::from_slice(&dequantize(ty, src, n, block_bytes), t.shape.clone()),
        };
        match array.error() {
            Some(e) => Err(self.error(name, e)),
            None => Ok(array),
        }
    }

    /// Tensor `name`'s description, its bytes in the file (whole blocks of its type, inside
    /// the file), its element count and its type's bytes per block.
    fn bytes(&self, name: &str) -> Result<(&GgufTensor, &[u8], usize, usize)> {
        let t =
            self.tensors.iter().find(|t| t.name == name).ok_or_else(|| self.error(name, "no tensor of that name"))?;
        let &(_, _, block, block_bytes) = TYPES
            .iter()
            .find(|k| k.0 == t.ggml_type)
            .ok_or_else(|| self.error(name, format!("ggml type {} is not supported", t.ggml_type)))?;
        let n: usize = t.shape.iter().map(|&d| d.max(0) as usize).product();
        if !n.is_multiple_of(block) {
            return Err(self.error(name, format!("{n} elements are not whole blocks of {block}")));
        }
        let bytes = n / block * block_bytes;
        let start = usize::try_from(t.offset).ok().and_then(|o| o.checked_add(self.data));
        let src = start.and_then(|s| self.map.get(s..s.checked_add(bytes)?)).ok_or_else(|| {
            self.error(name, format!("its {bytes} bytes at offset {} run past the end of the file", t.offset))
        })?;
        Ok((t, src, n, block_bytes))
    }

    fn error(&self, name: &str, what: impl std::fmt::Display) -> nuvec_core::Error {
        io_error("load_gguf", &self.path, format!("tensor '{name}': {what}"))
    }

    /// Every tensor, by name.
    pub fn load_all(&self) -> Result<BTreeMap<String, Array>> {
        self.tensors.iter().map(|t| Ok((t.name.clone(), self.get(&t.name)?))).collect()
    }

    /// Tensor `name` kept quantized, in MLX's affine format (groups of 32, as
    /// `ops::dequantize(&w, &scales, Some(&biases), 32, bits, "affine", ..)` reads it), when its
    /// blocks are groups of 32 levels with a scale and an offset: Q4_0, Q4_1, Q4_K (4 bits),
    /// Q5_0, Q5_1, Q5_K (5 bits) and Q8_0 (8 bits); `None` for other types (Q6_K, Q2_K and
    /// Q3_K scale groups of 16).
    ///
    /// The levels are packed at the narrowest of `widths` that holds them, or at the type's
    /// own width when `widths` is empty or none does: a backend with fast products at some
    /// widths only reads wider levels of the same values. K-quants' scales and offsets
    /// (products of a block's float16 scale and a 6-bit one) are rounded to float16; so are
    /// those of a block whose float16 product overflows, which gives `None`.
    pub fn affine(&self, name: &str, widths: &[i32]) -> Result<Option<GgufAffine>> {
        let (t, src, n, block_bytes) = self.bytes(name)?;
        let Some(own) = affine_bits(t.ggml_type) else {
            return Ok(None);
        };
        let bits = widths.iter().copied().filter(|&b| b >= own && [4, 5, 6, 8].contains(&b)).min().unwrap_or(own);
        let Some((&cols, rows)) = t.shape.split_last() else {
            return Err(self.error(name, "a 0-d tensor is not blocks"));
        };
        if cols % 32 != 0 {
            return Err(self.error(name, format!("its last dimension {cols} is not whole blocks of 32")));
        }
        let mut levels = Vec::with_capacity(n);
        let (mut scales, mut biases) = (Vec::new(), Vec::new());
        for b in src.chunks_exact(block_bytes) {
            block_levels(t.ggml_type, b, &mut levels, &mut |s, o| {
                scales.push(f16::from_f32(s));
                biases.push(f16::from_f32(o));
            });
        }
        if scales.iter().chain(&biases).any(|v| !v.is_finite()) {
            return Ok(None);
        }
        let shape = |last: i32| rows.iter().copied().chain([last]).collect::<Vec<i32>>();
        Ok(Some(GgufAffine {
            w: Array::from_slice(&pack(&levels, bits), shape(cols * bits / 32)),
            scales: Array::from_slice(&scales, shape(cols / 32)),
            biases: Array::from_slice(&biases, shape(cols / 32)),
            bits,
        }))
    }
}

/// Bits of the levels of a ggml type whose blocks are groups of 32 with a scale and an offset.
fn affine_bits(ty: u32) -> Option<i32> {
    match ty {
        2 | 3 | 12 => Some(4),
        6 | 7 | 13 => Some(5),
        8 => Some(8),
        _ => None,
    }
}

/// One block of type `ty` (of [`affine_bits`]) as unsigned levels in element order, appended
/// to `levels`, and each group of 32's scale and offset (`x = level · scale + offset`), handed
/// to `group`.
fn block_levels(ty: u32, b: &[u8], levels: &mut Vec<u8>, group: &mut dyn FnMut(f32, f32)) {
    // Elements 0..16 of a 32-group of nibbles are the low halves, 16..32 the high ones.
    let nibbles = |q: &[u8], levels: &mut Vec<u8>| {
        levels.extend(q.iter().map(|&v| v & 0xF));
        levels.extend(q.iter().map(|&v| v >> 4));
    };
    // Q5_0/Q5_1: bit i of the 32-bit word `qh` is element i's fifth bit.
    let fifth = |qh: &[u8], levels: &mut Vec<u8>| {
        let qh = u32::from_le_bytes([qh[0], qh[1], qh[2], qh[3]]);
        let at = levels.len() - 32;
        for (i, l) in levels[at..].iter_mut().enumerate() {
            *l |= (((qh >> i) & 1) as u8) << 4;
        }
    };
    match ty {
        2 => {
            let d = half(b);
            group(d, -8.0 * d);
            nibbles(&b[2..18], levels);
        }
        3 => {
            group(half(b), half(&b[2..]));
            nibbles(&b[4..20], levels);
        }
        6 => {
            let d = half(b);
            group(d, -16.0 * d);
            nibbles(&b[6..22], levels);
            fifth(&b[2..6], levels);
        }
        7 => {
            group(half(b), half(&b[2..]));
            nibbles(&b[8..24], levels);
            fifth(&b[4..8], levels);
        }
        8 => {
            let d = half(b);
            group(d, -128.0 * d);
            levels.extend(b[2..34].iter().map(|&v| (v as i8 as i16 + 128) as u8));
        }
        // Q4_K/Q5_K: 8 groups of 32 with 6-bit scales and minimums (`x = d·s·q − dmin·m`);
        // runs of 32 bytes hold group 2r in their low nibbles and 2r + 1 in their high ones.
        12 | 13 => {
            let (d, dmin, sc) = (half(b), half(&b[2..]), &b[4..16]);
            let (qh, q) = if ty == 13 { (Some(&b[16..48]), &b[48..]) } else { (None, &b[16..]) };
            for (r, qs) in q.chunks_exact(32).enumerate() {
                for (half_, shift) in [(0, 0), (1, 4)] {
                    let (s, m) = scale_min(2 * r + half_, sc);
                    group(d * s, -dmin * m);
                    let high = |l: usize| qh.map_or(0, |h| ((h[l] >> (2 * r + half_)) & 1) << 4);
                    levels.extend(qs.iter().enumerate().map(|(l, &v)| ((v >> shift) & 0xF) | high(l)));
                }
            }
        }
        _ => unreachable!("block_levels of ggml type {ty}, which has no affine form"),
    }
}

/// `levels` packed as MLX packs them: one little-endian bit stream of `bits`-bit values,
/// element `j` at bit `bits · j`, read as 32-bit words.
fn pack(levels: &[u8], bits: i32) -> Vec<u32> {
    let mut words = Vec::with_capacity(levels.len() * bits as usize / 32);
    let (mut acc, mut filled) = (0u64, 0);
    for &l in levels {
        acc |= (l as u64) << filled;
        filled += bits;
        if filled >= 32 {
            words.push(acc as u32);
            acc >>= 32;
            filled -= 32;
        }
    }
    words
}

/// A GGUF tensor kept quantized in MLX's affine format: `w` (`uint32`, `[.., K * bits / 32]`),
/// `scales` and `biases` (`float16`, `[.., K / 32]`), groups of 32.
pub struct GgufAffine {
    /// The packed values.
    pub w: Array,
    /// Each group's scale.
    pub scales: Array,
    /// Each group's bias.
    pub biases: Array,
    /// Bits per value: 4, 5, 6 or 8.
    pub bits: i32,
}

/// Every tensor of the GGUF file at `path` (quantized ones dequantized to float32), and its
/// metadata.
pub fn load_gguf(path: impl AsRef<Path>) -> Result<(BTreeMap<String, Array>, BTreeMap<String, GgufValue>)> {
    let file = GgufFile::open(path)?;
    Ok((file.load_all()?, file.metadata.clone()))
}

/// Little-endian reads from the header, each failing at the end of the bytes.
struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl Reader<'_> {
    fn take(&mut self, n: usize) -> std::result::Result<&[u8], String> {
        let end = self.at.checked_add(n).filter(|&e| e <= self.bytes.len()).ok_or("truncated header")?;
        let out = &self.bytes[self.at..end];
        self.at = end;
        Ok(out)
    }
    fn array<const N: usize>(&mut self) -> std::result::Result<[u8; N], String> {
        let mut a = [0u8; N];
        a.copy_from_slice(self.take(N)?);
        Ok(a)
    }
    fn u32(&mut self) -> std::result::Result<u32, String> {
        Ok(u32::from_le_bytes(self.array()?))
    }
    fn u64(&mut self) -> std::result::Result<u64, String> {
        Ok(u64::from_le_bytes(self.array()?))
    }
    fn string(&mut self) -> std::result::Result<String, String> {
        let n = usize::try_from(self.u64()?).map_err(|_| "string too long")?;
        String::from_utf8(self.take(n)?.to_vec()).map_err(|_| "a string is not UTF-8".into())
    }
    fn value(&mut self, ty: u32) -> std::result::Result<GgufValue, String> {
        use GgufValue as V;
        Ok(match ty {
            0 => V::U8(self.array::<1>()?[0]),
            1 => V::I8(self.array::<1>()?[0] as i8),
            2 => V::U16(u16::from_le_bytes(self.array()?)),
            3 => V::I16(i16::from_le_bytes(self.array()?)),
            4 => V::U32(self.u32()?),
            5 => V::I32(i32::from_le_bytes(self.array()?)),
            6 => V::F32(f32::from_le_bytes(self.array()?)),
            7 => V::Bool(self.array::<1>()?[0] != 0),
            8 => V::String(self.string()?),
            9 => {
                let inner = self.u32()?;
                let n = self.u64()?;
                // Each element takes at least a byte: a count past the file is corrupt.
                if n > (self.bytes.len() - self.at) as u64 {
                    return Err(format!("an array of {n} values runs past the end of the file"));
                }
                (0..n).map(|_| self.value(inner)).collect::<std::result::Result<_, _>>().map(V::Array)?
            }
            10 => V::U64(self.u64()?),
            11 => V::I64(i64::from_le_bytes(self.array()?)),
            12 => V::F64(f64::from_le_bytes(self.array()?)),
            t => return Err(format!("value type {t} is not known")),
        })
    }
}

fn half(b: &[u8]) -> f32 {
    f16::from_le_bytes([b[0], b[1]]).to_f32()
}

/// Scale and minimum `j` (0..8) of a Q4_K/Q5_K block's 12 packed 6-bit pairs.
fn scale_min(j: usize, q: &[u8]) -> (f32, f32) {
    let (sc, m) = if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        ((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4), (q[j + 4] >> 4) | ((q[j] >> 6) << 4))
    };
    (sc as f32, m as f32)
}

/// Q3_K's 16 6-bit scales (before subtracting 32) from their 12 packed bytes: low nibbles
/// in bytes 0..8, high pairs in bytes 8..12.
fn q3k_scales(b: &[u8]) -> [u8; 16] {
    let word = |i: usize| u32::from_le_bytes([b[4 * i], b[4 * i + 1], b[4 * i + 2], b[4 * i + 3]]);
    let (a0, a1, hi) = (word(0), word(1), word(2));
    let (low, pair) = (0x0F0F_0F0Fu32, 0x0303_0303u32);
    let words = [
        (a0 & low) | ((hi & pair) << 4),
        (a1 & low) | (((hi >> 2) & pair) << 4),
        ((a0 >> 4) & low) | (((hi >> 4) & pair) << 4),
        ((a1 >> 4) & low) | (((hi >> 6) & pair) << 4),
    ];
    let mut out = [0; 16];
    for (o, w) in out.chunks_exact_mut(4).zip(words) {
        o.copy_from_slice(&w.to_le_bytes());
    }
    out
}

/// The `n` values of ggml blocks of type `ty` (a type of [`TYPES`] other than F32/F16/BF16),
/// `block_bytes` each, computed as ggml's reference dequantization computes them.
fn dequantize(ty: u32, src: &[u8], n: usize, block_bytes: usize) -> Vec<f32> {
    let mut out = Vec::with_capacity(n);
    if affine_bits(ty).is_some() {
        let (mut levels, mut groups) = (Vec::with_capacity(256), Vec::with_capacity(8));
        for b in src.chunks_exact(block_bytes) {
            levels.clear();
            groups.clear();
            block_levels(ty, b, &mut levels, &mut |s, o| groups.push((s, o)));
            for (&(s, o), l) in groups.iter().zip(levels.chunks_exact(32)) {
                out.extend(l.iter().map(|&v| v as f32 * s + o));
            }
        }
        return out;
    }
    match ty {
        // Q2_K: 16 scale/min nibble pairs, 64 bytes of 2-bit values, d, dmin; each 32-byte
        // half holds 4 shifts × 2 runs of 16.
        10 => src.chunks_exact(84).for_each(|b| {
            let (sc, q, d, dmin) = (&b[..16], &b[16..80], half(&b[80..]), half(&b[82..]));
            let mut is = 0;
            for q in q.chunks_exact(32) {
                for shift in [0, 2, 4, 6] {
                    for run in q.chunks_exact(16) {
                        let (dl, ml) = (d * (sc[is] & 0xF) as f32, dmin * (sc[is] >> 4) as f32);
                        is += 1;
                        out.extend(run.iter().map(|&v| dl * ((v >> shift) & 3) as f32 - ml));
                    }
                }
            }
        }),
        // Q3_K: 32 bytes of high bits, 64 of 2-bit values, 12 of packed 6-bit scales, d; the
        // value is (2 low bits) − 4 where its high bit is clear.
        11 => {
            src.chunks_exact(110).for_each(|b| {
                let (hm, q, d) = (&b[..32], &b[32..96], half(&b[108..]));
                let sc = q3k_scales(&b[96..108]);
                let (mut is, mut m) = (0, 1u8);
                for q in q.chunks_exact(32) {
                    for shift in [0, 2, 4, 6] {
                        for (run, hm) in q.chunks_exact(16).zip(hm.chunks_exact(16)) {
                            let dl = d * (sc[is] as i32 - 32) as f32;
                            is += 1;
                            out.extend(run.iter().zip(hm).map(|(&v, &h)| {
                                dl * (((v >> shift) & 3) as i32 - if h & m != 0 { 0 } else { 4 }) as f32
                            }));
                        }
                        m <<= 1;
                    }
                }
            })
        }
        // Q6_K: 128 bytes of low nibbles, 64 of high 2-bit pairs, 16 signed scales, d.
        14 => src.chunks_exact(210).for_each(|b| {
            let (ql, qh, sc, d) = (&b[..128], &b[128..192], &b[192..208], half(&b[208..]));
            for h in 0..2 {
                let (ql, qh, sc) = (&ql[64 * h..], &qh[32 * h..], &sc[8 * h..]);
                let mut y = [0.0f32; 128];
                for l in 0..32 {
                    let is = l / 16;
                    let q1 = ((ql[l] & 0xF) | ((qh[l] & 3) << 4)) as i32 - 32;
                    let q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) as i32 - 32;
                    let q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i32 - 32;
                    let q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) as i32 - 32;
                    y[l] = d * (sc[is] as i8) as f32 * q1 as f32;
                    y[l + 32] = d * (sc[is + 2] as i8) as f32 * q2 as f32;
                    y[l + 64] = d * (sc[is + 4] as i8) as f32 * q3 as f32;
                    y[l + 96] = d * (sc[is + 6] as i8) as f32 * q4 as f32;
                }
                out.extend_from_slice(&y);
            }
        }),
        // F32, F16 and BF16 are read as they are (`get`).
        _ => {}
    }
    out
}
