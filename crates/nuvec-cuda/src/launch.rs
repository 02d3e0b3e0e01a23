//! Kernel arguments and launches.

use std::ffi::c_void;
use std::sync::Mutex;

use cudarc::driver::sys;
use nuvec_core::{Error, Result};

use crate::driver::{Gpu, check};

/// Axes (at most 10 after collapsing) and the strides of up to four operands, passed by value.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub(crate) struct Dims {
    pub(crate) shape: [i64; MAX_DIMS],
    pub(crate) strides: [[i64; MAX_DIMS]; 4],
    pub(crate) ndim: i32,
}

/// `NV_MAX_DIMS` of `common.cuh`.
pub(crate) const MAX_DIMS: usize = 10;

impl Dims {
    /// One axis of `n` elements (which may pass `i32::MAX`) read with each operand's stride:
    /// the flat walk of dense operands.
    pub(crate) fn flat(n: u64, strides: &[i64]) -> Dims {
        let mut out = Dims { shape: [1; MAX_DIMS], strides: [[0; MAX_DIMS]; 4], ndim: 1 };
        out.shape[0] = n as i64;
        for (operand, &s) in out.strides.iter_mut().zip(strides) {
            operand[0] = s;
        }
        out
    }

    /// Collapses `shape` over the operands' `strides` (axes of size 1 dropped, neighbours that
    /// are contiguous for every operand merged).
    pub(crate) fn new(shape: &[i32], strides: &[&[isize]]) -> Result<Dims> {
        let k = strides.len();
        let mut dims: Vec<(i64, [i64; 4])> = Vec::new();
        for (i, &d) in shape.iter().enumerate() {
            if d == 1 {
                continue;
            }
            let mut s = [0i64; 4];
            for j in 0..k {
                s[j] = strides[j][i] as i64;
            }
            if let Some((pd, ps)) = dims.last_mut()
                && (0..k).all(|j| ps[j] == s[j] * d as i64)
            {
                *pd *= d as i64;
                *ps = s;
                continue;
            }
            dims.push((d as i64, s));
        }
        if dims.len() > MAX_DIMS {
            return Err(Error::Backend(format!(
                "the GPU kernels index at most {MAX_DIMS} non-contiguous axes; this layout has {}",
                dims.len()
            )));
        }
        let mut out = Dims { shape: [1; MAX_DIMS], strides: [[0; MAX_DIMS]; 4], ndim: dims.len().max(1) as i32 };
        for (i, (d, s)) in dims.iter().enumerate() {
            out.shape[i] = *d;
            for (operand, &sj) in out.strides.iter_mut().zip(s) {
                operand[i] = sj;
            }
        }
        Ok(out)
    }
}

/// One kernel argument, kept alive until the launch.
pub(crate) enum Arg {
    U64(u64),
    I64(i64),
    I32(i32),
    F32(f32),
    F64(f64),
    Ptr(sys::CUdeviceptr),
    Dims(Box<Dims>),
    /// Raw bytes of a by-value parameter (a scalar, a struct); the driver copies as many as
    /// the kernel's parameter takes.
    Bytes(Vec<u64>),
}

impl Arg {
    fn as_ptr(&mut self) -> *mut c_void {
        match self {
            Arg::U64(v) => v as *mut u64 as *mut c_void,
            Arg::I64(v) => v as *mut i64 as *mut c_void,
            Arg::I32(v) => v as *mut i32 as *mut c_void,
            Arg::F32(v) => v as *mut f32 as *mut c_void,
            Arg::F64(v) => v as *mut f64 as *mut c_void,
            Arg::Ptr(v) => v as *mut u64 as *mut c_void,
            Arg::Dims(v) => &mut **v as *mut Dims as *mut c_void,
            Arg::Bytes(v) => v.as_mut_ptr() as *mut c_void,
        }
    }
}

/// Threads per block of the element-wise kernels.
pub(crate) const BLOCK: u32 = 256;

/// Blocks for `work` items handled by `per_block` each, capped so grid-stride loops keep every
/// multiprocessor busy without oversubscribing.
pub(crate) fn grid_for(gpu: &Gpu, work: u64, per_block: u64) -> u32 {
    let cap = gpu.info.multiprocessors.max(1) as u64 * 32;
    work.div_ceil(per_block.max(1)).clamp(1, cap) as u32
}

/// Dynamic shared memory a kernel may use without raising its limit.
pub(crate) const DEFAULT_SHARED_LIMIT: u32 = 48 * 1024;

/// Lets `function` use `bytes` of dynamic shared memory (above the default 48 KiB).
pub(crate) fn allow_shared(gpu: &Gpu, function: sys::CUfunction, bytes: u32) -> Result<()> {
    if bytes <= DEFAULT_SHARED_LIMIT {
        return Ok(());
    }
    gpu.bind()?;
    // SAFETY: `function` belongs to a module loaded in this context.
    unsafe {
        check(
            sys::cuFuncSetAttribute(
                function,
                sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                bytes as i32,
            ),
            "cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES)",
        )
    }
}

/// The kernels that begin with `nv_dependent_launch()` (`Family::dependent_launch`), by
/// address: `launch` starts them as programmatic dependents.
static DEPENDENT: std::sync::RwLock<Vec<usize>> = std::sync::RwLock::new(Vec::new());

/// Marks `function` as one whose body waits for the kernel before it first thing.
pub(crate) fn mark_dependent(function: sys::CUfunction) {
    let key = function as usize;
    if !DEPENDENT.read().unwrap_or_else(|e| e.into_inner()).contains(&key) {
        let mut known = DEPENDENT.write().unwrap_or_else(|e| e.into_inner());
        if !known.contains(&key) {
            known.push(key);
            known.sort_unstable();
        }
    }
}

/// Launches `function` on the device's stream; a kernel `mark_dependent` marked, as a
/// programmatic dependent of the previous kernel where the device has that.
pub(crate) fn launch(
    gpu: &Gpu,
    function: sys::CUfunction,
    grid: (u32, u32, u32),
    block: (u32, u32, u32),
    shared: u32,
    mut args: Vec<Arg>,
) -> Result<()> {
    gpu.bind()?;
    let mut ptrs: Vec<*mut c_void> = args.iter_mut().map(Arg::as_ptr).collect();
    let marked = DEPENDENT.read().unwrap_or_else(|e| e.into_inner()).binary_search(&(function as usize)).is_ok();
    if let Some(attr) = dependent_attr(gpu).filter(|_| marked) {
        let mut attrs = [attr];
        let mut cfg = config(gpu, grid.0, (block.0, block.1), &mut attrs);
        (cfg.gridDimY, cfg.gridDimZ, cfg.blockDimZ, cfg.sharedMemBytes) = (grid.1, grid.2, block.2, shared);
        // SAFETY: as below; `cfg` points at `attrs`, alive across the call.
        return unsafe {
            check(sys::cuLaunchKernelEx(&cfg, function, ptrs.as_mut_ptr(), std::ptr::null_mut()), "cuLaunchKernelEx")
        };
    }
    // SAFETY: `function` comes from a module loaded in this context; `ptrs` points at argument
    // values in `args`, which outlive the call (the driver copies them at launch); the argument
    // list matches the kernel's `extern "C"` signature (generated together in `kernels.rs`), and
    // every device pointer in it is inside a live allocation sized for the kernel's accesses.
    unsafe {
        check(
            sys::cuLaunchKernel(
                function,
                grid.0,
                grid.1,
                grid.2,
                block.0,
                block.1,
                block.2,
                shared,
                gpu.stream(),
                ptrs.as_mut_ptr(),
                std::ptr::null_mut(),
            ),
            "cuLaunchKernel",
        )
    }
}

/// A launch configuration of a 1-D grid of `grid` blocks of `threads` (x, y), no dynamic shared
/// memory, on the device's stream, with the launch attributes `attrs` (which must outlive the
/// returned value's use).
fn config(gpu: &Gpu, grid: u32, threads: (u32, u32), attrs: &mut [sys::CUlaunchAttribute]) -> sys::CUlaunchConfig {
    sys::CUlaunchConfig {
        gridDimX: grid,
        gridDimY: 1,
        gridDimZ: 1,
        blockDimX: threads.0,
        blockDimY: threads.1,
        blockDimZ: 1,
        sharedMemBytes: 0,
        hStream: gpu.stream(),
        attrs: attrs.as_mut_ptr(),
        numAttrs: attrs.len() as u32,
    }
}

fn attribute(id: sys::CUlaunchAttributeID) -> sys::CUlaunchAttribute {
    // SAFETY: the attribute is plain data; zeroed is a valid bit pattern for every field.
    let mut attr: sys::CUlaunchAttribute = unsafe { std::mem::zeroed() };
    attr.id = id;
    attr
}

fn cluster_attr(cluster: u32) -> sys::CUlaunchAttribute {
    let mut attr = attribute(sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION);
    attr.value.clusterDim = sys::CUlaunchAttributeValue_union__bindgen_ty_1 { x: cluster, y: 1, z: 1 };
    attr
}

/// Programmatic dependent launch: the kernel may start before the previous one on the stream
/// has finished (it waits for it in `nv_dependent_launch()`, common.cuh). Devices of compute
/// capability 9.0 and later; `NUVEC_DEPENDENT_LAUNCH=0` turns it off (for comparisons).
fn dependent_attr(gpu: &Gpu) -> Option<sys::CUlaunchAttribute> {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    let on = *ON.get_or_init(|| std::env::var("NUVEC_DEPENDENT_LAUNCH").map_or(true, |v| v != "0"));
    (on && gpu.info.compute_capability.0 >= 9).then(|| {
        let mut attr = attribute(sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION);
        attr.value.programmaticStreamSerializationAllowed = 1;
        attr
    })
}

/// Launches `f`, a kernel of a module whose kernels begin with `nv_dependent_launch()`
/// (`Family::dependent_launch`), on a 1-D grid of `grid` blocks of `threads` (x, y), as a
/// programmatic dependent of the previous kernel on the stream where the device has that; in
/// thread-block clusters of `cluster` blocks (sm_90 and later; at most 8; `grid` a multiple of
/// it) when `cluster` > 1.
pub(crate) fn launch_dependent(
    gpu: &Gpu,
    f: sys::CUfunction,
    grid: u32,
    threads: (u32, u32),
    cluster: u32,
    mut args: Vec<Arg>,
) -> Result<()> {
    gpu.bind()?;
    // At most two attributes, in place (this is every fused kernel's launch).
    let mut attrs = [cluster_attr(cluster); 2];
    let mut n = 0;
    for attr in [dependent_attr(gpu), (cluster > 1).then(|| cluster_attr(cluster))].into_iter().flatten() {
        attrs[n] = attr;
        n += 1;
    }
    let cfg = config(gpu, grid, threads, &mut attrs[..n]);
    let mut ptrs: Vec<*mut c_void> = args.iter_mut().map(Arg::as_ptr).collect();
    // SAFETY: as `launch`'s; `cfg` points at `attrs`, alive across the call.
    unsafe { check(sys::cuLaunchKernelEx(&cfg, f, ptrs.as_mut_ptr(), std::ptr::null_mut()), "cuLaunchKernelEx") }
}

/// How many clusters of `cluster` blocks of `threads` threads of `f` the device holds at once
/// (placement within the GPU's processing clusters included); 0 when none fits.
pub(crate) fn resident_clusters(gpu: &Gpu, f: sys::CUfunction, threads: u32, cluster: u32) -> Result<u64> {
    static KNOWN: Mutex<Vec<(usize, u32, u32, u64)>> = Mutex::new(Vec::new());
    let key = f as usize;
    let mut known = KNOWN.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(&(.., n)) = known.iter().find(|&&(k, t, c, _)| k == key && t == threads && c == cluster) {
        return Ok(n);
    }
    gpu.bind()?;
    let mut attr = [cluster_attr(cluster)];
    let cfg = config(gpu, cluster, (threads, 1), &mut attr);
    let mut n = 0;
    // SAFETY: `f` is a loaded function of this context; `cfg` points at `attr`; `n` is a
    // local out-pointer.
    unsafe { check(sys::cuOccupancyMaxActiveClusters(&mut n, f, &cfg), "cuOccupancyMaxActiveClusters")? };
    let n = n.max(0) as u64;
    known.push((key, threads, cluster, n));
    Ok(n)
}

/// How many blocks of `threads` threads of `f` one multiprocessor holds at once (asked of the
/// driver once per function and block size).
pub(crate) fn resident_blocks(gpu: &Gpu, f: sys::CUfunction, threads: u32) -> Result<u64> {
    resident_blocks_with(gpu, f, threads, 0)
}

/// [`resident_blocks`] for blocks of `shared` bytes of dynamic shared memory.
pub(crate) fn resident_blocks_with(gpu: &Gpu, f: sys::CUfunction, threads: u32, shared: u32) -> Result<u64> {
    static KNOWN: Mutex<Vec<(usize, u32, u32, u64)>> = Mutex::new(Vec::new());
    let key = f as usize;
    let mut known = KNOWN.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(&(.., n)) = known.iter().find(|&&(k, t, s, _)| k == key && t == threads && s == shared) {
        return Ok(n);
    }
    gpu.bind()?;
    let mut n = 0;
    // SAFETY: `f` is a loaded function of this context; `n` is a local out-pointer.
    unsafe {
        check(
            sys::cuOccupancyMaxActiveBlocksPerMultiprocessor(&mut n, f, threads as i32, shared as usize),
            "cuOccupancyMaxActiveBlocksPerMultiprocessor",
        )?
    };
    let n = n.max(1) as u64;
    known.push((key, threads, shared, n));
    Ok(n)
}
