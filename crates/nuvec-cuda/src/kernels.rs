//! The kernel modules: one generated source per (family, dtype), each a list of `extern "C"`
//! wrappers instantiating the templates of `kernels/*.cuh`. A module compiles once per device
//! architecture (and is cached on disk); [`all_modules`] lists every one, for the compile check
//! and for warming a cache.

use nuvec_core::DType;
use nuvec_core::primitive::{BinaryOp, ReduceOp, ScanOp, UnaryOp};

/// The C type of a dtype in kernel sources.
pub fn ctype(d: DType) -> &'static str {
    match d {
        DType::Bool => "bool",
        DType::U8 => "u8",
        DType::U16 => "u16",
        DType::U32 => "u32",
        DType::U64 => "u64",
        DType::I8 => "i8",
        DType::I16 => "i16",
        DType::I32 => "i32",
        DType::I64 => "i64",
        DType::F16 => "f16",
        DType::BF16 => "bf16",
        DType::F32 => "float",
        DType::F64 => "double",
        DType::Complex64 => "c64",
        _ => "void",
    }
}

/// A kernel module: which templates, for which dtype.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Family {
    /// Unary maps of one input dtype.
    Unary(DType),
    /// Binary maps of one input dtype.
    Binary(DType),
    /// Casts from one dtype to all others.
    Cast(DType),
    /// `where` for one value dtype.
    Select(DType),
    /// Strided copies of elements of one size (1, 2, 4 or 8 bytes).
    Copy(usize),
    /// Reductions of one dtype.
    Reduce(DType),
    /// Arg-reductions of one dtype.
    ArgReduce(DType),
    /// Scans of one dtype.
    Scan(DType),
    /// `arange` into one dtype.
    Arange(DType),
    /// Softmax and log-sum-exp rows of one float dtype.
    Fast(DType),
    /// Few-row matrix products of one float dtype.
    Gemv(DType),
    /// Integer matrix products.
    MatmulInt(DType),
    /// Threefry random bits (`kernels/random.cuh`).
    Random,
    /// Sorts and partitions of one dtype.
    Sort(DType),
    /// Gathers and scatters along one axis of one element dtype, for every index dtype.
    Gather(DType),
    /// Affine quantize and dequantize of one float dtype.
    Quantize(DType),
}

/// Index dtypes the gather kernels take.
pub const INDEX_DTYPES: [DType; 8] =
    [DType::I8, DType::I16, DType::I32, DType::I64, DType::U8, DType::U16, DType::U32, DType::U64];

/// Whether scatters with a reduction (sum, product, max, min) have a kernel for `d`.
pub fn has_scatter_reduce(d: DType) -> bool {
    !matches!(d, DType::Bool | DType::Complex64)
}

/// The functor implementing a unary op on `d`, or `None` when no kernel covers it.
pub fn unary_functor(op: UnaryOp, d: DType) -> Option<&'static str> {
    use UnaryOp::*;
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
        LogicalNot if d == DType::Bool => "Un_logical_not",
        _ => return None,
    })
}

const UNARY_OPS: [UnaryOp; 34] = {
    use UnaryOp::*;
    [
        Abs,
        Sign,
        Negative,
        Square,
        Floor,
        Ceil,
        Round,
        Exp,
        Expm1,
        Log,
        Log1p,
        Log2,
        Log10,
        Sqrt,
        Rsqrt,
        Reciprocal,
        Sin,
        Cos,
        Tan,
        ArcSin,
        ArcCos,
        ArcTan,
        Sinh,
        Cosh,
        Tanh,
        ArcSinh,
        ArcCosh,
        ArcTanh,
        Sigmoid,
        Erf,
        ErfInv,
        LogicalNot,
        BitwiseInvert,
        Conjugate,
    ]
};

const BINARY_OPS: [BinaryOp; 24] = {
    use BinaryOp::*;
    [
        Add,
        Subtract,
        Multiply,
        Divide,
        FloorDivide,
        Remainder,
        Power,
        Maximum,
        Minimum,
        LogAddExp,
        ArcTan2,
        Equal,
        NotEqual,
        Less,
        LessEqual,
        Greater,
        GreaterEqual,
        LogicalAnd,
        LogicalOr,
        BitwiseAnd,
        BitwiseOr,
        BitwiseXor,
        LeftShift,
        RightShift,
    ]
};

/// Whether the binary module of `d` has `op` (the ops core sends with inputs of dtype `d`).
pub fn has_binary(op: BinaryOp, d: DType) -> bool {
    op.compute_dtype(d) == Some(d) && !(d == DType::Complex64 && op == BinaryOp::ArcTan2)
}

/// The output dtype of a unary op's kernel.
fn unary_out(op: UnaryOp, d: DType) -> DType {
    op.output_dtype(d)
}

/// Reductions a module of `d` holds.
pub fn reduce_ops(d: DType) -> &'static [ReduceOp] {
    if d == DType::Bool {
        &[ReduceOp::And, ReduceOp::Or, ReduceOp::Max, ReduceOp::Min]
    } else if d == DType::Complex64 {
        &[ReduceOp::Sum, ReduceOp::Prod]
    } else {
        &[ReduceOp::Sum, ReduceOp::Prod, ReduceOp::Max, ReduceOp::Min]
    }
}

/// The template argument of a reduction (`OP` of `Red<T, OP>`).
pub fn reduce_code(op: ReduceOp) -> i32 {
    match op {
        ReduceOp::Sum => 0,
        ReduceOp::Prod => 1,
        ReduceOp::Max => 2,
        ReduceOp::Min => 3,
        ReduceOp::And => 4,
        ReduceOp::Or => 5,
    }
}

/// Scans a module of `d` holds.
pub fn scan_ops(d: DType) -> Vec<ScanOp> {
    match d {
        DType::Complex64 => vec![],
        DType::Bool => vec![ScanOp::Prod, ScanOp::Max, ScanOp::Min],
        d if d.is_float() => vec![ScanOp::Sum, ScanOp::Prod, ScanOp::Max, ScanOp::Min, ScanOp::LogAddExp],
        _ => vec![ScanOp::Sum, ScanOp::Prod, ScanOp::Max, ScanOp::Min],
    }
}

/// The template argument of a scan.
pub fn scan_code(op: ScanOp) -> i32 {
    match op {
        ScanOp::Sum => 0,
        ScanOp::Prod => 1,
        ScanOp::Max => 2,
        ScanOp::Min => 3,
        ScanOp::LogAddExp => 6,
    }
}

/// Dtypes whose elements a `bool`-free kernel family can hold.
const ALL: [DType; 14] = DType::ALL;

impl Family {
    /// The module's name (also its cache key).
    pub fn key(&self) -> String {
        match self {
            Family::Unary(d) => format!("unary_{d}"),
            Family::Binary(d) => format!("binary_{d}"),
            Family::Cast(d) => format!("cast_{d}"),
            Family::Select(d) => format!("select_{d}"),
            Family::Copy(s) => format!("copy_{s}"),
            Family::Reduce(d) => format!("reduce_{d}"),
            Family::ArgReduce(d) => format!("argreduce_{d}"),
            Family::Scan(d) => format!("scan_{d}"),
            Family::Arange(d) => format!("arange_{d}"),
            Family::Fast(d) => format!("fast_{d}"),
            Family::Gemv(d) => format!("gemv_{d}"),
            Family::MatmulInt(d) => format!("matmul_int_{d}"),
            Family::Random => "random".into(),
            Family::Sort(d) => format!("sort_{d}"),
            Family::Gather(d) => format!("gather_{d}"),
            Family::Quantize(d) => format!("quantize_{d}"),
        }
    }

    /// The generated source.
    pub fn source(&self) -> String {
        let mut s = String::new();
        let mut w = |line: String| {
            s.push_str(&line);
            s.push('\n');
        };
        match *self {
            Family::Unary(d) => {
                w("#include \"elementwise.cuh\"".into());
                let t = ctype(d);
                for op in UNARY_OPS {
                    let Some(f) = unary_functor(op, d) else { continue };
                    let u = ctype(unary_out(op, d));
                    let n = op.name();
                    w(format!(
                        "extern \"C\" __global__ void unary_{n}_c(const {t}* x, {u}* out, u64 n) {{ unary_contig<{t}, {u}>(x, out, n, {f}()); }}"
                    ));
                    w(format!(
                        "extern \"C\" __global__ void unary_{n}_s(const {t}* x, {u}* out, u64 n, Dims d) {{ unary_strided<{t}, {u}>(x, out, n, d, {f}()); }}"
                    ));
                }
            }
            Family::Binary(d) => {
                w("#include \"elementwise.cuh\"".into());
                let t = ctype(d);
                for op in BINARY_OPS {
                    if !has_binary(op, d) {
                        continue;
                    }
                    let u = ctype(op.output_dtype(d));
                    let n = op.name();
                    w(format!(
                        "extern \"C\" __global__ void binary_{n}_c(const {t}* a, const {t}* b, {u}* out, u64 n, int mode) {{ binary_contig<{t}, {u}>(a, b, out, n, mode, Bin_{n}()); }}"
                    ));
                    w(format!(
                        "extern \"C\" __global__ void binary_{n}_s(const {t}* a, const {t}* b, {u}* out, u64 n, Dims d) {{ binary_strided<{t}, {u}>(a, b, out, n, d, Bin_{n}()); }}"
                    ));
                }
            }
            Family::Cast(src) => {
                w("#include \"elementwise.cuh\"".into());
                let s_ = ctype(src);
                for dst in ALL {
                    let d_ = ctype(dst);
                    let n = dst.name();
                    w(format!(
                        "extern \"C\" __global__ void cast_{n}_c(const {s_}* x, {d_}* out, u64 n) {{ unary_contig<{s_}, {d_}>(x, out, n, CastF<{s_}, {d_}>()); }}"
                    ));
                    w(format!(
                        "extern \"C\" __global__ void cast_{n}_s(const {s_}* x, {d_}* out, u64 n, Dims d) {{ unary_strided<{s_}, {d_}>(x, out, n, d, CastF<{s_}, {d_}>()); }}"
                    ));
                }
            }
            Family::Select(d) => {
                let t = ctype(d);
                w("#include \"elementwise.cuh\"".into());
                w(format!(
                    "extern \"C\" __global__ void select_s(const bool* c, const {t}* a, const {t}* b, {t}* out, u64 n, Dims d) {{ select_strided<{t}>(c, a, b, out, n, d); }}"
                ));
            }
            Family::Copy(size) => {
                let t = match size {
                    1 => "u8",
                    2 => "u16",
                    4 => "u32",
                    _ => "u64",
                };
                w("#include \"misc.cuh\"".into());
                w(format!(
                    "extern \"C\" __global__ void copy_s(const {t}* src, {t}* dst, u64 n, Dims d) {{ copy_strided<{t}>(src, dst, n, d); }}"
                ));
            }
            Family::Reduce(d) => {
                let t = ctype(d);
                w("#include \"reduce.cuh\"".into());
                for &op in reduce_ops(d) {
                    let (n, c) = (op.name(), reduce_code(op));
                    let a = format!("typename Red<{t}, {c}>::A");
                    w(format!(
                        "extern \"C\" __global__ void reduce_rows_{n}(const {t}* x, {a}* partials, {t}* out, u64 rows, u64 len, u64 segs, Dims d) {{ reduce_rows<{t}, {c}>(x, partials, out, rows, len, segs, d); }}"
                    ));
                    w(format!(
                        "extern \"C\" __global__ void reduce_rows_warp_{n}(const {t}* x, {t}* out, u64 rows, u64 len, Dims d) {{ reduce_rows_warp<{t}, {c}>(x, out, rows, len, d); }}"
                    ));
                    w(format!(
                        "extern \"C\" __global__ void reduce_finish_{n}(const {a}* partials, {t}* out, u64 rows, u64 segs) {{ reduce_finish<{t}, {c}>(partials, out, rows, segs); }}"
                    ));
                    w(format!(
                        "extern \"C\" __global__ void reduce_cols_{n}(const {t}* x, {a}* partials, {t}* out, u64 cols, u64 red, u64 segs, Dims d) {{ reduce_cols<{t}, {c}>(x, partials, out, cols, red, segs, d); }}"
                    ));
                    w(format!(
                        "extern \"C\" __global__ void reduce_cols_finish_{n}(const {a}* partials, {t}* out, u64 cols, u64 segs) {{ reduce_cols_finish<{t}, {c}>(partials, out, cols, segs); }}"
                    ));
                    w(format!(
                        "extern \"C\" __global__ void reduce_general_{n}(const {t}* x, {t}* out, u64 n_out, u64 n_red, Dims kept, Dims red) {{ reduce_general<{t}, {c}>(x, out, n_out, n_red, kept, red); }}"
                    ));
                }
            }
            Family::ArgReduce(d) => {
                let t = ctype(d);
                w("#include \"reduce.cuh\"".into());
                for (n, max) in [("argmax", true), ("argmin", false)] {
                    w(format!(
                        "extern \"C\" __global__ void {n}(const {t}* x, u32* out, u64 n_out, u64 len, i64 axis_stride, Dims d) {{ arg_reduce<{t}, {max}>(x, out, n_out, len, axis_stride, d); }}"
                    ));
                }
            }
            Family::Scan(d) => {
                let t = ctype(d);
                w("#include \"reduce.cuh\"".into());
                for op in scan_ops(d) {
                    let (n, c) = (op.name(), scan_code(op));
                    w(format!(
                        "extern \"C\" __global__ void scan_{n}(const {t}* x, {t}* out, u64 lines, u64 len, int reverse, int inclusive) {{ scan_lines<{t}, {c}>(x, out, lines, len, reverse != 0, inclusive != 0); }}"
                    ));
                }
            }
            Family::Arange(d) => {
                let t = ctype(d);
                w("#include \"misc.cuh\"".into());
                w(format!(
                    "extern \"C\" __global__ void arange({t}* out, u64 n, double start, double step) {{ arange_fill<{t}>(out, n, start, step); }}"
                ));
            }
            Family::Fast(d) => {
                let t = ctype(d);
                let a = if d == DType::F64 { "double" } else { "float" };
                w("#include \"norm_regs.cuh\"".into());
                w("#include \"cross_entropy.cuh\"".into());
                w("#include \"rope.cuh\"".into());
                // The register-row norms, by vectors per thread (fast_rows.rs: row_plan; the
                // residual add and the layer norm take at most 4, their `v_max`).
                for v in [2, 4, 8] {
                    let lines = [
                        format!(
                            "__launch_bounds__(NV_REG_BLOCK) rms_norm_r{v}(const {t}* x, const {t}* res, const {t}* w, {t}* h, {t}* out, u64 rows, u64 len, float eps, int group) {{ rms_norm_regs<{t}, {v}, false>(x, res, w, h, out, rows, len, eps, group); }}"
                        ),
                        format!(
                            "__launch_bounds__(NV_REG_BLOCK) add_rms_norm_r{v}(const {t}* x, const {t}* res, const {t}* w, {t}* h, {t}* out, u64 rows, u64 len, float eps, int group) {{ rms_norm_regs<{t}, {v}, true>(x, res, w, h, out, rows, len, eps, group); }}"
                        ),
                        format!(
                            "__launch_bounds__(NV_REG_BLOCK) layer_norm_r{v}(const {t}* x, const {t}* w, const {t}* b, {t}* out, u64 rows, u64 len, float eps, int group) {{ layer_norm_regs<{t}, {v}>(x, w, b, out, rows, len, eps, group); }}"
                        ),
                        // A block per row (norm_regs.cuh).
                        format!(
                            "__launch_bounds__(NV_REG_BLOCK) rms_norm_o{v}(const {t}* x, const {t}* res, const {t}* w, {t}* h, {t}* out, u64 rows, u64 len, float eps) {{ rms_norm_one<{t}, {v}, false>(x, res, w, h, out, rows, len, eps); }}"
                        ),
                        format!(
                            "__launch_bounds__(NV_REG_BLOCK) add_rms_norm_o{v}(const {t}* x, const {t}* res, const {t}* w, {t}* h, {t}* out, u64 rows, u64 len, float eps) {{ rms_norm_one<{t}, {v}, true>(x, res, w, h, out, rows, len, eps); }}"
                        ),
                        format!(
                            "__launch_bounds__(NV_REG_BLOCK) layer_norm_o{v}(const {t}* x, const {t}* w, const {t}* b, {t}* out, u64 rows, u64 len, float eps) {{ layer_norm_one<{t}, {v}>(x, w, b, out, rows, len, eps); }}"
                        ),
                    ];
                    for line in lines.iter().filter(|l| v < 8 || l.contains(") rms_norm_")) {
                        w(format!("extern \"C\" __global__ void {line}"));
                    }
                }
                // Their derivatives: at most 4 vectors per thread for the RMS norm, 2 for the
                // layer norm (fast_rows.rs: `v_max`; 8 spill).
                for v in [2, 4] {
                    let lines = [
                        format!(
                            "__launch_bounds__(NV_REG_BLOCK, 1) rms_norm_vjp_r{v}(const {t}* x, const {t}* w, const {t}* g, {t}* gx, {a}* part, u64 rows, u64 len, float eps, int group) {{ rms_norm_vjp_regs<{t}, {v}>(x, w, g, gx, part, rows, len, eps, group); }}"
                        ),
                        format!(
                            "__launch_bounds__(NV_REG_BLOCK, 1) layer_norm_vjp_r{v}(const {t}* x, const {t}* w, const {t}* g, {t}* gx, {a}* part, u64 rows, u64 len, float eps, int group) {{ layer_norm_vjp_regs<{t}, {v}, false>(x, w, g, gx, part, rows, len, eps, group); }}"
                        ),
                        format!(
                            "__launch_bounds__(NV_REG_BLOCK, 1) layer_norm_vjp_e{v}(const {t}* x, const {t}* w, const {t}* g, {t}* gx, {a}* part, u64 rows, u64 len, float eps, int group) {{ layer_norm_vjp_regs<{t}, {v}, true>(x, w, g, gx, part, rows, len, eps, group); }}"
                        ),
                    ];
                    for line in lines.iter().filter(|l| v == 2 || l.contains(") rms_norm_vjp_")) {
                        w(format!("extern \"C\" __global__ void {line}"));
                    }
                }
                // RoPE: 16-byte chunks (`rope_vec`, `_t` traditional), or single features
                // (`rope_s1`) or pairs (`rope_s2`, traditional); `_f`: inverse frequencies from
                // `freqs`; `_w`: rows past 2^32 (64-bit row arithmetic). fast_rows.rs: rope.
                let n = 16 / d.size();
                for (name, width, vec, trad) in [
                    ("rope_vec", n, true, false),
                    ("rope_vec_t", n, true, true),
                    ("rope_s1", 1, false, false),
                    ("rope_s2", 2, false, true),
                ] {
                    for (f, freqs) in [("", false), ("_f", true)] {
                        for (wide, r32) in [("", true), ("_w", false)] {
                            w(format!(
                                "extern \"C\" __global__ void {name}{f}{wide}(const {t}* x, {t}* out, const i32* offset, int offset_per_batch, const float* freqs, float log2_base, float scale, float sign, u64 rows, u64 len, u64 dims, u64 seq, u64 per_batch) {{ rope_rows<{t}, {width}, {vec}, {r32}, {trad}, {freqs}>(x, out, offset, offset_per_batch, freqs, log2_base, scale, sign, rows, len, dims, seq, per_batch); }}"
                            ));
                        }
                    }
                }
                for line in [
                    format!(
                        "__launch_bounds__(1024) rms_norm(const {t}* x, const {t}* res, const {t}* w, {t}* h, {t}* out, u64 rows, u64 len, float eps) {{ rms_norm_rows<{t}>(x, res, w, h, out, rows, len, eps); }}"
                    ),
                    format!(
                        "__launch_bounds__(1024) layer_norm(const {t}* x, const {t}* w, const {t}* b, {t}* out, u64 rows, u64 len, float eps) {{ layer_norm_rows<{t}>(x, w, b, out, rows, len, eps); }}"
                    ),
                    format!(
                        "__launch_bounds__(NV_NORM_VJP_THREADS) rms_norm_vjp(const {t}* x, const {t}* w, const {t}* g, {t}* gx, {a}* part, u64 rows, u64 len, float eps) {{ rms_norm_vjp_rows<{t}>(x, w, g, gx, part, rows, len, eps); }}"
                    ),
                    format!(
                        "__launch_bounds__(NV_NORM_VJP_THREADS) layer_norm_vjp(const {t}* x, const {t}* w, const {t}* g, {t}* gx, {a}* part, u64 rows, u64 len, float eps) {{ layer_norm_vjp_rows<{t}>(x, w, g, gx, part, rows, len, eps); }}"
                    ),
                    format!(
                        "__launch_bounds__(NV_COL_SUM_THREADS) col_sum(const {a}* part, {a}* out, {a}* out_hi, u64 parts, u64 cols, u64 split, u64 stride) {{ col_sum<{a}, {a}>(part, out, out_hi, parts, cols, split, stride); }}"
                    ),
                    // The same, rounded to the dtype (the RMS norm's weight cotangent).
                    format!(
                        "__launch_bounds__(NV_COL_SUM_THREADS) col_sum_round(const {a}* part, {t}* out, {t}* out_hi, u64 parts, u64 cols, u64 split, u64 stride) {{ col_sum<{a}, {t}>(part, out, out_hi, parts, cols, split, stride); }}"
                    ),
                    format!(
                        "swiglu(const {t}* gate, const {t}* up, {t}* out, u64 n) {{ swiglu_elems<{t}>(gate, up, out, n); }}"
                    ),
                    format!(
                        "swiglu_vjp(const {t}* gate, const {t}* up, const {t}* g, {t}* dgate, {t}* dup, u64 n) {{ swiglu_vjp_elems<{t}>(gate, up, g, dgate, dup, n); }}"
                    ),
                    format!(
                        "__launch_bounds__(1024) cross_entropy(const {t}* x, const i32* t, {a}* loss, u64 rows, u64 len) {{ cross_entropy_rows<{t}>(x, t, loss, rows, len); }}"
                    ),
                    format!(
                        "cross_entropy_vjp(const {t}* x, const i32* t, const {a}* g, const {a}* loss, {t}* dx, u64 rows, u64 len) {{ cross_entropy_vjp_rows<{t}>(x, t, g, loss, dx, rows, len); }}"
                    ),
                ] {
                    w(format!("extern \"C\" __global__ void {line}"));
                }
                if d != DType::F64 {
                    // Float statistics only; clusters need sm_90 (the body traps before). Vectors
                    // per thread: 8, or 10 for the longest rows (fast_rows.rs).
                    for (name, u) in [("cross_entropy_fused", 8), ("cross_entropy_fused_wide", 10)] {
                        w(format!(
                            "extern \"C\" __global__ void __launch_bounds__(1024) {name}(const {t}* x, const i32* t, const float* g, float* loss, {t}* dx, u64 rows, u64 len, u64 slice) {{ cross_entropy_fused_rows<{t}, {u}>(x, t, g, loss, dx, rows, len, slice); }}"
                        ));
                    }
                }
                for (name, f) in [("softmax", "softmax_rows"), ("logsumexp", "logsumexp_rows")] {
                    w(format!(
                        "extern \"C\" __global__ void {name}(const {t}* x, {t}* out, u64 rows, u64 len) {{ {f}<{t}>(x, out, rows, len); }}"
                    ));
                    w(format!(
                        "extern \"C\" __global__ void {name}_warp(const {t}* x, {t}* out, u64 rows, u64 len) {{ {f}_warp<{t}>(x, out, rows, len); }}"
                    ));
                }
            }
            Family::Gemv(d) => {
                let t = ctype(d);
                w("#include \"gemv.cuh\"".into());
                for m in 1..=8 {
                    w(format!(
                        "extern \"C\" __global__ void gemv_rows_{m}(const {t}* x, const {t}* w, {t}* out, u64 n, u64 k, u64 ldx, u64 ldw, u64 ldo) {{ gemv_rows<{t}, {m}>(x, w, out, n, k, ldx, ldw, ldo); }}"
                    ));
                    w(format!(
                        "extern \"C\" __global__ void __launch_bounds__(NV_GEMV_COL_BLOCK) gemv_cols_{m}(const {t}* x, const {t}* b, float* partials, unsigned* counters, {t}* out, u64 n, u64 k, u64 ldx, u64 ldb, u64 ldo, u64 slices) {{ gemv_cols<{t}, {m}>(x, b, partials, counters, out, n, k, ldx, ldb, ldo, slices); }}"
                    ));
                }
            }
            Family::MatmulInt(d) => {
                let t = ctype(d);
                w("#include \"misc.cuh\"".into());
                w(format!(
                    "extern \"C\" __global__ void matmul_int(const {t}* a, const {t}* b, {t}* out, u64 batches, u64 m, u64 n, u64 k, i64 sa0, i64 sa1, i64 sb0, i64 sb1, Dims d) {{ matmul_int<{t}>(a, b, out, batches, m, n, k, sa0, sa1, sb0, sb1, d); }}"
                ));
            }
            // The kernel is self-contained; its source is the module (it includes common.cuh).
            Family::Random => w(include_str!("../kernels/random.cuh").into()),
            Family::Sort(d) => {
                let t = ctype(d);
                w("#include \"sort.cuh\"".into());
                for (suffix, indices) in [("vals", false), ("idx", true)] {
                    w(format!(
                        "extern \"C\" __global__ void sort_block_{suffix}(const {t}* x, void* out, u64 rows, u32 len, u32 p, i64 axis_stride, Dims d) {{ sort_block<{t}, {indices}>(x, out, rows, len, p, axis_stride, d); }}"
                    ));
                    w(format!(
                        "extern \"C\" __global__ void sort_global_write_{suffix}(const {t}* keys, const u32* idx, void* out, u64 rows, u32 len, u32 p) {{ sort_global_write<{t}, {indices}>(keys, idx, out, rows, len, p); }}"
                    ));
                }
                w(format!(
                    "extern \"C\" __global__ void sort_global_init(const {t}* x, {t}* keys, u32* idx, u64 rows, u32 len, u32 p, i64 axis_stride, Dims d) {{ sort_global_init<{t}>(x, keys, idx, rows, len, p, axis_stride, d); }}"
                ));
                w(format!(
                    "extern \"C\" __global__ void sort_global_step({t}* keys, u32* idx, u64 rows, u32 len, u32 p, u32 k, u32 j) {{ sort_global_step<{t}>(keys, idx, rows, len, p, k, j); }}"
                ));
            }
            Family::Gather(d) => {
                let t = ctype(d);
                w("#include \"gather.cuh\"".into());
                for idt in INDEX_DTYPES {
                    let (i, n) = (ctype(idt), idt.name());
                    let args = "u64 n, i64 axis_n, i64 axis_stride, Dims d";
                    w(format!(
                        "extern \"C\" __global__ void gather_{n}(const {t}* src, const {i}* idx, {t}* out, {args}) {{ gather_axis<{t}, {i}>(src, idx, out, n, axis_n, axis_stride, d); }}"
                    ));
                    w(format!(
                        "extern \"C\" __global__ void scatter_none_{n}(const {i}* idx, const {t}* upd, {t}* out, {args}) {{ scatter_set<{t}, {i}>(idx, upd, out, n, axis_n, axis_stride, d); }}"
                    ));
                    if has_scatter_reduce(d) {
                        for (r, f) in [("sum", "ScSum"), ("prod", "ScProd"), ("max", "ScMax"), ("min", "ScMin")] {
                            w(format!(
                                "extern \"C\" __global__ void scatter_{r}_{n}(const {i}* idx, const {t}* upd, {t}* out, {args}) {{ scatter_reduce<{t}, {i}>(idx, upd, out, n, axis_n, axis_stride, d, {f}<{t}>()); }}"
                            ));
                        }
                    }
                }
            }
            Family::Quantize(d) => {
                let t = ctype(d);
                w("#include \"quantize.cuh\"".into());
                w(format!(
                    "extern \"C\" __global__ void affine_quantize(const {t}* w, u32* out, {t}* scales, {t}* biases, u64 groups, int bits, int group_size) {{ affine_quantize<{t}>(w, out, scales, biases, groups, bits, group_size); }}"
                ));
                w(format!(
                    "extern \"C\" __global__ void affine_dequantize(const u32* w, const {t}* scales, const {t}* biases, {t}* out, u64 n, int bits, int group_size) {{ affine_dequantize<{t}>(w, scales, biases, out, n, bits, group_size); }}"
                ));
            }
        }
        if self.dependent_launch() {
            s = s.lines().map(|l| dependent(l) + "\n").collect();
        }
        s
    }

    /// Whether the module's kernels begin with `nv_dependent_launch()` (common.cuh), so that
    /// they may be launched with launch.rs's `launch_dependent`: the fused operations, whose
    /// launches are a visible share of their time at LLM shapes.
    pub fn dependent_launch(&self) -> bool {
        matches!(self, Family::Fast(_))
    }
}

/// A kernel definition line with `nv_dependent_launch();` as the first statement of its body;
/// other lines unchanged.
fn dependent(line: &str) -> String {
    match line.find(") { ") {
        Some(at) if line.starts_with("extern \"C\" __global__") => {
            format!("{}) {{ nv_dependent_launch(); {}", &line[..at], &line[at + 4..])
        }
        _ => line.to_string(),
    }
}

/// Every module the backend can build.
pub fn all_modules() -> Vec<Family> {
    let mut v = Vec::new();
    for d in ALL {
        v.extend([Family::Unary(d), Family::Binary(d), Family::Cast(d), Family::Select(d), Family::Reduce(d)]);
        if d != DType::Complex64 {
            v.extend([Family::ArgReduce(d), Family::Scan(d)]);
        }
        if d != DType::Complex64 && d != DType::Bool {
            v.push(Family::Arange(d));
        }
        if d.is_float() {
            v.push(Family::Fast(d));
        }
        if matches!(d, DType::F16 | DType::BF16 | DType::F32) {
            v.push(Family::Gemv(d));
        }
        if d.is_integer() {
            v.push(Family::MatmulInt(d));
        }
        v.push(Family::Sort(d));
        if crate::quantize::KERNEL_DTYPES.contains(&d) {
            v.push(Family::Quantize(d));
        }
    }
    v.extend([1, 2, 4, 8].map(Family::Copy));
    v.push(Family::Random);
    v.extend(ALL.into_iter().map(Family::Gather));
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fused_kernels_wait_for_the_kernel_before_them() {
        // launch_dependent may start any kernel of the fused-op module before the previous one
        // has finished: each must wait first thing, and only those modules are so marked.
        for d in [DType::F32, DType::BF16, DType::F64] {
            let family = Family::Fast(d);
            assert!(family.dependent_launch());
            let source = family.source();
            let kernels: Vec<&str> = source.lines().filter(|l| l.starts_with("extern \"C\" __global__")).collect();
            assert!(kernels.len() > 20);
            for k in kernels {
                let body = &k[k.find(") { ").expect("a kernel body") + 4..];
                assert!(body.starts_with("nv_dependent_launch(); "), "{k}");
            }
        }
        // The templates the module includes define no kernels of their own (which would not wait).
        for header in [
            include_str!("../kernels/common.cuh"),
            include_str!("../kernels/fast.cuh"),
            include_str!("../kernels/reduce.cuh"),
            include_str!("../kernels/elementwise.cuh"),
            include_str!("../kernels/norm.cuh"),
            include_str!("../kernels/norm_regs.cuh"),
            include_str!("../kernels/cross_entropy.cuh"),
            include_str!("../kernels/rope.cuh"),
        ] {
            assert!(!header.contains("__global__"));
        }
        assert!(!Family::Unary(DType::F32).dependent_launch());
    }

    #[test]
    fn norm_kernels_exist_for_the_vectors_per_thread_fast_rows_may_choose() {
        let source = Family::Fast(DType::BF16).source();
        let has = |name: &str| source.contains(&format!(" {name}("));
        for name in
            ["rms_norm_r8", "rms_norm_o8", "add_rms_norm_o4", "layer_norm_o4", "rms_norm_vjp_r4", "layer_norm_vjp_e2"]
        {
            assert!(has(name), "{name}");
        }
        // Past the residual add's and layer norm's `v_max` (4; their derivative's 2): not built.
        for name in [
            "add_rms_norm_r8",
            "add_rms_norm_o8",
            "layer_norm_r8",
            "layer_norm_o8",
            "layer_norm_vjp_r4",
            "layer_norm_vjp_e4",
        ] {
            assert!(!has(name), "{name}");
        }
        assert!(!Family::Unary(DType::F32).source().contains("nv_dependent_launch"));
    }
}
