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
