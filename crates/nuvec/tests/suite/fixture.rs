//! Reader of the golden fixture files recorded from MLX by `scripts/mlx_fixtures.py`, a minimal
//! JSON parser for their metadata and parameters, and the element comparator.
//!
//! File format (all integers little-endian):
//!
//! ```text
//! magic       8 bytes  b"NVFIX001"
//! meta_len    u32, then meta_len bytes of UTF-8 JSON ({"mlx_version", "device", "date", "seed", ...})
//! case_count  u32
//! case_count times:
//!     name    u16 length + UTF-8      unique, "<op>/<dtype>/<tag>"
//!     op      u16 length + UTF-8      the MLX function name
//!     params  u32 length + UTF-8 JSON object
//!     n_in    u8, then n_in tensors   (stored contiguous; layouts are applied by the replayer)
//!     n_out   u8, then n_out tensors
//! tensor:
//!     dtype   u8    DType order: bool=0 uint8 uint16 uint32 uint64 int8 int16 int32 int64
//!                   float16 bfloat16 float32 float64 complex64=13
//!     ndim    u8
//!     dims    ndim x u64
//!     data    raw little-endian row-major bytes (bool: one byte, 0 or 1)
//! ```

use std::fmt;

use nuvec::{Array, DType, bf16, f16};

// Tensors are stored little-endian and handed to nuvec as native-endian bytes.
const _: () = assert!(cfg!(target_endian = "little"), "the fixture reader assumes a little-endian host");

/// The magic bytes that open a fixture file.
pub const MAGIC: &[u8; 8] = b"NVFIX001";

/// A tensor as stored: dtype, shape and row-major little-endian bytes.
#[derive(Clone, Debug)]
pub struct Tensor {
    /// Element type.
    pub dtype: DType,
    /// Shape.
    pub shape: Vec<i32>,
    /// Row-major little-endian bytes (`bool`: one byte per element).
    pub bytes: Vec<u8>,
}

impl Tensor {
    /// Number of elements.
    pub fn size(&self) -> usize {
        self.shape.iter().map(|&d| d as usize).product()
    }

    /// The tensor as an evaluated nuvec array.
    pub fn to_array(&self) -> Array {
        Array::from_raw_bytes(&self.bytes, &self.shape[..], self.dtype)
    }

    /// The elements as `f64` (complex: real and imaginary parts interleaved).
    pub fn to_f64(&self) -> Vec<f64> {
        decode_f64(self.dtype, &self.bytes)
    }
}

/// One recorded call.
#[derive(Clone, Debug)]
pub struct Case {
    /// Unique name, `<op>/<dtype>/<tag>`.
    pub name: String,
    /// MLX function name.
    pub op: String,
    /// Parameters (a JSON object).
    pub params: Json,
    /// The parameters as recorded, for messages.
    pub params_text: String,
    /// Inputs, contiguous.
    pub inputs: Vec<Tensor>,
    /// MLX's outputs.
    pub outputs: Vec<Tensor>,
}

/// A parsed fixture file.
#[derive(Debug)]
pub struct Fixture {
    /// The metadata object.
    pub meta: Json,
    /// The cases, in file order.
    pub cases: Vec<Case>,
}

struct Cursor<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
        let end = self.at.checked_add(n).filter(|&e| e <= self.bytes.len());
        let end = end.ok_or_else(|| format!("truncated file: {n} bytes wanted at offset {}", self.at))?;
        let s = &self.bytes[self.at..end];
        self.at = end;
        Ok(s)
    }
    fn u8(&mut self) -> Result<u8, String> {
        Ok(self.take(1)?[0])
    }
    fn u16(&mut self) -> Result<u16, String> {
        Ok(u16::from_le_bytes(self.take(2)?.try_into().unwrap()))
    }
    fn u32(&mut self) -> Result<u32, String> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().unwrap()))
    }
    fn u64(&mut self) -> Result<u64, String> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().unwrap()))
    }
    fn string(&mut self, len: usize) -> Result<String, String> {
        String::from_utf8(self.take(len)?.to_vec()).map_err(|e| format!("bad UTF-8 at offset {}: {e}", self.at))
    }
    fn tensor(&mut self) -> Result<Tensor, String> {
        let code = self.u8()?;
        let dtype = DType::from_code(code).ok_or_else(|| format!("unknown dtype code {code}"))?;
        let ndim = self.u8()? as usize;
        let mut shape = Vec::with_capacity(ndim);
        for _ in 0..ndim {
            let d = self.u64()?;
            shape.push(i32::try_from(d).map_err(|_| format!("dimension {d} does not fit i32"))?);
        }
        let n: usize = shape.iter().map(|&d| d as usize).product();
        let bytes = self.take(n * dtype.size())?.to_vec();
        Ok(Tensor { dtype, shape, bytes })
    }
    fn tensors(&mut self) -> Result<Vec<Tensor>, String> {
        let n = self.u8()?;
        (0..n).map(|_| self.tensor()).collect()
    }
}

impl Fixture {
    /// Parses a fixture file.
    pub fn parse(bytes: &[u8]) -> Result<Fixture, String> {
        let mut c = Cursor { bytes, at: 0 };
        if c.take(8)? != MAGIC {
            return Err("not a fixture file (bad magic)".into());
        }
        let meta_len = c.u32()? as usize;
        let meta = Json::parse(&c.string(meta_len)?)?;
        let count = c.u32()? as usize;
        let mut cases = Vec::with_capacity(count);
        for _ in 0..count {
            let name_len = c.u16()? as usize;
            let name = c.string(name_len)?;
            let op_len = c.u16()? as usize;
            let op = c.string(op_len)?;
            let params_len = c.u32()? as usize;
            let params_text = c.string(params_len)?;
            let params = Json::parse(&params_text).map_err(|e| format!("{name}: params: {e}"))?;
            let inputs = c.tensors()?;
            let outputs = c.tensors()?;
            cases.push(Case { name, op, params, params_text, inputs, outputs });
        }
        if c.at != bytes.len() {
            return Err(format!("{} trailing bytes after the last case", bytes.len() - c.at));
        }
        Ok(Fixture { meta, cases })
    }
}

/// A JSON value. Numbers keep whether they were written as integers (`1`) or floats (`1.0`),
/// since that decides a weak scalar's kind.
#[derive(Clone, Debug, PartialEq)]
pub enum Json {
    /// `null`.
    Null,
    /// `true` / `false`.
    Bool(bool),
    /// A number without fraction or exponent.
    Int(i64),
    /// A number with a fraction or an exponent.
    Float(f64),
    /// A string.
    Str(String),
    /// An array.
    Arr(Vec<Json>),
    /// An object, in source order.
    Obj(Vec<(String, Json)>),
}

impl Json {
    /// Parses a complete JSON text.
    pub fn parse(text: &str) -> Result<Json, String> {
        let mut p = JsonParser { s: text.as_bytes(), at: 0 };
        let v = p.value()?;
        p.ws();
        if p.at != p.s.len() {
            return Err(format!("trailing characters at {} in {text}", p.at));
        }
        Ok(v)
    }

    /// The member `key` of an object (`None` when absent or not an object).
    pub fn get(&self, key: &str) -> Option<&Json> {
        match self {
            Json::Obj(members) => members.iter().find(|(k, _)| k == key).map(|(_, v)| v),
            _ => None,
        }
    }

    /// Whether this is `null`.
    pub fn is_null(&self) -> bool {
        matches!(self, Json::Null)
    }

    /// The value as an integer.
    pub fn as_i64(&self) -> Option<i64> {
        match *self {
            Json::Int(v) => Some(v),
            _ => None,
        }
    }

    /// The value as a number (integers convert).
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            Json::Int(v) => Some(v as f64),
            Json::Float(v) => Some(v),
            _ => None,
        }
    }

    /// The value as a boolean.
    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            Json::Bool(b) => Some(b),
            _ => None,
        }
    }

    /// The value as a string.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Json::Str(s) => Some(s),
            _ => None,
        }
    }

    /// The value as an array.
    pub fn as_array(&self) -> Option<&[Json]> {
        match self {
            Json::Arr(v) => Some(v),
            _ => None,
        }
    }

    /// The value as a list of `i32`.
    pub fn as_i32_vec(&self) -> Option<Vec<i32>> {
        self.as_array()?.iter().map(|v| v.as_i64().and_then(|i| i32::try_from(i).ok())).collect()
    }
}

impl fmt::Display for Json {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Json::Null => f.write_str("null"),
            Json::Bool(b) => write!(f, "{b}"),
            Json::Int(v) => write!(f, "{v}"),
            Json::Float(v) => write!(f, "{v:?}"),
            Json::Str(s) => write!(f, "{s:?}"),
            Json::Arr(items) => {
                f.write_str("[")?;
                for (i, v) in items.iter().enumerate() {
                    if i > 0 {
                        f.write_str(",")?;
                    }
                    write!(f, "{v}")?;
                }
                f.write_str("]")
            }
            Json::Obj(members) => {
                f.write_str("{")?;
                for (i, (k, v)) in members.iter().enumerate() {
                    if i > 0 {
                        f.write_str(",")?;
                    }
                    write!(f, "{k:?}:{v}")?;
                }
                f.write_str("}")
            }
        }
    }
}

struct JsonParser<'a> {
    s: &'a [u8],
    at: usize,
}

impl JsonParser<'_> {
    fn ws(&mut self) {
        while self.at < self.s.len() && self.s[self.at].is_ascii_whitespace() {
            self.at += 1;
        }
    }

    fn peek(&mut self) -> Option<u8> {
        self.ws();
        self.s.get(self.at).copied()
    }

    fn expect(&mut self, c: u8) -> Result<(), String> {
        if self.peek() == Some(c) {
            self.at += 1;
            Ok(())
        } else {
            Err(format!("expected '{}' at {}", c as char, self.at))
        }
    }

    fn literal(&mut self, word: &str, v: Json) -> Result<Json, String> {
        if self.s[self.at..].starts_with(word.as_bytes()) {
            self.at += word.len();
            Ok(v)
        } else {
            Err(format!("bad literal at {}", self.at))
        }
    }

    fn value(&mut self) -> Result<Json, String> {
        match self.peek().ok_or("unexpected end of JSON")? {
            b'n' => self.literal("null", Json::Null),
            b't' => self.literal("true", Json::Bool(true)),
            b'f' => self.literal("false", Json::Bool(false)),
            b'"' => self.string().map(Json::Str),
            b'[' => {
                self.at += 1;
                let mut items = Vec::new();
                if self.peek() == Some(b']') {
                    self.at += 1;
                    return Ok(Json::Arr(items));
                }
                loop {
                    items.push(self.value()?);
                    match self.peek() {
                        Some(b',') => self.at += 1,
                        Some(b']') => {
                            self.at += 1;
                            return Ok(Json::Arr(items));
                        }
                        _ => return Err(format!("expected ',' or ']' at {}", self.at)),
                    }
                }
            }
            b'{' => {
                self.at += 1;
                let mut members = Vec::new();
                if self.peek() == Some(b'}') {
                    self.at += 1;
                    return Ok(Json::Obj(members));
                }
                loop {
                    self.ws();
                    let key = self.string()?;
                    self.expect(b':')?;
                    members.push((key, self.value()?));
                    match self.peek() {
                        Some(b',') => self.at += 1,
                        Some(b'}') => {
                            self.at += 1;
                            return Ok(Json::Obj(members));
                        }
                        _ => return Err(format!("expected ',' or '}}' at {}", self.at)),
                    }
                }
            }
            _ => self.number(),
        }
    }

    fn string(&mut self) -> Result<String, String> {
        self.expect(b'"')?;
        let mut out = String::new();
        loop {
            let c = *self.s.get(self.at).ok_or("unterminated string")?;
            self.at += 1;
            match c {
                b'"' => return Ok(out),
                b'\\' => {
                    let e = *self.s.get(self.at).ok_or("unterminated escape")?;
                    self.at += 1;
                    match e {
                        b'"' | b'\\' | b'/' => out.push(e as char),
                        b'n' => out.push('\n'),
                        b't' => out.push('\t'),
                        b'r' => out.push('\r'),
                        b'b' => out.push('\u{8}'),
                        b'f' => out.push('\u{c}'),
                        b'u' => {
                            let hex = std::str::from_utf8(self.s.get(self.at..self.at + 4).ok_or("short \\u escape")?)
                                .map_err(|e| e.to_string())?;
                            let code = u32::from_str_radix(hex, 16).map_err(|e| e.to_string())?;
                            self.at += 4;
                            out.push(char::from_u32(code).unwrap_or('\u{fffd}'));
                        }
                        _ => return Err(format!("bad escape at {}", self.at)),
                    }
                }
                _ => {
                    // Copy a whole UTF-8 sequence.
                    let start = self.at - 1;
                    let mut end = self.at;
                    while end < self.s.len() && (self.s[end] & 0xC0) == 0x80 {
                        end += 1;
                    }
                    out.push_str(std::str::from_utf8(&self.s[start..end]).map_err(|e| e.to_string())?);
                    self.at = end;
                }
            }
        }
    }

    fn number(&mut self) -> Result<Json, String> {
        let start = self.at;
        while self.at < self.s.len() && matches!(self.s[self.at], b'-' | b'+' | b'.' | b'e' | b'E' | b'0'..=b'9') {
            self.at += 1;
        }
        let text = std::str::from_utf8(&self.s[start..self.at]).map_err(|e| e.to_string())?;
        if text.is_empty() {
            return Err(format!("unexpected character at {start}"));
        }
        if text.contains(['.', 'e', 'E']) {
            text.parse().map(Json::Float).map_err(|e| format!("bad number {text}: {e}"))
        } else {
            text.parse().map(Json::Int).map_err(|e| format!("bad number {text}: {e}"))
        }
    }
}

/// Elements of `bytes` (little-endian, `dtype`) as `f64`; complex numbers give two values each.
pub fn decode_f64(dtype: DType, bytes: &[u8]) -> Vec<f64> {
    fn each<const N: usize>(bytes: &[u8], f: impl Fn([u8; N]) -> f64) -> Vec<f64> {
        bytes.chunks_exact(N).map(|c| f(c.try_into().unwrap())).collect()
    }
    match dtype {
        DType::Bool => bytes.iter().map(|&b| (b != 0) as u8 as f64).collect(),
        DType::U8 => each(bytes, |b: [u8; 1]| b[0] as f64),
        DType::U16 => each(bytes, |b| u16::from_le_bytes(b) as f64),
        DType::U32 => each(bytes, |b| u32::from_le_bytes(b) as f64),
        DType::U64 => each(bytes, |b| u64::from_le_bytes(b) as f64),
        DType::I8 => each(bytes, |b: [u8; 1]| b[0] as i8 as f64),
        DType::I16 => each(bytes, |b| i16::from_le_bytes(b) as f64),
        DType::I32 => each(bytes, |b| i32::from_le_bytes(b) as f64),
        DType::I64 => each(bytes, |b| i64::from_le_bytes(b) as f64),
        DType::F16 => each(bytes, |b| f16::from_le_bytes(b).to_f64()),
        DType::BF16 => each(bytes, |b| bf16::from_le_bytes(b).to_f64()),
        DType::F32 | DType::Complex64 => each(bytes, |b| f32::from_le_bytes(b) as f64),
        DType::F64 => each(bytes, f64::from_le_bytes),
        other => panic!("no decoder for {other}"),
    }
}

/// Elements of an integer or boolean buffer, exactly.
fn decode_exact(dtype: DType, bytes: &[u8]) -> Vec<i128> {
    let n = dtype.size();
    bytes
        .chunks_exact(n)
        .map(|c| match dtype {
            DType::Bool => (c[0] != 0) as i128,
            DType::U8 | DType::U16 | DType::U32 | DType::U64 => {
                let mut b = [0u8; 16];
                b[..n].copy_from_slice(c);
                u128::from_le_bytes(b) as i128
            }
            _ => {
                // Sign-extend.
                let fill = if c[n - 1] & 0x80 != 0 { 0xFF } else { 0 };
                let mut b = [fill; 16];
                b[..n].copy_from_slice(c);
                i128::from_le_bytes(b)
            }
        })
        .collect()
}

/// How close floating-point results must be: `|got − want| <= atol + rtol·|want|`. NaN must
/// meet NaN and an infinity the same infinity. `bitwise` asks for identical bytes instead.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Tolerance {
    /// Relative tolerance.
    pub rtol: f64,
    /// Absolute tolerance.
    pub atol: f64,
    /// Compare the raw bytes (for bit casts, where NaN payloads matter too).
    pub bitwise: bool,
}

impl Tolerance {
    /// Values must be equal (NaN equals NaN).
    pub const EXACT: Tolerance = Tolerance::close(0.0, 0.0);
    /// Bytes must be identical.
    pub const BITWISE: Tolerance = Tolerance { rtol: 0.0, atol: 0.0, bitwise: true };

    /// `|got − want| <= atol + rtol·|want|`.
    pub const fn close(rtol: f64, atol: f64) -> Tolerance {
        Tolerance { rtol, atol, bitwise: false }
    }
}

/// Where and by how much an output differs from MLX's.
#[derive(Clone, Debug)]
pub struct Mismatch {
    /// What differs, in words.
    pub what: String,
    /// Largest absolute error over the elements (infinite for NaN or infinity mismatches).
    pub max_err: f64,
    /// Flat row-major index of the first mismatching element (for complex: of the element).
    pub first_index: Option<usize>,
    /// Number of mismatching elements.
    pub count: usize,
}

impl fmt::Display for Mismatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.what)?;
        if let Some(i) = self.first_index {
            write!(f, " [{} element(s) differ, max err {:.3e}, first at flat index {i}]", self.count, self.max_err)?;
        }
        Ok(())
    }
}

/// Compares nuvec's output (dtype, shape and row-major bytes) with MLX's.
pub fn compare(want: &Tensor, dtype: DType, shape: &[i32], bytes: &[u8], tol: Tolerance) -> Result<(), Mismatch> {
    let mismatch = |what: String| Mismatch { what, max_err: f64::INFINITY, first_index: None, count: 0 };
    if dtype != want.dtype {
        return Err(mismatch(format!("dtype: MLX {}, nuvec {dtype}", want.dtype)));
    }
    if shape != want.shape.as_slice() {
        return Err(mismatch(format!("shape: MLX {:?}, nuvec {shape:?}", want.shape)));
    }
    if bytes.len() != want.bytes.len() {
        return Err(mismatch(format!("byte count: MLX {}, nuvec {}", want.bytes.len(), bytes.len())));
    }
    let per_elem = if dtype == DType::Complex64 { 2 } else { 1 };
    let mut first = None;
    let mut first_pair = (String::new(), String::new());
    let mut count = 0;
    let mut max_err = 0.0f64;
    let mut note = |i: usize, err: f64, w: String, g: String| {
        count += 1;
        max_err = max_err.max(err);
        if first.is_none() {
            first = Some(i);
            first_pair = (w, g);
        }
    };
    if tol.bitwise {
        let n = dtype.size();
        for (i, (w, g)) in want.bytes.chunks_exact(n).zip(bytes.chunks_exact(n)).enumerate() {
            if w != g {
                note(i, f64::INFINITY, format!("{w:02x?}"), format!("{g:02x?}"));
            }
        }
    } else if !dtype.is_inexact() {
        let (w, g) = (decode_exact(dtype, &want.bytes), decode_exact(dtype, bytes));
        for (i, (&w, &g)) in w.iter().zip(&g).enumerate() {
            if w != g {
                note(i, (w - g).unsigned_abs() as f64, w.to_string(), g.to_string());
            }
        }
    } else {
        let (w, g) = (decode_f64(dtype, &want.bytes), decode_f64(dtype, bytes));
        for (i, (&w, &g)) in w.iter().zip(&g).enumerate() {
            let ok = if w.is_nan() || g.is_nan() {
                w.is_nan() && g.is_nan()
            } else if w.is_infinite() || g.is_infinite() {
                w == g
            } else {
                (g - w).abs() <= tol.atol + tol.rtol * w.abs()
            };
            if !ok {
                let err = if w.is_finite() && g.is_finite() { (g - w).abs() } else { f64::INFINITY };
                note(i / per_elem, err, format!("{w:?}"), format!("{g:?}"));
            }
        }
    }
    match first {
        None => Ok(()),
        Some(i) => Err(Mismatch {
            what: format!("values (MLX {}, nuvec {} at the first mismatch)", first_pair.0, first_pair.1),
            max_err,
            first_index: Some(i),
            count,
        }),
    }
}
