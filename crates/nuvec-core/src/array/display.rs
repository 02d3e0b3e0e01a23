//! `Display` and `Debug`: MLX's `array([...], dtype=...)` form.

use std::fmt;

use crate::array::Array;
use crate::dtype::{Complex64, DType, bf16, f16};

impl fmt::Debug for Array {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(e) = self.error() {
            return write!(f, "array(<failed: {e}>)");
        }
        if !self.is_evaluated() {
            return write!(f, "array(<lazy>, shape={:?}, dtype={})", self.shape(), self.dtype());
        }
        fmt::Display::fmt(self, f)
    }
}

impl fmt::Display for Array {
    /// Evaluates the array and prints its values.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let bytes = match self.to_bytes() {
            Ok(b) => b,
            Err(e) => return write!(f, "array(<failed: {e}>)"),
        };
        let items = format_items(&bytes, self.dtype());
        let mut s = String::new();
        nest(&mut s, self.shape(), &items);
        write!(f, "array({s}, dtype={})", self.dtype())
    }
}

fn format_items(bytes: &[u8], dtype: DType) -> Vec<String> {
    macro_rules! items {
        ($t:ty, $f:expr) => {
            bytemuck::pod_collect_to_vec::<u8, $t>(bytes).into_iter().map($f).collect()
        };
    }
    let float = |v: f64| {
        if v.is_finite() && v == v.trunc() && v.abs() < 1e16 { format!("{v:.0}.") } else { format!("{v}") }
    };
    match dtype {
        DType::Bool => bytes.iter().map(|&b| if b != 0 { "true".into() } else { "false".into() }).collect(),
        DType::U8 => items!(u8, |v| v.to_string()),
        DType::U16 => items!(u16, |v| v.to_string()),
        DType::U32 => items!(u32, |v| v.to_string()),
        DType::U64 => items!(u64, |v| v.to_string()),
        DType::I8 => items!(i8, |v| v.to_string()),
        DType::I16 => items!(i16, |v| v.to_string()),
        DType::I32 => items!(i32, |v| v.to_string()),
        DType::I64 => items!(i64, |v| v.to_string()),
        DType::F16 => items!(f16, |v| float(v.to_f64())),
        DType::BF16 => items!(bf16, |v| float(v.to_f64())),
        DType::F32 => items!(f32, |v| float(v as f64)),
        DType::F64 => items!(f64, float),
        DType::Complex64 => items!(Complex64, |v| format!("{}{:+}j", v.re, v.im)),
    }
}

fn nest(out: &mut String, shape: &[i32], items: &[String]) {
    match shape.split_first() {
        None => out.push_str(items.first().map(String::as_str).unwrap_or("")),
        Some((&n, rest)) => {
            let inner: usize = rest.iter().map(|&d| d as usize).product();
            out.push('[');
            for i in 0..n as usize {
                if i > 0 {
                    out.push_str(", ");
                }
                nest(out, rest, &items[i * inner..(i + 1) * inner]);
            }
            out.push(']');
        }
    }
}
