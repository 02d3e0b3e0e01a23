//! Compiled element-wise programs (`Primitive::Compiled`): one generated kernel per program and
//! arrangement of its inputs, compiled once (memory and disk cache, as every module).
//!
//! Each step is the functor its unfused kernel runs (`Un_*`, `Bin_*`, `convert`, `c ? a : b`)
//! on a local of its own dtype, so results are bit-identical to the steps run one by one.
//! Arrangements: every input dense in one layout (or a broadcast scalar) takes the contiguous
//! kernel, 16-byte vectors per thread; otherwise up to four strided inputs are walked in runs of
//! the innermost axis (`map.cuh`'s `for_runs`) beside row-major and scalar ones, and the rest
//! are copied to row-major first.

use std::collections::HashMap;
use std::fmt::Write;
use std::sync::{Arc, Mutex, OnceLock};

use cudarc::driver::sys::CUdeviceptr;
use nuvec_core::primitive::compiled::{Compiled, Program, Step};
use nuvec_core::primitive::{BinaryOp, UnaryOp};
use nuvec_core::shape::{Strides, elem_count, row_major_strides};
use nuvec_core::storage::{Data, Layout, Operand, Output, Spec};
use nuvec_core::{DType, Error, Result};

use crate::driver::Gpu;
use crate::kernels::ctype;
use crate::launch::{Arg, BLOCK, Dims};
use crate::operand::{Cost, aligned, alloc, alloc_out, dense, launch_map, ptr_of, row_major, scalar_like};
use crate::{binary, unary};

/// How one input of a compiled kernel is read.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum InputArrangement {
    /// Dense in the outputs' layout: element `i` at `in[i]`, read in vectors.
    Dense,
    /// One value for every element (all strides zero): read once.
    Scalar,
    /// Any other layout, walked through a `Dims` in runs of the innermost axis (at most four
    /// strided inputs per kernel; the outputs are then row-major).
    Strided,
}

impl InputArrangement {
    /// The letter of the arrangement in kernel names: `d`, `s` or `r`.
    fn letter(self) -> char {
        match self {
            InputArrangement::Dense => 'd',
            InputArrangement::Scalar => 's',
            InputArrangement::Strided => 'r',
        }
    }
}

/// Strided inputs one kernel walks (`Dims` holds four operands' strides).
const MAX_STRIDED: usize = 4;

/// Pointer parameters a kernel may take: with `n` and a `Dims`, well inside the 4 KiB of
/// parameters every driver accepts.
const MAX_OPERANDS: usize = 400;

/// The kernel name of `program` over inputs arranged as `arrangement`:
/// `compiled_<digest>_<one letter per input>`.
pub(crate) fn kernel_name(program: &Program, arrangement: &[InputArrangement]) -> String {
    let letters: String = arrangement.iter().map(|a| a.letter()).collect();
    format!("compiled_{:016x}_{letters}", program.digest())
}

fn unsupported(what: String) -> Error {
    Error::Backend(format!("compiled: {what}"))
}

/// The C expression of `step` over the values `v<k>`, or why no kernel covers it.
fn step_expr(p: &Program, step: Step) -> Result<String> {
    let v = |k: usize| format!("v{k}");
    Ok(match step {
        Step::Unary(op, a) => match (op, p.dtype(a)) {
            // A product rounds on its own (no FMA with a later step's add).
            (UnaryOp::Square, DType::F32) => format!("__fmul_rn(v{a}, v{a})"),
            (UnaryOp::Square, DType::F64) => format!("__dmul_rn(v{a}, v{a})"),
            (op, d) => {
                let f = unary::functor(op, d)
                    .ok_or_else(|| unsupported(format!("no GPU kernel for {} on {d}", op.name())))?;
                format!("{f}()({})", v(a))
            }
        },
        Step::Binary(op, a, b) => {
            let (da, db) = (p.dtype(a), p.dtype(b));
            if !binary::has_binary_pair(op, da, db) {
                return Err(unsupported(format!("no GPU kernel for {} on {da} and {db}", op.name())));
            }
            // A widened pair computes in float32: the half operand is widened first, as
            // `binary_widened_*` load it.
            let compute = if da == db { da } else { DType::F32 };
            let arg = |k: usize, d: DType| {
                if d == compute { v(k) } else { format!("convert<float, {}>({})", ctype(d), v(k)) }
            };
            let (x, y) = (arg(a, da), arg(b, db));
            match (op, compute) {
                (BinaryOp::Multiply, DType::F32) => format!("__fmul_rn({x}, {y})"),
                (BinaryOp::Multiply, DType::F64) => format!("__dmul_rn({x}, {y})"),
                _ => format!("Bin_{}()({x}, {y})", op.name()),
            }
        }
        Step::Select(c, a, b) => format!("({} ? {} : {})", v(c), v(a), v(b)),
        Step::AsType(d, a) => format!("convert<{}, {}>({})", ctype(d), ctype(p.dtype(a)), v(a)),
    })
}

/// Whether a value of `d` made by `step` passes the rounding barrier before later steps read
/// it: a float value whose last operation may be a product the compiler could fuse with a later
/// step's add. Sums, quotients, square roots, selects, casts and the steps' own products
/// (`__fmul_rn`, never fused) cannot; libdevice functions and complex arithmetic may.
fn rounds(step: Step, d: DType) -> bool {
    use UnaryOp::*;
    match d {
        DType::Complex64 => true,
        DType::F32 | DType::F64 => match step {
            Step::Unary(op, _) => !matches!(
                op,
                Abs | Sign | Negative | Square | Floor | Ceil | Round | Sqrt | Rsqrt | Reciprocal | LogicalNot
            ),
            Step::Binary(op, ..) => {
                matches!(op, BinaryOp::Power | BinaryOp::LogAddExp | BinaryOp::ArcTan2 | BinaryOp::Remainder)
            }
            Step::Select(..) | Step::AsType(..) => false,
        },
        _ => false,
    }
}

/// Whether every value's dtype has a C type here.
fn known(d: DType) -> bool {
    ctype(d) != "void"
}

/// Whether the GPU has a kernel for every step of `program`.
fn program_supported(p: &Program) -> bool {
    p.inputs.iter().chain(p.steps.iter().map(|(_, d)| d)).all(|&d| known(d))
        && p.steps.iter().all(|&(step, _)| match step {
            Step::Unary(op, a) => unary::functor(op, p.dtype(a)).is_some(),
            Step::Binary(op, a, b) => binary::has_binary_pair(op, p.dtype(a), p.dtype(b)),
            // Casts convert between any two dtypes (copy.cuh's CastF); `where` takes any.
            Step::Select(..) | Step::AsType(..) => true,
        })
}

/// Whether the GPU runs `compiled` on these specs: a kernel exists for every step (otherwise
/// core runs the steps one by one). Cheap: a match per step, no source is generated.
pub(crate) fn supports(compiled: &Compiled, inputs: &[Spec], outputs: &[Spec]) -> bool {
    let p = &*compiled.0;
    inputs.len() == p.inputs.len()
        && outputs.len() == p.outputs.len()
        && inputs.len() + outputs.len() <= MAX_OPERANDS
        && inputs.iter().zip(&p.inputs).all(|(s, &d)| s.dtype == d)
        && p.outputs.iter().all(|&o| o < p.inputs.len() + p.steps.len())
        && steps_read_earlier_values(p)
        && program_supported(p)
}

/// Whether every step reads only values before it (so the generated source is well formed).
fn steps_read_earlier_values(p: &Program) -> bool {
    p.steps.iter().enumerate().all(|(i, (step, _))| step.args().all(|a| a < p.inputs.len() + i))
}

/// How a program's kernel is launched: capped (grid-stride, fewer threads with more work each)
/// when any step calls a libdevice function (not a square root or reciprocal), whatever its
/// dtype, since a fused program does more work per element than one map (the compile record
/// in bench/results has the comparison).
fn cost(p: &Program) -> Cost {
    use nuvec_core::primitive::UnaryOp::*;
    let heavy = p.steps.iter().any(|&(step, _)| match step {
        Step::Unary(op, a) => {
            !matches!(
                op,
                Abs | Sign
                    | Negative
                    | Square
                    | Floor
                    | Ceil
                    | Round
                    | Sqrt
                    | Rsqrt
                    | Reciprocal
                    | LogicalNot
                    | BitwiseInvert
                    | Conjugate
            ) || unary::cost(op, p.dtype(a)) == Cost::Heavy
        }
        Step::Binary(op, ..) => {
            matches!(op, BinaryOp::Power | BinaryOp::LogAddExp | BinaryOp::ArcTan2 | BinaryOp::Remainder)
        }
        Step::Select(..) | Step::AsType(..) => false,
    });
    // `NUVEC_COMPILED_LAUNCH=light|heavy` overrides the rule, for comparisons.
    static FORCED: std::sync::OnceLock<Option<Cost>> = std::sync::OnceLock::new();
    let forced = FORCED.get_or_init(|| match std::env::var("NUVEC_COMPILED_LAUNCH").as_deref() {
        Ok("light") => Some(Cost::Light),
        Ok("heavy") => Some(Cost::Heavy),
        _ => None,
    });
    forced.unwrap_or(if heavy { Cost::Heavy } else { Cost::Light })
}

/// Elements per thread of the contiguous kernel, from the sizes of the operands it reads and
/// writes in vectors: a 16-byte vector of the narrowest, at most 32 bytes of the widest
/// (map.cuh's `contig_elems`).
fn contig_elems(sizes: impl Iterator<Item = usize> + Clone) -> usize {
    let narrow = sizes.clone().min().unwrap_or(4).max(1);
    let wide = sizes.max().unwrap_or(4).max(1);
    (16 / narrow).min((32 / wide).max(1)).max(1)
}

/// Elements per run of the strided kernel: 32 bytes of the narrowest operand, at most 8
/// (map.cuh's `RunLen`).
fn run_elems(sizes: impl Iterator<Item = usize>) -> usize {
    (32 / sizes.min().unwrap_or(4).max(1)).clamp(1, 8)
}

/// A generated kernel, ready to compile.
struct Kernel {
    name: String,
    source: String,
    /// Elements per thread (contiguous) or per run (strided).
    per_thread: usize,
    cost: Cost,
}

/// The full CUDA source of the kernel running `program` over inputs arranged as
/// `arrangement`; the entry point is named `compiled_<digest 016x>_<letters>` (`d` dense, `s`
/// scalar, `r` strided, one per input). For tools and tests: compile it with
/// `compile::compile_cubin(&source, name, arch, &[])`. Errors name what no kernel covers.
pub fn generate_compiled_kernel(program: &Program, arrangement: &[InputArrangement]) -> Result<String> {
    generate(program, arrangement).map(|k| k.source)
}

/// The pair type and its conversions of a half-precision program that runs two elements at a
/// time (see [`pair_dtype`]): (pair, float pair to pair, pair to float pair, two halves to pair).
fn pair_names(d: DType) -> (&'static str, &'static str, &'static str, &'static str) {
    if d == DType::BF16 {
        ("__nv_bfloat162", "__floats2bfloat162_rn", "__bfloat1622float2", "__halves2bfloat162")
    } else {
        ("__half2", "__floats2half2_rn", "__half22float2", "__halves2half2")
    }
}

/// The half-precision dtype of a program that runs on pairs of elements: every value of one
/// half dtype, and every step one whose half-precision kernel is "widen, compute in float32,
/// round" (so the float32 functor on the widened pair, rounded two at a time by one packed
/// conversion, gives the same bits). Rounding is what bounds such programs one at a time.
fn pair_dtype(p: &Program) -> Option<DType> {
    use UnaryOp::*;
    let d = *p.inputs.first()?;
    if !matches!(d, DType::BF16 | DType::F16) || p.inputs.iter().chain(p.steps.iter().map(|(_, t)| t)).any(|&t| t != d)
    {
        return None;
    }
    let ok = p.steps.iter().all(|&(step, _)| match step {
        // Not rsqrt: its half-precision kernel takes the hardware approximation.
        Step::Unary(op, _) => !matches!(op, Rsqrt | LogicalNot | BitwiseInvert | Conjugate),
        Step::Binary(op, ..) => matches!(
            op,
            BinaryOp::Add
                | BinaryOp::Subtract
                | BinaryOp::Multiply
                | BinaryOp::Divide
                | BinaryOp::Maximum
                | BinaryOp::Minimum
                | BinaryOp::Power
                | BinaryOp::LogAddExp
                | BinaryOp::ArcTan2
        ),
        Step::Select(..) | Step::AsType(..) => false,
    });
    ok.then_some(d)
}

/// The element function of a [`pair_dtype`] program on pairs: each step's float32 functor on
/// the widened pair, rounded by one packed conversion.
fn pair_function(p: &Program, d: DType, used: &[usize], read: &[bool]) -> Result<String> {
    let (pair, round, widen, _) = pair_names(d);
    let ni = p.inputs.len();
    let mut s = String::new();
    let params: Vec<String> = used
        .iter()
        .map(|&k| format!("{pair} v{k}"))
        .chain((0..p.outputs.len()).map(|j| format!("{pair}& o{j}")))
        .collect();
    let _ = writeln!(s, "__device__ __forceinline__ void compiled_pair({}) {{", params.join(", "));
    for &k in used {
        if read[k] {
            let _ = writeln!(s, "  const float2 f{k} = {widen}(v{k});");
        }
    }
    for (i, &(step, _)) in p.steps.iter().enumerate() {
        let k = ni + i;
        let lane = |l: &str| -> Result<String> {
            Ok(match step {
                Step::Unary(op, a) => {
                    let f = unary::functor(op, d)
                        .ok_or_else(|| unsupported(format!("no GPU kernel for {} on {d}", op.name())))?;
                    format!("{f}()(f{a}.{l})")
                }
                Step::Binary(op, a, b) => format!("Bin_{}()(f{a}.{l}, f{b}.{l})", op.name()),
                _ => return Err(unsupported("a pair step must be unary or binary".into())),
            })
        };
        let _ = writeln!(s, "  const {pair} v{k} = {round}({}, {});", lane("x")?, lane("y")?);
        if read[k] {
            let _ = writeln!(s, "  const float2 f{k} = {widen}(v{k});");
        }
    }
    for (j, &o) in p.outputs.iter().enumerate() {
        let _ = writeln!(s, "  o{j} = v{o};");
    }
    s.push_str("}\n");
    Ok(s)
}

fn generate(p: &Program, arr: &[InputArrangement]) -> Result<Kernel> {
    let ni = p.inputs.len();
    if arr.len() != ni {
        return Err(unsupported(format!("{} inputs, {} arrangements", ni, arr.len())));
    }
    if !steps_read_earlier_values(p) || p.outputs.iter().any(|&o| o >= ni + p.steps.len()) {
        return Err(unsupported("a step or an output names a value the program does not have".into()));
    }
    if let Some(d) = p.inputs.iter().chain(p.steps.iter().map(|(_, d)| d)).find(|&&d| !known(d)) {
        return Err(unsupported(format!("no GPU element type for {d}")));
    }
    let strided = arr.iter().filter(|&&a| a == InputArrangement::Strided).count();
    if strided > MAX_STRIDED {
        return Err(unsupported(format!("{strided} strided inputs (at most {MAX_STRIDED})")));
    }
    let name = kernel_name(p, arr);
    let values = ni + p.steps.len();
    // Which values later steps read (they pass the barrier) and which the kernel needs.
    let mut read = vec![false; values];
    for (step, _) in &p.steps {
        step.args().for_each(|a| read[a] = true);
    }
    let used: Vec<usize> = (0..ni).filter(|&k| read[k] || p.outputs.contains(&k)).collect();

    let mut s = String::new();
    for h in ["unary.cuh", "binary.cuh", "copy.cuh", "compiled.cuh"] {
        let _ = writeln!(s, "#include \"{h}\"");
    }
    for line in p.to_string().lines() {
        let _ = writeln!(s, "// {line}");
    }

    // The element function: the used inputs by value, the outputs by reference.
    let params: Vec<String> = used
        .iter()
        .map(|&k| format!("{} v{k}", ctype(p.inputs[k])))
        .chain(p.outputs.iter().enumerate().map(|(j, &o)| format!("{}& o{j}", ctype(p.dtype(o)))))
        .collect();
    let _ = writeln!(s, "__device__ __forceinline__ void compiled_element({}) {{", params.join(", "));
    s.push_str(
        "  // Bit-identical to the unfused kernels: each value keeps its own dtype, products round on\n  \
         // their own, and a float value a libdevice function made passes cl_round, so no FMA spans two steps.\n",
    );
    // The name holding value k as computed (outputs store it; consumers read `v<k>`).
    let mut raw: Vec<String> = (0..ni).map(|k| format!("v{k}")).collect();
    for (i, &(step, d)) in p.steps.iter().enumerate() {
        let k = ni + i;
        let expr = step_expr(p, step)?;
        let t = ctype(d);
        if rounds(step, d) && read[k] {
            let _ = writeln!(s, "  const {t} x{k} = {expr};");
            let _ = writeln!(s, "  const {t} v{k} = cl_round(x{k});");
            raw.push(format!("x{k}"));
        } else {
            let _ = writeln!(s, "  const {t} v{k} = {expr};");
            raw.push(format!("v{k}"));
        }
    }
    for (j, &o) in p.outputs.iter().enumerate() {
        let _ = writeln!(s, "  o{j} = {};", raw[o]);
    }
    s.push_str("}\n");
    // Half-precision programs of "widen, compute, round" steps also run two elements at a time.
    let pairs = if strided == 0 { pair_dtype(p) } else { None };
    if let Some(d) = pairs {
        s.push_str(&pair_function(p, d, &used, &read)?);
    }

    // The kernel's parameters: every input, every output, `n`, then `nvec` or the `Dims`. No
    // `__restrict__`: an output may be written into a donated input's buffer.
    let mut sig: Vec<String> =
        p.inputs.iter().enumerate().map(|(k, &d)| format!("const {}* in{k}", ctype(d))).collect();
    sig.extend(p.outputs.iter().enumerate().map(|(j, &o)| format!("{}* out{j}", ctype(p.dtype(o)))));
    sig.push("u64 n".into());
    let out_types: Vec<&str> = p.outputs.iter().map(|&o| ctype(p.dtype(o))).collect();
    let scalars: String = used
        .iter()
        .filter(|&&k| arr[k] == InputArrangement::Scalar)
        .map(|&k| format!("  const {} s{k} = in{k}[0];\n", ctype(p.inputs[k])))
        .collect();
    // No minimum of blocks per SM (unlike the light unfused maps): held to 32 registers, long
    // programs with transcendental steps spill (the compile record in bench/results).
    let bounds = format!("__launch_bounds__({BLOCK}) ");
    let per_thread;
    if strided == 0 {
        let sizes = used
            .iter()
            .filter(|&&k| arr[k] == InputArrangement::Dense)
            .map(|&k| p.inputs[k].size())
            .chain(p.outputs.iter().map(|&o| p.dtype(o).size()));
        per_thread = contig_elems(sizes);
        sig.push("u64 nvec".into());
        let _ = writeln!(s, "extern \"C\" __global__ void {bounds}{name}({}) {{", sig.join(", "));
        let _ = writeln!(s, "  constexpr int N = {per_thread};");
        s.push_str("  const u64 stride = (u64)gridDim.x * blockDim.x;\n");
        s.push_str("  const u64 first = (u64)blockIdx.x * blockDim.x + threadIdx.x;\n");
        s.push_str(&scalars);
        // Whole vectors (`nvec` is 0 when a pointer is not 16-byte aligned), then the rest one
        // element per thread.
        s.push_str("  for (u64 i = first; i < nvec; i += stride) {\n");
        let mut args = Vec::new();
        for &k in &used {
            if arr[k] == InputArrangement::Dense {
                let t = ctype(p.inputs[k]);
                let _ = writeln!(s, "    {t} a{k}[N];\n    cl_load<{t}, N>(in{k}, i, a{k});");
                args.push(format!("a{k}[j]"));
            } else {
                args.push(format!("s{k}"));
            }
        }
        for (j, t) in out_types.iter().enumerate() {
            let _ = writeln!(s, "    {t} r{j}[N];");
            args.push(format!("r{j}[j]"));
        }
        match pairs.filter(|_| per_thread % 2 == 0) {
            Some(d) => {
                let (pair, _, _, halves) = pair_names(d);
                let mut pair_args: Vec<String> = used
                    .iter()
                    .map(|&k| {
                        if arr[k] == InputArrangement::Dense {
                            format!("{halves}(a{k}[j], a{k}[j + 1])")
                        } else {
                            format!("{halves}(s{k}, s{k})")
                        }
                    })
                    .collect();
                pair_args.extend((0..out_types.len()).map(|j| format!("q{j}")));
                let outs: Vec<String> = (0..out_types.len()).map(|j| format!("q{j}")).collect();
                let _ = writeln!(s, "#pragma unroll\n    for (int j = 0; j < N; j += 2) {{");
                let _ = writeln!(s, "      {pair} {};", outs.join(", "));
                let _ = writeln!(s, "      compiled_pair({});", pair_args.join(", "));
                for j in 0..out_types.len() {
                    let _ = writeln!(s, "      r{j}[j] = q{j}.x;\n      r{j}[j + 1] = q{j}.y;");
                }
                s.push_str("    }\n");
            }
            None => {
                let _ = writeln!(
                    s,
                    "#pragma unroll\n    for (int j = 0; j < N; ++j) compiled_element({});",
                    args.join(", ")
                );
            }
        }
        for (j, t) in out_types.iter().enumerate() {
            let _ = writeln!(s, "    cl_store<{t}, N>(out{j}, i, r{j});");
        }
        s.push_str("  }\n  for (u64 i = nvec * N + first; i < n; i += stride) {\n");
        let mut args: Vec<String> = used
            .iter()
            .map(|&k| if arr[k] == InputArrangement::Dense { format!("in{k}[i]") } else { format!("s{k}") })
            .collect();
        for (j, t) in out_types.iter().enumerate() {
            let _ = writeln!(s, "    {t} r{j};");
            args.push(format!("r{j}"));
        }
        let _ = writeln!(s, "    compiled_element({});", args.join(", "));
        for j in 0..out_types.len() {
            let _ = writeln!(s, "    out{j}[i] = r{j};");
        }
        s.push_str("  }\n}\n");
    } else {
        let sizes = used
            .iter()
            .filter(|&&k| arr[k] != InputArrangement::Scalar)
            .map(|&k| p.inputs[k].size())
            .chain(p.outputs.iter().map(|&o| p.dtype(o).size()));
        per_thread = run_elems(sizes);
        sig.push("Dims d".into());
        let _ = writeln!(s, "extern \"C\" __global__ void {bounds}{name}({}) {{", sig.join(", "));
        let _ = writeln!(s, "  constexpr int R = {per_thread};");
        s.push_str(&scalars);
        // `Dims` holds the strided inputs' strides, in input order; dense inputs and the
        // (row-major) outputs sit at the run's element index `i`.
        let _ = writeln!(s, "  for_runs<{strided}, R>(d, n, [&](const i64* off, const i64* st, int cnt, u64 i) {{");
        let mut args = Vec::new();
        for &k in &used {
            let t = ctype(p.inputs[k]);
            let (off, st) = match arr[k] {
                InputArrangement::Scalar => {
                    args.push(format!("s{k}"));
                    continue;
                }
                InputArrangement::Dense => ("(i64)i".to_string(), "1".to_string()),
                InputArrangement::Strided => {
                    // Its slot in `Dims`: the strided inputs before it.
                    let slot = arr[..k].iter().filter(|&&a| a == InputArrangement::Strided).count();
                    (format!("off[{slot}]"), format!("st[{slot}]"))
                }
            };
            let _ = writeln!(s, "    {t} a{k}[R];\n    load_run<{t}, R>(in{k}, {off}, {st}, cnt, a{k});");
            args.push(format!("a{k}[j]"));
        }
        for (j, t) in out_types.iter().enumerate() {
            let _ = writeln!(s, "    {t} r{j}[R];");
            args.push(format!("r{j}[j]"));
        }
        let _ = writeln!(s, "#pragma unroll\n    for (int j = 0; j < R; ++j) compiled_element({});", args.join(", "));
        for (j, t) in out_types.iter().enumerate() {
            let _ = writeln!(s, "    store_run<{t}, R>(out{j}, (i64)i, 1, cnt, r{j});");
        }
        s.push_str("  });\n}\n");
    }
    Ok(Kernel { name, source: s, per_thread, cost: cost(p) })
}

/// The kernel of `program` over `arrangement`, generated once per process (and written to
/// `$NUVEC_COMPILE_DUMP/<name>.cu` when that is set).
fn generated(program: &Program, arrangement: &[InputArrangement]) -> Result<Arc<Kernel>> {
    // By program, then arrangement: a lookup borrows both (it runs on every evaluation), and the
    // program is hashed, not printed (`digest` formats the whole program).
    type Cache = Mutex<HashMap<Program, HashMap<Vec<InputArrangement>, Arc<Kernel>>>>;
    static CACHE: OnceLock<Cache> = OnceLock::new();
    let cache = CACHE.get_or_init(Default::default);
    if let Some(k) = cache.lock().unwrap_or_else(|e| e.into_inner()).get(program).and_then(|m| m.get(arrangement)) {
        return Ok(k.clone());
    }
    let k = Arc::new(generate(program, arrangement)?);
    if let Some(dir) = std::env::var_os("NUVEC_COMPILE_DUMP").filter(|d| !d.is_empty()) {
        // Best effort: a dump that cannot be written must not fail the evaluation.
        let dir = std::path::PathBuf::from(dir);
        let _ = std::fs::create_dir_all(&dir);
        let _ = std::fs::write(dir.join(format!("{}.cu", k.name)), &k.source);
    }
    let mut cache = cache.lock().unwrap_or_else(|e| e.into_inner());
    cache.entry(program.clone()).or_default().insert(arrangement.to_vec(), k.clone());
    Ok(k)
}

/// Whether `x`'s strides equal `strides` on every axis longer than one.
fn same_strides(x: &Operand, strides: &[isize]) -> bool {
    x.shape.iter().zip(x.data.layout.strides.iter().zip(strides)).all(|(&d, (a, b))| d == 1 || a == b)
}

/// Whether `x` is a dense buffer read across its rows (its innermost axis is not the
/// contiguous one): the strided walk would read it a few bytes per row, so it goes through the
/// tiled copy first (as binary.rs's operands do).
fn transposed(x: &Operand) -> bool {
    dense(x) && !scalar_like(x) && !x.data.layout.flags.row_contiguous && x.data.layout.strides.last() != Some(&1)
}

/// The inputs as the kernel reads them, how each is arranged, the outputs' strides and, for
/// the strided kernel, the strided inputs' `Dims`.
struct Plan {
    inputs: Vec<Operand>,
    arrangement: Vec<InputArrangement>,
    out_strides: Strides,
    dims: Option<Dims>,
}

fn plan(gpu: &Arc<Gpu>, inputs: Vec<Operand>, shape: &[i32]) -> Result<Plan> {
    use InputArrangement::*;
    let scalar: Vec<bool> = inputs.iter().map(scalar_like).collect();
    let lead = inputs.iter().zip(&scalar).find(|(_, s)| !**s).map(|(x, _)| x.data.layout.strides.clone());
    // Every input dense in one layout (any axis order), or a scalar: the contiguous kernel,
    // with the outputs in that layout.
    if let Some(lead) = &lead
        && inputs.iter().zip(&scalar).all(|(x, &s)| s || (dense(x) && same_strides(x, lead)))
    {
        let arrangement = scalar.iter().map(|&s| if s { Scalar } else { Dense }).collect();
        return Ok(Plan { inputs, arrangement, out_strides: lead.clone(), dims: None });
    }
    // Otherwise row-major outputs: row-major inputs stay dense, transposed ones are copied, and
    // up to four others are walked in runs.
    let mut plan = Plan {
        inputs: Vec::with_capacity(inputs.len()),
        arrangement: Vec::with_capacity(inputs.len()),
        out_strides: row_major_strides(shape),
        dims: None,
    };
    let mut strided = 0;
    for (x, s) in inputs.into_iter().zip(scalar) {
        let a = if s {
            Scalar
        } else if x.data.layout.flags.row_contiguous {
            Dense
        } else if strided < MAX_STRIDED && !transposed(&x) {
            strided += 1;
            Strided
        } else {
            plan.inputs.push(row_major(gpu, x)?);
            plan.arrangement.push(Dense);
            continue;
        };
        plan.inputs.push(x);
        plan.arrangement.push(a);
    }
    if strided > 0 {
        let strides: Vec<&[isize]> = plan
            .inputs
            .iter()
            .zip(&plan.arrangement)
            .filter(|(_, a)| **a == Strided)
            .map(|(x, _)| &x.data.layout.strides[..])
            .collect();
        // More non-contiguous axes than `Dims` holds: copy them to row-major instead.
        match Dims::new(shape, &strides) {
            Ok(d) => plan.dims = Some(d),
            Err(_) => {
                for k in 0..plan.inputs.len() {
                    if plan.arrangement[k] == Strided {
                        let x = plan.inputs[k].clone();
                        plan.inputs[k] = row_major(gpu, x)?;
                        plan.arrangement[k] = Dense;
                    }
                }
            }
        }
    }
    Ok(plan)
}

/// Runs `compiled` on the GPU: every input has the outputs' shape.
pub(crate) fn eval(gpu: &Arc<Gpu>, compiled: &Compiled, inputs: Vec<Operand>, outputs: &mut [Output]) -> Result<()> {
    let p = &*compiled.0;
    if inputs.len() != p.inputs.len() || outputs.len() != p.outputs.len() {
        return Err(unsupported(format!(
            "the program takes {} inputs and {} outputs, got {} and {}",
            p.inputs.len(),
            p.outputs.len(),
            inputs.len(),
            outputs.len()
        )));
    }
    let Some(shape) = outputs.first().map(|o| o.shape.clone()) else {
        return Err(unsupported("no outputs".into()));
    };
    if let Some(x) = inputs.iter().find(|x| x.shape != shape) {
        return Err(unsupported(format!("an input of shape {:?} beside outputs of shape {:?}", x.shape, shape)));
    }
    // The kernel's pointer types come from the program: operands of other dtypes would be
    // read or written out of bounds.
    let dtypes_match = inputs.iter().zip(&p.inputs).all(|(x, &d)| x.dtype == d)
        && outputs.iter().zip(&p.outputs).all(|(o, &v)| o.shape == shape && o.dtype == p.dtype(v));
    if !dtypes_match {
        return Err(unsupported("operand dtypes or shapes differ from the program's".into()));
    }
    let n = elem_count(&shape);
    if n == 0 {
        for o in outputs.iter_mut() {
            alloc_out(gpu, o)?;
        }
        return Ok(());
    }
    let plan = plan(gpu, inputs, &shape)?;
    let k = generated(p, &plan.arrangement)?;
    let ptrs: Vec<CUdeviceptr> = plan.inputs.iter().map(ptr_of).collect::<Result<_>>()?;

    // Outputs in the planned layout, each in a donated dense input's buffer where one of its
    // dtype is left (the kernel reads an element's inputs before writing its outputs).
    let out_layout = Layout::new(&shape, plan.out_strides.clone(), 0);
    let mut donors: Vec<usize> = (0..plan.inputs.len())
        .filter(|&i| {
            let x = &plan.inputs[i];
            plan.arrangement[i] == InputArrangement::Dense && x.writable() && same_strides(x, &plan.out_strides)
        })
        .collect();
    let mut out_ptrs = Vec::with_capacity(outputs.len());
    for o in outputs.iter_mut() {
        if let Some(at) = donors.iter().position(|&i| plan.inputs[i].dtype == o.dtype) {
            let i = donors.remove(at);
            o.data = Some(plan.inputs[i].data.clone());
            out_ptrs.push(ptrs[i]);
        } else {
            let (ptr, storage) = alloc(gpu, n, o.dtype)?;
            o.data = Some(Data { storage, layout: out_layout.clone() });
            out_ptrs.push(ptr);
        }
    }

    let module = gpu.modules.get(gpu, &k.name, || k.source.clone(), &[])?;
    let function = module.function(&k.name)?;
    let mut args: Vec<Arg> = ptrs.iter().chain(&out_ptrs).map(|&p| Arg::Ptr(p)).collect();
    args.push(Arg::U64(n as u64));
    let per = k.per_thread as u64;
    let cost = match plan.dims {
        Some(d) => {
            args.push(Arg::Dims(Box::new(d)));
            // The capped grid: faster than a run per thread for strided walks.
            Cost::Heavy
        }
        None => {
            let vectors: Vec<CUdeviceptr> = (0..ptrs.len())
                .filter(|&i| plan.arrangement[i] == InputArrangement::Dense)
                .map(|i| ptrs[i])
                .chain(out_ptrs.iter().copied())
                .collect();
            args.push(Arg::U64(if aligned(&vectors) { n as u64 / per } else { 0 }));
            k.cost
        }
    };
    launch_map(gpu, function, n as u64, per, cost, args).map_err(|e| unsupported(format!("{}: {e}", k.name)))?;
    // The row-major copies and the donated inputs stay alive until the launch is queued; later
    // frees are ordered on the stream.
    drop(plan);
    Ok(())
}
