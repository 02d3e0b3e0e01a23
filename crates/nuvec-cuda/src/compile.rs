//! NVRTC: kernel sources compiled at run time for the device's architecture, cached in memory
//! and on disk (`NUVEC_KERNEL_CACHE`, default `~/.cache/nuvec/kernels`) by a hash of the
//! source, the architecture, the options and the NVRTC version.

use std::collections::HashMap;
use std::ffi::{CStr, CString, c_char};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

use cudarc::driver::sys as dsys;
use cudarc::nvrtc::sys as nsys;
use nuvec_core::{Error, Result};

use crate::driver::{Gpu, check};

/// The headers our kernel sources include, by name.
pub const HEADERS: [(&str, &str); 23] = [
    ("common.cuh", include_str!("../kernels/common.cuh")),
    ("arith.cuh", include_str!("../kernels/arith.cuh")),
    ("map.cuh", include_str!("../kernels/map.cuh")),
    ("unary.cuh", include_str!("../kernels/unary.cuh")),
    ("binary.cuh", include_str!("../kernels/binary.cuh")),
    ("copy.cuh", include_str!("../kernels/copy.cuh")),
    ("reduce.cuh", include_str!("../kernels/reduce.cuh")),
    ("scan.cuh", include_str!("../kernels/scan.cuh")),
    ("matmul.cuh", include_str!("../kernels/matmul.cuh")),
    ("gather.cuh", include_str!("../kernels/gather.cuh")),
    ("sort.cuh", include_str!("../kernels/sort.cuh")),
    ("quantize.cuh", include_str!("../kernels/quantize.cuh")),
    ("softmax.cuh", include_str!("../kernels/softmax.cuh")),
    ("norm.cuh", include_str!("../kernels/norm.cuh")),
    ("norm_registers.cuh", include_str!("../kernels/norm_registers.cuh")),
    ("rope.cuh", include_str!("../kernels/rope.cuh")),
    ("swiglu.cuh", include_str!("../kernels/swiglu.cuh")),
    ("cross_entropy.cuh", include_str!("../kernels/cross_entropy.cuh")),
    ("attention.cuh", include_str!("../kernels/attention.cuh")),
    ("quantized_matmul.cuh", include_str!("../kernels/quantized_matmul.cuh")),
    ("compiled.cuh", include_str!("../kernels/compiled.cuh")),
    ("gated_delta.cuh", include_str!("../kernels/gated_delta.cuh")),
    ("gather_mm.cuh", include_str!("../kernels/gather_mm.cuh")),
];

/// [`HEADERS`], each replaced by the file of the same name in the folder
/// `NUVEC_KERNEL_SOURCE_DIR` where it has one: a kernel change tried on a GPU machine without
/// rebuilding (the cache key hashes the text, so the change compiles afresh).
pub fn headers() -> &'static [(&'static str, String)] {
    static ALL: OnceLock<Vec<(&'static str, String)>> = OnceLock::new();
    ALL.get_or_init(|| {
        let dir = std::env::var_os("NUVEC_KERNEL_SOURCE_DIR").filter(|d| !d.is_empty()).map(PathBuf::from);
        HEADERS
            .iter()
            .map(|&(name, text)| {
                let file = dir.as_ref().and_then(|d| std::fs::read_to_string(d.join(name)).ok());
                (name, file.unwrap_or_else(|| text.to_string()))
            })
            .collect()
    })
}

/// `sm_XYa` for compute capability 9.0 and later (so Hopper's wgmma and TMA are usable),
/// `sm_XY` before.
pub fn arch_for((major, minor): (i32, i32)) -> String {
    if major >= 9 { format!("sm_{major}{minor}a") } else { format!("sm_{major}{minor}") }
}

/// Folders holding the CUDA headers (`cuda_fp16.h`, ...): `NUVEC_CUDA_INCLUDE` (`:`-separated),
/// `$CUDA_HOME/include`, `$CUDA_PATH/include`, `/usr/local/cuda/include`, and the
/// `nvidia/cu13/include` folders (plus `cccl`) of the `nvidia-cuda-runtime` and
/// `nvidia-cuda-cccl` Python wheels in the usual site-packages locations.
pub fn cuda_include_dirs() -> Result<Vec<PathBuf>> {
    static DIRS: OnceLock<std::result::Result<Vec<PathBuf>, String>> = OnceLock::new();
    DIRS.get_or_init(find_include_dirs).clone().map_err(Error::Backend)
}

fn find_include_dirs() -> std::result::Result<Vec<PathBuf>, String> {
    let mut candidates: Vec<PathBuf> = Vec::new();
    if let Ok(v) = std::env::var("NUVEC_CUDA_INCLUDE") {
        candidates.extend(v.split(':').filter(|s| !s.is_empty()).map(PathBuf::from));
    }
    for var in ["CUDA_HOME", "CUDA_PATH"] {
        if let Ok(v) = std::env::var(var) {
            candidates.push(Path::new(&v).join("include"));
        }
    }
    candidates.push("/usr/local/cuda/include".into());
    for site in site_packages() {
        for sub in ["nvidia/cu13/include", "nvidia/cuda_runtime/include", "nvidia/cu12/include"] {
            candidates.push(site.join(sub));
        }
    }
    let mut found = Vec::new();
    for dir in candidates {
        if dir.join("cuda_fp16.h").is_file() && !found.contains(&dir) {
            if dir.join("cccl").is_dir() {
                found.push(dir.join("cccl"));
            }
            found.push(dir);
        }
    }
    if found.is_empty() {
        return Err("CUDA headers (cuda_fp16.h) not found: set NUVEC_CUDA_INCLUDE or CUDA_HOME, or \
                    `pip install nvidia-cuda-runtime nvidia-cuda-cccl`"
            .into());
    }
    Ok(found)
}

/// Python site-packages folders that commonly hold NVIDIA's wheels.
fn site_packages() -> Vec<PathBuf> {
    let mut roots: Vec<PathBuf> = vec!["/usr/local/lib".into(), "/usr/lib".into()];
    if let Ok(home) = std::env::var("HOME") {
        roots.push(Path::new(&home).join(".local/lib"));
        if let Ok(rd) = std::fs::read_dir(Path::new(&home).join(".pyenv/versions")) {
            roots.extend(rd.flatten().map(|e| e.path().join("lib")));
        }
    }
    for var in ["VIRTUAL_ENV", "CONDA_PREFIX"] {
        if let Ok(v) = std::env::var(var) {
            roots.push(Path::new(&v).join("lib"));
        }
    }
    if let Ok(rd) = std::fs::read_dir("/opt") {
        roots.extend(rd.flatten().map(|e| e.path().join(".venv/lib")));
    }
    let mut out: Vec<PathBuf> = std::env::var("PYTHONPATH")
        .map(|p| p.split(':').filter(|s| !s.is_empty()).map(PathBuf::from).collect())
        .unwrap_or_default();
    for root in roots {
        if let Ok(rd) = std::fs::read_dir(&root) {
            for e in rd.flatten() {
                let name = e.file_name();
                if name.to_string_lossy().starts_with("python3") {
                    out.push(e.path().join("site-packages"));
                    out.push(e.path().join("dist-packages"));
                }
            }
        }
    }
    out
}

/// NVRTC's version (major, minor).
pub fn nvrtc_version() -> Result<(i32, i32)> {
    if let Err(e) = crate::driver::probe_nvrtc() {
        return Err(Error::Backend(e));
    }
    let (mut major, mut minor) = (0, 0);
    // SAFETY: the library is present; the call writes two ints.
    let r = unsafe { nsys::nvrtcVersion(&mut major, &mut minor) };
    if r != nsys::nvrtcResult::NVRTC_SUCCESS {
        return Err(Error::Backend(format!("nvrtcVersion failed: {r:?}")));
    }
    Ok((major, minor))
}

/// A 64-bit FNV-1a hash: stable across builds, so the disk cache outlives the binary.
fn fnv1a(parts: &[&[u8]]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for p in parts {
        for &b in *p {
            h ^= b as u64;
            h = h.wrapping_mul(0x100_0000_01b3);
        }
        h ^= 0xff;
        h = h.wrapping_mul(0x100_0000_01b3);
    }
    h
}

/// Options every nuvec kernel is compiled with (IEEE math: no fast-math flags).
fn options(arch: &str) -> Result<Vec<String>> {
    let mut o = vec![format!("--gpu-architecture={arch}"), "-std=c++17".into(), "-default-device".into()];
    for dir in cuda_include_dirs()? {
        o.push(format!("--include-path={}", dir.display()));
    }
    Ok(o)
}

/// How often a module was built in this process: NVRTC compilations and loads into a device.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BuildCounts {
    /// NVRTC compilations (a disk-cache hit compiles nothing).
    pub compiled: usize,
    /// Loads into a device (the in-memory cache makes this at most one per device).
    pub loaded: usize,
}

fn build_counts() -> &'static Mutex<HashMap<String, BuildCounts>> {
    static COUNTS: OnceLock<Mutex<HashMap<String, BuildCounts>>> = OnceLock::new();
    COUNTS.get_or_init(|| Mutex::new(HashMap::new()))
}

fn count_build(name: &str, f: impl FnOnce(&mut BuildCounts)) {
    f(build_counts().lock().unwrap_or_else(|e| e.into_inner()).entry(name.to_string()).or_default());
}

/// How often the module `name` (a kernel family key, or a custom kernel's key) was compiled
/// and loaded by this process.
pub fn builds(name: &str) -> BuildCounts {
    build_counts().lock().unwrap_or_else(|e| e.into_inner()).get(name).copied().unwrap_or_default()
}

/// Compiles `source` (which may include [`headers`] by name, plus `extra_headers`) to a CUBIN
/// for `arch` (`sm_90a`), or to PTX for a virtual architecture (`compute_90`: the front end
/// only, no machine code). Errors carry NVRTC's log.
pub fn compile_cubin(source: &str, name: &str, arch: &str, extra_headers: &[(&str, &str)]) -> Result<Vec<u8>> {
    nvrtc_version()?;
    count_build(name, |c| c.compiled += 1);
    let c = |s: &str| CString::new(s).map_err(|_| Error::InvalidArgument("kernel source contains a NUL byte".into()));
    let src = c(source)?;
    let cname = c(name)?;
    let all: Vec<(&str, &str)> =
        headers().iter().map(|(n, t)| (*n, t.as_str())).chain(extra_headers.iter().copied()).collect();
    let header_names: Vec<CString> = all.iter().map(|h| c(h.0)).collect::<Result<_>>()?;
    let header_srcs: Vec<CString> = all.iter().map(|h| c(h.1)).collect::<Result<_>>()?;
    let name_ptrs: Vec<*const c_char> = header_names.iter().map(|s| s.as_ptr()).collect();
    let src_ptrs: Vec<*const c_char> = header_srcs.iter().map(|s| s.as_ptr()).collect();
    let opts: Vec<CString> = options(arch)?.iter().map(|o| c(o)).collect::<Result<_>>()?;
    let opt_ptrs: Vec<*const c_char> = opts.iter().map(|s| s.as_ptr()).collect();
    let fail = |what: &str, r: nsys::nvrtcResult| Error::Backend(format!("NVRTC {what} failed: {r:?}"));
    // SAFETY: every pointer handed to NVRTC points into a CString that outlives the program;
    // the program is destroyed on every path.
    unsafe {
        let mut prog: nsys::nvrtcProgram = std::ptr::null_mut();
        let r = nsys::nvrtcCreateProgram(
            &mut prog,
            src.as_ptr(),
            cname.as_ptr(),
            all.len() as i32,
            src_ptrs.as_ptr(),
            name_ptrs.as_ptr(),
        );
        if r != nsys::nvrtcResult::NVRTC_SUCCESS {
            return Err(fail("nvrtcCreateProgram", r));
        }
        let r = nsys::nvrtcCompileProgram(prog, opt_ptrs.len() as i32, opt_ptrs.as_ptr());
        let result = if r != nsys::nvrtcResult::NVRTC_SUCCESS {
            let mut size = 0usize;
            nsys::nvrtcGetProgramLogSize(prog, &mut size);
            let mut log = vec![0 as c_char; size.max(1)];
            nsys::nvrtcGetProgramLog(prog, log.as_mut_ptr());
            let log = CStr::from_ptr(log.as_ptr()).to_string_lossy().into_owned();
            Err(Error::Backend(format!("NVRTC could not compile {name} for {arch}:\n{log}")))
        } else {
            let ptx = arch.starts_with("compute_");
            let mut size = 0usize;
            let r = if ptx { nsys::nvrtcGetPTXSize(prog, &mut size) } else { nsys::nvrtcGetCUBINSize(prog, &mut size) };
            if r != nsys::nvrtcResult::NVRTC_SUCCESS {
                Err(fail("nvrtcGetCUBINSize", r))
            } else {
                let mut bin = vec![0u8; size];
                let out = bin.as_mut_ptr() as *mut c_char;
                let r = if ptx { nsys::nvrtcGetPTX(prog, out) } else { nsys::nvrtcGetCUBIN(prog, out) };
                if r != nsys::nvrtcResult::NVRTC_SUCCESS { Err(fail("nvrtcGetCUBIN", r)) } else { Ok(bin) }
            }
        };
        nsys::nvrtcDestroyProgram(&mut prog);
        result
    }
}

/// The on-disk cache folder.
pub fn cache_dir() -> Option<PathBuf> {
    if let Ok(v) = std::env::var("NUVEC_KERNEL_CACHE") {
        return (!v.is_empty() && v != "0").then(|| PathBuf::from(v));
    }
    let base = std::env::var("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|_| std::env::var("HOME").map(|h| Path::new(&h).join(".cache")))
        .ok()?;
    Some(base.join("nuvec").join("kernels"))
}

/// The cache file name of `source` compiled for `arch`: a hash of the source, the headers, the
/// architecture and NVRTC's major.minor version.
pub fn cache_file_name(source: &str, arch: &str, extra_headers: &[(&str, &str)]) -> Result<String> {
    let (major, minor) = nvrtc_version()?;
    let version = format!("nvrtc{major}.{minor}");
    let mut parts: Vec<&[u8]> = vec![source.as_bytes(), arch.as_bytes(), version.as_bytes()];
    for h in headers().iter().map(|(n, t)| (*n, t.as_str())).chain(extra_headers.iter().copied()) {
        parts.push(h.0.as_bytes());
        parts.push(h.1.as_bytes());
    }
    Ok(format!("{:016x}-{arch}.cubin", fnv1a(&parts)))
}

/// A CUBIN for `source`, from the disk cache or compiled (and then stored).
pub fn cached_cubin(source: &str, name: &str, arch: &str, extra_headers: &[(&str, &str)]) -> Result<Vec<u8>> {
    let key = cache_file_name(source, arch, extra_headers)?;
    let path = cache_dir().map(|d| d.join(&key));
    if let Some(p) = &path
        && let Ok(bin) = std::fs::read(p)
    {
        return Ok(bin);
    }
    let bin = compile_cubin(source, name, arch, extra_headers)?;
    if let Some(p) = &path {
        // Write then rename, so concurrent processes never read a partial file.
        if let Some(dir) = p.parent() {
            let _ = std::fs::create_dir_all(dir);
            let tmp = dir.join(format!("{key}.{}.tmp", std::process::id()));
            if std::fs::write(&tmp, &bin).is_ok() {
                let _ = std::fs::rename(&tmp, p);
            }
        }
    }
    Ok(bin)
}

/// A loaded module and the functions looked up in it.
pub(crate) struct Module {
    module: dsys::CUmodule,
    functions: Mutex<HashMap<String, dsys::CUfunction>>,
}

// SAFETY: module and function handles may be used from any thread with the context current.
unsafe impl Send for Module {}
// SAFETY: as above; the function map is behind a mutex.
unsafe impl Sync for Module {}

impl Module {
    /// The kernel `name` of the module.
    pub(crate) fn function(&self, name: &str) -> Result<dsys::CUfunction> {
        let mut f = self.functions.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(&func) = f.get(name) {
            return Ok(func);
        }
        let cname = CString::new(name).map_err(|_| Error::InvalidArgument("kernel name with NUL".into()))?;
        let mut func = std::ptr::null_mut();
        // SAFETY: the module is loaded; the call writes the function handle.
        unsafe { check(dsys::cuModuleGetFunction(&mut func, self.module, cname.as_ptr()), name)? };
        f.insert(name.to_string(), func);
        Ok(func)
    }
}

/// The modules of one device, keyed by their source's name.
pub(crate) struct Modules {
    pub(crate) arch: String,
    loaded: Mutex<HashMap<String, Arc<Module>>>,
}

impl Modules {
    pub(crate) fn new(arch: String) -> Modules {
        Modules { arch, loaded: Mutex::new(HashMap::new()) }
    }

    /// The module `key`, built from `source()` on first use.
    pub(crate) fn get(
        &self,
        gpu: &Gpu,
        key: &str,
        source: impl FnOnce() -> String,
        extra_headers: &[(&str, &str)],
    ) -> Result<Arc<Module>> {
        if let Some(m) = self.loaded.lock().unwrap_or_else(|e| e.into_inner()).get(key) {
            return Ok(m.clone());
        }
        let bin = cached_cubin(&source(), key, &self.arch, extra_headers)?;
        gpu.bind()?;
        let mut module = std::ptr::null_mut();
        // SAFETY: `bin` is a complete CUBIN image for this device's architecture.
        unsafe { check(dsys::cuModuleLoadData(&mut module, bin.as_ptr() as *const _), "cuModuleLoadData")? };
        count_build(key, |c| c.loaded += 1);
        let m = Arc::new(Module { module, functions: Mutex::new(HashMap::new()) });
        self.loaded.lock().unwrap_or_else(|e| e.into_inner()).insert(key.to_string(), m.clone());
        Ok(m)
    }
}
