//! Single-precision matrix product for x86-64 with AVX2 and FMA: BLIS's loop nest (panels of B
//! sized for L3, blocks of A for L2, a 6×16 register tile) with the packed panel of B shared by
//! the threads, which split the rows of C.
//!
//! The `gemm` crate covers every other case; this path exists because large f32 products ran
//! behind OpenBLAS through `gemm` on AVX2 machines. Threads are
//! scoped OS threads that meet at a barrier once per panel of B, so the product never waits on
//! a rayon pool that its caller may already occupy.

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;
use std::sync::Barrier;

/// Rows of the register tile.
const MR: usize = 6;
/// Columns of the register tile (two 8-lane vectors).
const NR: usize = 16;
/// Depth of a packed block: a 256 × 16 micro-panel of B (16 KiB) stays in L1.
const KC: usize = 256;
/// Rows of a packed block of A: 144 × 256 floats (144 KiB) stay in L2.
const MC: usize = 144;
/// Columns of a packed panel of B: 256 × 4080 floats (4 MiB, twice for double buffering) in L3.
const NC: usize = 4080;

/// A strided f32 matrix: element (i, j) at `ptr + i·rs + j·cs`.
#[derive(Clone, Copy)]
pub struct Mat {
    /// First element.
    pub ptr: *const f32,
    /// Row stride, in elements.
    pub rs: isize,
    /// Column stride, in elements.
    pub cs: isize,
}

// SAFETY: `Mat` is read-only access to a buffer the caller keeps alive and unchanged for the
// whole product (see `sgemm`'s contract); reading it from several threads is sound.
unsafe impl Send for Mat {}
// SAFETY: as for `Send`: shared access only reads.
unsafe impl Sync for Mat {}

/// Whether this CPU runs the AVX2 + FMA kernel.
pub fn available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// One product `C = alpha · A·B + beta · C` (`beta: None` writes C without reading it) for A
/// `[m, k]`, B `[k, n]` and C `[m, n]` row-major with row stride `ldc`.
pub struct Product {
    /// Rows of A and C.
    pub m: usize,
    /// Columns of B and C.
    pub n: usize,
    /// Columns of A, rows of B.
    pub k: usize,
    /// The left operand.
    pub a: Mat,
    /// The right operand.
    pub b: Mat,
    /// First element of C.
    pub c: *mut f32,
    /// Row stride of C, in elements.
    pub ldc: usize,
    /// Scale of A·B.
    pub alpha: f32,
    /// Scale of C's previous values; `None` when they are not read.
    pub beta: Option<f32>,
}

/// Runs `p` on up to `threads` threads.
///
/// # Safety
/// [`available`] is true; every element of A and B that the shapes and strides name is
/// readable and unchanged until the call returns; C's `m` rows of `n` elements at stride `ldc`
/// are writable and overlap neither A nor B; `k > 0`.
pub unsafe fn sgemm(p: Product, threads: usize) {
    let Product { m, n, k, a, b, c, ldc, alpha, beta } = p;
    if m == 0 || n == 0 {
        return;
    }
    // At least four register tiles of rows per thread; the rows split in whole tiles.
    let threads = threads.clamp(1, m.div_ceil(4 * MR));
    let rows_per = m.div_ceil(threads).div_ceil(MR) * MR;
    let panels = NC.min(n.div_ceil(NR) * NR) / NR;
    let mut b_bufs = [PackBuf::new(KC * panels * NR), PackBuf::new(if threads > 1 { KC * panels * NR } else { 0 })];
    let c = CPtr(c);
    let b_ptrs = [b_bufs[0].ptr(), b_bufs[1].ptr()];
    let job = Job { n, k, a, b, c, ldc, alpha, beta, threads, b_bufs: b_ptrs };
    if threads == 1 {
        // SAFETY: the caller's contract; one thread owns every row.
        unsafe { job.run(0, 0, m, None) };
        return;
    }
    let barrier = Barrier::new(threads);
    std::thread::scope(|s| {
        for t in 1..threads {
            let (job, barrier) = (&job, &barrier);
            let lo = (t * rows_per).min(m);
            let hi = ((t + 1) * rows_per).min(m);
            // SAFETY: the caller's contract; threads write disjoint rows of C and disjoint
            // panels of the shared B buffer, and read that buffer only after the barrier.
            s.spawn(move || unsafe { job.run(t, lo, hi, Some(barrier)) });
        }
        // SAFETY: as for the spawned threads.
        unsafe { job.run(0, 0, rows_per.min(m), Some(&barrier)) };
    });
    drop(b_bufs);
}

#[derive(Clone, Copy)]
struct CPtr(*mut f32);
// SAFETY: each thread writes only its own rows of C (see `Job::run`).
unsafe impl Send for CPtr {}
// SAFETY: as for `Send`: the threads sharing it write disjoint rows.
unsafe impl Sync for CPtr {}

/// A packing buffer aligned to 64 bytes, so the kernel's vector loads of B never split a line.
struct PackBuf {
    store: Vec<f32>,
    offset: usize,
}

thread_local! {
    /// Packing buffers this thread used before: fresh ones of a few MiB are fresh pages, whose
    /// faults and zeroing cost a training step more than its products' packing.
    static SPARE_PACKS: std::cell::RefCell<Vec<Vec<f32>>> = const { std::cell::RefCell::new(Vec::new()) };
}

impl PackBuf {
    /// A buffer of at least `len` elements; its contents are whatever a previous product left
    /// (packing writes every element the kernel reads).
    fn new(len: usize) -> PackBuf {
        let spare = SPARE_PACKS.with(|s| {
            let mut s = s.borrow_mut();
            let at = s.iter().position(|b| b.len() >= len + 16)?;
            Some(s.swap_remove(at))
        });
        let store = spare.unwrap_or_else(|| vec![0.0f32; len + 16]);
        let offset = store.as_ptr().align_offset(64).min(16);
        PackBuf { store, offset }
    }
    /// The aligned start. The threads that pack write through it; `store` is not touched
    /// through `self` again until it is dropped after they finish.
    fn ptr(&mut self) -> CPtr {
        CPtr(self.store.as_mut_ptr().wrapping_add(self.offset))
    }
}

impl Drop for PackBuf {
    fn drop(&mut self) {
        let store = std::mem::take(&mut self.store);
        if store.len() > 16 {
            // A few per thread: the two B buffers and A's.
            let _ = SPARE_PACKS.try_with(|s| {
                let mut s = s.borrow_mut();
                if s.len() < 4 {
                    s.push(store);
                }
            });
        }
    }
}

struct Job {
    n: usize,
    k: usize,
    a: Mat,
    b: Mat,
    c: CPtr,
    ldc: usize,
    alpha: f32,
    beta: Option<f32>,
    threads: usize,
    b_bufs: [CPtr; 2],
}

/// How a tile of C is updated with `alpha · A·B`.
#[derive(Clone, Copy)]
enum Update {
    /// C = alpha·AB (C is not read: it may be uninitialized).
    Write,
    /// C = alpha·AB + beta·C.
    Scale(f32),
    /// C += alpha·AB (later blocks of the depth).
    Add,
}

impl Job {
    /// Thread `t`'s share: rows `lo..hi` of C. With a barrier, the threads pack the panels of B
    /// together and each waits for all of them before using it; panels alternate between two
    /// buffers, so one barrier per panel keeps a panel from being repacked while in use (a
    /// thread that packs panel p + 1 has passed panel p's barrier, which every thread reaches
    /// only after finishing panel p − 1, the previous user of that buffer).
    unsafe fn run(&self, t: usize, lo: usize, hi: usize, barrier: Option<&Barrier>) {
        let mut a_buf = PackBuf::new(MC * KC);
        let ap = a_buf.ptr().0;
        // One thread packs into a single buffer; several alternate between two.
        let mut step = 0usize;
        for jc in (0..self.n).step_by(NC) {
            let nc = NC.min(self.n - jc);
            let np = nc.div_ceil(NR);
            for pc in (0..self.k).step_by(KC) {
                let kc = KC.min(self.k - pc);
                let bp = self.b_bufs[if barrier.is_some() { step % 2 } else { 0 }].0;
                step += 1;
                let (p0, p1) = match barrier {
                    Some(_) => (t * np / self.threads, (t + 1) * np / self.threads),
                    None => (0, np),
                };
                let b = self.b;
                for p in p0..p1 {
                    let src = b.ptr.wrapping_offset(pc as isize * b.rs + (jc + p * NR) as isize * b.cs);
                    // SAFETY: rows pc..pc+kc and these columns of B are in bounds (contract);
                    // the destination panel lies inside the buffer sized for `np` panels.
                    unsafe { pack_b(kc, NR.min(nc - p * NR), src, b.rs, b.cs, bp.add(p * KC * NR)) };
                }
                if let Some(barrier) = barrier {
                    barrier.wait();
                }
                let update = match (pc, self.beta) {
                    (0, None) => Update::Write,
                    (0, Some(beta)) => Update::Scale(beta),
                    _ => Update::Add,
                };
                for ic in (lo..hi).step_by(MC) {
                    let mc = MC.min(hi - ic);
                    let a = self.a;
                    let src = a.ptr.wrapping_offset(ic as isize * a.rs + pc as isize * a.cs);
                    // SAFETY: rows ic..ic+mc, depth pc..pc+kc of A are in bounds (contract).
                    unsafe { pack_a(mc, kc, src, a.rs, a.cs, ap) };
                    for jr in (0..nc).step_by(NR) {
                        let nr = NR.min(nc - jr);
                        let bpanel = bp.wrapping_add(jr / NR * KC * NR);
                        for ir in (0..mc).step_by(MR) {
                            let mr = MR.min(mc - ir);
                            let apanel = ap.wrapping_add(ir / MR * KC * MR);
                            let out = self.c.0.wrapping_add((ic + ir) * self.ldc + jc + jr);
                            // SAFETY: the panels hold kc packed steps; the tile's mr × nr
                            // elements of C are this thread's rows (contract).
                            unsafe { tile(kc, apanel, bpanel, out, self.ldc, mr, nr, self.alpha, update) };
                        }
                    }
                }
            }
        }
    }
}

/// Packs `kc` rows of up to 16 columns of B into one micro-panel: step p holds B(p, 0..16),
/// zero past `nr`.
unsafe fn pack_b(kc: usize, nr: usize, src: *const f32, rs: isize, cs: isize, dst: *mut f32) {
    for p in 0..kc {
        let row = src.wrapping_offset(p as isize * rs);
        let out = dst.wrapping_add(p * NR);
        // SAFETY: (p, j < nr) is in B; the destination step has NR slots.
        unsafe {
            if cs == 1 && nr == NR {
                std::ptr::copy_nonoverlapping(row, out, NR);
            } else {
                for j in 0..NR {
                    *out.add(j) = if j < nr { *row.offset(j as isize * cs) } else { 0.0 };
                }
            }
        }
    }
}

/// Packs an `mc × kc` block of A into micro-panels of 6 rows: step p of a panel holds A(0..6, p),
/// zero past the block's last row.
unsafe fn pack_a(mc: usize, kc: usize, src: *const f32, rs: isize, cs: isize, dst: *mut f32) {
    for (panel, i0) in (0..mc).step_by(MR).enumerate() {
        let out = dst.wrapping_add(panel * KC * MR);
        let mr = MR.min(mc - i0);
        for i in 0..MR {
            let row = src.wrapping_offset((i0 + i) as isize * rs);
            for p in 0..kc {
                // SAFETY: (i0 + i < mc, p < kc) is in the block; the panel has kc·MR slots.
                unsafe { *out.add(p * MR + i) = if i < mr { *row.offset(p as isize * cs) } else { 0.0 } };
            }
        }
    }
}

/// One register tile: the full 6 × 16 kernel, straight into C when the tile is whole, else
/// through a scratch tile (the packed panels are zero-padded, so the full kernel is exact).
#[allow(clippy::too_many_arguments)]
unsafe fn tile(
    kc: usize,
    a: *const f32,
    b: *const f32,
    c: *mut f32,
    ldc: usize,
    mr: usize,
    nr: usize,
    alpha: f32,
    update: Update,
) {
    if mr == MR && nr == NR {
        // SAFETY: `available()` was checked by `sgemm`'s caller; the tile is in C.
        unsafe { kernel(kc, a, b, c, ldc, alpha, update) };
        return;
    }
    let mut scratch = [0.0f32; MR * NR];
    // SAFETY: as above, into the scratch tile.
    unsafe { kernel(kc, a, b, scratch.as_mut_ptr(), NR, alpha, Update::Write) };
    for i in 0..mr {
        for j in 0..nr {
            // SAFETY: (i < mr, j < nr) is inside the tile of C.
            unsafe {
                let o = c.add(i * ldc + j);
                let v = scratch[i * NR + j];
                *o = match update {
                    Update::Write => v,
                    Update::Scale(beta) => v + beta * *o,
                    Update::Add => v + *o,
                };
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn kernel(kc: usize, a: *const f32, b: *const f32, c: *mut f32, ldc: usize, alpha: f32, update: Update) {
    // Twelve accumulators: rows 0..6 × two 8-lane halves. Written out so they stay in registers.
    let z = _mm256_setzero_ps();
    let (mut c00, mut c01, mut c10, mut c11, mut c20, mut c21) = (z, z, z, z, z, z);
    let (mut c30, mut c31, mut c40, mut c41, mut c50, mut c51) = (z, z, z, z, z, z);
    // The tile of C is read and written after the loop: fetch its lines now, so that those
    // accesses hit instead of stalling on L3 or memory once per tile.
    for i in 0..MR {
        // SAFETY: prefetches of the tile's rows (in C), which never fault.
        unsafe {
            _mm_prefetch::<_MM_HINT_T0>(c.add(i * ldc) as *const i8);
            _mm_prefetch::<_MM_HINT_T0>(c.add(i * ldc + NR - 1) as *const i8);
        }
    }
    let (mut a, mut b) = (a, b);
    // One step of the depth: two vectors of B, six broadcasts of A, twelve FMAs.
    macro_rules! step {
        ($s:expr) => {{
            let (a, b) = (a.add($s * MR), b.add($s * NR));
            let b0 = _mm256_loadu_ps(b);
            let b1 = _mm256_loadu_ps(b.add(8));
            let x = _mm256_broadcast_ss(&*a);
            c00 = _mm256_fmadd_ps(x, b0, c00);
            c01 = _mm256_fmadd_ps(x, b1, c01);
            let x = _mm256_broadcast_ss(&*a.add(1));
            c10 = _mm256_fmadd_ps(x, b0, c10);
            c11 = _mm256_fmadd_ps(x, b1, c11);
            let x = _mm256_broadcast_ss(&*a.add(2));
            c20 = _mm256_fmadd_ps(x, b0, c20);
            c21 = _mm256_fmadd_ps(x, b1, c21);
            let x = _mm256_broadcast_ss(&*a.add(3));
            c30 = _mm256_fmadd_ps(x, b0, c30);
            c31 = _mm256_fmadd_ps(x, b1, c31);
            let x = _mm256_broadcast_ss(&*a.add(4));
            c40 = _mm256_fmadd_ps(x, b0, c40);
            c41 = _mm256_fmadd_ps(x, b1, c41);
            let x = _mm256_broadcast_ss(&*a.add(5));
            c50 = _mm256_fmadd_ps(x, b0, c50);
            c51 = _mm256_fmadd_ps(x, b1, c51);
        }};
    }
    for _ in 0..kc / 4 {
        // SAFETY: the panels hold kc steps of MR and NR floats; the prefetches (which never
        // fault) may point past them.
        unsafe {
            _mm_prefetch::<_MM_HINT_T0>(a.wrapping_add(8 * MR) as *const i8);
            _mm_prefetch::<_MM_HINT_T0>(b.wrapping_add(8 * NR) as *const i8);
            _mm_prefetch::<_MM_HINT_T0>(b.wrapping_add(8 * NR + 16) as *const i8);
            step!(0);
            step!(1);
            _mm_prefetch::<_MM_HINT_T0>(b.wrapping_add(10 * NR) as *const i8);
            _mm_prefetch::<_MM_HINT_T0>(b.wrapping_add(10 * NR + 16) as *const i8);
            step!(2);
            step!(3);
            a = a.add(4 * MR);
            b = b.add(4 * NR);
        }
    }
    for _ in 0..kc % 4 {
        // SAFETY: as above.
        unsafe {
            step!(0);
            a = a.add(MR);
            b = b.add(NR);
        }
    }
    let va = _mm256_set1_ps(alpha);
    let rows = [[c00, c01], [c10, c11], [c20, c21], [c30, c31], [c40, c41], [c50, c51]];
    for (i, [lo, hi]) in rows.into_iter().enumerate() {
        // SAFETY: row i of the tile has NR writable floats at c + i·ldc.
        unsafe {
            let p = c.add(i * ldc);
            let (lo, hi) = (_mm256_mul_ps(lo, va), _mm256_mul_ps(hi, va));
            let (lo, hi) = match update {
                Update::Write => (lo, hi),
                Update::Scale(beta) => {
                    let vb = _mm256_set1_ps(beta);
                    (_mm256_fmadd_ps(_mm256_loadu_ps(p), vb, lo), _mm256_fmadd_ps(_mm256_loadu_ps(p.add(8)), vb, hi))
                }
                Update::Add => (_mm256_add_ps(_mm256_loadu_ps(p), lo), _mm256_add_ps(_mm256_loadu_ps(p.add(8)), hi)),
            };
            _mm256_storeu_ps(p, lo);
            _mm256_storeu_ps(p.add(8), hi);
        }
    }
}

#[cfg(not(target_arch = "x86_64"))]
unsafe fn kernel(_: usize, _: *const f32, _: *const f32, _: *mut f32, _: usize, _: f32, _: Update) {
    unreachable!("sgemm::available() is false off x86-64")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reference(m: usize, n: usize, k: usize, a: &[f32], b: &[f32]) -> Vec<f64> {
        let mut c = vec![0.0f64; m * n];
        for i in 0..m {
            for p in 0..k {
                for j in 0..n {
                    c[i * n + j] += a[i * k + p] as f64 * b[p * n + j] as f64;
                }
            }
        }
        c
    }

    fn values(len: usize, seed: u32) -> Vec<f32> {
        (0..len)
            .map(|i| ((i as u32).wrapping_mul(2654435761).wrapping_add(seed) >> 8) as f32 / 16777216.0 - 0.5)
            .collect()
    }

    #[test]
    fn agrees_with_float64_over_edges_threads_and_updates() {
        if !available() {
            return;
        }
        // Shapes straddling every blocking boundary: tiles (6, 16), blocks (144, 256), panel 4080.
        for &(m, n, k) in &[(1, 1, 1), (7, 17, 3), (150, 40, 300), (13, 4100, 257), (300, 33, 520)] {
            let (a, b) = (values(m * k, 1), values(k * n, 2));
            let want = reference(m, n, k, &a, &b);
            for threads in [1, 2, 3] {
                for beta in [None, Some(0.5f32)] {
                    let init = values(m * n, 3);
                    let mut c = if beta.is_some() { init.clone() } else { vec![f32::NAN; m * n] };
                    let am = Mat { ptr: a.as_ptr(), rs: k as isize, cs: 1 };
                    let bm = Mat { ptr: b.as_ptr(), rs: n as isize, cs: 1 };
                    // SAFETY: the buffers match the shapes; C is its own allocation.
                    unsafe {
                        sgemm(Product { m, n, k, a: am, b: bm, c: c.as_mut_ptr(), ldc: n, alpha: 2.0, beta }, threads)
                    };
                    for (idx, (&got, &w)) in c.iter().zip(&want).enumerate() {
                        let w = 2.0 * w + beta.map_or(0.0, |bt| bt as f64 * init[idx] as f64);
                        let tol = 1e-5 * (k as f64).sqrt() + 1e-6 * w.abs();
                        assert!(
                            (got as f64 - w).abs() <= tol,
                            "{m}x{n}x{k} threads {threads} beta {beta:?} at {idx}: {got} vs {w}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn reads_transposed_and_strided_operands() {
        if !available() {
            return;
        }
        let (m, n, k) = (37, 29, 70);
        let (a, b) = (values(m * k, 4), values(k * n, 5));
        let want = reference(m, n, k, &a, &b);
        // A stored column-major, B column-major: the same matrices through other strides.
        let mut at = vec![0.0f32; m * k];
        let mut bt = vec![0.0f32; k * n];
        for i in 0..m {
            for p in 0..k {
                at[p * m + i] = a[i * k + p];
            }
        }
        for p in 0..k {
            for j in 0..n {
                bt[j * k + p] = b[p * n + j];
            }
        }
        let mut c = vec![0.0f32; m * (n + 5)];
        let am = Mat { ptr: at.as_ptr(), rs: 1, cs: m as isize };
        let bm = Mat { ptr: bt.as_ptr(), rs: 1, cs: k as isize };
        // SAFETY: as above; C rows have stride n + 5.
        unsafe { sgemm(Product { m, n, k, a: am, b: bm, c: c.as_mut_ptr(), ldc: n + 5, alpha: 1.0, beta: None }, 2) };
        for i in 0..m {
            for j in 0..n {
                let (got, w) = (c[i * (n + 5) + j] as f64, want[i * n + j]);
                assert!((got - w).abs() <= 1e-4, "({i}, {j}): {got} vs {w}");
            }
        }
    }
}
