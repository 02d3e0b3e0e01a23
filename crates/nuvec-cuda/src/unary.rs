//! Unary maps (`kernels/unary.cuh`): a contiguous vectorised kernel and a strided one per op
//! and input dtype.

use std::sync::Arc;

use nuvec_core::DType;
use nuvec_core::Result;
use nuvec_core::primitive::UnaryOp;
use nuvec_core::storage::{Operand, Output};

use crate::driver::Gpu;
use crate::kernels::{Family, Source, ctype};
use crate::launch::{Arg, Dims};
use crate::operand::{Cost, aligned, alloc_out, dense, dense_output, kernel, launch_1d, launch_map, ptr_of};

/// The functor implementing a unary op on `d`, or `None` when no kernel covers it.
pub fn functor(op: UnaryOp, d: DType) -> Option<&'static str> {
    use UnaryOp::*;
    if op == LogicalNot {
        return Some("Un_logical_not");
    }
    if d == DType::Complex64 {
        return Some(match op {
            Abs => "Un_cabs",
            Negative => "Un_cnegative",
            Square => "Un_csquare",
            Conjugate => "Un_cconjugate",
            Exp => "Un_cexp",
            Log => "Un_clog",
            Sqrt => "Un_csqrt",
            Reciprocal => "Un_creciprocal",
            Sign => "Un_csign",
            _ => return None,
        });
    }
    if d.is_float() {
        return Some(match op {
            Abs => "Un_fabs",
            Sign => "Un_fsign",
            Negative => "Un_fnegative",
            Square => "Un_fsquare",
            Floor => "Un_floor",
            Ceil => "Un_ceil",
            Round => "Un_round",
            Exp => "Un_exp",
            Expm1 => "Un_expm1",
            Log => "Un_log",
            Log1p => "Un_log1p",
            Log2 => "Un_log2",
            Log10 => "Un_log10",
            Sqrt => "Un_sqrt",
            Rsqrt => "Un_rsqrt",
            Reciprocal => "Un_reciprocal",
            Sin => "Un_sin",
            Cos => "Un_cos",
            Tan => "Un_tan",
            ArcSin => "Un_arcsin",
            ArcCos => "Un_arccos",
            ArcTan => "Un_arctan",
            Sinh => "Un_sinh",
            Cosh => "Un_cosh",
            Tanh => "Un_tanh",
            ArcSinh => "Un_arcsinh",
            ArcCosh => "Un_arccosh",
            ArcTanh => "Un_arctanh",
            Sigmoid => "Un_sigmoid",
            Erf => "Un_erf",
            ErfInv => "Un_erfinv",
            _ => return None,
        });
    }
    Some(match op {
        Abs => "Un_abs",
        Sign => "Un_sign",
        Negative => "Un_negative",
        Square => "Un_square",
        BitwiseInvert => "Un_bitwise_invert",
        _ => return None,
    })
}

/// The module of input dtype `d`: `unary_{op}_c` and `unary_{op}_s` for each op it covers.
pub(crate) fn source(d: DType) -> String {
    let mut s = Source::new(&["unary.cuh"]);
    let t = ctype(d);
    for op in UnaryOp::ALL {
        let Some(f) = functor(op, d) else { continue };
        let (n, u) = (op.name(), ctype(op.output_dtype(d)));
        s.map_kernel(
            cost(op, d) == Cost::Light,
            format!("unary_{n}_c(const {t}* x, {u}* out, u64 n) {{ unary_contig<{t}, {u}>(x, out, n, {f}()); }}"),
        );
        s.kernel(format!(
            "unary_{n}_s(const {t}* x, {u}* out, u64 n, Dims d) {{ unary_strided<{t}, {u}>(x, out, n, d, {f}()); }}"
        ));
    }
    s.finish()
}

/// How the contiguous map of `op` on `d` is launched: compute-bound maps (half-precision
/// transcendental functions, float32's inverse hyperbolic ones) run faster capped.
pub(crate) fn cost(op: UnaryOp, d: DType) -> Cost {
    use UnaryOp::*;
    match op {
        Abs | Sign | Negative | Square | Floor | Ceil | Round | Sqrt | Rsqrt | Reciprocal | Exp | Sigmoid
        | LogicalNot | BitwiseInvert | Conjugate => Cost::Light,
        ArcSinh | ArcCosh | ArcTanh => Cost::Heavy,
        _ if d == DType::F32 => Cost::Light,
        _ => Cost::Heavy,
    }
}

pub(crate) fn unary(gpu: &Arc<Gpu>, op: UnaryOp, x: Operand, out: &mut Output) -> Result<()> {
    let cost = cost(op, x.dtype);
    map(gpu, Family::Unary(x.dtype), &format!("unary_{}", op.name()), x, out, cost)
}

/// Elements per thread of a contiguous one-operand map from `x` to `out` (map.cuh's
/// `contig_elems`): a 16-byte vector of the input, at most 32 bytes of results.
fn contig_elems(x: DType, out: DType) -> u64 {
    (16 / x.size()).clamp(1, (32 / out.size()).max(1)) as u64
}

/// Runs the one-operand map `{name}_c` (dense, aligned: 16-byte vectors, writing into a donated
/// input where it can) or `{name}_s` (strided) of `family`.
pub(crate) fn map(gpu: &Arc<Gpu>, family: Family, name: &str, x: Operand, out: &mut Output, cost: Cost) -> Result<()> {
    let n = out.size() as u64;
    if n == 0 {
        alloc_out(gpu, out)?;
        return Ok(());
    }
    let xp = ptr_of(&x)?;
    if dense(&x) {
        let op = dense_output(gpu, &x, out)?;
        if aligned(&[xp, op]) {
            let f = kernel(gpu, family, &format!("{name}_c"))?;
            let per = contig_elems(x.dtype, out.dtype);
            return launch_map(gpu, f, n, per, cost, vec![Arg::Ptr(xp), Arg::Ptr(op), Arg::U64(n)]);
        }
        let d = Dims::flat(n, &[1]);
        let f = kernel(gpu, family, &format!("{name}_s"))?;
        return launch_1d(gpu, f, n, 1, vec![Arg::Ptr(xp), Arg::Ptr(op), Arg::U64(n), Arg::Dims(Box::new(d))]);
    }
    let op = alloc_out(gpu, out)?;
    let d = Dims::new(&x.shape, &[&x.data.layout.strides])?;
    let f = kernel(gpu, family, &format!("{name}_s"))?;
    launch_1d(gpu, f, n, 1, vec![Arg::Ptr(xp), Arg::Ptr(op), Arg::U64(n), Arg::Dims(Box::new(d))])
}
