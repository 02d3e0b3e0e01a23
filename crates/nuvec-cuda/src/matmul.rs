//! Matrix products: cuBLASLt for f16/bf16/f32/f64 (batched, strided, with AddMM's `beta`),
//! our GEMV kernels for a few rows (see [`gemv_rows_max`]), and a plain kernel for integers.
//!
//! cuBLASLt is column-major: a row-major `C[M, N] = A[M, K] B[K, N]` is computed as the
//! column-major `C^T = B^T A^T`, so our `B` is its first operand and our `A` its second.

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::Arc;

use cudarc::cublaslt::sys as lt;
use nuvec_core::fast::FastOp;
use nuvec_core::shape::row_major_strides;
use nuvec_core::storage::{Data, Layout, Operand, Output};
use nuvec_core::{DType, Error, Result};

use crate::copy::copy;
use crate::driver::Gpu;
use crate::kernels::{Family, Source, ctype};
use crate::launch::{Arg, BLOCK, Dims, launch};
use crate::operand::{alloc, alloc_out, internal, kernel, ptr_of, row_major};

/// Whether the backend has kernels of its own for products of `d`: the few-row products of
/// f16, bf16 and f32, or every product of an integer dtype.
pub(crate) fn has_kernels(d: DType) -> bool {
    matches!(d, DType::F16 | DType::BF16 | DType::F32) || d.is_integer()
}

/// The most rows of x `gemv_rows` takes (`W^T` products; more go to cuBLASLt):
/// `NUVEC_GEMV_MAX_ROWS` (0 to 8), by default 2: with more rows the kernel runs slower than
/// cuBLASLt (measured in bench/results/).
pub(crate) fn gemv_rows_max() -> u64 {
    static MAX: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *MAX.get_or_init(|| {
        std::env::var("NUVEC_GEMV_MAX_ROWS").ok().and_then(|v| v.parse::<u64>().ok()).map_or(2, |v| v.min(8))
    })
}

/// The module of `d`: `gemv_rows_{m}` (with the prologues `gemv_rows_rms_norm_{m}` and
/// `gemv_rows_swiglu_{m}`) and `gemv_cols_{m}` for 1 to 8 rows (floats), or `matmul_int`
/// (integers).
pub(crate) fn source(d: DType) -> String {
    let mut s = Source::new(&["matmul.cuh"]);
    let t = ctype(d);
    if d.is_integer() {
        s.kernel(format!(
            "matmul_int(const {t}* a, const {t}* b, {t}* out, u64 batches, u64 m, u64 n, u64 k, i64 sa0, i64 sa1, i64 sb0, i64 sb1, Dims d) {{ matmul_int<{t}>(a, b, out, batches, m, n, k, sa0, sa1, sb0, sb1, d); }}"
        ));
        return s.finish();
    }
    for m in 1..=8 {
        for (name, pro) in
            [("gemv_rows", "PRO_NONE"), ("gemv_rows_rms_norm", "PRO_RMS_NORM"), ("gemv_rows_swiglu", "PRO_SWIGLU")]
        {
            s.kernel(format!(
                "{name}_{m}(const {t}* x, const {t}* x2, u64 ldx2, float eps, const {t}* w, {t}* out, u64 n, u64 k, u64 ldx, u64 ldw, u64 ldo, const {t}* add, float beta) {{ gemv_rows<{t}, {m}, {pro}>(x, x2, ldx2, eps, w, out, n, k, ldx, ldw, ldo, add, beta); }}"
            ));
        }
        s.kernel(format!(
            "__launch_bounds__(NV_GEMV_COL_BLOCK) gemv_cols_{m}(const {t}* x, const {t}* b, float* partials, unsigned* counters, {t}* out, u64 n, u64 k, u64 ldx, u64 ldb, u64 ldo, u64 slices) {{ gemv_cols<{t}, {m}>(x, b, partials, counters, out, n, k, ldx, ldb, ldo, slices); }}"
        ));
    }
    s.finish()
}

fn blas_check(s: lt::cublasStatus_t, what: &str) -> Result<()> {
    if s == lt::cublasStatus_t::CUBLAS_STATUS_SUCCESS {
        Ok(())
    } else {
        Err(Error::Backend(format!("cuBLASLt: {what} failed with {s:?}")))
    }
}

/// A column-major operand as cuBLASLt sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct Mat {
    rows: u64,
    cols: u64,
    ld: i64,
    trans: bool,
    batch_stride: i64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct Key {
    dtype: DType,
    tf32: bool,
    a: Mat,
    b: Mat,
    m: u64,
    n: u64,
    batch: u64,
    beta_zero: bool,
}

struct Plan {
    desc: lt::cublasLtMatmulDesc_t,
    la: lt::cublasLtMatrixLayout_t,
    lb: lt::cublasLtMatrixLayout_t,
    lc: lt::cublasLtMatrixLayout_t,
    algo: lt::cublasLtMatmulAlgo_t,
}

/// The cuBLASLt state of one device: handle, workspaces and cached plans.
pub(crate) struct Blas {
    handle: lt::cublasLtHandle_t,
    /// The workspace of products run as they are queued. One product may queue several
    /// kernels that pass partial results through it (a split-K product and its reduction),
    /// and a CUDA graph another thread launches can land between them, so products recorded
    /// into graphs use `recorded` instead. Graph launches never overlap one another.
    eager: u64,
    recorded: u64,
    plans: HashMap<Key, Plan>,
}

// SAFETY: cuBLASLt handles and descriptors may be used from any thread; access is serialised
// by the mutex that holds the `Blas`.
unsafe impl Send for Blas {}

const WORKSPACE: usize = 32 << 20;

impl Blas {
    fn new(gpu: &Arc<Gpu>) -> Result<Blas> {
        gpu.bind()?;
        let mut handle = std::ptr::null_mut();
        // SAFETY: writes the new handle into the local.
        blas_check(unsafe { lt::cublasLtCreate(&mut handle) }, "cublasLtCreate")?;
        // Straight from the device's allocator, never a recording's pool, and kept for the
        // device's life (recorded graphs hold the addresses).
        let (eager, _) = gpu.alloc.alloc(gpu, WORKSPACE)?;
        let (recorded, _) = gpu.alloc.alloc(gpu, WORKSPACE)?;
        Ok(Blas { handle, eager, recorded, plans: HashMap::new() })
    }

    fn plan(&mut self, key: Key) -> Result<&Plan> {
        if !self.plans.contains_key(&key) {
            let plan = self.make_plan(&key)?;
            self.plans.insert(key, plan);
        }
        self.plans.get(&key).ok_or_else(|| internal("plan vanished"))
    }

    fn make_plan(&self, k: &Key) -> Result<Plan> {
        let dt = match k.dtype {
            DType::F16 => lt::cudaDataType::CUDA_R_16F,
            DType::BF16 => lt::cudaDataType::CUDA_R_16BF,
            DType::F32 => lt::cudaDataType::CUDA_R_32F,
            DType::F64 => lt::cudaDataType::CUDA_R_64F,
            d => return Err(internal(format!("no cuBLASLt type for {d}"))),
        };
        let (compute, scale) = match k.dtype {
            DType::F64 => (lt::cublasComputeType_t::CUBLAS_COMPUTE_64F, lt::cudaDataType::CUDA_R_64F),
            DType::F32 if k.tf32 => {
                (lt::cublasComputeType_t::CUBLAS_COMPUTE_32F_FAST_TF32, lt::cudaDataType::CUDA_R_32F)
            }
            _ => (lt::cublasComputeType_t::CUBLAS_COMPUTE_32F, lt::cudaDataType::CUDA_R_32F),
        };
        // SAFETY: descriptor calls write into locals and read attribute values from locals of
        // the stated sizes.
        unsafe {
            let mut desc = std::ptr::null_mut();
            blas_check(lt::cublasLtMatmulDescCreate(&mut desc, compute, scale), "cublasLtMatmulDescCreate")?;
            let set_op = |attr, t: bool| {
                let v: i32 = t as i32;
                blas_check(
                    lt::cublasLtMatmulDescSetAttribute(desc, attr, &v as *const i32 as *const c_void, 4),
                    "cublasLtMatmulDescSetAttribute",
                )
            };
            set_op(lt::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_TRANSA, k.a.trans)?;
            set_op(lt::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_TRANSB, k.b.trans)?;
            let layout = |m: &Mat| -> Result<lt::cublasLtMatrixLayout_t> {
                let mut l = std::ptr::null_mut();
                blas_check(
                    lt::cublasLtMatrixLayoutCreate(&mut l, dt, m.rows, m.cols, m.ld),
                    "cublasLtMatrixLayoutCreate",
                )?;
                if k.batch > 1 {
                    let count = k.batch as i32;
                    blas_check(
                        lt::cublasLtMatrixLayoutSetAttribute(
                            l,
                            lt::cublasLtMatrixLayoutAttribute_t::CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT,
                            &count as *const i32 as *const c_void,
                            4,
                        ),
                        "batch count",
                    )?;
                    blas_check(
                        lt::cublasLtMatrixLayoutSetAttribute(
                            l,
                            lt::cublasLtMatrixLayoutAttribute_t::CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                            &m.batch_stride as *const i64 as *const c_void,
                            8,
                        ),
                        "batch stride",
                    )?;
                }
                Ok(l)
            };
            let la = layout(&k.a)?;
            let lb = layout(&k.b)?;
            let c = Mat { rows: k.n, cols: k.m, ld: k.n as i64, trans: false, batch_stride: (k.m * k.n) as i64 };
            let lc = layout(&c)?;
            let mut pref = std::ptr::null_mut();
            blas_check(lt::cublasLtMatmulPreferenceCreate(&mut pref), "cublasLtMatmulPreferenceCreate")?;
            let ws = WORKSPACE as u64;
            blas_check(
                lt::cublasLtMatmulPreferenceSetAttribute(
                    pref,
                    lt::cublasLtMatmulPreferenceAttributes_t::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                    &ws as *const u64 as *const c_void,
                    8,
                ),
                "workspace preference",
            )?;
            let mut result: lt::cublasLtMatmulHeuristicResult_t = std::mem::zeroed();
            let mut count = 0;
            let status =
                lt::cublasLtMatmulAlgoGetHeuristic(self.handle, desc, la, lb, lc, lc, pref, 1, &mut result, &mut count);
            lt::cublasLtMatmulPreferenceDestroy(pref);
            blas_check(status, "cublasLtMatmulAlgoGetHeuristic")?;
            if count == 0 {
                return Err(Error::Backend(format!("cuBLASLt has no algorithm for {k:?}")));
            }
            Ok(Plan { desc, la, lb, lc, algo: result.algo })
        }
    }
}

/// How a row-major `[rows, cols]` operand with strides `(s0, s1)` reads as a column-major
/// matrix `[cols, rows]`, or `None` when neither stride is 1.
fn as_col_major(rows: u64, cols: u64, s0: isize, s1: isize, batch_stride: isize) -> Option<Mat> {
    if (s1 == 1 || cols == 1) && s0 >= cols.max(1) as isize {
        Some(Mat { rows: cols, cols: rows, ld: s0 as i64, trans: false, batch_stride: batch_stride as i64 })
    } else if (s0 == 1 || rows == 1) && s1 >= rows.max(1) as isize {
        Some(Mat { rows, cols, ld: s1 as i64, trans: true, batch_stride: batch_stride as i64 })
    } else {
        None
    }
}

/// The batch axes of an operand as one stride, when they collapse to one.
fn batch_stride(op: &Operand, nb: usize) -> Option<isize> {
    let d = Dims::new(&op.shape[..nb], &[&op.data.layout.strides[..nb]]).ok()?;
    (d.ndim <= 1).then(|| d.strides[0][0] as isize)
}

/// `alpha * a @ b + beta * c` (`c` broadcast to the output shape), batched over leading axes.
pub(crate) fn matmul(
    gpu: &Arc<Gpu>,
    a: Operand,
    b: Operand,
    c: Option<Operand>,
    alpha: f32,
    beta: f32,
    out: &mut Output,
) -> Result<()> {
    let r = out.shape.len();
    let (m, n) = (out.shape[r - 2] as u64, out.shape[r - 1] as u64);
    let k = a.shape[r - 1] as u64;
    let nb = r - 2;
    let batch: u64 = out.shape[..nb].iter().map(|&d| d as u64).product();
    let dtype = out.dtype;
    if dtype.is_integer() {
        return matmul_int(gpu, a, b, out);
    }
    // Few rows against W^T: the GEMV, adding a row-major `c` as it writes (a residual added
    // to a decode step's projection costs no kernel of its own).
    let with_c = c.is_some() && beta != 0.0;
    let c_dense = c.as_ref().filter(|c| c.shape == out.shape && c.data.layout.flags.row_contiguous);
    if with_c
        && let Some(cd) = c_dense
        && batch == 1
        && m <= 8
        && k > 0
        && n > 0
        && matches!(dtype, DType::F16 | DType::BF16 | DType::F32)
        && alpha == 1.0
    {
        let add = (ptr_of(cd)?, beta);
        let op_ptr = alloc_out(gpu, out)?;
        if let Some(done) = gemv(gpu, &a, &b, op_ptr, m, n, k, Some(add), Prologue::None)? {
            return Ok(done);
        }
    }
    // The destination starts as `c` when there is one.
    let op_ptr = match c {
        Some(c) if beta != 0.0 => {
            copy(gpu, c, out)?;
            ptr_of_out(out)?
        }
        _ => alloc_out(gpu, out)?,
    };
    if m == 0 || n == 0 || batch == 0 {
        return Ok(());
    }
    if k == 0 {
        // An empty sum (`addmm` handles this case before recording, so only products get here).
        if !with_c {
            gpu.bind()?;
            // SAFETY: the output buffer holds `m * n * batch` elements.
            unsafe {
                crate::driver::check(
                    cudarc::driver::sys::cuMemsetD8Async(
                        op_ptr,
                        0,
                        (m * n * batch) as usize * dtype.size(),
                        gpu.stream(),
                    ),
                    "cuMemsetD8Async",
                )?;
            }
            return Ok(());
        }
        return Err(internal("addmm with an empty inner dimension reached the GPU"));
    }
    if !with_c
        && batch == 1
        && m <= 8
        && matches!(dtype, DType::F16 | DType::BF16 | DType::F32)
        && alpha == 1.0
        && let Some(done) = gemv(gpu, &a, &b, op_ptr, m, n, k, None, Prologue::None)?
    {
        return Ok(done);
    }
    // Operands whose layout cuBLASLt cannot read become row-major copies.
    let fit = |op: Operand| -> Result<(Operand, Mat)> {
        let rr = op.shape.len();
        let (rows, cols) = (op.shape[rr - 2] as u64, op.shape[rr - 1] as u64);
        let s = &op.data.layout.strides;
        if let Some(bs) = batch_stride(&op, nb)
            && let Some(mat) = as_col_major(rows, cols, s[rr - 2], s[rr - 1], bs)
        {
            return Ok((op, mat));
        }
        let op = row_major(gpu, op)?;
        let mat = as_col_major(rows, cols, cols.max(1) as isize, 1, (rows * cols) as isize)
            .ok_or_else(|| internal("row-major operand has no cuBLASLt layout"))?;
        Ok((op, mat))
    };
    let (a, ma) = fit(a)?;
    let (b, mb) = fit(b)?;
    let tf32 = std::env::var("NUVEC_TF32").map(|v| v == "1").unwrap_or(false);
    let key = Key { dtype, tf32, a: mb, b: ma, m, n, batch, beta_zero: !with_c };
    let (ap, bp) = (ptr_of(&a)?, ptr_of(&b)?);
    let mut guard = gpu.blas.lock().unwrap_or_else(|e| e.into_inner());
    if guard.is_none() {
        *guard = Some(Blas::new(gpu)?);
    }
    let blas = guard.as_mut().ok_or_else(|| internal("no cuBLASLt state"))?;
    let handle = blas.handle;
    let ws = if crate::graph::recording_stream(gpu.index).is_some() { blas.recorded } else { blas.eager };
    let plan = blas.plan(key)?;
    let (alpha32, beta32) = (alpha, if with_c { beta } else { 0.0 });
    let (alpha64, beta64) = (alpha as f64, beta32 as f64);
    let (pa, pb): (*const c_void, *const c_void) = if dtype == DType::F64 {
        (&alpha64 as *const f64 as *const c_void, &beta64 as *const f64 as *const c_void)
    } else {
        (&alpha32 as *const f32 as *const c_void, &beta32 as *const f32 as *const c_void)
    };
    gpu.bind()?;
    // SAFETY: the plan's layouts describe exactly these buffers (shapes, leading dimensions
    // and batch strides computed above from their layouts); C and D are the same buffer with
    // the same layout, which cuBLASLt allows; the workspace holds WORKSPACE bytes; the scalars
    // live until the call returns (cuBLASLt reads host scalars before returning).
    unsafe {
        blas_check(
            lt::cublasLtMatmul(
                handle,
                plan.desc,
                pa,
                bp as *const c_void,
                plan.la,
                ap as *const c_void,
                plan.lb,
                pb,
                op_ptr as *const c_void,
                plan.lc,
                op_ptr as *mut c_void,
                plan.lc,
                &plan.algo,
                ws as *mut c_void,
                WORKSPACE,
                gpu.stream() as lt::cudaStream_t,
            ),
            "cublasLtMatmul",
        )
    }
}

fn ptr_of_out(out: &Output) -> Result<u64> {
    let data = out.data.as_ref().ok_or_else(|| internal("output not allocated"))?;
    let op = Operand { shape: out.shape.clone(), dtype: out.dtype, data: data.clone(), donated: false };
    ptr_of(&op)
}

/// What the GEMV applies to its left operand as it loads it (`PRO_*` in matmul.cuh).
#[derive(Clone, Copy)]
enum Prologue {
    /// The operand as it is.
    None,
    /// An RMS norm over each row, with this weight (`K` elements) and epsilon.
    RmsNorm { weight: u64, eps: f32 },
    /// SwiGLU: the operand is the gate, `up` the first up row, the next ones `ld` apart.
    SwiGlu { up: u64, ld: u64 },
}

/// `fast::rms_norm_matmul` (inputs `[x, weight, b]`) or `fast::swiglu_matmul` (`[gate, up, b,
/// c?]`) for the few rows `fast::supports` admits. With `b` a transposed row-major weight the
/// GEMV applies the norm or the activation as it loads the rows (no kernel and no round trip of
/// its own); otherwise the fused operation's kernel writes the operand and the product follows.
pub(crate) fn fused(gpu: &Arc<Gpu>, op: &FastOp, inputs: Vec<Operand>, out: &mut Output) -> Result<()> {
    let mut it = inputs.into_iter();
    let mut next = || it.next().ok_or_else(|| internal(format!("{} is missing an input", op.name())));
    let (x, x2, b) = (next()?, next()?, next()?);
    let c = if matches!(op, FastOp::SwiGluMatmul { add: true }) { Some(next()?) } else { None };
    let (k, n) = (b.shape[0] as u64, b.shape[1] as u64);
    let m = (out.size() as u64).checked_div(n).unwrap_or(0);
    if k == 0
        && m * n > 0
        && let Some(c) = &c
    {
        // An empty sum: the product is c.
        return copy(gpu, c.clone(), out);
    }
    let op_ptr = alloc_out(gpu, out)?;
    if m * n == 0 {
        return Ok(());
    }
    if k == 0 {
        // An empty sum and no c: zeros.
        return gpu.zero(op_ptr, out.size() * out.dtype.size());
    }
    let rows = |o: &Operand| {
        as_rows(o).map_or_else(
            || as_rows(&row_major(gpu, o.clone())?).ok_or_else(|| internal("row-major operand has no rows")),
            Ok,
        )
    };
    let (x, x2) = match op {
        FastOp::SwiGluMatmul { .. } => (rows(&x)?, rows(&x2)?),
        _ => (rows(&x)?, row_major(gpu, x2)?),
    };
    let pro = match op {
        FastOp::RmsNormMatmul { eps } => Prologue::RmsNorm { weight: ptr_of(&x2)?, eps: *eps },
        _ => Prologue::SwiGlu { up: ptr_of(&x2)?, ld: x2.data.layout.strides[0] as u64 },
    };
    // c has the output's shape: row-major, its rows are the output's.
    let c = c.map(|c| rows(&row_major(gpu, c)?)).transpose()?;
    let add = c.as_ref().map(|c| ptr_of(c).map(|p| (p, 1.0))).transpose()?;
    if gemv(gpu, &x, &b, op_ptr, m, n, k, add, pro)?.is_some() {
        return Ok(());
    }
    // The operand through its own kernel, then the product.
    let unfused = match op {
        FastOp::RmsNormMatmul { eps } => FastOp::RmsNorm { eps: *eps, weighted: true },
        _ => FastOp::SwiGlu,
    };
    let mut y = Output { shape: x.shape.clone(), dtype: x.dtype, data: None };
    crate::fast::eval(gpu, &unfused, vec![x, x2], std::slice::from_mut(&mut y))?;
    let y =
        Operand { shape: y.shape, dtype: y.dtype, data: y.data.ok_or_else(|| internal("no operand"))?, donated: true };
    let mut product = Output { shape: [m as i32, n as i32].into_iter().collect(), dtype: out.dtype, data: None };
    matmul(gpu, y, b, c, 1.0, 1.0, &mut product)?;
    out.data =
        Some(Data { layout: Layout::row_major(&out.shape), ..product.data.ok_or_else(|| internal("no product"))? });
    Ok(())
}

/// The operand as a 2-D view `[rows, last axis]`, when its leading axes collapse to one stride
/// and its last axis is dense.
fn as_rows(op: &Operand) -> Option<Operand> {
    let r = op.shape.len();
    let last = *op.shape.last()?;
    let s = &op.data.layout.strides;
    let rows: i32 = op.shape[..r - 1].iter().product();
    let lead = Dims::new(&op.shape[..r - 1], &[&s[..r - 1]]).ok()?;
    if (s[r - 1] != 1 && last > 1) || lead.ndim > 1 {
        return None;
    }
    let ld = if rows > 1 { lead.strides[0][0] as isize } else { last as isize };
    let shape: nuvec_core::shape::Shape = [rows, last].into_iter().collect();
    let layout = Layout::new(&shape, [ld, 1].into_iter().collect(), op.data.layout.offset);
    Some(Operand { shape, dtype: op.dtype, data: Data { layout, ..op.data.clone() }, donated: false })
}

/// Column threads of a `gemv_cols` block (NV_GEMV_CT in matmul.cuh).
const GEMV_COL_THREADS: u64 = 8;
/// Threads of a `gemv_cols` block (NV_GEMV_COL_BLOCK in matmul.cuh, its launch bound).
const GEMV_COL_BLOCK: u32 = 256;

/// The GEMV kernels, when the layout suits them; `None` leaves the product to cuBLASLt. With
/// `add` (a row-major `[m, n]` buffer and its factor), `gemv_rows` adds it as it writes;
/// `gemv_cols` has no such epilogue and leaves those products to cuBLASLt.
#[allow(clippy::too_many_arguments)]
fn gemv(
    gpu: &Arc<Gpu>,
    a: &Operand,
    b: &Operand,
    out: u64,
    m: u64,
    n: u64,
    k: u64,
    add: Option<(u64, f32)>,
    pro: Prologue,
) -> Result<Option<()>> {
    let ra = a.shape.len();
    let (sa0, sa1) = (a.data.layout.strides[ra - 2], a.data.layout.strides[ra - 1]);
    let (sb0, sb1) = (b.data.layout.strides[ra - 2], b.data.layout.strides[ra - 1]);
    if sa1 != 1 && k > 1 {
        return Ok(None);
    }
    let v = (16 / a.dtype.size()) as u64;
    let (xp, wp) = (ptr_of(a)?, ptr_of(b)?);
    let ldx = if m > 1 { sa0 as u64 } else { k };
    let family = Family::Matmul(a.dtype);
    let x_aligned = xp % 16 == 0 && (m == 1 || ldx % v == 0);
    let (name, x2, ldx2, eps) = match pro {
        Prologue::None => ("gemv_rows", 0, 0, 0.0),
        Prologue::RmsNorm { weight, eps } => ("gemv_rows_rms_norm", weight, 0, eps),
        Prologue::SwiGlu { up, ld } => ("gemv_rows_swiglu", up, if m > 1 { ld } else { k }, 0.0),
    };
    let x2_aligned = x2 % 16 == 0 && ldx2 % v == 0;
    if m <= gemv_rows_max()
        && sb0 == 1
        && sb1 as u64 >= k
        && x_aligned
        && x2_aligned
        && wp % 16 == 0
        && (sb1 as u64).is_multiple_of(v)
    {
        // B = W^T with W [N, K] row-major: a warp's worth of threads per output column (matmul.cuh
        // groups adjacent outputs in a block and splits K across it).
        let f = kernel(gpu, family, &format!("{name}_{m}"))?;
        let grid = n.div_ceil((BLOCK / 32) as u64).min(65535 * 32) as u32;
        let args = vec![
            Arg::Ptr(xp),
            Arg::Ptr(x2),
            Arg::U64(ldx2),
            Arg::F32(eps),
            Arg::Ptr(wp),
            Arg::Ptr(out),
            Arg::U64(n),
            Arg::U64(k),
            Arg::U64(ldx),
            Arg::U64(sb1 as u64),
            Arg::U64(n),
            Arg::Ptr(add.map_or(0, |(p, _)| p)),
            Arg::F32(add.map_or(0.0, |(_, beta)| beta)),
        ];
        launch(gpu, f, (grid, 1, 1), (BLOCK, 1, 1), 0, args)?;
        return Ok(Some(()));
    }
    if add.is_some() || !matches!(pro, Prologue::None) {
        return Ok(None);
    }
    if sb1 == 1 && sb0 as u64 >= n && wp % 16 == 0 && (sb0 as u64).is_multiple_of(v) {
        // B [K, N] row-major: a block per tile of columns and slice of K (matmul.cuh). Slices: about
        // two blocks per SM (where a sweep peaked, above every resident block filled; see
        // bench/results/), never a second wave, at least 128 rows each.
        let f = kernel(gpu, family, &format!("gemv_cols_{m}"))?;
        let tile = GEMV_COL_THREADS * v;
        let tiles = n.div_ceil(tile);
        let sms = gpu.info.multiprocessors.max(1) as u64;
        let resident = crate::launch::resident_blocks(gpu, f, GEMV_COL_BLOCK)? * sms;
        let wanted = (2 * sms + tiles / 2) / tiles;
        let slices = wanted.min(resident / tiles).min(k.div_ceil(128)).clamp(1, 65535);
        let partials = if slices > 1 { Some(alloc(gpu, (slices * m * n) as usize, DType::F32)?) } else { None };
        let pp = partials.as_ref().map(|p| p.0).unwrap_or(0);
        let counters = if slices > 1 { gpu.counters(tiles as usize)? } else { 0 };
        let args = vec![
            Arg::Ptr(xp),
            Arg::Ptr(wp),
            Arg::Ptr(pp),
            Arg::Ptr(counters),
            Arg::Ptr(out),
            Arg::U64(n),
            Arg::U64(k),
            Arg::U64(ldx),
            Arg::U64(sb0 as u64),
            Arg::U64(n),
            Arg::U64(slices),
        ];
        launch(gpu, f, (tiles as u32, slices as u32, 1), (GEMV_COL_BLOCK, 1, 1), 0, args)?;
        return Ok(Some(()));
    }
    Ok(None)
}

fn matmul_int(gpu: &Arc<Gpu>, a: Operand, b: Operand, out: &mut Output) -> Result<()> {
    let r = out.shape.len();
    let (m, n) = (out.shape[r - 2] as u64, out.shape[r - 1] as u64);
    let k = a.shape[r - 1] as u64;
    let nb = r - 2;
    let batches: u64 = out.shape[..nb].iter().map(|&d| d as u64).product();
    let op = alloc_out(gpu, out)?;
    if batches * m * n == 0 {
        return Ok(());
    }
    let out_strides = row_major_strides(&out.shape);
    let d =
        Dims::new(&out.shape[..nb], &[&a.data.layout.strides[..nb], &b.data.layout.strides[..nb], &out_strides[..nb]])?;
    let (sa, sb) = (&a.data.layout.strides, &b.data.layout.strides);
    let f = kernel(gpu, Family::Matmul(a.dtype), "matmul_int")?;
    let args = vec![
        Arg::Ptr(ptr_of(&a)?),
        Arg::Ptr(ptr_of(&b)?),
        Arg::Ptr(op),
        Arg::U64(batches),
        Arg::U64(m),
        Arg::U64(n),
        Arg::U64(k),
        Arg::I64(sa[r - 2] as i64),
        Arg::I64(sa[r - 1] as i64),
        Arg::I64(sb[r - 2] as i64),
        Arg::I64(sb[r - 1] as i64),
        Arg::Dims(Box::new(d)),
    ];
    let grid = crate::launch::grid_for(gpu, batches * m * n, BLOCK as u64);
    launch(gpu, f, (grid, 1, 1), (BLOCK, 1, 1), 0, args)
}
