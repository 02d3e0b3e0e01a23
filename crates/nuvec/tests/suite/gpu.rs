//! The GPU against the CPU: every primitive family over dtypes and layouts, computed on both
//! devices and compared (exactly for integers and booleans). With `NUVEC_REQUIRE_GPU=1` a
//! missing GPU is a failure, so a GPU run cannot pass by skipping; without a GPU the tests
//! check that everything reports "unavailable" and runs on the CPU.

use nuvec::{Array, DType, Device, array, ops, with_stream};

fn gpu_usable() -> bool {
    let required = std::env::var("NUVEC_REQUIRE_GPU").as_deref() == Ok("1");
    let ok = nuvec::cuda::is_available();
    if required {
        assert!(ok, "NUVEC_REQUIRE_GPU=1 but the GPU is unusable: {:?}", nuvec::cuda::unavailable_reason());
    }
    ok
}

/// Whether a test that needs the GPU runs; says so when it skips.
pub(crate) fn gpu() -> bool {
    let ok = gpu_usable();
    if !ok {
        crate::skipped(&format!("no usable GPU ({})", nuvec::cuda::unavailable_reason().unwrap_or_default()));
    }
    ok
}

#[test]
fn gpu_presence_is_reported_without_panicking() {
    let usable = gpu_usable();
    assert_eq!(usable, nuvec::graph::is_available(Device::gpu(0)));
    if usable {
        let info = nuvec::cuda::device_info(0).unwrap();
        println!("{info:?}");
        assert!(info.multiprocessors > 0 && info.total_memory > 0);
        assert_eq!(
            nuvec::default_device(),
            if std::env::var("NUVEC_DEVICE").as_deref() == Ok("cpu") { Device::cpu() } else { Device::gpu(0) }
        );
    } else {
        assert!(nuvec::cuda::unavailable_reason().is_some());
        assert!(nuvec::cuda::device_info(0).is_err());
        assert!(nuvec::cuda::memory(0).is_err());
    }
}

/// Deterministic values of `dtype` with a spread of magnitudes and signs (and some exact
/// zeros), never all equal.
fn values(shape: &[i32], dtype: DType, seed: f32) -> Array {
    let n: i32 = shape.iter().product();
    let x = (ops::arange(0, n.max(1), 1).astype(DType::F32) * 0.7311 + seed).sin() * 3.0;
    let x = x.slice(&[0], &[n], &[1]).reshape(shape);
    match dtype {
        DType::Bool => x.greater(0.0),
        d if d.is_integer() => {
            let v = (x * 20.0).round();
            if matches!(d, DType::U8 | DType::U16 | DType::U32 | DType::U64) { v.abs().astype(d) } else { v.astype(d) }
        }
        d => x.astype(d),
    }
}

fn on<R>(device: Device, f: impl FnOnce() -> R) -> R {
    with_stream(device, f)
}

/// Compares an array computed on each device: same dtype and shape, equal integers/booleans,
/// floats within a tolerance of the dtype.
fn assert_same(what: &str, cpu: &Array, gpu: &Array) {
    cpu.eval().unwrap_or_else(|e| panic!("{what} on the CPU: {e}"));
    gpu.eval().unwrap_or_else(|e| panic!("{what} on the GPU: {e}"));
    assert_eq!(cpu.shape(), gpu.shape(), "{what}: shapes");
    assert_eq!(cpu.dtype(), gpu.dtype(), "{what}: dtypes");
    let dtype = cpu.dtype();
    if !dtype.is_inexact() {
        assert_eq!(cpu.to_bytes().unwrap(), gpu.to_bytes().unwrap(), "{what}: integer results differ");
        return;
    }
    let as_f64 = |a: &Array| -> Vec<f64> {
        match a.dtype() {
            DType::Complex64 => {
                let v = a.to_vec::<nuvec::Complex64>().unwrap();
                v.iter().flat_map(|c| [c.re as f64, c.im as f64]).collect()
            }
            _ => a.astype(DType::F64).to_vec::<f64>().unwrap(),
        }
    };
    let (c, g) = (as_f64(cpu), as_f64(gpu));
    let tol = match dtype {
        DType::F16 => 2e-3,
        DType::BF16 => 1.6e-2,
        DType::F64 => 1e-12,
        _ => 2e-5,
    };
    for (i, (x, y)) in c.iter().zip(&g).enumerate() {
        if x.is_nan() && y.is_nan() {
            continue;
        }
        let ok = if x.is_infinite() || y.is_infinite() {
            x == y
        } else {
            (x - y).abs() <= tol * (1.0 + x.abs().max(y.abs()))
        };
        assert!(ok, "{what}: element {i} CPU {x} GPU {y}");
    }
}

/// Runs `f` on both devices with the same inputs and compares.
fn both(what: &str, inputs: &[Array], f: impl Fn(&[Array]) -> Array) {
    let c = on(Device::cpu(), || f(inputs));
    let g = on(Device::gpu(0), || f(inputs));
    assert_same(what, &c, &g);
}

/// `op` applied to `a` and `b` through its public method.
fn binary_op(op: nuvec::graph::BinaryOp, a: &Array, b: &Array) -> Array {
    use nuvec::graph::BinaryOp;
    match op {
        BinaryOp::Add => a + b,
        BinaryOp::Subtract => a - b,
        BinaryOp::Multiply => a * b,
        BinaryOp::Divide => a / b,
        BinaryOp::FloorDivide => a.floor_divide(b),
        BinaryOp::Remainder => a.remainder(b),
        BinaryOp::Power => a.power(b),
        BinaryOp::Maximum => a.maximum(b),
        BinaryOp::Minimum => a.minimum(b),
        BinaryOp::LogAddExp => a.logaddexp(b),
        BinaryOp::ArcTan2 => a.arctan2(b),
        BinaryOp::Equal => a.equal(b),
        BinaryOp::NotEqual => a.not_equal(b),
        BinaryOp::Less => a.less(b),
        BinaryOp::LessEqual => a.less_equal(b),
        BinaryOp::Greater => a.greater(b),
        BinaryOp::GreaterEqual => a.greater_equal(b),
        BinaryOp::LogicalAnd => a.logical_and(b),
        BinaryOp::LogicalOr => a.logical_or(b),
        BinaryOp::BitwiseAnd => a.bitwise_and(b),
        BinaryOp::BitwiseOr => a.bitwise_or(b),
        BinaryOp::BitwiseXor => a.bitwise_xor(b),
        BinaryOp::LeftShift => a.left_shift(b),
        BinaryOp::RightShift => a.right_shift(b),
    }
}

const ALL: [DType; 14] = DType::ALL;

#[test]
fn elementwise_agrees() {
    if !gpu() {
        return;
    }
    use nuvec::graph::{BinaryOp, UnaryOp};
    // Every unary op but those without a float form (they map to a copy below).
    let unary = UnaryOp::ALL.into_iter().filter(|op| !matches!(op, UnaryOp::BitwiseInvert | UnaryOp::Conjugate));
    for dtype in [DType::F32, DType::F16, DType::BF16, DType::F64, DType::I32, DType::U8, DType::Bool] {
        let x = values(&[7, 33], dtype, 0.1);
        for op in unary.clone() {
            let f = |a: &[Array]| -> Array {
                let x = &a[0];
                match op {
                    UnaryOp::Abs => x.abs(),
                    UnaryOp::Sign => x.sign(),
                    UnaryOp::Negative => x.negative(),
                    UnaryOp::Square => x.square(),
                    UnaryOp::Floor => x.floor(),
                    UnaryOp::Ceil => x.ceil(),
                    UnaryOp::Round => x.round(),
                    UnaryOp::Exp => x.exp(),
                    UnaryOp::Expm1 => x.expm1(),
                    UnaryOp::Log => x.abs().log(),
                    UnaryOp::Log1p => x.abs().log1p(),
                    UnaryOp::Log2 => x.abs().log2(),
                    UnaryOp::Log10 => x.abs().log10(),
                    UnaryOp::Sqrt => x.abs().sqrt(),
                    UnaryOp::Rsqrt => x.abs().rsqrt(),
                    UnaryOp::Reciprocal => x.reciprocal(),
                    UnaryOp::Sin => x.sin(),
                    UnaryOp::Cos => x.cos(),
                    UnaryOp::Tan => x.tan(),
                    UnaryOp::ArcSin => (x * 0.3).arcsin(),
                    UnaryOp::ArcCos => (x * 0.3).arccos(),
                    UnaryOp::ArcTan => x.arctan(),
                    UnaryOp::Sinh => x.sinh(),
                    UnaryOp::Cosh => x.cosh(),
                    UnaryOp::Tanh => x.tanh(),
                    UnaryOp::ArcSinh => x.arcsinh(),
                    UnaryOp::ArcCosh => (x.abs() + 1.0).arccosh(),
                    UnaryOp::ArcTanh => (x * 0.3).arctanh(),
                    UnaryOp::Sigmoid => x.sigmoid(),
                    UnaryOp::Erf => x.erf(),
                    UnaryOp::ErfInv => (x * 0.3).erfinv(),
                    UnaryOp::LogicalNot => x.logical_not(),
                    _ => x.clone(),
                }
            };
            if dtype == DType::Bool && matches!(op, UnaryOp::Negative) {
                continue;
            }
            both(&format!("{} {dtype}", op.name()), std::slice::from_ref(&x), f);
            // Transposed (strided) input.
            both(&format!("{} {dtype} transposed", op.name()), &[x.t()], f);
        }
    }
    let binary = BinaryOp::ALL;
    for dtype in ALL {
        let a = values(&[5, 1, 40], dtype, 0.2);
        let b = values(&[3, 40], dtype, 1.3);
        for op in binary {
            let promoted = dtype;
            if op.compute_dtype(promoted).is_none() {
                continue;
            }
            let f = |v: &[Array]| -> Array {
                let (a, b) = (&v[0], &v[1]);
                let b = match op {
                    BinaryOp::LeftShift | BinaryOp::RightShift => b.abs().remainder(7),
                    BinaryOp::Power if dtype.is_integer() => b.abs().remainder(4),
                    _ => b.clone(),
                };
                binary_op(op, a, &b)
            };
            // Broadcast, same-shape contiguous, scalar, and transposed operands.
            both(&format!("{} {dtype} broadcast", op.name()), &[a.clone(), b.clone()], f);
            let c = values(&[40, 40], dtype, 0.5);
            both(&format!("{} {dtype} contiguous", op.name()), &[c.clone(), c.t().contiguous()], f);
            both(&format!("{} {dtype} scalar", op.name()), &[c.clone(), values(&[], dtype, 0.9)], f);
            both(&format!("{} {dtype} transposed", op.name()), &[c.t(), c.clone()], f);
        }
    }
}

#[test]
fn casts_selects_and_copies_agree() {
    if !gpu() {
        return;
    }
    for from in ALL {
        let x = values(&[6, 17], from, 0.3);
        for to in ALL {
            both(&format!("astype {from} -> {to}"), std::slice::from_ref(&x), |v| v[0].astype(to));
            both(&format!("astype {from} -> {to} strided"), std::slice::from_ref(&x), |v| v[0].t().astype(to));
        }
        let c = values(&[6, 17], DType::Bool, 0.7);
        both(&format!("where {from}"), &[c, x.clone(), x.t().t()], |v| ops::where_(&v[0], &v[1], v[2].zeros_like()));
        both(&format!("copy {from}"), std::slice::from_ref(&x), |v| v[0].t().contiguous());
        both(&format!("reshape of transposed {from}"), std::slice::from_ref(&x), |v| v[0].t().reshape([-1]));
        both(&format!("concatenate {from}"), std::slice::from_ref(&x), |v| {
            ops::concatenate(
                &[v[0].clone(), v[0].slice(&[0, 3], &[6, 9], &[1, 1]).t().reshape([6, 6]), v[0].clone()],
                1,
            )
        });
        both(&format!("slice_update {from}"), std::slice::from_ref(&x), |v| {
            v[0].slice_update(v[0].slice(&[0, 0], &[3, 6], &[1, 2]), &[2, 1], &[5, 7], &[1, 2])
        });
        both(&format!("pad {from}"), std::slice::from_ref(&x), |v| v[0].pad(&[(1, 2), (0, 3)], 1));
    }
    for d in [DType::F32, DType::I32, DType::U8, DType::F16, DType::I64] {
        both(&format!("arange {d}"), &[], |_| ops::arange_dtype(3, 1000, 7, d));
    }
}

#[test]
fn reductions_and_scans_agree() {
    if !gpu() {
        return;
    }
    let shapes: [&[i32]; 5] = [&[1000], &[37, 129], &[4, 5, 300], &[2, 3000], &[300, 1, 2]];
    for dtype in [DType::F32, DType::F16, DType::BF16, DType::F64, DType::I32, DType::U8, DType::I64, DType::Bool] {
        for shape in shapes {
            let x = values(shape, dtype, 0.4);
            let nd = shape.len() as i32;
            let mut axis_sets: Vec<Vec<i32>> = (0..nd).map(|a| vec![a]).collect();
            axis_sets.push((0..nd).collect());
            if nd >= 3 {
                axis_sets.push(vec![0, 2]);
            }
            for axes in &axis_sets {
                let tag = format!("{dtype} {shape:?} axes {axes:?}");
                if dtype != DType::Bool {
                    both(&format!("sum {tag}"), std::slice::from_ref(&x), |v| v[0].sum(axes));
                    both(&format!("max {tag}"), std::slice::from_ref(&x), |v| v[0].max(axes));
                    both(&format!("min {tag} transposed"), std::slice::from_ref(&x), |v| v[0].t().min(axes));
                    if dtype.is_float() {
                        both(&format!("prod {tag}"), std::slice::from_ref(&x), |v| {
                            (v[0].clone() * 0.1 + 1.0).prod(axes)
                        });
                        both(&format!("logsumexp {tag}"), std::slice::from_ref(&x), |v| v[0].logsumexp(axes));
                        both(&format!("softmax {tag}"), std::slice::from_ref(&x), |v| v[0].softmax(axes));
                        both(&format!("mean/var {tag}"), std::slice::from_ref(&x), |v| {
                            v[0].var(axes) + v[0].mean(axes)
                        });
                    }
                }
                both(&format!("all/any {tag}"), std::slice::from_ref(&x), |v| {
                    v[0].all(axes).logical_or(v[0].any(axes))
                });
            }
            for axis in 0..nd {
                let tag = format!("{dtype} {shape:?} axis {axis}");
                both(&format!("argmax {tag}"), std::slice::from_ref(&x), |v| v[0].argmax(axis));
                both(&format!("argmin {tag}"), std::slice::from_ref(&x), |v| v[0].t().argmin(axis));
                let opts = [(false, false), (true, false), (false, true), (true, true)];
                for (reverse, exclusive) in opts {
                    let o = nuvec::ScanOptions { reverse, exclusive };
                    let t = format!("{tag} reverse {reverse} exclusive {exclusive}");
                    if dtype != DType::Bool {
                        both(&format!("cumsum {t}"), std::slice::from_ref(&x), |v| v[0].cumsum_with(axis, o));
                    }
                    both(&format!("cummax {t}"), std::slice::from_ref(&x), |v| v[0].cummax_with(axis, o));
                    both(&format!("cummin {t}"), std::slice::from_ref(&x), |v| v[0].cummin_with(axis, o));
                    if dtype.is_float() {
                        both(&format!("cumprod {t}"), std::slice::from_ref(&x), |v| {
                            (v[0].clone() * 0.01 + 1.0).cumprod_with(axis, o)
                        });
                        both(&format!("logcumsumexp {t}"), std::slice::from_ref(&x), |v| {
                            v[0].logcumsumexp_with(axis, o)
                        });
                    }
                }
            }
        }
    }
    // A long row: the split reduction with partials (positive values: a sum without
    // cancellation, so both devices' rounding stays near 1e-6 relative).
    let long = values(&[1 << 22], DType::F32, 0.8).abs() + 0.5;
    both("sum of 4M", std::slice::from_ref(&long), |v| v[0].sum(..));
    both("max of 4M", std::slice::from_ref(&long), |v| v[0].max(..));
    // Special values through softmax and logsumexp.
    let special = array![
        [1.0, f32::NEG_INFINITY, 2.0],
        [f32::NEG_INFINITY, f32::NEG_INFINITY, f32::NEG_INFINITY],
        [f32::NAN, 0.0, 1.0]
    ];
    both("softmax special", std::slice::from_ref(&special), |v| v[0].softmax(-1));
    both("logsumexp special", std::slice::from_ref(&special), |v| v[0].logsumexp(-1));
    // The same inside rows long enough for the vector loads (NaN, +inf and -inf mid-row; an
    // all-NaN row), every float type.
    let mut rows = vec![0.0f32; 6 * 200];
    for (i, v) in rows.iter_mut().enumerate() {
        *v = ((i * 37) % 23) as f32 * 0.25 - 2.0;
    }
    rows[77] = f32::NAN;
    rows[200 + 150] = f32::INFINITY;
    rows[400 + 5] = f32::NAN;
    rows[400 + 6] = f32::INFINITY;
    rows[600..800].fill(f32::NAN);
    rows[800..1000].fill(f32::NEG_INFINITY);
    rows[1000 + 199] = f32::NEG_INFINITY;
    // A NaN in a vector otherwise all -inf (the kernels skip such vectors: the NaN must stay).
    rows[1016..1024].fill(f32::NEG_INFINITY);
    rows[1020] = f32::NAN;
    let long_special = Array::from_slice(&rows, [6, 200]);
    for dtype in [DType::F32, DType::F16, DType::BF16, DType::F64] {
        let x = long_special.astype(dtype);
        both(&format!("softmax special rows {dtype}"), std::slice::from_ref(&x), |v| v[0].softmax(-1));
        both(&format!("logsumexp special rows {dtype}"), std::slice::from_ref(&x), |v| v[0].logsumexp(-1));
    }
    // Scores masked with the dtype's lowest value (attention's idiom): a row all lowest is
    // uniform, and lowest values before the row's maximum weigh nothing.
    for dtype in [DType::F32, DType::BF16] {
        let low = if dtype == DType::F32 { f32::MIN } else { -3.3895314e38 };
        let mut masked = vec![low; 3 * 64];
        masked[64 + 40] = 1.0;
        masked[128 + 63] = -2.0;
        let x = Array::from_slice(&masked, [3, 64]).astype(dtype);
        both(&format!("softmax lowest rows {dtype}"), std::slice::from_ref(&x), |v| v[0].softmax(-1));
    }
    // Rows past the warp kernels' 64 KiB and odd lengths around the 8-vector loop.
    for shape in [[3, 70_001], [5, 4099], [7, 1031]] {
        let x = values(&shape, DType::F32, 0.3) * 4.0;
        both(&format!("logsumexp {shape:?}"), std::slice::from_ref(&x), |v| v[0].logsumexp(-1));
        both(&format!("softmax {shape:?}"), std::slice::from_ref(&x), |v| v[0].softmax(-1));
        let h = x.astype(DType::BF16);
        both(&format!("logsumexp bf16 {shape:?}"), std::slice::from_ref(&h), |v| v[0].logsumexp(-1));
    }
}

#[test]
fn products_agree() {
    if !gpu() {
        return;
    }
    let cases: [(&[i32], &[i32]); 8] = [
        (&[1, 64], &[64, 300]),
        (&[8, 256], &[256, 512]),
        (&[3, 1, 512], &[512, 1000]),
        (&[33, 70], &[70, 45]),
        (&[4, 17, 33], &[4, 33, 9]),
        (&[2, 1, 5, 8], &[3, 8, 6]),
        (&[64], &[64, 10]),
        (&[10, 64], &[64]),
    ];
    for dtype in [DType::F32, DType::F16, DType::BF16, DType::F64, DType::I32] {
        for (sa, sb) in cases {
            let a = values(sa, dtype, 0.1) * 0.25;
            let b = values(sb, dtype, 0.6) * 0.25;
            both(&format!("matmul {dtype} {sa:?} @ {sb:?}"), &[a.clone(), b.clone()], |v| v[0].matmul(&v[1]));
        }
        // Transposed weights (the decode layout x @ W^T), for the GEMV paths too.
        // (k, n): split-K with partial column tiles (n = 1000, 72) and short slices (k = 300).
        for (k, n) in [(256, 384), (1000, 1000), (300, 72)] {
            for m in [1, 2, 5, 8, 9] {
                let x = values(&[m, k], dtype, 0.2) * 0.25;
                let w = values(&[n, k], dtype, 0.9) * 0.25;
                both(&format!("x @ W^T {dtype} m={m} k={k} n={n}"), &[x.clone(), w.clone()], |v| {
                    v[0].matmul(&v[1].t())
                });
                if dtype.is_float() {
                    // addmm with a dense c of the product's shape: the GEMV adds it as it writes
                    // (a residual); a broadcast c takes the copy and cuBLASLt.
                    let c = values(&[m, n], dtype, 0.7);
                    both(&format!("c + x @ W^T {dtype} m={m} k={k} n={n}"), &[x.clone(), w.clone(), c], |v| {
                        ops::addmm(&v[2], &v[0], &v[1].t(), 1.0, 0.5)
                    });
                    let bias = values(&[n], dtype, 0.3);
                    both(&format!("bias + x @ W^T {dtype} m={m} k={k} n={n}"), &[x.clone(), w.clone(), bias], |v| {
                        ops::addmm(&v[2], &v[0], &v[1].t(), 1.0, 1.0)
                    });
                }
                let w2 = values(&[k, n], dtype, 0.9) * 0.25;
                both(&format!("x @ W {dtype} m={m} k={k} n={n}"), &[x, w2.clone()], |v| v[0].matmul(&v[1]));
                // x a view one element into wider rows: its rows are not 16-byte aligned, so
                // the row-major GEMV reads x element by element.
                let wide = values(&[m, k + 3], dtype, 0.4) * 0.25;
                both(&format!("x[:, 1..] @ W {dtype} m={m} k={k} n={n}"), &[wide, w2], |v| {
                    v[0].slice(&[0, 1], &[m, k + 1], &[1, 1]).matmul(&v[1])
                });
            }
        }
        if dtype.is_float() {
            let a = values(&[16, 32], dtype, 0.1) * 0.25;
            let b = values(&[32, 24], dtype, 0.3) * 0.25;
            let c = values(&[24], dtype, 0.5);
            both(&format!("addmm {dtype}"), &[a, b, c], |v| ops::addmm(&v[2], &v[0], &v[1], 0.5, 2.0));
        }
    }
}

#[test]
fn arrays_move_between_devices() {
    if !gpu() {
        return;
    }
    // A host constant used on the GPU is uploaded once, and the copy is kept with it.
    let w = values(&[256, 256], DType::F32, 0.1);
    w.eval().unwrap();
    let y1 = on(Device::gpu(0), || w.sum(..));
    let y2 = on(Device::gpu(0), || w.max(..));
    nuvec::eval(&(&y1, &y2)).unwrap();
    // A GPU result feeds a CPU computation.
    let z = on(Device::cpu(), || &y1 + 1.0);
    assert!((z.item::<f32>().unwrap() - (y1.item::<f32>().unwrap() + 1.0)).abs() < 1e-3);
    // Primitives without a GPU kernel (complex argmax is rejected earlier; complex scans are
    // not) fall back to the CPU transparently.
    let c = on(Device::gpu(0), || values(&[8], DType::F32, 0.1).astype(DType::Complex64).cumsum(0));
    assert_eq!(c.to_vec::<nuvec::Complex64>().unwrap().len(), 8);
}

/// Held by the tests that set a memory limit or allocate gigabytes, so that neither fails the
/// other.
static BIG_MEMORY: std::sync::Mutex<()> = std::sync::Mutex::new(());

#[test]
fn memory_limits_fail_cleanly() {
    if !gpu() {
        return;
    }
    let _big = BIG_MEMORY.lock().unwrap_or_else(|e| e.into_inner());
    nuvec::cuda::synchronize(0).unwrap();
    let before = nuvec::cuda::memory(0).unwrap();
    let old = nuvec::cuda::set_memory_limit(0, before.active + (64 << 20)).unwrap();
    let big = on(Device::gpu(0), || ops::zeros([256 << 20], DType::F32) + 1.0);
    let err = big.eval().unwrap_err();
    assert!(
        matches!(err, nuvec::Error::OutOfMemory { op: "add", bytes, limit: Some(_), .. } if bytes == 1 << 30),
        "{err}"
    );
    assert!(err.to_string().contains("add on gpu:0 could not allocate 1073741824 bytes (1.0 GiB)"), "{err}");
    nuvec::cuda::set_memory_limit(0, old).unwrap();
    let ok = on(Device::gpu(0), || ops::zeros([1 << 20], DType::F32) + 1.0);
    assert_eq!(ok.sum(..).item::<f32>().unwrap(), (1 << 20) as f32);
    // Other tests of this binary free blocks concurrently, so only the call is checked here.
    nuvec::cuda::clear_cache(0).unwrap();
}

/// Unary and binary element-wise ops over more than 2^31 elements of a dense view that is not
/// 16-byte aligned (the flat walk, not the vector kernels): every element is right.
#[test]
fn flat_walks_past_two_to_the_31_elements() {
    if !gpu() {
        return;
    }
    let _big = BIG_MEMORY.lock().unwrap_or_else(|e| e.into_inner());
    // Rows 1..5 of [5, M]: 4M = 2^31 + 36 elements, starting 2M bytes (not a multiple of 16) in.
    let m = (1 << 29) + 9;
    let (e, ends) = on(Device::gpu(0), || {
        let x = ops::ones([5, m], DType::F16);
        let v = x.slice(&[1, 0], &[5, m], &[1, 1]);
        let e = Array::from(1.0f32).astype(DType::F16).exp().astype(DType::F32).item::<f32>().unwrap();
        // The first and last elements of each result (a wrapped count garbles every index).
        let ends = |y: &Array| {
            let first = y.slice(&[0, 0], &[1, 4], &[1, 1]).astype(DType::F32).to_vec::<f32>().unwrap();
            let last = y.slice(&[3, m - 4], &[4, m], &[1, 1]).astype(DType::F32).to_vec::<f32>().unwrap();
            [first, last].concat()
        };
        (e, [ends(&v.exp()), ends(&(&v + 1.0))])
    });
    assert!((e - std::f32::consts::E).abs() < 2e-3, "exp(1) in f16 is {e}");
    assert_eq!(ends[0], vec![e; 8], "exp");
    assert_eq!(ends[1], vec![2.0; 8], "add");
    nuvec::cuda::clear_cache(0).unwrap();
}

#[test]
fn random_bits_agree() {
    if !gpu() {
        return;
    }
    use nuvec::random;
    let keys = [random::key(0), random::key(1), random::key(u64::MAX), random::key(0x1234_5678_9abc_def0)];
    let shapes: [&[i32]; 12] =
        [&[], &[1], &[2], &[3], &[5], &[7], &[8], &[13], &[3, 5], &[0], &[1000], &[(1 << 20) + 3]];
    for (i, k) in keys.iter().enumerate() {
        for width in [1, 2, 4] {
            for s in shapes {
                both(&format!("bits key {i} width {width} shape {s:?}"), std::slice::from_ref(k), |v| {
                    random::bits(s, width, Some(&v[0]))
                });
            }
        }
    }
    // Many keys at once (the batching rule) from a transposed, non-contiguous key array.
    let ks = random::split(&random::key(9), 6).t();
    for width in [1, 2, 4] {
        for s in [3, 8, 257] {
            let f = nuvec::transforms::vmap_flat(
                move |x| Ok(vec![random::bits([s], width, Some(&x[0]))]),
                &[Some(1)],
                &[0],
            );
            let c = on(Device::cpu(), || f(std::slice::from_ref(&ks)).unwrap().remove(0));
            let g = on(Device::gpu(0), || f(std::slice::from_ref(&ks)).unwrap().remove(0));
            assert_same(&format!("batched bits width {width} size {s}"), &c, &g);
        }
    }
    // Distributions built on the bits.
    let k = random::key(5);
    both("uniform", std::slice::from_ref(&k), |v| random::uniform(-2.0, 3.0, [4097], DType::F32, Some(&v[0])));
    both("normal bf16", std::slice::from_ref(&k), |v| random::normal([513], DType::BF16, 0.0, 1.0, Some(&v[0])));
    both("randint", std::slice::from_ref(&k), |v| random::randint(-7, 1000, [999], DType::I32, Some(&v[0])));
    both("split", std::slice::from_ref(&k), |v| random::split(&v[0], 33));
}

#[test]
fn sorts_agree() {
    if !gpu() {
        return;
    }
    // Rows from 1 element to past the shared-memory limit (4096), so both the block network
    // and the global-memory one run; values with ties, and NaN in the floats.
    let lens = [1, 2, 31, 32, 33, 100, 1000, 4095, 4096, 4097, 5000];
    for dtype in ALL {
        for (i, &len) in lens.iter().enumerate() {
            let rows = [3, 1, 2][i % 3];
            let x = values(&[rows, len], dtype, 0.3 + i as f32);
            let x = if dtype.is_float() {
                ops::where_((ops::arange(0, rows * len, 1).reshape([rows, len]) % 17).equal(5), f32::NAN, &x)
                    .astype(dtype)
            } else {
                x
            };
            for axis in [1, 0] {
                let tag = format!("{dtype} [{rows}, {len}] axis {axis}");
                both(&format!("sort {tag}"), std::slice::from_ref(&x), |v| v[0].sort(axis));
                both(&format!("argsort {tag}"), std::slice::from_ref(&x), |v| v[0].argsort(axis));
                both(&format!("argsort transposed {tag}"), std::slice::from_ref(&x), |v| v[0].t().argsort(1 - axis));
                let n = x.shape()[axis as usize];
                for kth in [0, n / 2, n - 1] {
                    // The order around kth is the backend's: compare what defines a partition.
                    let t = format!("{tag} kth {kth}");
                    let at = |a: &Array| {
                        let mut start = vec![0, 0];
                        start[axis as usize] = kth;
                        let mut stop = a.shape().to_vec();
                        stop[axis as usize] = kth + 1;
                        a.slice(&start, &stop, &[])
                    };
                    both(&format!("partition pivot {t}"), std::slice::from_ref(&x), |v| at(&v[0].partition(kth, axis)));
                    both(&format!("argpartition pivot {t}"), std::slice::from_ref(&x), |v| {
                        at(&v[0].argpartition(kth, axis))
                    });
                    both(&format!("partition sorted {t}"), std::slice::from_ref(&x), |v| {
                        v[0].partition(kth, axis).sort(axis)
                    });
                }
                let k = n.min(5);
                both(&format!("topk sorted {tag}"), std::slice::from_ref(&x), |v| v[0].topk(k, axis).sort(axis));
            }
        }
    }
    // A 3-d strided input and the derivative (a gather through the permutation).
    let x = values(&[4, 6, 5], DType::F32, 1.7);
    both("sort 3-d middle axis", std::slice::from_ref(&x), |v| v[0].transpose(&[2, 0, 1]).sort(1));
    let w = values(&[4, 6, 5], DType::F32, 2.1);
    both("grad of sort", &[x, w], |v| {
        let w = v[1].clone();
        nuvec::grad(move |x: &Array| Ok((x.sort(1) * &w).sum(..)))(&v[0]).unwrap()
    });
}

#[test]
fn convolutions_and_contractions_agree() {
    if !gpu() {
        return;
    }
    for dtype in [DType::F32, DType::F16, DType::BF16, DType::F64] {
        // Gated DeltaNet's short convolution (depthwise, causal), then ordinary and grouped ones.
        let x = values(&[2, 37, 64], dtype, 0.1) * 0.5;
        let w = values(&[64, 4, 1], dtype, 0.4) * 0.5;
        both(&format!("depthwise conv1d {dtype}"), &[x.clone(), w], |v| ops::conv1d(&v[0], &v[1], 1, 3, 1, 64));
        let w = values(&[48, 3, 64], dtype, 0.7) * 0.25;
        both(&format!("conv1d {dtype}"), &[x.clone(), w], |v| ops::conv1d(&v[0], &v[1], 2, 1, 2, 1));
        let w = values(&[32, 5, 16], dtype, 0.8) * 0.25;
        both(&format!("grouped conv1d {dtype}"), &[x, w], |v| ops::conv1d(&v[0], &v[1], 1, 2, 1, 4));
        let x = values(&[2, 9, 11, 8], dtype, 0.2) * 0.5;
        let w = values(&[6, 3, 3, 4], dtype, 0.3) * 0.5;
        both(&format!("conv2d {dtype}"), &[x, w], |v| ops::conv2d(&v[0], &v[1], (1, 2), 1, (2, 1), 2));
        let q = values(&[2, 4, 7, 16], dtype, 0.5) * 0.5;
        let k = values(&[2, 4, 9, 16], dtype, 0.6) * 0.5;
        both(&format!("einsum bhqd,bhkd->bhqk {dtype}"), &[q, k], |v| ops::einsum("bhqd,bhkd->bhqk", v));
        let m = values(&[12, 12], dtype, 0.9);
        both(&format!("einsum trace {dtype}"), std::slice::from_ref(&m), |v| ops::einsum("ii", v));
        both(&format!("tensordot {dtype}"), &[m.reshape([3, 4, 12]), m], |v| ops::tensordot(&v[0], &v[1], 1));
    }
}

#[test]
fn custom_kernel_agrees_with_cpu_ops() {
    if !gpu() {
        return;
    }
    use nuvec::fast::{CudaKernel, KernelConfig, TemplateArg};
    // y = a * b + c over strided views of every float dtype, against the same ops on the CPU.
    // (cuda_kernel.rs `fma_view_case` has the same body, for the NVRTC compile check.)
    let body = "uint i = threadIdx.x + blockIdx.x * blockDim.x;\n\
                if (i >= SIZE) return;\n\
                A a = static_cast<A>(x[elem_to_loc(i, x_shape, x_strides, x_ndim)]);\n\
                y[i] = static_cast<T>(a * static_cast<A>(w[i]) + static_cast<A>(c));";
    let k = CudaKernel::new("fma_view", &["x", "w", "c"], &["y"], body).ensure_row_contiguous(false);
    for d in [DType::F32, DType::F16, DType::BF16, DType::F64] {
        // Accumulate in f32, or f64 for f64 (the CPU does the same).
        let acc = if d == DType::F64 { DType::F64 } else { DType::F32 };
        let x = values(&[7, 9], d, 0.1).t().slice(&[8, 0], &[0, 7], &[-2, 2]);
        let w = values(&[4, 4], d, 0.7);
        let c = Array::from(0.5f32).astype(d);
        let n = x.size() as u32;
        let config = KernelConfig {
            grid: (n, 1, 1),
            threadgroup: (32, 1, 1),
            template: vec![
                ("T".into(), TemplateArg::DType(d)),
                ("A".into(), TemplateArg::DType(acc)),
                ("SIZE".into(), TemplateArg::Int(n as i32)),
            ],
            ..Default::default()
        };
        let g = on(Device::gpu(0), || {
            k.call(&[x.clone(), w.clone(), c.clone()], &[(x.shape().to_vec(), d)], &config).remove(0)
        });
        let want = on(Device::cpu(), || (x.astype(acc) * w.astype(acc) + c.astype(acc)).astype(d));
        assert_same(&format!("custom kernel {d:?}"), &want, &g);
    }
}

#[test]
fn gathers_and_scatters_agree() {
    use nuvec::IndexStep;
    if !gpu() {
        return;
    }
    // Repeated, negative and out-of-range indices (gathers clamp, scatters drop them).
    let idx = array![[3, -1, 0, 7], [2, 2, -5, 1], [0, 1, 1, -2]];
    // Distinct positions per row after wrapping (a set scatter with duplicates has no defined winner).
    let unique = array![[3, -2, 0], [2, 0, 1], [0, 1, -2]];
    for d in ALL {
        let x = values(&[3, 4], d, 0.3);
        let u = values(&[3, 4], d, 1.1);
        let name = |op: &str| format!("{op} {d}");
        both(&name("take"), &[x.clone(), idx.clone()], |a| a[0].take(&a[1], 1));
        both(&name("take_flat"), &[x.clone(), idx.clone()], |a| a[0].take(&a[1], None));
        both(&name("take_along_axis_t"), &[x.clone(), idx.clone()], |a| a[0].t().take_along_axis(&a[1].t(), 0));
        both(&name("index"), &[x.clone(), idx.clone()], |a| a[0].i((&a[1].i((.., 0..1)), (..).step(-2))));
        both(&name("put_along_axis"), &[x.clone(), unique.clone(), u.clone()], |a| {
            a[0].put_along_axis(&a[1], a[2].i((.., ..3)), 1)
        });
        for op in ["add", "multiply", "maximum", "minimum"] {
            if matches!(d, DType::Bool | DType::Complex64) && op != "add" {
                continue;
            }
            both(&name(op), &[x.clone(), idx.clone(), u.clone()], |a| {
                let at = a[0].at((.., &a[1].i(1)));
                let v = a[2].i((.., 1..2));
                match op {
                    "add" => at.add(&v),
                    "multiply" => at.multiply(&v),
                    "maximum" => at.maximum(&v),
                    _ => at.minimum(&v),
                }
            });
        }
    }
    // Index dtypes, a larger float scatter-add with many collisions, and gather_mm.
    for it in [DType::I8, DType::U8, DType::I16, DType::U16, DType::U32, DType::I64, DType::U64] {
        both(&format!("take idx {it}"), &[values(&[50, 3], DType::F32, 0.2), idx.abs().astype(it)], |a| {
            a[0].take(&a[1], 0)
        });
    }
    let big = values(&[4096], DType::I32, 0.5).abs().remainder(97);
    both("scatter_add collisions", &[ops::zeros([97, 8], DType::F32), big, values(&[4096, 8], DType::F32, 0.9)], |a| {
        a[0].at(&a[1]).add(&a[2])
    });
    both(
        "gather_mm",
        &[values(&[6, 1, 32], DType::F32, 0.1), values(&[4, 32, 16], DType::F32, 0.4), array![3, 0, 0, 2, 1, 3]],
        |a| ops::gather_mm(&a[0], &a[1], None, Some(&a[2]), false),
    );
}

#[test]
fn quantization_agrees() {
    if !gpu() {
        return;
    }
    let exact = |what: &str, c: &Array, g: &Array| {
        assert_eq!(c.dtype(), g.dtype(), "{what}: dtypes");
        assert_eq!(c.shape(), g.shape(), "{what}: shapes");
        assert_eq!(c.to_bytes().unwrap(), g.to_bytes().unwrap(), "{what}: bytes differ");
    };
    for dtype in [DType::F32, DType::F16, DType::BF16] {
        for bits in [2, 3, 4, 5, 6, 8] {
            for gs in [32, 64, 128] {
                // A transposed input also checks that the kernel reads a row-major copy.
                let w = values(&[256, 24], dtype, 0.3 + bits as f32).t() * 0.1;
                let run = || {
                    let (q, s, b) = ops::quantize(&w, gs, bits, "affine");
                    let d = ops::dequantize(&q, &s, b.as_ref(), gs, bits, "affine", None);
                    [q, s, b.unwrap(), d]
                };
                let c = on(Device::cpu(), run);
                let g = on(Device::gpu(0), run);
                for (i, (c, g)) in c.iter().zip(&g).enumerate() {
                    exact(&format!("affine {dtype} bits {bits} group {gs} output {i}"), c, g);
                }
            }
        }
        let w = values(&[48, 128], dtype, 0.7) * 0.1;
        for mode in ["affine", "mxfp4", "mxfp8", "nvfp4"] {
            let run = || {
                let (q, s, b) = ops::quantize(&w, None, None, mode);
                let d = ops::dequantize(&q, &s, b.as_ref(), None, None, mode, dtype);
                (q, s, b, d)
            };
            let (cq, cs, _, cd) = on(Device::cpu(), run);
            let (gq, gs_, gb, gd) = on(Device::gpu(0), run);
            exact(&format!("{mode} {dtype} packed"), &cq, &gq);
            exact(&format!("{mode} {dtype} scales"), &cs, &gs_);
            exact(&format!("{mode} {dtype} dequantized"), &cd, &gd);
            let x = values(&[2, 5, 128], dtype, 0.2) * 0.25;
            both(&format!("quantized_matmul {mode} {dtype}"), &[x, gq, gs_], |v| {
                ops::quantized_matmul(&v[0], &v[1], &v[2], gb.as_ref(), true, None, None, mode)
            });
        }
    }
}

/// The fast operations run as fused kernels on the GPU (not silently as their compositions),
/// so `fast_ops` and `mlx_fast` test the kernels when the GPU is the default device.
#[test]
fn fast_ops_have_gpu_kernels() {
    use nuvec::fast::{FastOp, RopeParams};
    use nuvec::graph::{Primitive, Spec, backend_for};
    if !gpu() {
        return;
    }
    let backend = backend_for(Device::gpu(0)).unwrap();
    let spec = |shape: &[i32], dtype: DType| Spec { shape: shape.iter().copied().collect(), dtype };
    for d in [DType::F32, DType::F16, DType::BF16] {
        let (x, w) = (spec(&[64, 4096], d), spec(&[4096], d));
        let rows = spec(&[64], DType::I32);
        let acc = spec(&[64], DType::F32);
        let rope = RopeParams { dims: 128, traditional: false, base: Some(1e4), scale: 1.0, forward: true };
        let cases: Vec<(FastOp, Vec<Spec>)> = vec![
            (FastOp::RmsNorm { eps: 1e-5, weighted: true }, vec![x.clone(), w.clone()]),
            (FastOp::AddRmsNorm { eps: 1e-5, weighted: true }, vec![x.clone(), x.clone(), w.clone()]),
            (FastOp::LayerNorm { eps: 1e-5, weighted: true, biased: true }, vec![x.clone(), w.clone(), w.clone()]),
            (FastOp::RmsNormVjp { eps: 1e-5, weighted: true }, vec![x.clone(), w.clone(), x.clone()]),
            (FastOp::LayerNormVjp { eps: 1e-5, weighted: true, biased: true }, vec![x.clone(), w.clone(), x.clone()]),
            (FastOp::SwiGlu, vec![x.clone(), x.clone()]),
            (FastOp::SwiGluVjp, vec![x.clone(), x.clone(), x.clone()]),
            (FastOp::CrossEntropy, vec![x.clone(), rows.clone()]),
            (FastOp::CrossEntropyVjp, vec![x.clone(), rows.clone(), acc.clone(), acc.clone()]),
            (FastOp::CrossEntropyWithGrad, vec![x.clone(), rows.clone(), acc.clone()]),
            (FastOp::Rope(rope), vec![spec(&[1, 32, 16, 128], d), spec(&[], DType::I32)]),
        ];
        // Decoding's products with 4-bit weights (8 rows at most).
        let qmm = nuvec::fast::QuantMatmulParams {
            mode: "affine".parse().unwrap(),
            group_size: 64,
            bits: 4,
            transpose: true,
            dtype: d,
        };
        let (qx, qw, qs) = (spec(&[8, 4096], d), spec(&[1024, 512], DType::U32), spec(&[1024, 64], d));
        let mut cases = cases;
        cases.push((FastOp::QuantizedMatmul(qmm), vec![qx, qw, qs.clone(), qs]));
        // Decoding's products whose operand a norm or SwiGLU makes (2 rows at most: more run
        // the norm, then cuBLASLt).
        let (rows, b, c) = (spec(&[2, 1, 4096], d), spec(&[4096, 1024], d), spec(&[2, 1, 1024], d));
        cases.push((FastOp::RmsNormMatmul { eps: 1e-5 }, vec![rows.clone(), w.clone(), b.clone()]));
        cases.push((FastOp::SwiGluMatmul { add: true }, vec![rows.clone(), rows, b, c]));
        // A decode step's rotation and cache writes (Llama-3-8B's heads).
        let cache = spec(&[1, 8, 1024, 128], d);
        let inputs = vec![spec(&[1, 1, 48, 128], d), cache.clone(), cache, spec(&[1], DType::I32)];
        cases.push((FastOp::RopeKvWrite { rope, q_heads: 32, rows: false }, inputs));
        // Paged decode in half precision: 4 sequences, 8 query heads over 2 key-value heads.
        if d.is_half() {
            let paged = nuvec::fast::PagedParams { scale: 0.1, window: None, sinks: false, blocks: 4 };
            let cache = spec(&[64, 2, 16, 128], d);
            let inputs = vec![
                spec(&[4, 8, 1, 128], d),
                cache.clone(),
                cache,
                spec(&[4, 16], DType::I32),
                spec(&[4], DType::I32),
            ];
            cases.push((FastOp::PagedAttention(paged), inputs));
        }
        // Gated DeltaNet's recurrence at Qwen3-Next's heads (16 key heads, 32 value heads of
        // 128): decode (the packed kernel) and prefill with every step's state; a gate per key
        // channel with a mask (the row kernel, as Kimi's).
        let (f32_, bool_) = (DType::F32, DType::Bool);
        for (t, channel, masked, steps) in [(1, false, false, false), (64, false, false, true), (7, true, true, false)]
        {
            let g = if channel { spec(&[4, t, 32, 128], f32_) } else { spec(&[4, t, 32], f32_) };
            let qk = spec(&[4, t, 16, 128], d);
            let mut inputs = vec![qk.clone(), qk, spec(&[4, t, 32, 128], d), g, spec(&[4, t, 32], d)];
            inputs.push(spec(&[4, 32, 128, 128], f32_));
            if masked {
                inputs.push(spec(&[4, t], bool_));
            }
            let p = nuvec::fast::GatedDeltaParams { steps, storage: f32_, masked };
            cases.push((FastOp::GatedDelta(p), inputs));
        }
        // A mixture of experts' products (512 experts of 512 × 2048): decoding one token's 10
        // experts, and 4096 tokens' sorted choices (half precision only).
        let experts = spec(&[512, 2048, 512], d);
        let (idx, tokens) = (spec(&[10], DType::U32), spec(&[40960], DType::U32));
        cases.push((FastOp::GatherMm, vec![spec(&[1, 1, 2048], d), experts.clone(), spec(&[10], DType::I32), idx]));
        // The same experts in 4 bits (groups of 64): one token, and 4096 tokens' choices.
        let (qw, qs) = (spec(&[512, 512, 256], DType::U32), spec(&[512, 512, 32], d));
        let gq = nuvec::fast::QuantMatmulParams { group_size: 64, bits: 4, ..qmm };
        for (rows, l) in [(1, 10), (40960, 40960)] {
            let inputs = vec![
                spec(&[rows, 1, 2048], d),
                qw.clone(),
                qs.clone(),
                qs.clone(),
                spec(&[l], DType::I32),
                spec(&[l], DType::U32),
            ];
            cases.push((FastOp::GatherQmm(gq), inputs));
        }
        if d.is_half() {
            let rows = spec(&[40960, 1, 2048], d);
            cases.push((FastOp::GatherMm, vec![rows, experts, spec(&[40960], DType::I32), tokens]));
        }
        for (op, inputs) in cases {
            let outputs = op.output_specs(&inputs).unwrap();
            let name = op.name();
            assert!(backend.supports(&Primitive::Fast(op), &inputs, &outputs), "{name} {d:?} has no GPU kernel");
        }
    }
}

/// A half-precision operand beside a float32 one runs the widening kernels (no cast first):
/// every binary op, both orders, dense, broadcast, scalar and transposed operands, against the
/// CPU; and the GPU claims those kernels (no silent fallback).
#[test]
fn widened_pairs_agree() {
    use nuvec::graph::{BinaryOp, Primitive, Spec, backend_for};
    if !gpu() {
        return;
    }
    let backend = backend_for(Device::gpu(0)).unwrap();
    let spec = |dtype: DType| Spec { shape: [8, 64].into_iter().collect(), dtype };
    for half in [DType::BF16, DType::F16] {
        let h = values(&[6, 40], half, 0.2);
        let f = values(&[6, 40], DType::F32, 1.3);
        let layouts: Vec<(&str, Array, Array)> = vec![
            ("dense", h.clone(), f.clone()),
            ("broadcast", values(&[6, 1], half, 0.4), f.clone()),
            ("scalar", values(&[], half, 0.7), f.clone()),
            ("transposed", values(&[40, 6], half, 0.5).t(), f.clone()),
            ("odd length", values(&[7, 3], half, 0.1), values(&[7, 3], DType::F32, 0.9)),
        ];
        for op in BinaryOp::ALL {
            if op.compute_dtype(DType::F32) != Some(DType::F32) {
                continue;
            }
            for (a_spec, b_spec) in [(spec(half), spec(DType::F32)), (spec(DType::F32), spec(half))] {
                let out = op.output_dtype(DType::F32);
                let outputs = [Spec { shape: a_spec.shape.clone(), dtype: out }];
                let ok = backend.supports(&Primitive::Binary(op), &[a_spec, b_spec], &outputs);
                assert!(ok, "{} of {half} and float32 has no GPU kernel", op.name());
            }
            let run = |a: &Array, b: &Array| -> Array {
                if op == BinaryOp::Power { binary_op(op, &a.abs(), &b.abs()) } else { binary_op(op, a, b) }
            };
            for (layout, a, b) in &layouts {
                let tag = format!("{} {half} {layout}", op.name());
                both(&format!("{tag} (half, float)"), &[a.clone(), b.clone()], |v| run(&v[0], &v[1]));
                both(&format!("{tag} (float, half)"), &[b.clone(), a.clone()], |v| run(&v[0], &v[1]));
            }
        }
    }
}

/// Concatenation copies a row-major input whole (no rows before the axis), by blocks of
/// 16-byte vectors (whole vectors per row) or with the strided kernel (the rest): all three,
/// mixed in one call, along the first, a middle and the last axis, a transposed input among
/// them.
#[test]
fn concatenation_by_block_copies_agrees() {
    if !gpu() {
        return;
    }
    for dtype in [DType::F32, DType::BF16, DType::U8] {
        let a = values(&[64, 300], dtype, 0.1);
        let b = values(&[64, 200], dtype, 0.2);
        let c = values(&[7, 64], dtype, 0.3);
        let tag = format!("{dtype}");
        both(&format!("concat last axis {tag}"), &[a.clone(), b.clone(), c.clone()], |v| {
            ops::concatenate(&[v[0].clone(), v[1].clone(), v[2].t()], 1)
        });
        let (w1, w2) = (values(&[64, 256], dtype, 0.6), values(&[64, 128], dtype, 0.7));
        both(&format!("concat last axis, whole vectors {tag}"), &[w1, w2, a.clone()], |v| {
            ops::concatenate(&[v[0].clone(), v[1].clone(), v[2].clone()], 1)
        });
        both(&format!("concat first axis {tag}"), &[a.clone(), b.clone()], |v| {
            ops::concatenate(&[v[0].t(), v[1].t()], 0)
        });
        both(&format!("concat first axis, dense {tag}"), &[a.clone(), a.clone()], |v| {
            ops::concatenate(&[v[0].clone(), v[1].clone() * 2], 0)
        });
        let x = values(&[4, 5, 256], dtype, 0.4);
        let y = values(&[4, 3, 256], dtype, 0.5);
        both(&format!("concat middle axis {tag}"), &[x, y], |v| ops::concatenate(&[v[0].clone(), v[1].clone()], 1));
    }
}

/// Column reductions of elements narrower than 4 bytes read adjacent columns together (the
/// vector path needs an even column count, or a multiple of 4 for bytes): every op, with one
/// segment and several, against the CPU, and the odd widths that take the scalar path.
#[test]
fn narrow_column_reductions_agree() {
    if !gpu() {
        return;
    }
    for dtype in [DType::BF16, DType::F16, DType::I16, DType::U8, DType::Bool] {
        for (rows, cols) in [(20000, 4), (300, 130), (5, 8), (4001, 12), (50, 7)] {
            let x = values(&[rows, cols], dtype, 0.3);
            let tag = format!("{dtype} [{rows}, {cols}]");
            if dtype == DType::Bool {
                both(&format!("all cols {tag}"), std::slice::from_ref(&x), |v| v[0].all(0));
                both(&format!("any cols {tag}"), std::slice::from_ref(&x), |v| v[0].any(0));
                continue;
            }
            both(&format!("sum cols {tag}"), std::slice::from_ref(&x), |v| v[0].sum(0));
            both(&format!("max cols {tag}"), std::slice::from_ref(&x), |v| v[0].max(0));
            both(&format!("min cols {tag}"), std::slice::from_ref(&x), |v| v[0].min(0));
            both(&format!("sum cols of 3-D {tag}"), std::slice::from_ref(&x), |v| {
                v[0].reshape([rows, 1, cols]).sum(&[0, 1][..])
            });
        }
    }
}

/// Reductions of permuted layouts: a transposed matrix summed whole collapses to one run (the
/// reduced axes taken widest stride first), and few long reductions over an interleaved layout
/// go through a row-major copy (the general kernel would walk each in one thread).
#[test]
fn permuted_reductions_agree() {
    if !gpu() {
        return;
    }
    for dtype in [DType::F32, DType::BF16] {
        let x = values(&[256, 1024], dtype, 0.7);
        both(&format!("sum of a transpose {dtype}"), std::slice::from_ref(&x), |v| v[0].t().sum(..));
        both(&format!("max of a transpose {dtype}"), std::slice::from_ref(&x), |v| v[0].t().max(..));
        let y = values(&[64, 3, 512], dtype, 0.2);
        both(&format!("sum over axes 0 and 2 {dtype}"), std::slice::from_ref(&y), |v| {
            v[0].transpose(&[2, 1, 0]).sum(&[0, 2][..])
        });
        both(&format!("min of a strided slice {dtype}"), std::slice::from_ref(&y), |v| {
            v[0].slice(&[0, 0, 0], &[64, 3, 512], &[2, 1, 3]).min(&[0, 2][..])
        });
    }
}

/// Arg-reductions along rows run a block per row (and per segment, when few long rows would not
/// fill the GPU) over 16-byte vectors: ties and NaNs spread over the block's threads and the
/// segments must give the CPU's first index, for row lengths that fill the vectors and ones
/// that do not (the general kernel), rows contiguous or apart.
#[test]
fn arg_reductions_along_rows_agree() {
    if !gpu() {
        return;
    }
    for dtype in [DType::F32, DType::BF16, DType::F16, DType::I32, DType::U8] {
        for (rows, len) in [(3, 151_936), (64, 4096), (1000, 40), (7, 1001), (1, 8)] {
            let x = (values(&[rows, len], DType::F32, 0.9) * 3.0).floor();
            let x = if dtype.is_float() {
                let r = ops::arange(0, rows, 1).reshape([rows, 1]);
                let c = ops::arange(0, len, 1).reshape([1, len]);
                let nan_at =
                    r.equal(1).logical_and(c.equal(len - 2)).logical_or(r.equal(2).logical_and(c.equal(len / 3)));
                ops::where_(&nan_at, f32::NAN, &x)
            } else {
                x.abs()
            };
            let x = x.astype(dtype);
            let tag = format!("{dtype} [{rows}, {len}]");
            both(&format!("argmax rows {tag}"), std::slice::from_ref(&x), |v| v[0].argmax(1));
            both(&format!("argmin rows {tag}"), std::slice::from_ref(&x), |v| v[0].argmin(1));
            both(&format!("argmax last axis of 3-D {tag}"), std::slice::from_ref(&x), |v| {
                v[0].reshape([1, rows, len]).argmax(-1)
            });
            // Rows 2·len apart (the last position's logits of a prompt's).
            let apart = ops::concatenate(&[x.clone(), x.clone()], 1);
            both(&format!("argmax rows apart {tag}"), std::slice::from_ref(&apart), |v| {
                v[0].slice(&[0, len], &[rows, 2 * len], &[1, 1]).argmax(1)
            });
        }
    }
}

/// Arg-reductions down long columns run in segments merged in order: ties and NaNs that fall
/// in different segments must give the CPU's first index.
#[test]
fn arg_reductions_down_long_columns_agree() {
    if !gpu() {
        return;
    }
    for dtype in [DType::F32, DType::BF16, DType::I32] {
        for (rows, cols) in [(5000, 3), (20000, 40), (700, 300)] {
            // Few distinct values (many ties), a NaN late in column 1 and early in column 2.
            let x = (values(&[rows, cols], DType::F32, 0.9) * 2.0).floor();
            let x = if dtype.is_float() {
                let r = ops::arange(0, rows, 1).reshape([rows, 1]);
                let c = ops::arange(0, cols, 1).reshape([1, cols]);
                let nan_at = r.equal(rows - 3).logical_and(c.equal(1)).logical_or(r.equal(7).logical_and(c.equal(2)));
                ops::where_(&nan_at, f32::NAN, &x)
            } else {
                x
            };
            let x = x.astype(dtype);
            let tag = format!("{dtype} [{rows}, {cols}]");
            both(&format!("argmax axis 0 {tag}"), std::slice::from_ref(&x), |v| v[0].argmax(0));
            both(&format!("argmin axis 0 {tag}"), std::slice::from_ref(&x), |v| v[0].argmin(0));
            both(&format!("argmax axis 1 of transposed {tag}"), std::slice::from_ref(&x), |v| v[0].t().argmax(1));
        }
    }
}

// ---- the gated delta rule ---------------------------------------------------------------------

/// How a gated delta case lays out q, k and v.
#[derive(Clone, Copy, Debug, PartialEq)]
enum GdnLayout {
    /// Each its own row-major array.
    Dense,
    /// Views of one `[B, T, 2·Hk + Hv, D]` projection (Dk = Dv): read through their strides.
    Fused,
    /// k a transposed view (its last axis not contiguous): copied before the kernel.
    KTransposed,
}

/// One `fast::gated_delta` call: shapes, dtypes and options.
#[derive(Clone, Copy, Debug)]
struct Gdn {
    b: i32,
    t: i32,
    hk: i32,
    hv: i32,
    dk: i32,
    dv: i32,
    /// q, k and v (and so y).
    dtype: DType,
    /// g and beta.
    gate: DType,
    /// g per key channel, `[B, T, Hv, Dk]`.
    channel: bool,
    /// The given state's dtype; `None`: no state (zeros).
    state: Option<DType>,
    masked: bool,
    /// Every step's state (`gated_delta_steps_with`).
    steps: bool,
    storage: Option<DType>,
    layout: GdnLayout,
}

/// A case's inputs, as the op receives them.
struct GdnInputs {
    q: Array,
    k: Array,
    v: Array,
    g: Array,
    beta: Array,
    state: Option<Array>,
    mask: Option<Array>,
}

impl Gdn {
    /// A case of these shapes with a float32 gate per head and state, no mask, the last state.
    fn new(b: i32, t: i32, hk: i32, hv: i32, dk: i32, dv: i32, dtype: DType) -> Gdn {
        let (gate, state, layout) = (DType::F32, Some(DType::F32), GdnLayout::Dense);
        Gdn {
            b,
            t,
            hk,
            hv,
            dk,
            dv,
            dtype,
            gate,
            channel: false,
            state,
            masked: false,
            steps: false,
            storage: None,
            layout,
        }
    }

    /// Inputs as a model makes them: q and k of unit length (q also scaled by Dk^-1/2), v in
    /// [-1, 1], the gates in (0.85, 1), beta in (0.05, 0.95), a state in [-0.5, 0.5], about one
    /// step in five masked out; all from `seed`.
    fn inputs(&self, seed: u64) -> GdnInputs {
        let mut rng = crate::Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
        let Gdn { b, t, hk, hv, dk, dv, .. } = *self;
        let mut uniform =
            |n: i32, lo: f64, hi: f64| -> Vec<f32> { (0..n).map(|_| (lo + (hi - lo) * rng.unit()) as f32).collect() };
        let unit_rows = |mut x: Vec<f32>, scale: f32| -> Vec<f32> {
            for row in x.chunks_mut(dk as usize) {
                let norm = row.iter().map(|v| v * v).sum::<f32>().sqrt().max(1e-6);
                row.iter_mut().for_each(|v| *v *= scale / norm);
            }
            x
        };
        let rows = b * t * hk * dk;
        let q = unit_rows(uniform(rows, -1.0, 1.0), (dk as f32).powf(-0.5));
        let k = unit_rows(uniform(rows, -1.0, 1.0), 1.0);
        let v = uniform(b * t * hv * dv, -1.0, 1.0);
        let d = self.dtype;
        let (q, k, v) = match self.layout {
            GdnLayout::Fused => {
                // One projection per step: q's heads, k's, then v's.
                assert_eq!(dk, dv, "a fused projection needs Dk = Dv");
                let (per_q, per_v) = ((hk * dk) as usize, (hv * dv) as usize);
                let mut all = Vec::with_capacity((b * t) as usize * (2 * per_q + per_v));
                for i in 0..(b * t) as usize {
                    all.extend_from_slice(&q[i * per_q..][..per_q]);
                    all.extend_from_slice(&k[i * per_q..][..per_q]);
                    all.extend_from_slice(&v[i * per_v..][..per_v]);
                }
                let all = Array::from_slice(&all, [b, t, 2 * hk + hv, dk]).astype(d);
                let heads = |from: i32, n: i32| all.slice(&[0, 0, from, 0], &[b, t, from + n, dk], &[1, 1, 1, 1]);
                (heads(0, hk), heads(hk, hk), heads(2 * hk, hv))
            }
            GdnLayout::KTransposed => {
                let k = Array::from_slice(&k, [b, t, hk, dk]).swapaxes(2, 3).astype(d).swapaxes(2, 3);
                (Array::from_slice(&q, [b, t, hk, dk]).astype(d), k, Array::from_slice(&v, [b, t, hv, dv]).astype(d))
            }
            GdnLayout::Dense => (
                Array::from_slice(&q, [b, t, hk, dk]).astype(d),
                Array::from_slice(&k, [b, t, hk, dk]).astype(d),
                Array::from_slice(&v, [b, t, hv, dv]).astype(d),
            ),
        };
        let g = if self.channel {
            Array::from_slice(&uniform(b * t * hv * dk, 0.85, 1.0), [b, t, hv, dk])
        } else {
            Array::from_slice(&uniform(b * t * hv, 0.85, 1.0), [b, t, hv])
        };
        let beta = Array::from_slice(&uniform(b * t * hv, 0.05, 0.95), [b, t, hv]);
        let state =
            self.state.map(|sd| Array::from_slice(&uniform(b * hv * dv * dk, -0.5, 0.5), [b, hv, dv, dk]).astype(sd));
        let mask = self.masked.then(|| {
            let keep: Vec<bool> = uniform(b * t, 0.0, 1.0).iter().map(|&u| u < 0.8).collect();
            Array::from_slice(&keep, [b, t])
        });
        GdnInputs { q, k, v, g: g.astype(self.gate), beta: beta.astype(self.gate), state, mask }
    }

    /// The op's two outputs (`mask` in place of the case's own where given).
    fn run(&self, x: &GdnInputs, mask: Option<&Array>) -> (Array, Array) {
        let options = nuvec::fast::StepOptions { storage: self.storage, mask: mask.or(x.mask.as_ref()).cloned() };
        let f = if self.steps { nuvec::fast::gated_delta_steps_with } else { nuvec::fast::gated_delta_with };
        f(&x.q, &x.k, &x.v, &x.g, &x.beta, x.state.as_ref(), &options)
    }

    /// The primitive's parameters, as the op records them.
    fn params(&self, masked: bool) -> nuvec::fast::GatedDeltaParams {
        let given = self.state.unwrap_or(DType::F32);
        let storage = if self.steps { self.storage.unwrap_or(DType::F32) } else { self.storage.unwrap_or(given) };
        nuvec::fast::GatedDeltaParams { steps: self.steps, storage, masked }
    }

    /// The primitive's input specs.
    fn specs(&self, masked: bool) -> Vec<nuvec::graph::Spec> {
        let spec = |shape: &[i32], dtype: DType| nuvec::graph::Spec { shape: shape.iter().copied().collect(), dtype };
        let Gdn { b, t, hk, hv, dk, dv, .. } = *self;
        let g = if self.channel { spec(&[b, t, hv, dk], self.gate) } else { spec(&[b, t, hv], self.gate) };
        let mut v = vec![spec(&[b, t, hk, dk], self.dtype), spec(&[b, t, hk, dk], self.dtype)];
        v.extend([spec(&[b, t, hv, dv], self.dtype), g, spec(&[b, t, hv], self.gate)]);
        v.push(spec(&[b, hv, dv, dk], self.state.unwrap_or(DType::F32)));
        if masked {
            v.push(spec(&[b, t], DType::Bool));
        }
        v
    }

    /// The kernel the CUDA backend would run (`None`: the composition).
    fn kernel(&self, masked: bool) -> Option<nuvec_cuda::GatedDeltaKernel> {
        nuvec_cuda::gated_delta_kernel(&self.params(masked), &self.specs(masked))
    }

    /// The composition on the GPU (the reference of the kernels, and their fallback).
    fn composition(&self, x: &GdnInputs) -> (Array, Array) {
        let Gdn { b, hv, dv, dk, .. } = *self;
        let state = x.state.clone().unwrap_or_else(|| ops::zeros(&[b, hv, dv, dk][..], DType::F32));
        let mut inputs = vec![x.q.clone(), x.k.clone(), x.v.clone(), x.g.clone(), x.beta.clone(), state];
        inputs.extend(x.mask.clone());
        let mut out = nuvec::fast::FastOp::GatedDelta(self.params(self.masked)).composition(&inputs);
        let states = out.pop().unwrap();
        (out.pop().unwrap(), states)
    }

    /// The recurrence in float64 from the inputs' values (`gated_delta`'s loop): y
    /// `[B, T, Hv, Dv]` and the last state (or every step's, `[B, T, Hv, Dv, Dk]`).
    fn reference(&self, x: &GdnInputs) -> (Vec<f64>, Vec<f64>) {
        let wide = |a: &Array| on(Device::cpu(), || a.astype(DType::F64).to_vec::<f64>().unwrap());
        let (q, k, v, g, beta) = (wide(&x.q), wide(&x.k), wide(&x.v), wide(&x.g), wide(&x.beta));
        let mask = x.mask.as_ref().map(|m| on(Device::cpu(), || m.to_vec::<bool>().unwrap()));
        let [b, t, hk, hv, dk, dv] = [self.b, self.t, self.hk, self.hv, self.dk, self.dv].map(|n| n as usize);
        let state = x.state.as_ref().map_or_else(|| vec![0.0; b * hv * dv * dk], wide);
        let d = crate::gated_delta::Dims { b, t, hk, hv, dk, dv };
        let r = crate::gated_delta::reference(&d, [&q, &k, &v, &g, &beta], self.channel, &state, mask.as_deref());
        (r.y, if self.steps { r.steps } else { r.last })
    }
}

/// The tolerance of results stored as `dtype`, relative to the array's largest magnitude.
fn gdn_tolerance(dtype: DType) -> f64 {
    match dtype {
        DType::BF16 => 1e-2,
        DType::F16 => 2e-3,
        _ => 2e-4,
    }
}

/// `got` within `tol` of `want`: |got − want| ≤ tol·(max |want| + |want|), NaN nowhere.
fn gdn_close(what: &str, got: &[f64], want: &[f64], tol: f64) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    let scale = want.iter().fold(1e-3f64, |m, w| m.max(w.abs()));
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!((g - w).abs() <= tol * (scale + w.abs()), "{what}: element {i} is {g}, expected {w} (scale {scale})");
    }
}

/// Both outputs of a case against the float64 loop and against the composition on the GPU.
fn gdn_check(tag: &str, c: &Gdn, x: &GdnInputs, got: &(Array, Array)) {
    let wide = |a: &Array| a.astype(DType::F64).to_vec::<f64>().unwrap_or_else(|e| panic!("{tag}: {e}"));
    let (y, s) = (wide(&got.0), wide(&got.1));
    let (ry, rs) = c.reference(x);
    let storage = c.params(c.masked).storage;
    assert_eq!(got.0.dtype(), c.dtype, "{tag}: y's dtype");
    assert_eq!(got.1.dtype(), storage, "{tag}: the states' dtype");
    // The chunked kernels' products take half-precision operands (the state's included), and
    // their rounding adds up over a chunk's 64 steps.
    let (y_tol, s_tol) = if c.kernel(c.masked) == Some(nuvec_cuda::GatedDeltaKernel::Chunked) {
        let t = 2.0 * gdn_tolerance(c.dtype);
        (t, t)
    } else {
        (gdn_tolerance(c.dtype), gdn_tolerance(storage))
    };
    gdn_close(&format!("{tag}: y against float64"), &y, &ry, y_tol);
    gdn_close(&format!("{tag}: states against float64"), &s, &rs, s_tol);
    let (cy, cs) = on(Device::gpu(0), || c.composition(x));
    let (cy, cs) = (wide(&cy), wide(&cs));
    gdn_close(&format!("{tag}: y against the composition"), &y, &cy, y_tol);
    gdn_close(&format!("{tag}: states against the composition"), &s, &cs, s_tol);
}

/// The gated delta rule's kernels against a float64 loop and against the composition: grouped
/// heads, Dk 32 to 256, Dv 16 to 128, 0 to 300 steps, 1 and 3 batch rows, masks, gates per
/// channel, every step's state, storage and state dtypes, half-precision inputs, q, k and v as
/// views of one projection and a transposed k; and the GPU claims every case the kernels cover.
#[test]
fn gated_delta_kernels_agree() {
    use nuvec_cuda::GatedDeltaKernel::{Chunked, Packed, Rows};
    if !gpu() {
        return;
    }
    let (f32_, f16_, bf16_) = (DType::F32, DType::F16, DType::BF16);
    let mut cases: Vec<(Gdn, Option<nuvec_cuda::GatedDeltaKernel>)> = Vec::new();
    // Decode at grouped heads, q, k and v views of one projection.
    let c = Gdn { layout: GdnLayout::Fused, ..Gdn::new(3, 1, 2, 4, 128, 128, bf16_) };
    cases.push((c, Some(Packed)));
    // No state given (zeros).
    cases.push((Gdn { state: None, ..Gdn::new(1, 1, 4, 8, 128, 128, f32_) }, Some(Packed)));
    // A gate per key channel, a mask, a transposed k.
    let c = Gdn { channel: true, masked: true, layout: GdnLayout::KTransposed, ..Gdn::new(3, 7, 2, 4, 64, 64, f32_) };
    cases.push((c, Some(Rows)));
    // A long prompt at Dk 256, bfloat16 gates and state in, float32 out, masked.
    let c = Gdn {
        gate: bf16_,
        state: Some(bf16_),
        masked: true,
        storage: Some(f32_),
        ..Gdn::new(1, 300, 1, 2, 256, 64, bf16_)
    };
    cases.push((c, Some(Rows)));
    // Every step's state, in float16, from views of one projection.
    let c = Gdn { steps: true, storage: Some(f16_), layout: GdnLayout::Fused, ..Gdn::new(3, 7, 2, 2, 128, 128, f16_) };
    cases.push((c, Some(Packed)));
    // Every step's state of a long prompt, in bfloat16.
    let c = Gdn { steps: true, storage: Some(bf16_), ..Gdn::new(1, 300, 2, 4, 128, 128, bf16_) };
    cases.push((c, Some(Packed)));
    // Dk 96 and Dv 40 (not a multiple of 8): half-precision gates per channel and state, masked.
    let c = Gdn {
        gate: bf16_,
        channel: true,
        state: Some(bf16_),
        masked: true,
        steps: true,
        ..Gdn::new(3, 7, 1, 3, 96, 40, bf16_)
    };
    cases.push((c, Some(Rows)));
    // Dk 32, a float16 gate and state.
    cases.push((Gdn { gate: f16_, state: Some(f16_), ..Gdn::new(1, 1, 1, 1, 32, 16, f32_) }, Some(Rows)));
    // A float32 prompt of 300 steps at Dv 64.
    cases.push((Gdn::new(3, 300, 2, 4, 128, 64, f32_), Some(Packed)));
    // A gate per channel at Dk 128 takes the row kernel.
    cases.push((Gdn { channel: true, ..Gdn::new(3, 7, 2, 4, 128, 128, bf16_) }, Some(Rows)));
    // No steps: the state converted to the storage dtype.
    cases.push((Gdn { state: Some(bf16_), storage: Some(f32_), ..Gdn::new(2, 0, 1, 2, 64, 64, f32_) }, Some(Rows)));
    // Dk 48 has no kernel: the composition runs, and agrees.
    cases.push((Gdn::new(1, 7, 2, 2, 48, 32, f32_), None));
    // Long prompts: the chunked kernels, a last chunk of 44 steps, grouped heads.
    cases.push((Gdn::new(2, 300, 2, 4, 128, 128, bf16_), Some(Chunked)));
    // Views of one projection in float16, a bfloat16 state in, float32 out, bfloat16 gates.
    let c = Gdn {
        layout: GdnLayout::Fused,
        gate: bf16_,
        state: Some(bf16_),
        storage: Some(f32_),
        ..Gdn::new(1, nuvec_cuda::GATED_DELTA_CHUNKED_FROM as i32, 1, 2, 128, 128, f16_)
    };
    cases.push((c, Some(Chunked)));
    // No state given; 9 chunks, the last of one step.
    cases.push((Gdn { state: None, ..Gdn::new(1, 513, 2, 2, 128, 128, bf16_) }, Some(Chunked)));
    // Three value heads per key head: the prep takes them one at a time, not in pairs.
    cases.push((Gdn::new(2, 300, 1, 3, 128, 128, f16_), Some(Chunked)));
    let packed_on = ["NUVEC_GDN_PACKED", "MLX_GDN_PACKED"].iter().all(|v| std::env::var(v).as_deref() != Ok("0"));
    let chunked_on =
        Gdn::new(1, nuvec_cuda::GATED_DELTA_CHUNKED_FROM as i32, 1, 1, 128, 128, bf16_).kernel(false) == Some(Chunked);
    for (i, (c, expected)) in cases.iter().enumerate() {
        let tag = format!("gated_delta case {i} {c:?}");
        let expected = expected.map(|k| match k {
            Packed if !packed_on => Rows,
            Chunked if !chunked_on => {
                if packed_on && c.gate == f32_ && c.state.is_none_or(|d| d == f32_) {
                    Packed
                } else {
                    Rows
                }
            }
            k => k,
        });
        assert_eq!(c.kernel(c.masked), expected, "{tag}: kernel");
        let x = c.inputs(i as u64 + 1);
        let got = on(Device::gpu(0), || c.run(&x, None));
        gdn_check(&tag, c, &x, &got);
    }
}

/// The packed kernel (8 rows per warp) gives the row kernel's bits: the same inputs without a
/// mask (packed) and with a mask that keeps every step (the row kernel, whose arithmetic the
/// mask does not change); decode, prompts with and without every step's state, and the row
/// kernel's two forms (T = 1, and loading ahead).
#[test]
fn gated_delta_packed_kernel_matches_the_row_kernel_bit_for_bit() {
    use nuvec_cuda::GatedDeltaKernel::{Packed, Rows};
    if !gpu() {
        return;
    }
    let cases = [
        Gdn::new(3, 1, 2, 4, 128, 128, DType::BF16),
        Gdn { steps: true, storage: Some(DType::BF16), ..Gdn::new(2, 7, 2, 4, 128, 64, DType::BF16) },
        Gdn { gate: DType::F32, ..Gdn::new(1, 300, 1, 2, 128, 128, DType::F32) },
        Gdn { steps: true, layout: GdnLayout::Fused, ..Gdn::new(2, 300, 2, 2, 128, 128, DType::F16) },
        Gdn { state: None, ..Gdn::new(1, 7, 2, 4, 128, 8, DType::BF16) },
        // One step (gated_delta_decode): every step's state in float16, views of one projection.
        Gdn {
            steps: true,
            storage: Some(DType::F16),
            layout: GdnLayout::Fused,
            ..Gdn::new(2, 1, 2, 4, 128, 128, DType::F16)
        },
        Gdn { state: None, ..Gdn::new(5, 1, 1, 3, 128, 8, DType::BF16) },
    ];
    for (i, c) in cases.iter().enumerate() {
        let tag = format!("case {i} {c:?}");
        if c.kernel(false) != Some(Packed) {
            crate::skipped(&format!(
                "the packed kernel is switched off (NUVEC_GDN_PACKED=0 or MLX_GDN_PACKED=0): {tag}"
            ));
            return;
        }
        assert_eq!(c.kernel(true), Some(Rows), "{tag}: the masked call's kernel");
        let x = c.inputs(100 + i as u64);
        let keep = ops::ones(&[c.b, c.t][..], DType::Bool);
        let (packed, rows) = on(Device::gpu(0), || (c.run(&x, None), c.run(&x, Some(&keep))));
        for (what, p, r) in [("y", &packed.0, &rows.0), ("states", &packed.1, &rows.1)] {
            p.eval().unwrap_or_else(|e| panic!("{tag}: packed {what}: {e}"));
            r.eval().unwrap_or_else(|e| panic!("{tag}: row kernel's {what}: {e}"));
            assert_eq!(p.dtype(), r.dtype(), "{tag}: {what}'s dtype");
            let (pb, rb) = (p.to_bytes().unwrap(), r.to_bytes().unwrap());
            let first = pb.iter().zip(&rb).position(|(a, b)| a != b);
            assert!(first.is_none() && pb.len() == rb.len(), "{tag}: {what} differ first at byte {first:?}");
        }
        // And both agree with the float64 loop.
        gdn_check(&tag, c, &x, &packed);
    }
}

/// A prompt run whole by the chunked kernels equals the same prompt in two pieces, the first
/// chunked and the second (one chunk) by the recurrence's kernel, the state carried between
/// them: y and the last state within the chunked kernels' tolerance.
#[test]
fn gated_delta_chunked_prompt_in_pieces() {
    use nuvec_cuda::GatedDeltaKernel::Chunked;
    if !gpu() {
        return;
    }
    let from = nuvec_cuda::GATED_DELTA_CHUNKED_FROM as i32;
    let whole = Gdn::new(2, from + 64, 2, 4, 128, 128, DType::BF16);
    if whole.kernel(false) != Some(Chunked) {
        crate::skipped("the chunked kernels are switched off (NUVEC_GDN_CHUNKED)");
        return;
    }
    let x = whole.inputs(7);
    let steps = |a: &Array, lo: i32, hi: i32| {
        let mut start = vec![0; a.ndim()];
        let mut stop: Vec<i32> = a.shape().to_vec();
        (start[1], stop[1]) = (lo, hi);
        a.slice(&start, &stop, &vec![1; a.ndim()])
    };
    let piece = |lo: i32, hi: i32, state: Option<Array>| GdnInputs {
        q: steps(&x.q, lo, hi),
        k: steps(&x.k, lo, hi),
        v: steps(&x.v, lo, hi),
        g: steps(&x.g, lo, hi),
        beta: steps(&x.beta, lo, hi),
        state,
        mask: None,
    };
    let (first, second) = (Gdn { t: from, ..whole }, Gdn { t: 64, ..whole });
    assert_eq!(first.kernel(false), Some(Chunked));
    assert_ne!(second.kernel(false), Some(Chunked));
    let (all, y1, y2, last) = on(Device::gpu(0), || {
        let all = whole.run(&x, None);
        let (y1, s1) = first.run(&piece(0, from, x.state.clone()), None);
        let (y2, s2) = second.run(&piece(from, from + 64, Some(s1)), None);
        (all, y1, y2, s2)
    });
    let wide = |a: &Array| a.astype(DType::F64).to_vec::<f64>().unwrap();
    let pieces_y = wide(&ops::concatenate(&[y1, y2], 1));
    let tol = 2.0 * gdn_tolerance(DType::BF16);
    gdn_close("y whole against in pieces", &wide(&all.0), &pieces_y, tol);
    gdn_close("last state whole against in pieces", &wide(&all.1), &wide(&last), tol);
    gdn_check("the whole prompt", &whole, &x, &all);
}
