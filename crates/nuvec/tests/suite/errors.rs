//! Error messages of invalid calls.
//!
//! Each test makes one bad call and checks the failed array's error: the operation's public
//! name (`op_name`), the error kind (`OpErrorKind::ShapeMismatch`, `InvalidAxis`, ...), the
//! caller's location (`#[track_caller]` all the way down: the file is this one and the line is
//! the line of the call, for methods, free functions and operators alike), and a `Display`
//! message that names the operation and the offending argument or shape. It also checks that
//! the error surfaces unchanged at `eval`, `item`, `to_vec` and `check`, and through later
//! operations.
//!
//! Run: `cargo test -p nuvec --release --test suite -- errors::`.

use nuvec::{Array, DType, Error, OpErrorKind, ScanOptions, ops};

/// An `f32` array of `shape` holding 0, 1, 2, ...
fn iota(shape: &[i32]) -> Array {
    let n: i32 = shape.iter().product();
    let v: Vec<f32> = (0..n).map(|i| i as f32).collect();
    let a = Array::from_slice(&v, shape.to_vec());
    assert!(!a.is_failed(), "test input {shape:?}");
    a
}

/// Checks a failed array: named `op`, called from this file at `line`; its error is the same at
/// every boundary, and its message names the op and the location. Returns the error.
#[track_caller]
fn failed(a: &Array, op: &str, line: u32) -> Error {
    let e = failed_somewhere(a, op);
    let at = e.location().unwrap_or_else(|| panic!("no location in {e}"));
    assert!(at.file().ends_with("errors.rs"), "location {}:{} is not in this test file ({e})", at.file(), at.line());
    assert_eq!(at.line(), line, "location line of {e}");
    let msg = e.to_string();
    assert!(msg.contains(&format!("errors.rs:{line}")), "message {msg:?} does not give the location");
    e
}

/// [`failed`] without the location checks, for the calls whose location is a known nuvec bug
/// (checked by `#[ignore]`d `axis_shape_and_batch_errors_point_at_the_caller`).
#[track_caller]
fn failed_somewhere(a: &Array, op: &str) -> Error {
    let e = a.error().unwrap_or_else(|| panic!("expected {op} to fail, got a valid array of shape {:?}", a.shape()));
    assert!(a.is_failed());
    assert_eq!(e.op_name(), Some(op), "op name of {e}");
    // The same error at every boundary.
    assert_eq!(a.eval().unwrap_err(), e);
    assert_eq!(a.to_vec::<f32>().unwrap_err(), e);
    assert_eq!(a.item::<f32>().unwrap_err(), e);
    assert_eq!(a.clone().check().unwrap_err(), e);
    assert_eq!(nuvec::eval(std::slice::from_ref(a)).unwrap_err(), e);
    // The message names the op first.
    let msg = e.to_string();
    assert!(msg.starts_with(op), "message {msg:?} does not start with the op name {op}");
    e
}

/// Asserts that `msg` contains each of `parts`.
#[track_caller]
fn mentions(e: &Error, parts: &[&str]) {
    let msg = e.to_string();
    for p in parts {
        assert!(msg.contains(p), "message {msg:?} does not mention {p:?}");
    }
}

#[test]
fn add_shape_mismatch() {
    let (a, b) = (iota(&[2, 3]), iota(&[4]));
    let want = OpErrorKind::ShapeMismatch { lhs: vec![2, 3], rhs: vec![4] };

    let (c, line) = (a.add(&b), line!());
    let e = failed(&c, "add", line);
    assert_eq!(e.kind(), Some(&want));
    mentions(&e, &["add", "[2, 3]", "[4]"]);

    // The free function and the operator report the same op at their own lines.
    let (c, line) = (ops::add(&a, &b), line!());
    assert_eq!(failed(&c, "add", line).kind(), Some(&want));
    let (c, line) = (&a + &b, line!());
    assert_eq!(failed(&c, "add", line).kind(), Some(&want));
    let (c, line) = (a.clone() + b.clone(), line!());
    assert_eq!(failed(&c, "add", line).kind(), Some(&want));

    // Operand order is kept in the message.
    let (c, line) = (&b * &a, line!());
    let e = failed(&c, "multiply", line);
    assert_eq!(e.kind(), Some(&OpErrorKind::ShapeMismatch { lhs: vec![4], rhs: vec![2, 3] }));
    mentions(&e, &["multiply", "[4]", "[2, 3]"]);
}

#[test]
fn sum_bad_axis() {
    // Op, kind and message; the location of axis errors is checked (and fails) in
    // `axis_shape_and_batch_errors_point_at_the_caller`.
    let a = iota(&[2, 3]);
    let s = a.sum(5);
    let e = failed_somewhere(&s, "sum");
    assert_eq!(e.kind(), Some(&OpErrorKind::InvalidAxis { axis: 5, ndim: 2 }));
    mentions(&e, &["sum", "axis 5", "2 dimensions"]);

    let s = ops::sum(&a, [0, -3], true);
    let e = failed_somewhere(&s, "sum");
    assert_eq!(e.kind(), Some(&OpErrorKind::InvalidAxis { axis: -3, ndim: 2 }));
    mentions(&e, &["axis -3"]);

    // Other reductions and axis-taking ops name themselves.
    let m = a.max_keepdims(2);
    assert_eq!(failed_somewhere(&m, "max").kind(), Some(&OpErrorKind::InvalidAxis { axis: 2, ndim: 2 }));
    let m = a.mean(-4);
    assert_eq!(failed_somewhere(&m, "mean").kind(), Some(&OpErrorKind::InvalidAxis { axis: -4, ndim: 2 }));
    let m = a.argmax(2);
    assert_eq!(failed_somewhere(&m, "argmax").kind(), Some(&OpErrorKind::InvalidAxis { axis: 2, ndim: 2 }));
    let m = a.cumsum_with(3, ScanOptions::default());
    assert_eq!(failed_somewhere(&m, "cumsum").kind(), Some(&OpErrorKind::InvalidAxis { axis: 3, ndim: 2 }));
    let m = a.softmax(7);
    assert_eq!(failed_somewhere(&m, "softmax").kind(), Some(&OpErrorKind::InvalidAxis { axis: 7, ndim: 2 }));
    let m = a.logsumexp([0, 9]);
    assert_eq!(failed_somewhere(&m, "logsumexp").kind(), Some(&OpErrorKind::InvalidAxis { axis: 9, ndim: 2 }));
    let m = a.swapaxes(0, 2);
    assert_eq!(failed_somewhere(&m, "swapaxes").kind(), Some(&OpErrorKind::InvalidAxis { axis: 2, ndim: 2 }));
    let m = a.expand_dims(3);
    assert_eq!(failed_somewhere(&m, "expand_dims").kind(), Some(&OpErrorKind::InvalidAxis { axis: 3, ndim: 3 }));

    // A repeated axis is an invalid argument that names it.
    let m = a.sum([1, -1]);
    let e = failed_somewhere(&m, "sum");
    assert!(matches!(e.kind(), Some(OpErrorKind::InvalidArgument(_))), "{e:?}");
    mentions(&e, &["repeated"]);
}

#[test]
fn axis_shape_and_batch_errors_point_at_the_caller() {
    let a = iota(&[2, 3]);
    let (s, line) = (a.sum(5), line!());
    failed(&s, "sum", line);
    let (s, line) = (ops::sum(&a, [0, -3], true), line!());
    failed(&s, "sum", line);
    let (s, line) = (a.sum([1, -1]), line!());
    failed(&s, "sum", line);
    let (m, line) = (a.max_keepdims(2), line!());
    failed(&m, "max", line);
    let (m, line) = (a.mean(-4), line!());
    failed(&m, "mean", line);
    let (m, line) = (a.argmax(2), line!());
    failed(&m, "argmax", line);
    let (m, line) = (a.cumsum_with(3, ScanOptions::default()), line!());
    failed(&m, "cumsum", line);
    let (m, line) = (a.softmax(7), line!());
    failed(&m, "softmax", line);
    let (m, line) = (a.transpose(&[0, 2]), line!());
    failed(&m, "transpose", line);
    let (m, line) = (a.swapaxes(0, 2), line!());
    failed(&m, "swapaxes", line);
    let (m, line) = (a.expand_dims(3), line!());
    failed(&m, "expand_dims", line);
    let (m, line) = (a.flatten(0, 5), line!());
    failed(&m, "flatten", line);
    let (m, line) = (ops::concatenate(&[a.clone(), a.clone()], 2), line!());
    failed(&m, "concatenate", line);
    let (m, line) = (a.split(2, 3)[0].clone(), line!());
    failed(&m, "split", line);
    // Shapes of creation ops.
    let (z, line) = (ops::full([-1, 2], 1.0), line!());
    failed(&z, "full", line);
    // Batch axes of products.
    let (c, line) = (iota(&[2, 2, 3]).matmul(&iota(&[3, 3, 4])), line!());
    failed(&c, "matmul", line);
}

#[test]
fn bitwise_and_on_float() {
    let (a, b) = (iota(&[3]), iota(&[3]));
    let (c, line) = (a.bitwise_and(&b), line!());
    let e = failed(&c, "bitwise_and", line);
    assert_eq!(e.kind(), Some(&OpErrorKind::UnsupportedDType(DType::F32)));
    mentions(&e, &["bitwise_and", "float32"]);

    let (c, line) = (&a & &b, line!());
    assert_eq!(failed(&c, "bitwise_and", line).kind(), Some(&OpErrorKind::UnsupportedDType(DType::F32)));
    // With an int operand the promoted dtype (float32) is what is rejected.
    let (c, line) = (ops::bitwise_or(a.astype(DType::F16), 3), line!());
    assert_eq!(failed(&c, "bitwise_or", line).kind(), Some(&OpErrorKind::UnsupportedDType(DType::F16)));
    let (c, line) = (a.left_shift(1), line!());
    assert_eq!(failed(&c, "left_shift", line).kind(), Some(&OpErrorKind::UnsupportedDType(DType::F32)));
    let (c, line) = (a.bitwise_invert(), line!());
    assert_eq!(failed(&c, "bitwise_invert", line).kind(), Some(&OpErrorKind::UnsupportedDType(DType::F32)));
}

#[test]
fn negative_on_bool() {
    let a = Array::from_slice(&[true, false], [2]);
    let (c, line) = (a.negative(), line!());
    let e = failed(&c, "negative", line);
    assert_eq!(e.kind(), Some(&OpErrorKind::UnsupportedDType(DType::Bool)));
    mentions(&e, &["negative", "bool"]);

    let (c, line) = (-&a, line!());
    assert_eq!(failed(&c, "negative", line).kind(), Some(&OpErrorKind::UnsupportedDType(DType::Bool)));
    let (c, line) = (ops::negative(&a), line!());
    assert_eq!(failed(&c, "negative", line).kind(), Some(&OpErrorKind::UnsupportedDType(DType::Bool)));

    // Other dtype rules: complex numbers have no floor, remainder, arctan2 or products.
    let z = iota(&[2]).astype(DType::Complex64);
    let (c, line) = (z.floor(), line!());
    assert_eq!(failed(&c, "floor", line).kind(), Some(&OpErrorKind::UnsupportedDType(DType::Complex64)));
    let (c, line) = (z.remainder(&z), line!());
    let e = failed(&c, "remainder", line);
    assert_eq!(e.kind(), Some(&OpErrorKind::UnsupportedDType(DType::Complex64)));
    mentions(&e, &["complex64"]);
    let (c, line) = (ops::arctan2(&z, 1.0), line!());
    assert_eq!(failed(&c, "arctan2", line).kind(), Some(&OpErrorKind::UnsupportedDType(DType::Complex64)));
    let (c, line) = (z.matmul(&z), line!());
    assert_eq!(failed(&c, "matmul", line).kind(), Some(&OpErrorKind::UnsupportedDType(DType::Complex64)));
}

#[test]
fn reshape_size_mismatch() {
    let a = iota(&[2, 3]);
    let (r, line) = (a.reshape([4, 5]), line!());
    let e = failed(&r, "reshape", line);
    assert!(matches!(e.kind(), Some(OpErrorKind::InvalidArgument(_))), "{e:?}");
    mentions(&e, &["reshape", "[2, 3]", "[4, 5]", "6 elements", "20 elements"]);

    let (r, line) = (ops::reshape(&a, [4]), line!());
    mentions(&failed(&r, "reshape", line), &["[2, 3]", "[4]"]);

    // Two inferred sizes, or a negative size, is an invalid shape.
    let (r, line) = (a.reshape([-1, -1]), line!());
    let e = failed(&r, "reshape", line);
    assert_eq!(e.kind(), Some(&OpErrorKind::InvalidShape(vec![-1, -1])));
    mentions(&e, &["[-1, -1]"]);
    let (r, line) = (a.reshape([-2, -3]), line!());
    assert_eq!(failed(&r, "reshape", line).kind(), Some(&OpErrorKind::InvalidShape(vec![-2, -3])));
    // An inferred size that does not divide.
    let (r, line) = (a.reshape([4, -1]), line!());
    let e = failed(&r, "reshape", line);
    assert!(matches!(e.kind(), Some(OpErrorKind::InvalidArgument(_))), "{e:?}");
    mentions(&e, &["[4, -1]", "6"]);
}

#[test]
fn reshape_size_mismatch_message_names_the_shapes() {
    let a = iota(&[2, 3]);
    let (r, line) = (a.reshape([4, 5]), line!());
    let e = failed(&r, "reshape", line);
    mentions(&e, &["[4, 5]", "[2, 3]"]);
}

#[test]
fn matmul_mismatch() {
    let (a, b) = (iota(&[2, 3]), iota(&[4, 5]));
    let (c, line) = (a.matmul(&b), line!());
    let e = failed(&c, "matmul", line);
    assert_eq!(e.kind(), Some(&OpErrorKind::ShapeMismatch { lhs: vec![2, 3], rhs: vec![4, 5] }));
    mentions(&e, &["matmul", "[2, 3]", "[4, 5]"]);

    // 1-d operands are reported with their own shapes.
    let (c, line) = (ops::matmul(&iota(&[3]), &iota(&[4])), line!());
    assert_eq!(failed(&c, "matmul", line).kind(), Some(&OpErrorKind::ShapeMismatch { lhs: vec![3], rhs: vec![4] }));
    // Batch axes that do not broadcast (location: see the ignored test above); the kind holds
    // the operands' shapes and the message names the batch dimensions.
    let c = iota(&[2, 2, 3]).matmul(&iota(&[3, 3, 4]));
    let e = failed_somewhere(&c, "matmul");
    assert_eq!(e.kind(), Some(&OpErrorKind::ShapeMismatch { lhs: vec![2, 2, 3], rhs: vec![3, 3, 4] }));
    mentions(&e, &["[2, 2, 3] @ [3, 3, 4]", "batch dimensions [2] and [3]"]);
    // 0-d operands.
    let (c, line) = (iota(&[]).matmul(&iota(&[3])), line!());
    let e = failed(&c, "matmul", line);
    assert!(matches!(e.kind(), Some(OpErrorKind::InvalidArgument(_))), "{e:?}");
    mentions(&e, &["[]", "[3]"]);
    // addmm: a bias that does not broadcast to the product.
    let (c, line) = (ops::addmm(&iota(&[3]), &iota(&[2, 3]), &iota(&[3, 4]), 1.0, 1.0), line!());
    let e = failed(&c, "addmm", line);
    assert_eq!(e.kind(), Some(&OpErrorKind::ShapeMismatch { lhs: vec![3], rhs: vec![2, 4] }));
}

#[test]
fn concatenate_stack_split_mismatch() {
    let (a, b) = (iota(&[2, 3]), iota(&[2, 4]));
    let (c, line) = (ops::concatenate(&[a.clone(), b.clone()], 0), line!());
    let e = failed(&c, "concatenate", line);
    assert_eq!(e.kind(), Some(&OpErrorKind::ShapeMismatch { lhs: vec![2, 3], rhs: vec![2, 4] }));
    mentions(&e, &["concatenate", "[2, 3]", "[2, 4]"]);
    // Along axis 1 they fit.
    assert_eq!(ops::concatenate(&[a.clone(), b.clone()], 1).shape(), &[2, 7]);
    let (c, line) = (ops::concatenate(&[], 0), line!());
    failed(&c, "concatenate", line);
    let (c, line) = (ops::concatenate(&[a.clone(), iota(&[3])], 0), line!());
    assert!(matches!(failed(&c, "concatenate", line).kind(), Some(OpErrorKind::ShapeMismatch { .. })));

    let (c, line) = (ops::stack(&[a.clone(), b.clone()], 0), line!());
    assert_eq!(
        failed(&c, "stack", line).kind(),
        Some(&OpErrorKind::ShapeMismatch { lhs: vec![2, 3], rhs: vec![2, 4] })
    );

    let x = iota(&[5, 2]);
    let (parts, line) = (x.split(2, 0), line!());
    // A failed split still gives one (failed) array per requested part.
    assert_eq!(parts.len(), 2);
    assert!(parts.iter().all(|p| p.is_failed()));
    let e = failed(&parts[0], "split", line);
    assert!(matches!(e.kind(), Some(OpErrorKind::InvalidArgument(_))), "{e:?}");
    mentions(&e, &["split", "5", "2"]);
    let (parts, line) = (x.split(0, 1), line!());
    failed(&parts[0], "split", line);
}

#[test]
fn bad_arguments_name_the_argument() {
    let a = iota(&[4, 3]);
    // Slice with a zero step.
    let (s, line) = (a.slice(&[0, 0], &[4, 3], &[1, 0]), line!());
    let e = failed(&s, "slice", line);
    assert!(matches!(e.kind(), Some(OpErrorKind::InvalidArgument(_))), "{e:?}");
    mentions(&e, &["slice", "axis 1", "zero"]);
    // Slice with the wrong number of bounds.
    let (s, line) = (a.slice(&[0], &[4], &[]), line!());
    failed(&s, "slice", line);
    // arange with a zero or non-finite step.
    let (r, line) = (ops::arange(0, 10, 0), line!());
    let e = failed(&r, "arange", line);
    mentions(&e, &["arange", "step 0"]);
    let (r, line) = (ops::arange(0.0, f64::INFINITY, 1.0), line!());
    failed(&r, "arange", line);
    let (r, line) = (ops::arange_dtype(0, 3, 1, DType::Bool), line!());
    assert_eq!(failed(&r, "arange", line).kind(), Some(&OpErrorKind::UnsupportedDType(DType::Bool)));
    // view to an incompatible size.
    let (v, line) = (iota(&[3]).view(DType::F64), line!());
    let e = failed(&v, "view", line);
    mentions(&e, &["view", "float64", "12 bytes"]);
    let (v, line) = (iota(&[]).view(DType::U8), line!());
    failed(&v, "view", line);
    // transpose with a non-permutation, broadcast to an incompatible shape, squeeze of a
    // non-unit axis.
    let (t, line) = (a.transpose(&[0, 0]), line!());
    let e = failed(&t, "transpose", line);
    mentions(&e, &["[0, 0]", "permutation"]);
    let (t, line) = (a.broadcast_to([5, 3]), line!());
    let e = failed(&t, "broadcast_to", line);
    assert_eq!(e.kind(), Some(&OpErrorKind::ShapeMismatch { lhs: vec![4, 3], rhs: vec![5, 3] }));
    let (t, line) = (a.squeeze(0), line!());
    let e = failed(&t, "squeeze", line);
    mentions(&e, &["axis 0", "size 4"]);
    // where with shapes that do not broadcast.
    let (w, line) = (ops::where_(a.greater(1.0), &a, iota(&[2])), line!());
    let e = failed(&w, "where", line);
    assert!(matches!(e.kind(), Some(OpErrorKind::ShapeMismatch { .. })), "{e:?}");
    // Empty axes where an element is needed.
    let empty = iota(&[0, 3]);
    let (m, line) = (empty.max(0), line!());
    mentions(&failed(&m, "max", line), &["empty", "[0, 3]"]);
    let (m, line) = (empty.argmin(0), line!());
    mentions(&failed(&m, "argmin", line), &["empty", "[0, 3]"]);
    let (m, line) = (empty.logsumexp(0), line!());
    mentions(&failed(&m, "logsumexp", line), &["empty"]);
    // Negative counts.
    let (r, line) = (a.repeat(-1, 0), line!());
    mentions(&failed(&r, "repeat", line), &["-1"]);
    let (r, line) = (a.tile(&[2, -2]), line!());
    mentions(&failed(&r, "tile", line), &["-2"]);
    let (r, line) = (a.pad(&[(1, -1)], 0.0), line!());
    mentions(&failed(&r, "pad", line), &["(1, -1)"]);
    let (r, line) = (ops::eye(-2, None, 0, DType::F32), line!());
    mentions(&failed(&r, "eye", line), &["-2"]);
    let (r, line) = (ops::linspace(0.0, 1.0, -3, DType::F32), line!());
    mentions(&failed(&r, "linspace", line), &["-3"]);
    let (r, line) = (a.flatten(1, 0), line!());
    failed(&r, "flatten", line);
    let (r, line) = (iota(&[3]).tril(0), line!());
    mentions(&failed(&r, "tril", line), &["[3]"]);
    // Host data that does not fit the shape.
    let (r, line) = (Array::from_slice(&[1.0f32; 5], [2, 3]), line!());
    let e = failed(&r, "from_slice", line);
    assert_eq!(e.kind(), Some(&OpErrorKind::SizeMismatch { expected: 6, actual: 5 }));
    let (r, line) = (Array::from_slice(&[0u8; 0], [-1, 0]), line!());
    assert_eq!(failed(&r, "from_slice", line).kind(), Some(&OpErrorKind::InvalidShape(vec![-1, 0])));
    let (r, line) = (Array::from_raw_bytes(&[0u8; 7], [2], DType::F32), line!());
    assert_eq!(failed(&r, "from_raw_bytes", line).kind(), Some(&OpErrorKind::SizeMismatch { expected: 8, actual: 7 }));
}

#[test]
fn negative_sizes() {
    // Location: see `axis_shape_and_batch_errors_point_at_the_caller`.
    let z = ops::full([-1, 2], 1.0);
    let e = failed_somewhere(&z, "full");
    assert_eq!(e.kind(), Some(&OpErrorKind::InvalidShape(vec![-1, 2])));
    mentions(&e, &["[-1, 2]"]);
    let (b, line) = (iota(&[2]).broadcast_to([-2, 2]), line!());
    assert_eq!(failed(&b, "broadcast_to", line).kind(), Some(&OpErrorKind::InvalidShape(vec![-2, 2])));
}

#[test]
fn composite_ops_name_the_called_op() {
    let a = iota(&[2, 3]);
    let z = ops::zeros([-1, 2], DType::F32);
    assert_eq!(failed_somewhere(&z, "zeros").kind(), Some(&OpErrorKind::InvalidShape(vec![-1, 2])));
    failed_somewhere(&ops::ones([2, -5], DType::I32), "ones");
    failed_somewhere(&a.std(4), "std");
    failed_somewhere(&a.clip(iota(&[4]), 1.0), "clip");
    failed_somewhere(&a.slice_update(iota(&[4]), &[0, 0], &[2, 3], &[]), "slice_update");
    failed_somewhere(&ops::full([2, 3], iota(&[4])), "full");
    failed_somewhere(&ops::identity(-1, DType::F32), "identity");
}

#[test]
fn item_and_to_vec_misuse() {
    let a = iota(&[2, 3]);
    let e = a.item::<f32>().unwrap_err();
    assert!(matches!(e, Error::Op { op: "item", .. }), "{e:?}");
    mentions(&e, &["item", "[2, 3]"]);
    let e = iota(&[0]).item::<f32>().unwrap_err();
    mentions(&e, &["item", "[0]"]);
    assert_eq!(iota(&[1, 1]).item::<f32>().unwrap(), 0.0);

    let e = a.to_vec::<i32>().unwrap_err();
    assert!(matches!(e, Error::Op { op: "to_vec", .. }), "{e:?}");
    mentions(&e, &["float32", "int32"]);
    let e = a.item::<f64>().unwrap_err();
    mentions(&e, &["float32", "float64"]);
}

#[test]
fn failures_propagate_unchanged() {
    let a = iota(&[2, 3]);
    let (bad, line) = (a.reshape([7]), line!());
    let first = failed(&bad, "reshape", line);
    // Element-wise, reductions, views, products, joins, scans, casts, softmax: same error.
    let later = [
        bad.exp(),
        &bad + 1.0,
        1.0f32 - &bad,
        a.add(&bad),
        bad.sum(..),
        bad.mean(0),
        bad.var(0),
        bad.argmax(None),
        bad.cumsum(None),
        bad.softmax(-1),
        bad.logsumexp(..),
        bad.transpose(&[]),
        bad.t(),
        bad.reshape([2, 3]),
        bad.expand_dims(0),
        bad.squeeze(..),
        bad.broadcast_to([2, 3]),
        bad.slice(&[], &[], &[]),
        bad.astype(DType::I32),
        bad.view(DType::I32),
        bad.matmul(&a),
        a.matmul(&bad),
        ops::concatenate(&[a.clone(), bad.clone()], 0),
        ops::stack(std::slice::from_ref(&bad), 0),
        ops::where_(&bad, &a, &a),
        ops::where_(a.greater(0.0), &bad, 0.0),
        bad.clip(0.0, 1.0),
        bad.pad(&[], 0.0),
        bad.tile(&[2]),
        bad.repeat(2, None),
        bad.flatten(0, -1),
        bad.isnan(),
        bad.isfinite(),
        bad.zeros_like(),
        ops::full([2, 2], &bad),
        bad.split(1, 0)[0].clone(),
        a.slice_update(&bad, &[0, 0], &[1, 1], &[]),
        bad.contiguous(),
        bad.copy(),
        bad.stop_gradient(),
        !&bad,
        -&bad,
        bad.exp().log().sum(0).reshape([1]),
    ];
    for (i, l) in later.iter().enumerate() {
        assert_eq!(l.error().as_ref(), Some(&first), "later op #{i}");
        assert_eq!(l.eval().unwrap_err(), first, "later op #{i}");
    }
}

#[test]
fn axis_ops_on_failed_arrays_keep_the_first_error() {
    let a = iota(&[2, 3]);
    let bad = a.reshape([7]);
    let first = bad.error().expect("reshape fails");
    assert_eq!(bad.swapaxes(0, 1).error(), Some(first.clone()));
    assert_eq!(bad.moveaxis(0, 1).error(), Some(first.clone()));
    assert_eq!(ops::swapaxes(&bad, 0, -1).error(), Some(first.clone()));
    assert_eq!(ops::moveaxis(&bad, 1, 0).error(), Some(first));
}
