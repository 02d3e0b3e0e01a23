//! Every kernel module compiles with NVRTC for sm_90 and sm_90a — no GPU needed. CI installs
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
            eprintln!("skipped: {e}");
            false
        }
    }
}

#[test]
fn every_module_compiles_for_hopper() {
    if !nvrtc_or_skip() {
        return;
    }
    // Compile without the disk cache so a stale entry cannot hide an error; one job per core.
    // NUVEC_COMPILE_FILTER=fast_bf16 (a part of the module key) compiles only those while
    // working on a kernel.
    let filter = std::env::var("NUVEC_COMPILE_FILTER").ok();
    let mut modules = nuvec_cuda::kernels::all_modules();
    modules.retain(|m| filter.as_deref().is_none_or(|f| m.key().contains(f)));
    let jobs: Vec<(&str, &nuvec_cuda::kernels::Family)> =
        ["sm_90", "sm_90a"].iter().flat_map(|a| modules.iter().map(move |m| (*a, m))).collect();
    let next = std::sync::atomic::AtomicUsize::new(0);
    let failures = std::sync::Mutex::new(Vec::new());
    let threads = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(2);
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| {
                while let Some((arch, m)) = jobs.get(next.fetch_add(1, std::sync::atomic::Ordering::Relaxed)) {
                    if let Err(e) = nuvec_cuda::compile::compile_cubin(&m.source(), &m.key(), arch, &[]) {
                        failures.lock().unwrap().push(format!("{} ({arch}):\n{e}", m.key()));
                    }
                }
            });
        }
    });
    let failures = failures.into_inner().unwrap();
    assert!(failures.is_empty(), "{} modules do not compile:\n{}", failures.len(), failures.join("\n"));
    assert!(filter.is_some() || modules.len() > 50, "only {} modules", modules.len());
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
