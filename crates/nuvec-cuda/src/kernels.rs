//! The kernel modules: one generated source per (family, dtype), each a list of `extern "C"`
//! wrappers instantiating the templates of `kernels/*.cuh`. Each family's generator lives in
//! the family's module (`unary::source`, `fast::norm::source`, ...); this file names the
//! modules. A module compiles once per device architecture (and is cached on disk);
//! [`all_modules`] lists every one, for the compile check and for warming a cache.

use nuvec_core::DType;

use crate::launch::BLOCK;
use crate::{binary, copy, fast, gather, matmul, quantize, random, reduce, scan, sort, unary};

/// The C type of a dtype in kernel sources: the standard names core's custom-kernel generator
/// uses too (common.cuh typedefs them).
pub fn ctype(d: DType) -> &'static str {
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
        _ => "void",
    }
}

/// A kernel module: which templates, for which dtype. Named after the family module of this
/// crate (and of `kernels/`) that launches it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Family {
    /// Unary maps of one input dtype (`unary`).
    Unary(DType),
    /// Binary maps of one input dtype (`binary`).
    Binary(DType),
    /// Binary maps of a half-precision dtype's operand beside a float32 one, both orders
    /// (`binary`).
    BinaryWidened(DType),
    /// `where` for one value dtype (`binary`).
    Select(DType),
    /// Casts from one dtype to all others (`copy`).
    Cast(DType),
    /// Strided copies of elements of one size: 1, 2, 4 or 8 bytes (`copy`).
    Copy(usize),
    /// `arange` into one dtype (`copy`).
    Arange(DType),
    /// Reductions of one dtype (`reduce`).
    Reduce(DType),
    /// Arg-reductions of one dtype (`reduce`).
    ArgReduce(DType),
    /// Scans of one dtype (`scan`).
    Scan(DType),
    /// The products the backend computes itself (`matmul`): few-row products of a float
    /// dtype, or all products of an integer dtype.
    Matmul(DType),
    /// Gathers and scatters along one axis of one element dtype, for every index dtype
    /// (`gather`).
    Gather(DType),
    /// Sorts and partitions of one dtype (`sort`).
    Sort(DType),
    /// Threefry random bits (`random`).
    Random,
    /// Affine quantize and dequantize of one float dtype (`quantize`).
    Quantize(DType),
    /// Softmax and log-sum-exp rows of one float dtype (`fast::softmax`).
    Softmax(DType),
    /// RMS norm (with the residual add), layer norm and their derivatives (`fast::norm`).
    Norm(DType),
    /// RoPE (`fast::rope`).
    Rope(DType),
    /// SwiGLU and its derivative (`fast::swiglu`).
    Swiglu(DType),
    /// Cross entropy, its derivative and both at once (`fast::cross_entropy`).
    CrossEntropy(DType),
    /// Scaled-dot-product attention (`fast::attention`).
    Attention(DType),
    /// Products with quantized weights of few rows (`fast::quantized_matmul`).
    QuantizedMatmul(DType),
    /// The gated delta rule, for q, k and v of one dtype (`fast::gated_delta`).
    GatedDelta(DType),
    /// Products of matrices picked by index (`fast::gather_mm`).
    GatherMm(DType),
}

impl Family {
    /// The module's name (also its cache key).
    pub fn key(&self) -> String {
        match self {
            Family::Unary(d) => format!("unary_{d}"),
            Family::Binary(d) => format!("binary_{d}"),
            Family::BinaryWidened(d) => format!("binary_widened_{d}"),
            Family::Select(d) => format!("select_{d}"),
            Family::Cast(d) => format!("cast_{d}"),
            Family::Copy(s) => format!("copy_{s}"),
            Family::Arange(d) => format!("arange_{d}"),
            Family::Reduce(d) => format!("reduce_{d}"),
            Family::ArgReduce(d) => format!("argreduce_{d}"),
            Family::Scan(d) => format!("scan_{d}"),
            Family::Matmul(d) => format!("matmul_{d}"),
            Family::Gather(d) => format!("gather_{d}"),
            Family::Sort(d) => format!("sort_{d}"),
            Family::Random => "random".into(),
            Family::Quantize(d) => format!("quantize_{d}"),
            Family::Softmax(d) => format!("softmax_{d}"),
            Family::Norm(d) => format!("norm_{d}"),
            Family::Rope(d) => format!("rope_{d}"),
            Family::Swiglu(d) => format!("swiglu_{d}"),
            Family::CrossEntropy(d) => format!("cross_entropy_{d}"),
            Family::Attention(d) => format!("attention_{d}"),
            Family::QuantizedMatmul(d) => format!("quantized_matmul_{d}"),
            Family::GatedDelta(d) => format!("gated_delta_{d}"),
            Family::GatherMm(d) => format!("gather_mm_{d}"),
        }
    }

    /// The generated source.
    pub fn source(&self) -> String {
        let s = match *self {
            Family::Unary(d) => unary::source(d),
            Family::Binary(d) => binary::source(d),
            Family::BinaryWidened(d) => binary::widened_source(d),
            Family::Select(d) => binary::select_source(d),
            Family::Cast(d) => copy::cast_source(d),
            Family::Copy(size) => copy::source(size),
            Family::Arange(d) => copy::arange_source(d),
            Family::Reduce(d) => reduce::source(d),
            Family::ArgReduce(d) => reduce::arg_source(d),
            Family::Scan(d) => scan::source(d),
            Family::Matmul(d) => matmul::source(d),
            Family::Gather(d) => gather::source(d),
            Family::Sort(d) => sort::source(d),
            Family::Random => random::source(),
            Family::Quantize(d) => quantize::source(d),
            Family::Softmax(d) => fast::softmax::source(d),
            Family::Norm(d) => fast::norm::source(d),
            Family::Rope(d) => fast::rope::source(d),
            Family::Swiglu(d) => fast::swiglu::source(d),
            Family::CrossEntropy(d) => fast::cross_entropy::source(d),
            Family::Attention(d) => fast::attention::source(d),
            Family::QuantizedMatmul(d) => fast::quantized_matmul::source(d),
            Family::GatedDelta(d) => fast::gated_delta::source(d),
            Family::GatherMm(d) => fast::gather_mm::source(d),
        };
        if self.dependent_launch() { s.lines().map(|l| dependent(l) + "\n").collect() } else { s }
    }

    /// Whether the module's kernels begin with `nv_dependent_launch()` (common.cuh), so that
    /// they start as programmatic dependents of the kernel before them (launch.rs): the fused
    /// operations and the ones a decode step is made of besides them (products, element-wise
    /// arithmetic, copies, gathers and scatters, attention), whose launches are a visible
    /// share of their time at LLM shapes.
    pub fn dependent_launch(&self) -> bool {
        matches!(
            self,
            Family::Softmax(_)
                | Family::Norm(_)
                | Family::Rope(_)
                | Family::Swiglu(_)
                | Family::CrossEntropy(_)
                | Family::QuantizedMatmul(_)
                | Family::Matmul(_)
                | Family::Binary(_)
                | Family::Copy(_)
                | Family::Gather(_)
                | Family::Attention(_)
                | Family::GatedDelta(_)
                | Family::GatherMm(_)
        )
    }
}

/// A module's source being written: its includes, then one `extern "C" __global__ void` line
/// per kernel.
pub(crate) struct Source(String);

impl Source {
    /// A source including the `kernels/` headers `headers`, after the definitions of
    /// `NUVEC_KERNEL_DEFINES` (`NAME=VALUE,...`: the headers' `#ifndef` tuning parameters, such
    /// as `NV_GEMV_ROW_LOADS=16`, set for an experiment without a rebuild).
    pub(crate) fn new(headers: &[&str]) -> Source {
        let defines = std::env::var("NUVEC_KERNEL_DEFINES").unwrap_or_default();
        let defines = defines.split(',').filter_map(|d| d.split_once('=')).map(|(k, v)| format!("#define {k} {v}\n"));
        Source(defines.chain(headers.iter().map(|h| format!("#include \"{h}\"\n"))).collect())
    }

    /// Adds the kernel `signature_and_body` (what follows `extern "C" __global__ void `).
    pub(crate) fn kernel(&mut self, signature_and_body: impl AsRef<str>) {
        self.0.push_str("extern \"C\" __global__ void ");
        self.0.push_str(signature_and_body.as_ref());
        self.0.push('\n');
    }

    /// Adds a contiguous map kernel, `bounded` to eight 256-thread blocks per SM (at most 32
    /// registers) when it is launched light (a thread per vector): such a kernel lives on the
    /// loads it keeps in flight, so every thread slot must stay usable. Kernels whose maths
    /// needs more registers (they would spill) are not bounded.
    pub(crate) fn map_kernel(&mut self, bounded: bool, signature_and_body: impl AsRef<str>) {
        let bounds = if bounded { format!("__launch_bounds__({BLOCK}, 8) ") } else { String::new() };
        self.kernel(format!("{bounds}{}", signature_and_body.as_ref()));
    }

    /// The finished source.
    pub(crate) fn finish(self) -> String {
        self.0
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
    for d in DType::ALL {
        v.extend([Family::Unary(d), Family::Binary(d), Family::Cast(d), Family::Select(d), Family::Reduce(d)]);
        if d != DType::Complex64 {
            v.extend([Family::ArgReduce(d), Family::Scan(d)]);
        }
        if d != DType::Complex64 && d != DType::Bool {
            v.push(Family::Arange(d));
        }
        if d.is_half() {
            v.push(Family::BinaryWidened(d));
        }
        if d.is_float() {
            v.extend([
                Family::Softmax(d),
                Family::Norm(d),
                Family::Rope(d),
                Family::Swiglu(d),
                Family::CrossEntropy(d),
            ]);
        }
        if matches!(d, DType::F32 | DType::F16 | DType::BF16) {
            v.extend([Family::Attention(d), Family::QuantizedMatmul(d), Family::GatedDelta(d), Family::GatherMm(d)]);
        }
        if matmul::has_kernels(d) {
            v.push(Family::Matmul(d));
        }
        v.push(Family::Sort(d));
        if quantize::KERNEL_DTYPES.contains(&d) {
            v.push(Family::Quantize(d));
        }
    }
    v.extend([1, 2, 4, 8].map(Family::Copy));
    v.push(Family::Random);
    v.extend(DType::ALL.into_iter().map(Family::Gather));
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dependent_kernels_wait_for_the_kernel_before_them() {
        // launch.rs may start any kernel of a dependent module before the previous one has
        // finished: each must wait first thing.
        let mut count = 0;
        for family in all_modules().into_iter().filter(Family::dependent_launch) {
            let source = family.source();
            let kernels: Vec<&str> = source.lines().filter(|l| l.starts_with("extern \"C\" __global__")).collect();
            assert!(!kernels.is_empty(), "{}", family.key());
            // Every kernel is defined on one line, so the rewrite saw it.
            assert_eq!(source.matches("__global__").count(), kernels.len(), "{}", family.key());
            count += kernels.len();
            for k in kernels {
                let body = &k[k.find(") { ").expect("a kernel body") + 4..];
                assert!(body.starts_with("nv_dependent_launch(); "), "{k}");
            }
        }
        assert!(count > 100, "{count}");
        // The headers those modules include define no kernels of their own (which would not
        // wait): only random.cuh does, and its module is not dependent.
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("kernels");
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            let text = std::fs::read_to_string(&path).unwrap();
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            assert_eq!(text.contains("__global__"), name == "random.cuh", "{name}");
        }
        assert!(!Family::Random.dependent_launch());
        assert!(!Family::Unary(DType::F32).dependent_launch());
        assert!(!Family::Unary(DType::F32).source().contains("nv_dependent_launch"));
    }

    #[test]
    fn module_keys_are_unique() {
        let keys: std::collections::HashSet<String> = all_modules().iter().map(|m| m.key()).collect();
        assert_eq!(keys.len(), all_modules().len());
    }

    #[test]
    fn generated_wrappers_use_the_standard_type_names() {
        let source = Family::Binary(DType::U8).source();
        assert!(source.contains("binary_add_c(const uint8_t* a, const uint8_t* b, uint8_t* out"));
        assert!(source.contains("binary_equal_s(const uint8_t* a, const uint8_t* b, bool* out"));
        assert!(Family::Unary(DType::Complex64).source().contains("const complex64_t* x"));
        // Every unary and binary op of core has its kernels where the backend says it does.
        for d in DType::ALL {
            let (u, b) = (Family::Unary(d).source(), Family::Binary(d).source());
            for op in nuvec_core::primitive::UnaryOp::ALL {
                let name = format!(" unary_{}_c(", op.name());
                assert_eq!(u.contains(&name), unary::functor(op, d).is_some(), "{name} {d}");
            }
            for op in nuvec_core::primitive::BinaryOp::ALL {
                let name = format!(" binary_{}_c(", op.name());
                assert_eq!(b.contains(&name), binary::has_binary(op, d), "{name} {d}");
            }
        }
    }

    #[test]
    fn every_real_unary_op_core_sends_has_a_kernel() {
        // Core sends a unary op with its input in the compute dtype; a missing functor would fall
        // back to the CPU silently (only some complex functions do, by design).
        for d in DType::ALL.into_iter().filter(|&d| d != DType::Complex64) {
            for op in nuvec_core::primitive::UnaryOp::ALL {
                if op.compute_dtype(d) == Some(d) && !op.is_identity_for(d) {
                    assert!(unary::functor(op, d).is_some(), "{} on {d} has no kernel", op.name());
                }
            }
        }
    }
}
