//! Precompiles every CUDA kernel module with NVRTC into the on-disk kernel cache, so binaries
//! taken to a GPU machine load their kernels instead of compiling them. Needs NVRTC and the
//! CUDA headers, not a GPU.
//!
//! ```text
//! NUVEC_KERNEL_CACHE=target/gpu-kcache cargo run --release -p nuvec --example precompile_kernels -- sm_90a --export .gpu/kcache
//! ```
//!
//! The cache key holds NVRTC's major.minor version (printed here), so the cache serves a
//! machine with the same NVRTC version. `--export DIR` copies just the current modules' files.

use std::path::PathBuf;
use std::time::Instant;

fn main() {
    let mut arch = "sm_90a".to_string();
    let mut export_to: Option<PathBuf> = None;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--export" => export_to = args.next().map(PathBuf::from),
            _ => arch = a,
        }
    }
    let fail = |msg: String| -> ! {
        eprintln!("precompile_kernels: {msg}");
        std::process::exit(1)
    };
    let version = nuvec_cuda::compile::nvrtc_version().unwrap_or_else(|e| fail(format!("NVRTC is unusable: {e}")));
    let cache = nuvec_cuda::compile::cache_dir()
        .unwrap_or_else(|| fail("the kernel cache is disabled (NUVEC_KERNEL_CACHE is empty or 0)".into()));
    println!("NVRTC {}.{}, arch {arch}, cache {}", version.0, version.1, cache.display());
    let started = Instant::now();
    let n = nuvec::cuda::compile_all(&arch).unwrap_or_else(|e| fail(e.to_string()));
    println!("{n} modules for {arch} in {:.1} s", started.elapsed().as_secs_f64());
    if let Some(dest) = export_to {
        std::fs::create_dir_all(&dest).unwrap_or_else(|e| fail(format!("cannot create {}: {e}", dest.display())));
        let mut bytes = 0;
        for m in nuvec_cuda::kernels::all_modules() {
            let file =
                nuvec_cuda::compile::cache_file_name(&m.source(), &arch, &[]).unwrap_or_else(|e| fail(e.to_string()));
            bytes += std::fs::copy(cache.join(&file), dest.join(&file))
                .unwrap_or_else(|e| fail(format!("cannot copy {file}: {e}")));
        }
        println!("exported {n} modules ({:.1} MiB) to {}", bytes as f64 / (1 << 20) as f64, dest.display());
    }
}
