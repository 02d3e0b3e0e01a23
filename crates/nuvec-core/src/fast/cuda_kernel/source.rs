//! Source generation for custom CUDA kernels: the kernel signature derived from the inputs,
//! outputs, template arguments and what the body mentions. Pure string work, so it is tested
//! without a GPU or NVRTC.

use crate::dtype::DType;
use crate::storage::Spec;

use super::TemplateArg;

/// The header every generated source includes (shipped by the CUDA backend): MLX's type names,
/// `Shape`/`Strides`, `elem_to_loc`, warp reductions and mixed half/integer arithmetic.
pub const PRELUDE_HEADER: &str = "nuvec_custom_kernel.cuh";

/// Most axes `Shape` and `Strides` hold (`MAX_NDIM` of the prelude).
pub const MAX_NDIM: usize = 10;

/// How one input is passed to the kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct InputParams {
    /// A 0-d input, passed by value instead of by pointer.
    pub by_value: bool,
    /// `name_shape` follows the input (a `Shape` by value).
    pub shape: bool,
    /// `name_strides` follows (a `Strides` by value, in elements).
    pub strides: bool,
    /// `name_ndim` follows (an `int`).
    pub ndim: bool,
}

/// A generated kernel: its entry point, its full source and the parameters it takes.
#[derive(Clone, Debug, PartialEq)]
pub struct GeneratedKernel {
    /// The `extern "C"` kernel name: `custom_kernel_<name>` plus one suffix per template
    /// argument (`_3`, `_t`/`_f`, `_float16_t`).
    pub entry: String,
    /// The compiled-module key: the entry and a hash of the source. Equal sources share one
    /// compiled module.
    pub key: String,
    /// The complete CUDA C++ source (it includes [`PRELUDE_HEADER`]).
    pub source: String,
    /// How each input is passed, in order.
    pub inputs: Vec<InputParams>,
}

/// The CUDA type of a dtype in generated signatures (MLX's table).
pub fn cuda_type(d: DType) -> &'static str {
    match d {
        DType::Bool => "bool",
        DType::U8 => "uint8_t",
        DType::U16 => "uint16_t",
        DType::U32 => "uint32_t",
        DType::U64 => "uint64_t",
        DType::I8 => "int8_t",
        DType::I16 => "int16_t",
        DType::I32 => "int32_t",
        DType::I64 => "int64_t",
        DType::F16 => "__half",
        DType::BF16 => "__nv_bfloat16",
        DType::F32 => "float",
        DType::F64 => "double",
        DType::Complex64 => "complex64_t",
    }
}

/// The MLX type name used in kernel-name suffixes (`float16_t` rather than `__half`).
fn type_name(d: DType) -> &'static str {
    match d {
        DType::F16 => "float16_t",
        DType::BF16 => "bfloat16_t",
        d => cuda_type(d),
    }
}

fn is_ident_char(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'_'
}

/// Whether `s` is a C identifier.
pub fn is_identifier(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty() && !b[0].is_ascii_digit() && b.iter().all(|&c| is_ident_char(c))
}

/// Whether `word` occurs in `text` as a whole identifier (so the input `x` does not pick up
/// `max_shape`).
pub fn mentions(text: &str, word: &str) -> bool {
    let (t, w) = (text.as_bytes(), word.len());
    let mut from = 0;
    while let Some(pos) = text[from..].find(word) {
        let at = from + pos;
        let before = at == 0 || !is_ident_char(t[at - 1]);
        let after = at + w >= t.len() || !is_ident_char(t[at + w]);
        if before && after {
            return true;
        }
        from = at + 1;
    }
    false
}

/// The kernel-name suffix of one template argument.
fn suffix(arg: &TemplateArg) -> String {
    match arg {
        TemplateArg::Int(v) if *v < 0 => format!("_n{}", v.unsigned_abs()),
        TemplateArg::Int(v) => format!("_{v}"),
        TemplateArg::Bool(b) => (if *b { "_t" } else { "_f" }).to_string(),
        TemplateArg::DType(d) => format!("_{}", type_name(*d)),
    }
}

/// A 64-bit FNV-1a hash (stable across builds and platforms).
fn fnv1a(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        h ^= b as u64;
        h = h.wrapping_mul(0x100_0000_01b3);
    }
    h
}

/// What a kernel is generated from. Names are assumed validated (C identifiers).
pub struct KernelText<'a> {
    /// The kernel's name.
    pub name: &'a str,
    /// Input names, in order.
    pub input_names: &'a [String],
    /// Output names, in order.
    pub output_names: &'a [String],
    /// The body.
    pub source: &'a str,
    /// Code placed before the kernel (helpers, includes).
    pub header: &'a str,
}

/// Generates the kernel for inputs and outputs of these shapes and dtypes (only the input
/// ranks and the dtypes matter) and these template arguments.
pub fn generate(
    text: &KernelText<'_>,
    inputs: &[Spec],
    output_dtypes: &[DType],
    template: &[(String, TemplateArg)],
) -> GeneratedKernel {
    let entry = format!("custom_kernel_{}{}", text.name, template.iter().map(|(_, a)| suffix(a)).collect::<String>());
    let mut params = Vec::with_capacity(inputs.len());
    let mut sig: Vec<String> = Vec::new();
    for (name, spec) in text.input_names.iter().zip(inputs) {
        let t = cuda_type(spec.dtype);
        let mut p = InputParams { by_value: spec.shape.is_empty(), ..Default::default() };
        if p.by_value {
            sig.push(format!("const {t} {name}"));
        } else {
            sig.push(format!("const {t}* __restrict__ {name}"));
            p.shape = mentions(text.source, &format!("{name}_shape"));
            p.strides = mentions(text.source, &format!("{name}_strides"));
            p.ndim = mentions(text.source, &format!("{name}_ndim"));
            if p.shape {
                sig.push(format!("const __grid_constant__ Shape {name}_shape"));
            }
            if p.strides {
                sig.push(format!("const __grid_constant__ Strides {name}_strides"));
            }
            if p.ndim {
                sig.push(format!("const int {name}_ndim"));
            }
        }
        params.push(p);
    }
    for (name, d) in text.output_names.iter().zip(output_dtypes) {
        sig.push(format!("{}* {name}", cuda_type(*d)));
    }

    let mut out = String::new();
    out.push_str(&format!("// Generated by nuvec for the custom kernel `{}`.\n", text.name));
    out.push_str(&format!("#include \"{PRELUDE_HEADER}\"\n"));
    // `#line` makes NVRTC report errors at the user's own line numbers, per file.
    if !text.header.is_empty() {
        out.push_str(&format!("#line 1 \"{}.header\"\n", text.name));
        out.push_str(text.header);
        if !text.header.ends_with('\n') {
            out.push('\n');
        }
        let next = out.lines().count() + 2;
        out.push_str(&format!("#line {next} \"{entry}.cu\"\n"));
    }
    out.push_str(&format!("extern \"C\" __global__ void {entry}(\n    {}) {{\n", sig.join(",\n    ")));
    for (name, arg) in template {
        match arg {
            TemplateArg::Int(v) => out.push_str(&format!("  constexpr int {name} = {v};\n")),
            TemplateArg::Bool(b) => out.push_str(&format!("  constexpr bool {name} = {b};\n")),
            TemplateArg::DType(d) => out.push_str(&format!("  using {name} = {};\n", cuda_type(*d))),
        }
    }
    out.push_str(&format!("#line 1 \"{}.source\"\n", text.name));
    out.push_str(text.source);
    if !text.source.ends_with('\n') {
        out.push('\n');
    }
    out.push_str("}\n");
    let key = format!("{entry}_{:016x}", fnv1a(out.as_bytes()));
    GeneratedKernel { entry, key, source: out, inputs: params }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(shape: &[i32], dtype: DType) -> Spec {
        Spec { shape: shape.into(), dtype }
    }

    fn names(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn scale_signature() {
        let (i, o) = (names(&["inp"]), names(&["out"]));
        let body = "uint i = threadIdx.x + blockIdx.x * blockDim.x;\nout[i] = static_cast<T>(inp[i] * N);";
        let text = KernelText { name: "scale", input_names: &i, output_names: &o, source: body, header: "" };
        let template = vec![("T".to_string(), TemplateArg::DType(DType::F16)), ("N".to_string(), TemplateArg::Int(3))];
        let g = generate(&text, &[spec(&[1024], DType::F16)], &[DType::F16], &template);
        assert_eq!(g.entry, "custom_kernel_scale_float16_t_3");
        assert!(g.source.contains("const __half* __restrict__ inp,\n    __half* out)"), "{}", g.source);
        assert!(g.source.contains("  using T = __half;\n  constexpr int N = 3;\n#line 1 \"scale.source\"\n"));
        assert!(!g.source.contains("inp_shape"));
        assert_eq!(g.inputs, vec![InputParams::default()]);
        assert!(g.key.starts_with("custom_kernel_scale_float16_t_3_"));
    }

    #[test]
    fn shape_strides_ndim_only_when_mentioned() {
        let (i, o) = (names(&["a", "b", "s"]), names(&["y"]));
        let body = "y[0] = a[elem_to_loc(0, a_shape.data(), a_strides.data(), a_ndim)] + b_ndim + s; // max_shape";
        let text = KernelText { name: "k", input_names: &i, output_names: &o, source: body, header: "" };
        let g = generate(
            &text,
            &[spec(&[2, 3], DType::F32), spec(&[4], DType::I32), spec(&[], DType::F32)],
            &[DType::F32],
            &[],
        );
        let want = "const float* __restrict__ a,\n    const __grid_constant__ Shape a_shape,\n    \
                    const __grid_constant__ Strides a_strides,\n    const int a_ndim,\n    \
                    const int32_t* __restrict__ b,\n    const int b_ndim,\n    const float s,\n    float* y)";
        assert!(g.source.contains(want), "{}", g.source);
        assert_eq!(
            g.inputs,
            vec![
                InputParams { by_value: false, shape: true, strides: true, ndim: true },
                InputParams { by_value: false, shape: false, strides: false, ndim: true },
                InputParams { by_value: true, ..Default::default() },
            ]
        );
    }

    #[test]
    fn mentions_whole_identifiers_only() {
        assert!(mentions("x_shape[0]", "x_shape"));
        assert!(mentions("a + x_shape", "x_shape"));
        assert!(!mentions("max_shape", "x_shape"));
        assert!(!mentions("x_shapes", "x_shape"));
        assert!(mentions("max_shape + x_shape", "x_shape"));
    }

    #[test]
    fn template_suffixes_and_values() {
        let (i, o) = (names(&[]), names(&["o"]));
        let text = KernelText { name: "t", input_names: &i, output_names: &o, source: "o[0] = B ? V : 0;", header: "" };
        let template = vec![
            ("V".to_string(), TemplateArg::Int(-2)),
            ("B".to_string(), TemplateArg::Bool(true)),
            ("F".to_string(), TemplateArg::Bool(false)),
            ("U".to_string(), TemplateArg::DType(DType::BF16)),
        ];
        let g = generate(&text, &[], &[DType::I64], &template);
        assert_eq!(g.entry, "custom_kernel_t_n2_t_f_bfloat16_t");
        for line in [
            "constexpr int V = -2;",
            "constexpr bool B = true;",
            "constexpr bool F = false;",
            "using U = __nv_bfloat16;",
        ] {
            assert!(g.source.contains(line), "{line} missing in {}", g.source);
        }
        assert!(g.source.contains("(\n    int64_t* o)"));
    }

    #[test]
    fn header_and_line_directives() {
        let (i, o) = (names(&["x"]), names(&["y"]));
        let header = "__device__ float twice(float v) { return 2 * v; }\n";
        let text = KernelText { name: "h", input_names: &i, output_names: &o, source: "y[0] = twice(x[0]);", header };
        let g = generate(&text, &[spec(&[1], DType::F32)], &[DType::F32], &[]);
        let lines: Vec<&str> = g.source.lines().collect();
        let h = lines.iter().position(|l| *l == "#line 1 \"h.header\"").unwrap();
        assert_eq!(lines[h + 1], header.trim_end());
        // The directive after the header names the real line of the next line.
        let (n, file) = lines[h + 2].strip_prefix("#line ").unwrap().split_once(' ').unwrap();
        assert_eq!(n.parse::<usize>().unwrap(), h + 4);
        assert_eq!(file, format!("\"{}.cu\"", g.entry));
        let s = lines.iter().position(|l| *l == "#line 1 \"h.source\"").unwrap();
        assert_eq!(lines[s + 1], "y[0] = twice(x[0]);");
    }

    #[test]
    fn keys_follow_the_source() {
        let (i, o) = (names(&["x"]), names(&["y"]));
        let text = KernelText { name: "k", input_names: &i, output_names: &o, source: "y[0] = x[0];", header: "" };
        let a = generate(&text, &[spec(&[1], DType::F32)], &[DType::F32], &[]);
        let b = generate(&text, &[spec(&[7], DType::F32)], &[DType::F32], &[]);
        let c = generate(&text, &[spec(&[1], DType::F64)], &[DType::F32], &[]);
        assert_eq!(a.key, b.key, "shapes do not change the source");
        assert_ne!(a.key, c.key, "dtypes do");
        assert_eq!(a.entry, c.entry);
    }

    #[test]
    fn identifiers() {
        assert!(is_identifier("inp_1") && is_identifier("_x"));
        assert!(!is_identifier("") && !is_identifier("1x") && !is_identifier("a-b") && !is_identifier("a b"));
    }
}
