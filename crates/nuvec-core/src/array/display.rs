//! `Display` and `Debug`: MLX's `array([...], dtype=...)` form.
//!
//! The layout is MLX's (`mlx/utils.cpp`, as Python's `repr` shows it):
//!
//! ```text
//! array([1, 2.5, 3], dtype=float32)
//! array([[1, 2],
//!        [3, 4]], dtype=int32)
//! array([True, False], dtype=bool)
//! array(1.5, dtype=float32)
//! array([1+2j, -0.5-1.5j], dtype=complex64)
//! ```
//!
//! - **Numbers.** A float prints as C's `%g` with six significant digits, MLX's (C++ stream)
//!   default: `1` (no trailing `.`), `0.1`, `1e-08`, `1.5e+10`, `inf`, `-inf`, `nan`. Where six
//!   digits do not identify the value in the array's dtype, the precision grows until they do, so
//!   what prints is the dtype's own shortest round-trip digits (`float32` 1/3: `0.33333334`, where
//!   MLX prints `0.333333`; never `float64` digits). Six digits always identify a `float16` or
//!   `bfloat16` value, so those print exactly as MLX (`bfloat16` 0.1: `0.100098`). Complex numbers
//!   print as `re+imj` / `re-imj`, booleans as `True` / `False` (MLX's Python form).
//! - **Rows.** Each row of a 2-D or higher array stands on its own line, indented under the first
//!   `[`; higher dimensions stack their blocks the same way (MLX puts no blank line between them).
//! - **Columns.** In arrays of two or more dimensions every element is right-aligned to the widest
//!   printed element, as NumPy does; 1-D arrays and scalars are not padded (MLX never pads).
//! - **Summaries.** An array of more than 1000 elements shows 3 items at each edge of every axis
//!   longer than 6, with `...` in between (on its own line between rows), as NumPy does. (MLX
//!   summarises every axis longer than 6 whatever the size; NumPy's threshold keeps small arrays
//!   whole.)
//! - **Precision.** `{:.N}` prints floats with `N` fixed decimals, MLX's
//!   `set_printoptions(precision=N)`: `format!("{:.2}", a)` gives `array([0.10, 0.33], ...)`.
//!
//! `Display` evaluates the array; a failed array prints `array(<failed: error>)`. `Debug` never
//! evaluates: an evaluated array prints as `Display` with its shape added,
//! `array([[1, 2],\n       [3, 4]], shape=[2, 2], dtype=int32)` (NumPy 2 adds `shape=` too), and an
//! unevaluated one `array(<lazy>, shape=[2, 2], dtype=int32)`.

use std::fmt;

use crate::array::Array;
use crate::dtype::{DType, bf16, f16};

/// Arrays of more than this many elements are summarised (NumPy's `threshold`).
const THRESHOLD: usize = 1000;
/// Items shown at each edge of a summarised axis (NumPy's `edgeitems`, MLX's `num_print`).
const EDGE: usize = 3;

impl fmt::Debug for Array {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(e) = self.error() {
            return write!(f, "array(<failed: {e}>)");
        }
        if !self.is_evaluated() {
            return write!(f, "array(<lazy>, shape={:?}, dtype={})", self.shape(), self.dtype());
        }
        match self.to_bytes() {
            Ok(bytes) => f.write_str(&render(&bytes, self.shape(), self.dtype(), f.precision(), true)),
            Err(e) => write!(f, "array(<failed: {e}>)"),
        }
    }
}

impl fmt::Display for Array {
    /// Evaluates the array and prints its values.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.to_bytes() {
            Ok(bytes) => f.write_str(&render(&bytes, self.shape(), self.dtype(), f.precision(), false)),
            Err(e) => write!(f, "array(<failed: {e}>)"),
        }
    }
}

/// The whole `array(...)` text of row-major `bytes`.
fn render(bytes: &[u8], shape: &[i32], dtype: DType, precision: Option<usize>, with_shape: bool) -> String {
    let dims: Vec<usize> = shape.iter().map(|&d| d.max(0) as usize).collect();
    let summarise = dims.iter().product::<usize>() > THRESHOLD;
    let mut at = Vec::new();
    printed(&dims, summarise, 0, &mut at);
    let items: Vec<String> = at.iter().map(|&i| item(bytes, dtype, i, precision)).collect();
    let width = if dims.len() >= 2 { items.iter().map(String::len).max().unwrap_or(0) } else { 0 };
    let mut out = String::from("array(");
    if dims.is_empty() {
        out.push_str(items.first().map_or("", String::as_str));
    } else {
        nest(&mut out, &dims, 0, summarise, width, &mut items.iter());
    }
    if with_shape {
        out.push_str(&format!(", shape={shape:?}"));
    }
    out.push_str(&format!(", dtype={dtype})"));
    out
}

/// The positions shown along an axis of `n`: `None` stands for the `...` of a summary.
fn shown(n: usize, summarise: bool) -> Vec<Option<usize>> {
    if summarise && n > 2 * EDGE {
        (0..EDGE).map(Some).chain([None]).chain((n - EDGE..n).map(Some)).collect()
    } else {
        (0..n).map(Some).collect()
    }
}

/// The row-major indices of the printed elements, in print order.
fn printed(dims: &[usize], summarise: bool, base: usize, out: &mut Vec<usize>) {
    match dims.split_first() {
        None => out.push(base),
        Some((&n, rest)) => {
            let inner: usize = rest.iter().product();
            for i in shown(n, summarise).into_iter().flatten() {
                printed(rest, summarise, base + i * inner, out);
            }
        }
    }
}

/// Writes the brackets of `dims` (at least one dimension), taking the formatted elements in order.
fn nest<'a>(
    out: &mut String,
    dims: &[usize],
    depth: usize,
    summarise: bool,
    width: usize,
    items: &mut impl Iterator<Item = &'a String>,
) {
    let (&n, rest) = dims.split_first().expect("nest needs a dimension");
    out.push('[');
    for (k, pos) in shown(n, summarise).into_iter().enumerate() {
        if k > 0 {
            if rest.is_empty() {
                out.push_str(", ");
            } else {
                out.push_str(",\n");
                // Under this level's '[': "array(" and one '[' per enclosing level.
                out.push_str(&" ".repeat(7 + depth));
            }
        }
        match pos {
            None => out.push_str("..."),
            Some(_) if rest.is_empty() => {
                let s = items.next().map_or("", String::as_str);
                out.push_str(&" ".repeat(width.saturating_sub(s.len())));
                out.push_str(s);
            }
            Some(_) => nest(out, rest, depth + 1, summarise, width, items),
        }
    }
    out.push(']');
}

/// Element `i` of row-major `bytes`, formatted.
fn item(bytes: &[u8], dtype: DType, i: usize, precision: Option<usize>) -> String {
    let size = dtype.size();
    let b = &bytes[i * size..(i + 1) * size];
    macro_rules! int {
        ($t:ty) => {
            <$t>::from_ne_bytes(b.try_into().expect("element bytes")).to_string()
        };
    }
    let real = |b: &[u8], kind: Real| {
        let v = match kind {
            Real::F16 => f16::from_ne_bytes(b.try_into().expect("element bytes")).to_f64(),
            Real::BF16 => bf16::from_ne_bytes(b.try_into().expect("element bytes")).to_f64(),
            Real::F32 => f32::from_ne_bytes(b.try_into().expect("element bytes")) as f64,
            Real::F64 => f64::from_ne_bytes(b.try_into().expect("element bytes")),
        };
        float(v, kind, precision)
    };
    match dtype {
        DType::Bool => (if b[0] != 0 { "True" } else { "False" }).to_string(),
        DType::U8 => int!(u8),
        DType::U16 => int!(u16),
        DType::U32 => int!(u32),
        DType::U64 => int!(u64),
        DType::I8 => int!(i8),
        DType::I16 => int!(i16),
        DType::I32 => int!(i32),
        DType::I64 => int!(i64),
        DType::F16 => real(b, Real::F16),
        DType::BF16 => real(b, Real::BF16),
        DType::F32 => real(b, Real::F32),
        DType::F64 => real(b, Real::F64),
        DType::Complex64 => {
            let (re, im) = b.split_at(4);
            let im_v = f32::from_ne_bytes(im.try_into().expect("element bytes"));
            // MLX writes `+` for a non-negative or NaN imaginary part, else `-` and its magnitude
            // (MLX's `-0.0 >= 0` gives `+-0j`; here the sign bit decides: `-0j`).
            if im_v.is_sign_negative() && !im_v.is_nan() {
                format!("{}-{}j", real(re, Real::F32), float(-(im_v as f64), Real::F32, precision))
            } else {
                format!("{}+{}j", real(re, Real::F32), real(im, Real::F32))
            }
        }
    }
}

/// The real floating-point types, for their round-trip precision.
#[derive(Clone, Copy)]
enum Real {
    F16,
    BF16,
    F32,
    F64,
}

/// A float as MLX prints it: `%g` with 6 significant digits, more where the dtype needs them to
/// read back the same value; with a precision, fixed decimals.
fn float(v: f64, kind: Real, precision: Option<usize>) -> String {
    if v.is_nan() {
        return "nan".into();
    }
    if v.is_infinite() {
        return (if v > 0.0 { "inf" } else { "-inf" }).into();
    }
    if let Some(p) = precision {
        return format!("{v:.p$}");
    }
    // Six digits identify every f16/bf16 value (they need at most 5 and 4); f32 needs at most
    // 9, f64 17.
    let most = match kind {
        Real::F16 | Real::BF16 => 6,
        Real::F32 => 9,
        Real::F64 => 17,
    };
    for digits in 6..most {
        let s = general(v, digits);
        let same = match kind {
            Real::F32 => s.parse::<f32>().is_ok_and(|x| x.to_bits() == (v as f32).to_bits()),
            _ => s.parse::<f64>().is_ok_and(|x| x.to_bits() == v.to_bits()),
        };
        if same {
            return s;
        }
    }
    general(v, most)
}

/// C's `%.{digits}g` of a finite `v`: `digits` significant digits, scientific notation (two-digit
/// exponent at least) when the exponent is below -4 or at least `digits`, trailing zeros dropped.
fn general(v: f64, digits: usize) -> String {
    // Rust's `{:.Ne}` rounds the exact value to nearest, ties to even, as C's printf does.
    let e = format!("{:.*e}", digits - 1, v);
    let (mantissa, exp) = e.split_once('e').expect("`{:e}` has an exponent");
    let exp: i32 = exp.parse().expect("`{:e}` exponent");
    let (sign, mantissa) = mantissa.strip_prefix('-').map_or(("", mantissa), |m| ("-", m));
    let ds: String = mantissa.chars().filter(|&c| c != '.').collect();
    let point = |int: &str, frac: &str| {
        let frac = frac.trim_end_matches('0');
        if frac.is_empty() { format!("{sign}{int}") } else { format!("{sign}{int}.{frac}") }
    };
    if exp < -4 || exp >= digits as i32 {
        let (head, tail) = ds.split_at(1);
        format!("{}e{}{:02}", point(head, tail), if exp < 0 { '-' } else { '+' }, exp.unsigned_abs())
    } else if exp >= 0 {
        let (int, frac) = ds.split_at(exp as usize + 1);
        point(int, frac)
    } else {
        point("0", &format!("{}{ds}", "0".repeat((-exp - 1) as usize)))
    }
}
