//! Printing: golden strings of `Display` and `Debug`.
//!
//! "MLX" marks a string MLX's Python `repr` gives for the same array (its `mlx/utils.cpp`
//! printer: `%g` with six significant digits, rows under the first `[`, `True`/`False`);
//! each was checked against MLX 0.32.4's `repr` (the `mlx[cpu]` wheel for Linux). Where
//! nuvec differs on purpose the comment says how: the dtype's round-trip digits where six are
//! not enough, NumPy's 1000-element summary threshold, NumPy's column alignment in 2-D and up.

use nuvec::{Array, Complex64, DType, array, bf16, f16, ops};

fn f16s(v: &[f32]) -> Array {
    Array::from_slice(&v.iter().map(|&x| f16::from_f32(x)).collect::<Vec<_>>(), [v.len()])
}

fn bf16s(v: &[f32]) -> Array {
    Array::from_slice(&v.iter().map(|&x| bf16::from_f32(x)).collect::<Vec<_>>(), [v.len()])
}

#[test]
fn float32_prints_its_own_digits() {
    // MLX.
    assert_eq!(array![0.1, 0.2, 1e-8].to_string(), "array([0.1, 0.2, 1e-08], dtype=float32)");
    assert_eq!(array![1.0, 2.5, 3.0].to_string(), "array([1, 2.5, 3], dtype=float32)");
    assert_eq!(
        array![-7.25, 1e10, 1.5e-5, 123456.0].to_string(),
        "array([-7.25, 1e+10, 1.5e-05, 123456], dtype=float32)"
    );
    // Six digits do not identify these float32 values: MLX prints `0.333333` and `1.23457e+06`;
    // nuvec adds digits until the float32 reads back (float32's shortest round-trip digits).
    assert_eq!(
        Array::from_slice(&[1.0f32 / 3.0, 1234567.0], [2]).to_string(),
        "array([0.33333334, 1234567], dtype=float32)"
    );
    // float64 keeps its own digits.
    assert_eq!(array![0.1f64, 0.5].to_string(), "array([0.1, 0.5], dtype=float64)");
    assert_eq!(Array::from_slice(&[1.0f64 / 3.0], [1]).to_string(), "array([0.3333333333333333], dtype=float64)");
}

#[test]
fn inf_nan_and_signed_zero() {
    // MLX.
    let a = Array::from_slice(&[f32::INFINITY, f32::NEG_INFINITY, f32::NAN, 0.0, -0.0], [5]);
    assert_eq!(a.to_string(), "array([inf, -inf, nan, 0, -0], dtype=float32)");
}

#[test]
fn half_types() {
    // MLX: float16 0.1 is 0.0999755859375, bfloat16 0.1 is 0.10009765625, printed with six
    // digits, ties to even (bfloat16 2.015625: `2.01562`; 2^-10: `0.000976562`).
    assert_eq!(
        f16s(&[0.1, 1.0, -2.5, 65504.0, 1e-4]).to_string(),
        "array([0.0999756, 1, -2.5, 65504, 0.000100017], dtype=float16)"
    );
    assert_eq!(
        bf16s(&[0.1, 1.0, 2.015625, -0.0009765625, 256.0, 1e10]).to_string(),
        "array([0.100098, 1, 2.01562, -0.000976562, 256, 9.99922e+09], dtype=bfloat16)"
    );
    assert_eq!(array![0.5, 0.25].astype(DType::BF16).to_string(), "array([0.5, 0.25], dtype=bfloat16)");
}

#[test]
fn complex64() {
    // MLX.
    let a = Array::from_slice(
        &[Complex64::new(1.0, 2.0), Complex64::new(-0.5, -1.5), Complex64::new(0.1, 0.0), Complex64::new(0.0, -1.0)],
        [4],
    );
    assert_eq!(a.to_string(), "array([1+2j, -0.5-1.5j, 0.1+0j, 0-1j], dtype=complex64)");
}

#[test]
fn bool_and_scalar() {
    // MLX.
    assert_eq!(array![true, false].to_string(), "array([True, False], dtype=bool)");
    assert_eq!(Array::scalar(1.5, DType::F32).to_string(), "array(1.5, dtype=float32)");
    assert_eq!(Array::scalar(7, DType::I32).to_string(), "array(7, dtype=int32)");
    assert_eq!(Array::scalar(true, DType::Bool).to_string(), "array(True, dtype=bool)");
}

#[test]
fn rows_and_alignment() {
    // MLX.
    assert_eq!(array![[1, 2], [3, 4]].to_string(), "array([[1, 2],\n       [3, 4]], dtype=int32)");
    assert_eq!(array![[1, 2], [3, 4]].t().to_string(), "array([[1, 3],\n       [2, 4]], dtype=int32)");
    assert_eq!(array![-1, 2, -30].to_string(), "array([-1, 2, -30], dtype=int32)");
    assert_eq!(
        ops::arange(0, 8, 1).reshape([2, 2, 2]).to_string(),
        "array([[[0, 1],\n        [2, 3]],\n       [[4, 5],\n        [6, 7]]], dtype=int32)"
    );
    // NumPy-style: in 2-D and up every element is right-aligned to the widest (MLX does not pad).
    assert_eq!(array![[1, -20], [300, 4]].to_string(), "array([[  1, -20],\n       [300,   4]], dtype=int32)");
    assert_eq!(array![[1.0, 2.5], [-3.0, 0.1]].to_string(), "array([[  1, 2.5],\n       [ -3, 0.1]], dtype=float32)");
}

#[test]
fn empty_arrays() {
    // MLX.
    assert_eq!(Array::from_slice::<f32>(&[], [0]).to_string(), "array([], dtype=float32)");
    assert_eq!(Array::from_slice::<f32>(&[], [2, 0]).to_string(), "array([[],\n       []], dtype=float32)");
    assert_eq!(Array::from_slice::<i32>(&[], [0, 3]).to_string(), "array([], dtype=int32)");
}

#[test]
fn large_arrays_are_summarised() {
    // NumPy-style (NumPy prints the same values; MLX the same layout without the padding).
    let a = ops::arange(0, 10000, 1).reshape([100, 100]);
    let s = a.to_string();
    assert_eq!(
        s,
        "array([[   0,    1,    2, ...,   97,   98,   99],\n       \
                [ 100,  101,  102, ...,  197,  198,  199],\n       \
                [ 200,  201,  202, ...,  297,  298,  299],\n       \
                ...,\n       \
                [9700, 9701, 9702, ..., 9797, 9798, 9799],\n       \
                [9800, 9801, 9802, ..., 9897, 9898, 9899],\n       \
                [9900, 9901, 9902, ..., 9997, 9998, 9999]], dtype=int32)"
    );
    let f = (a.astype(DType::F32) / 7.0).to_string();
    assert!(f.len() < 2000 && f.lines().count() == 7, "{f}");
    assert!(f.contains("..."), "{f}");
    // One row per line, each the same length (aligned columns).
    let rows: Vec<&str> = f.lines().filter(|l| !l.trim_start().starts_with("...")).collect();
    let ends: Vec<usize> = rows.iter().map(|l| l.find(']').unwrap()).collect();
    assert!(ends.windows(2).all(|w| w[0] == w[1]), "{f}");
    // 1-D: NumPy's threshold (MLX summarises any axis longer than 6, NumPy only past 1000 elements).
    assert_eq!(ops::arange(0, 2000, 1).to_string(), "array([0, 1, 2, ..., 1997, 1998, 1999], dtype=int32)");
    assert_eq!(ops::arange(0, 10, 1).to_string(), "array([0, 1, 2, 3, 4, 5, 6, 7, 8, 9], dtype=int32)");
    // 3-D: every long axis is cut, `...` sits under the bracket it stands for.
    let c = ops::arange(0, 2000, 1).reshape([10, 10, 20]).to_string();
    assert_eq!(c.lines().count(), 6 * 6 + 6 + 1, "{c}");
    assert!(c.contains("\n       ...,\n") && c.contains("\n        ...,\n"), "{c}");
}

#[test]
fn precision_gives_fixed_decimals() {
    // MLX's `set_printoptions(precision=2)`.
    assert_eq!(format!("{:.2}", array![0.1, 1.0 / 3.0]), "array([0.10, 0.33], dtype=float32)");
}

#[test]
fn debug_shows_shape_and_dtype() {
    let a = array![[1, 2], [3, 4]];
    assert_eq!(format!("{a:?}"), "array([[1, 2],\n       [3, 4]], shape=[2, 2], dtype=int32)");
    // Debug does not evaluate; Display does.
    let lazy = &a + 1;
    assert_eq!(format!("{lazy:?}"), "array(<lazy>, shape=[2, 2], dtype=int32)");
    assert_eq!(lazy.to_string(), "array([[2, 3],\n       [4, 5]], dtype=int32)");
    assert_eq!(format!("{lazy:?}"), "array([[2, 3],\n       [4, 5]], shape=[2, 2], dtype=int32)");
    // A failed array prints its error.
    let bad = a.reshape([3]);
    assert!(bad.to_string().starts_with("array(<failed: "), "{bad}");
    assert!(format!("{bad:?}").starts_with("array(<failed: "), "{bad:?}");
}
