//! nuvec's integration tests, one binary for all of them: each module was its own test target,
//! but every target links the whole library (~50 MB each in release), so two dozen of them cost
//! gigabytes of disk and most of CI's link time.
//!
//! Run one module with a filter: `cargo test -p nuvec --release --test suite -- mlx_sort::`.

mod attention;
mod compile;
mod conv_einsum;
mod cuda_kernel;
mod errors;
mod eval;
mod fast_ops;
mod first_hour;
mod fixture;
mod fuzz_ops;
mod gated_delta;
mod gather;
mod gpu;
mod memory;
mod metal_kernel;
mod metal_kernel_mlx_lm;
mod mlx_attention;
mod mlx_conv;
mod mlx_fast;
mod mlx_fixtures;
mod mlx_gather;
mod mlx_quant;
mod mlx_random;
mod mlx_sort;
mod mlx_transforms;
mod paged;
mod printing;
mod quant;
mod random;
mod reference_f64;
mod smoke;
mod sort;
mod transforms;
mod transforms_ops;

/// xorshift64*, seeded so failures reproduce. Modules add the draws they need in their own
/// `impl Rng` blocks.
pub struct Rng(pub u64);

impl Rng {
    /// The next 64 random bits.
    pub fn bits(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    /// A value in `0..n`.
    pub fn below(&mut self, n: usize) -> usize {
        (self.bits() % n as u64) as usize
    }
    /// A value in `[0, 1)`.
    pub fn unit(&mut self) -> f64 {
        (self.bits() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// The unit roundoff of `dtype` (half an ulp at 1).
pub fn epsilon(dtype: nuvec::DType) -> f64 {
    match dtype {
        nuvec::DType::F16 => 2f64.powi(-11),
        nuvec::DType::BF16 => 2f64.powi(-8),
        nuvec::DType::F32 => 2f64.powi(-24),
        _ => 2f64.powi(-53),
    }
}

/// Says on the terminal that the calling test skipped and why. libtest captures `print!` and
/// `eprint!` of passing tests but not writes to the stderr handle, so every run shows its skips
/// (and `NUVEC_REQUIRE_GPU=1` / `NUVEC_REQUIRE_NVRTC=1` turn them into failures where they apply).
pub fn skipped(why: &str) {
    use std::io::Write;
    let test = std::thread::current().name().unwrap_or("a test").to_string();
    let _ = writeln!(std::io::stderr(), "SKIPPED {test}: {why}");
}

/// Whether custom-kernel tests can run on the GPU: a skip without one, a failure under
/// `NUVEC_REQUIRE_GPU=1`.
pub fn custom_gpu() -> bool {
    let ok = nuvec::cuda::is_available();
    if std::env::var("NUVEC_REQUIRE_GPU").as_deref() == Ok("1") {
        assert!(ok, "NUVEC_REQUIRE_GPU=1 but the GPU is unusable: {:?}", nuvec::cuda::unavailable_reason());
    }
    if !ok {
        skipped("no usable GPU");
    }
    ok
}

/// Whether NVRTC compiles here (custom kernels are checked by compiling them without a GPU): a
/// skip without it, a failure under `NUVEC_REQUIRE_NVRTC=1`.
pub fn custom_nvrtc() -> bool {
    match nuvec::cuda::compile_custom_kernel("", "probe", "sm_90") {
        Ok(_) => true,
        Err(e) => {
            assert!(
                std::env::var("NUVEC_REQUIRE_NVRTC").as_deref() != Ok("1"),
                "NUVEC_REQUIRE_NVRTC=1 but NVRTC is unusable: {e}"
            );
            skipped(&format!("NVRTC is unusable: {e}"));
            false
        }
    }
}

/// Memory of the device operations run on by default (the GPU when one is usable).
pub fn device_memory() -> nuvec::memory::MemoryStats {
    if nuvec::default_device() == nuvec::Device::cpu() {
        nuvec::memory::host_memory()
    } else {
        nuvec::cuda::synchronize(0).unwrap();
        nuvec::cuda::memory(0).unwrap()
    }
}

/// Starts the default device's peak memory afresh.
pub fn reset_device_peak() {
    if nuvec::default_device() == nuvec::Device::cpu() {
        nuvec::memory::reset_host_peak();
    } else {
        nuvec::cuda::reset_peak(0).unwrap();
    }
}
