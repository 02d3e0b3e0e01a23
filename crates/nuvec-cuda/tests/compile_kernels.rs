//! Every kernel module compiles with NVRTC for sm_90a (and its front end for compute_90) — no GPU needed. CI installs
//! NVRTC and the CUDA headers from NVIDIA's wheels and sets `NUVEC_REQUIRE_NVRTC=1`, so a kernel
//! that does not compile cannot land; elsewhere the test reports why it did not run.

fn nvrtc_or_skip() -> bool {
    match nuvec_cuda::compile::nvrtc_version().and_then(|_| nuvec_cuda::compile::cuda_include_dirs()) {
        Ok(_) => true,
        Err(e) => {
            assert!(
                std::env::var("NUVEC_REQUIRE_NVRTC").as_deref() != Ok("1"),
                "NUVEC_REQUIRE_NVRTC=1 but NVRTC is unusable: {e}"
            );
            progress(&format!("SKIPPED {}: NVRTC is unusable: {e}", std::thread::current().name().unwrap_or("a test")));
            false
        }
    }
}

#[test]
fn every_module_compiles_for_hopper() {
    if !nvrtc_or_skip() {
        return;
    }
    // Compile without the disk cache so a stale entry cannot hide an error; one job per core,
    // the largest sources first so the cores finish together. Hopper runs sm_90a machine code
    // (compile.rs `arch_for`), built here in full; `compute_90` checks that every kernel also
    // compiles without the sm_90a-only features (front end only: the machine code would repeat
    // sm_90a's). NUVEC_COMPILE_FILTER=norm_bfloat16 (a part of the module key) compiles only
    // those while working on a kernel.
    let filter = std::env::var("NUVEC_COMPILE_FILTER").ok();
    let mut modules: Vec<(String, String)> =
        nuvec_cuda::kernels::all_modules().iter().map(|m| (m.key(), m.source())).collect();
    modules.retain(|(key, _)| filter.as_deref().is_none_or(|f| key.contains(f)));
    let mut jobs: Vec<(&str, &(String, String))> =
        ["sm_90a", "compute_90"].iter().flat_map(|a| modules.iter().map(move |m| (*a, m))).collect();
    jobs.sort_by_key(|(arch, (_, source))| {
        std::cmp::Reverse(source.len() * if arch.starts_with("sm_") { 2 } else { 1 })
    });
    let next = std::sync::atomic::AtomicUsize::new(0);
    let done = std::sync::atomic::AtomicUsize::new(0);
    let failures = std::sync::Mutex::new(Vec::new());
    let threads = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(2);
    let start = std::time::Instant::now();
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| {
                while let Some((arch, (key, source))) =
                    jobs.get(next.fetch_add(1, std::sync::atomic::Ordering::Relaxed))
                {
                    if let Err(e) = nuvec_cuda::compile::compile_cubin(source, key, arch, &[]) {
                        failures.lock().unwrap().push(format!("{key} ({arch}):\n{e}"));
                    }
                    let n = done.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
                    if n.is_multiple_of(25) || n == jobs.len() {
                        progress(&format!(
                            "compile_kernels: {n}/{} compiled, {:.0} s",
                            jobs.len(),
                            start.elapsed().as_secs_f64()
                        ));
                    }
                }
            });
        }
    });
    let failures = failures.into_inner().unwrap();
    assert!(failures.is_empty(), "{} modules do not compile:\n{}", failures.len(), failures.join("\n"));
    assert!(filter.is_some() || modules.len() > 50, "only {} modules", modules.len());
}

/// A progress line on the terminal even while libtest captures the test's output (it captures
/// `print!`/`eprint!`, not writes to the stderr handle).
fn progress(line: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "{line}");
}

#[test]
fn compile_errors_carry_the_nvrtc_log() {
    if !nvrtc_or_skip() {
        return;
    }
    let err = nuvec_cuda::compile::compile_cubin(
        "extern \"C\" __global__ void k() { undefined_thing(); }",
        "bad",
        "sm_90",
        &[],
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("undefined_thing"), "{err}");
}

// The generated kernels of compiled programs (`Primitive::Compiled`): float32, bfloat16 beside
// float32, int32, float64 and complex64 programs over dense, scalar and strided inputs.
#[test]
fn compiled_programs_compile_for_hopper() {
    use nuvec_core::DType::*;
    use nuvec_core::primitive::compiled::{Program, Step};
    use nuvec_core::primitive::{BinaryOp as B, UnaryOp as U};
    use nuvec_cuda::InputArrangement::{Dense, Scalar, Strided};

    // A float32 chain of ten steps: products, transcendental functions, `where`, casts.
    let chain = Program {
        inputs: vec![F32, F32, Bool],
        steps: vec![
            (Step::Binary(B::Multiply, 0, 1), F32),
            (Step::Binary(B::Add, 3, 0), F32),
            (Step::Unary(U::Exp, 4), F32),
            (Step::Unary(U::Tanh, 5), F32),
            (Step::Unary(U::Sigmoid, 6), F32),
            (Step::Select(2, 7, 3), F32),
            (Step::Unary(U::Square, 8), F32),
            (Step::AsType(BF16, 9), BF16),
            (Step::AsType(F32, 10), F32),
            (Step::Binary(B::Subtract, 11, 1), F32),
        ],
        outputs: vec![12],
    };
    // bfloat16 beside float32 (a widened pair), casts, a predicate; two outputs.
    let half = Program {
        inputs: vec![BF16, F32],
        steps: vec![
            (Step::Binary(B::Multiply, 0, 1), F32),
            (Step::Binary(B::Maximum, 1, 0), F32),
            (Step::AsType(BF16, 2), BF16),
            (Step::Unary(U::Exp, 4), BF16),
            (Step::Binary(B::Add, 5, 0), BF16),
            (Step::Binary(B::Less, 6, 0), Bool),
            (Step::Binary(B::Divide, 3, 2), F32),
        ],
        outputs: vec![6, 7, 8],
    };
    let int = Program {
        inputs: vec![I32, I32],
        steps: vec![
            (Step::Binary(B::Add, 0, 1), I32),
            (Step::Binary(B::Multiply, 2, 0), I32),
            (Step::Binary(B::FloorDivide, 3, 1), I32),
            (Step::Binary(B::Remainder, 3, 1), I32),
            (Step::Binary(B::BitwiseXor, 4, 5), I32),
            (Step::Binary(B::LeftShift, 6, 1), I32),
            (Step::Binary(B::Greater, 7, 0), Bool),
            (Step::Select(8, 6, 5), I32),
            (Step::Unary(U::Negative, 9), I32),
            (Step::AsType(F32, 10), F32),
        ],
        outputs: vec![10, 11],
    };
    // A broadcast scalar (input 1) and two outputs, one of them an input.
    let scalar = Program {
        inputs: vec![F32, F32],
        steps: vec![(Step::Binary(B::Multiply, 0, 1), F32), (Step::Binary(B::Add, 2, 1), F32)],
        outputs: vec![3, 0],
    };
    let wide = Program {
        inputs: vec![F64, Complex64],
        steps: vec![
            (Step::Unary(U::Square, 0), F64),
            (Step::Unary(U::Log1p, 2), F64),
            (Step::Unary(U::Exp, 1), Complex64),
            (Step::Binary(B::Multiply, 4, 1), Complex64),
            (Step::Unary(U::Abs, 5), F32),
            (Step::AsType(F64, 6), F64),
            (Step::Binary(B::Power, 3, 7), F64),
        ],
        outputs: vec![8, 5],
    };
    // Half-precision "widen, compute, round" steps only: run on pairs of elements.
    let pairs = |d| Program {
        inputs: vec![d, d],
        steps: vec![
            (Step::Binary(B::Multiply, 0, 1), d),
            (Step::Unary(U::Tanh, 2), d),
            (Step::Binary(B::Add, 3, 0), d),
            (Step::Binary(B::Maximum, 4, 1), d),
        ],
        outputs: vec![5, 3],
    };
    let (pairs_bf16, pairs_f16) = (pairs(BF16), pairs(F16));
    let cases: Vec<(&Program, Vec<nuvec_cuda::InputArrangement>)> = vec![
        (&chain, vec![Dense, Dense, Dense]),
        (&chain, vec![Dense, Scalar, Strided]),
        (&half, vec![Dense, Dense]),
        (&half, vec![Strided, Scalar]),
        (&int, vec![Dense, Scalar]),
        (&int, vec![Strided, Strided]),
        (&scalar, vec![Dense, Scalar]),
        (&scalar, vec![Scalar, Scalar]),
        (&wide, vec![Dense, Dense]),
        (&wide, vec![Strided, Dense]),
        (&pairs_bf16, vec![Dense, Scalar]),
        (&pairs_f16, vec![Dense, Dense]),
    ];
    let mut sources = Vec::new();
    for (program, arrangement) in &cases {
        program.validate().unwrap_or_else(|e| panic!("invalid test program {program}: {e:?}"));
        let source = nuvec_cuda::generate_compiled_kernel(program, arrangement).unwrap();
        let letters: String = arrangement
            .iter()
            .map(|a| match a {
                Dense => 'd',
                Scalar => 's',
                Strided => 'r',
            })
            .collect();
        let name = format!("compiled_{:016x}_{letters}", program.digest());
        assert!(source.contains(&format!(" {name}(")), "the entry point is {name}:\n{source}");
        sources.push((name, source));
    }
    // The numerics rule in the source: float32 products round on their own, and a float32 value
    // a later step reads passes the barrier when a libdevice function made it (exp, tanh and
    // sigmoid here, not the sums, products, selects and casts); half-precision values need none.
    let chain_src = &sources[0].1;
    assert!(chain_src.contains("__fmul_rn(v0, v1)") && chain_src.contains("__fmul_rn(v8, v8)"), "{chain_src}");
    assert_eq!(chain_src.matches("= cl_round(").count(), 3, "{chain_src}");
    for k in [5, 6, 7] {
        assert!(chain_src.contains(&format!("v{k} = cl_round(x{k})")), "{chain_src}");
    }
    assert!(sources[2].1.contains("__fmul_rn(convert<float, __nv_bfloat16>(v0), v1)"), "{}", sources[2].1);
    assert!(!sources[4].1.contains("cl_round(x"), "{}", sources[4].1);
    // Half-precision programs of such steps also run on pairs, rounded two at a time; with a
    // cast or a widened pair (`half` above) they do not.
    for (i, round) in [(10, "__floats2bfloat162_rn("), (11, "__floats2half2_rn(")] {
        let src = &sources[i].1;
        assert!(src.contains("compiled_pair(") && src.matches(round).count() == 4, "{src}");
    }
    assert!(!sources[2].1.contains("compiled_pair("), "{}", sources[2].1);
    assert!(sources[8].1.contains("__dmul_rn(v0, v0)"), "{}", sources[8].1);
    // A step no kernel covers is an error naming `compiled`, not a panic.
    let floor_int = Program { inputs: vec![I32], steps: vec![(Step::Unary(U::Floor, 0), I32)], outputs: vec![1] };
    let err = nuvec_cuda::generate_compiled_kernel(&floor_int, &[Dense]).unwrap_err().to_string();
    assert!(err.contains("compiled") && err.contains("floor"), "{err}");
    assert!(nuvec_cuda::generate_compiled_kernel(&scalar, &[Dense]).is_err());

    if !nvrtc_or_skip() {
        return;
    }
    // One at a time: ten small sources.
    let failures: Vec<String> = sources
        .iter()
        .filter_map(|(name, source)| {
            nuvec_cuda::compile::compile_cubin(source, name, "sm_90", &[])
                .err()
                .map(|e| format!("{name}:\n{e}\n{source}"))
        })
        .collect();
    assert!(failures.is_empty(), "{} compiled kernels do not compile:\n{}", failures.len(), failures.join("\n"));
}
