//! What a new user meets in the first hour: the message a `main` that returns an error prints,
//! the dimensions a bad matmul names, `NUVEC_DEVICE`'s values, and why the GPU is not usable.
//!
//! Run: `cargo test -p nuvec --release --test suite -- first_hour::`.

use nuvec::{Array, Device, Error, OpErrorKind, array, parse_device_env, with_stream};

fn ones(shape: &[i32]) -> Array {
    let n: i32 = shape.iter().product();
    Array::from_slice(&vec![1.0f32; n as usize], shape.to_vec())
}

#[test]
fn debug_of_an_error_is_its_message() {
    let (c, line) = (ones(&[3, 4]).matmul(&ones(&[5, 6])), line!());
    let e = c.eval().unwrap_err();
    // `fn main() -> nuvec::Result<()>` prints `Error: {e:?}`.
    assert_eq!(format!("{e:?}"), e.to_string());
    assert_eq!(format!("{:?}", Err::<(), Error>(e.clone())), format!("Err({e})"));
    assert!(format!("{e:?}").contains(&format!("first_hour.rs:{line}")), "{e:?}");
    // The alternate form keeps the structure for debugging.
    let structured = format!("{e:#?}");
    assert!(structured.starts_with("Op {") && structured.contains("ShapeMismatch"), "{structured}");
    // Errors that are not an operation's too.
    let e = Error::InvalidArgument("x".into());
    assert_eq!(format!("{e:?}"), "invalid argument: x");
    assert!(format!("{e:#?}").starts_with("InvalidArgument("));
}

#[test]
fn matmul_names_the_shapes_and_the_inner_dimensions() {
    let (c, line) = (ones(&[3, 4]).matmul(&ones(&[5, 6])), line!());
    let e = c.eval().unwrap_err();
    assert_eq!(e.kind(), Some(&OpErrorKind::ShapeMismatch { lhs: vec![3, 4], rhs: vec![5, 6] }));
    let at = e.location().unwrap();
    assert_eq!(
        e.to_string(),
        format!("matmul at {}:{line}: [3, 4] @ [5, 6]: inner dimensions 4 and 5 differ", at.file())
    );
    // 1-d operands: a row on the left, a column on the right.
    let e = ones(&[3]).matmul(&ones(&[4, 2])).eval().unwrap_err();
    assert!(e.to_string().ends_with("[3] @ [4, 2]: inner dimensions 3 and 4 differ"), "{e}");
    let e = ones(&[2, 3]).matmul(&ones(&[4])).eval().unwrap_err();
    assert!(e.to_string().ends_with("[2, 3] @ [4]: inner dimensions 3 and 4 differ"), "{e}");
    // Batch dimensions that do not broadcast.
    let e = ones(&[2, 2, 3]).matmul(&ones(&[3, 3, 4])).eval().unwrap_err();
    assert!(e.to_string().ends_with("[2, 2, 3] @ [3, 3, 4]: batch dimensions [2] and [3] do not broadcast"), "{e}");
}

#[test]
fn nuvec_device_values() {
    assert_eq!(parse_device_env("cpu"), Ok(Some(Device::cpu())));
    assert_eq!(parse_device_env("CPU"), Ok(Some(Device::cpu())));
    assert_eq!(parse_device_env("gpu"), Ok(Some(Device::gpu(0))));
    assert_eq!(parse_device_env("GPU"), Ok(Some(Device::gpu(0))));
    assert_eq!(parse_device_env("Gpu"), Ok(Some(Device::gpu(0))));
    assert_eq!(parse_device_env(" gpu\n"), Ok(Some(Device::gpu(0))));
    assert_eq!(parse_device_env("gpu:1"), Ok(Some(Device::gpu(1))));
    assert_eq!(parse_device_env("GPU:0"), Ok(Some(Device::gpu(0))));
    // Empty is unset.
    assert_eq!(parse_device_env(""), Ok(None));
    assert_eq!(parse_device_env("  "), Ok(None));
    // Anything else is rejected with a message naming the variable, the value and the choices.
    for bad in ["bogus", "gpu0", "gpu:", "gpu:x", "gpu:-1", "cuda", "metal"] {
        let msg = parse_device_env(bad).unwrap_err();
        assert!(msg.contains("NUVEC_DEVICE") && msg.contains(&format!("{bad:?}")), "{bad}: {msg}");
        assert!(msg.contains("cpu") && msg.contains("gpu"), "{bad}: {msg}");
    }
}

#[test]
fn the_gpu_error_says_why_the_gpu_is_unusable() {
    if nuvec::cuda::is_available() {
        return; // Only meaningful on a machine without a usable GPU.
    }
    let reason = nuvec::cuda::unavailable_reason().expect("a reason when the GPU is not usable");
    let y = with_stream(Device::gpu(0), || array![1.0, 2.0] * 2.0);
    let e = y.eval().unwrap_err();
    assert!(matches!(e, Error::UnsupportedDevice(d) if d == Device::gpu(0)), "{e}");
    let msg = e.to_string();
    assert!(msg.starts_with("unsupported device gpu:0: no backend for it is available"), "{msg}");
    assert!(msg.contains(&reason), "{msg} does not say {reason:?}");
    assert_eq!(format!("{e:?}"), msg);
    assert_eq!(nuvec::graph::unavailable_reason(Device::gpu(0)), Some(format!("cuda: {reason}")));
    // The CPU is usable.
    assert_eq!(nuvec::graph::unavailable_reason(Device::cpu()), None);
}

#[test]
fn a_gpu_that_is_not_present_is_named() {
    // GPU 4096 is on no machine; the message says how many there are (or why there are none).
    let e = with_stream(Device::gpu(4096), || array![1.0] + 1.0).eval().unwrap_err();
    assert!(matches!(e, Error::UnsupportedDevice(_)), "{e}");
    let msg = e.to_string();
    if nuvec::cuda::is_available() {
        assert!(msg.contains("gpu:4096 is not present") && msg.contains("CUDA device"), "{msg}");
    } else {
        assert!(msg.contains(&nuvec::cuda::unavailable_reason().unwrap()), "{msg}");
    }
}

#[test]
fn transform_misuse_names_the_caller() {
    // A loss that is not a single value: the error points at the line that made the transform.
    let (vg, line) = (nuvec::value_and_grad(|w: &Array| w * 2.0), line!());
    let e = vg(&array![1.0, 2.0]).unwrap_err();
    assert_eq!(e.location().map(|l| l.line()), Some(line), "{e}");
    assert!(
        e.to_string().starts_with("value_and_grad at ")
            && e.to_string().ends_with("the function must return a single value, it returned shape [2]"),
        "{e}"
    );
    let (g, line) = (nuvec::transforms::grad_flat(|x| Ok(x[0].sum(..)), &[3]), line!());
    let e = g(&[array![1.0]]).unwrap_err();
    assert_eq!(e.location().map(|l| l.line()), Some(line), "{e}");
    assert!(e.to_string().ends_with("argnum 3 but only 1 arguments"), "{e}");
}

/// `grad_args`: the first argument is differentiated, the data is passed, not captured, and
/// gets no gradient; checked against central differences in float64.
#[test]
fn grad_args_differentiates_the_first_argument() {
    use nuvec::DType;
    let loss = |(w, b): &(Array, Array), (x, y): &(Array, Array)| (x.matmul(w) + b - y).square().mean(..);
    let x = array![[0.5, -1.0], [2.0, 0.25], [-0.5, 1.5]].astype(DType::F64);
    let y = array![[1.0], [-2.0], [0.5]].astype(DType::F64);
    // f64 from the start: an f32 literal cast up is not 0.3.
    let w = Array::from_slice(&[0.3f64, -0.7], [2, 1]);
    let b = Array::from_slice(&[0.1f64], [1]);
    let data = (x.clone(), y.clone());
    let (value, (dw, db)) = nuvec::value_and_grad_args(loss)(&(w.clone(), b.clone()), &data).unwrap();
    let (dw2, db2) = nuvec::grad_args(loss)(&(w.clone(), b.clone()), &data).unwrap();
    let f = |w: &[f64], b: f64| -> f64 {
        let w = Array::from_slice(w, [2, 1]);
        loss(&(w, Array::from_slice(&[b], [1])), &data).item::<f64>().unwrap()
    };
    assert!((value.item::<f64>().unwrap() - f(&[0.3, -0.7], 0.1)).abs() < 1e-12);
    let h = 1e-6;
    let num_dw = [
        (f(&[0.3 + h, -0.7], 0.1) - f(&[0.3 - h, -0.7], 0.1)) / (2.0 * h),
        (f(&[0.3, -0.7 + h], 0.1) - f(&[0.3, -0.7 - h], 0.1)) / (2.0 * h),
    ];
    let num_db = (f(&[0.3, -0.7], 0.1 + h) - f(&[0.3, -0.7], 0.1 - h)) / (2.0 * h);
    for (got, want) in dw.to_vec::<f64>().unwrap().iter().zip(num_dw) {
        assert!((got - want).abs() < 1e-6, "dw {got} vs {want}");
    }
    assert!((db.item::<f64>().unwrap() - num_db).abs() < 1e-6);
    assert_eq!(dw2.to_vec::<f64>().unwrap(), dw.to_vec::<f64>().unwrap());
    assert_eq!(db2.to_vec::<f64>().unwrap(), db.to_vec::<f64>().unwrap());
}

#[test]
fn tree_map_walks_trees_together() {
    let params = vec![array![1.0, 2.0], array![3.0]];
    let grads = vec![array![0.5, 0.5], array![1.0]];
    let next = nuvec::tree_map_with(&params, &[&grads], |p, g| p - &g[0] * 0.1);
    assert_eq!(next[1].to_vec::<f32>().unwrap(), vec![2.9]);
    let doubled = nuvec::tree_map(&params, |p| p * 2.0);
    assert_eq!(doubled[0].to_vec::<f32>().unwrap(), vec![2.0, 4.0]);
    // Trees of different leaf counts: every leaf says so.
    let short = vec![array![0.5, 0.5]];
    let bad = nuvec::tree_map_with(&params, &[&short], |p, g| p - &g[0]);
    let e = bad[0].eval().unwrap_err();
    assert_eq!(e.to_string(), "invalid argument: tree_map: the trees differ: 2 leaves and 1 leaves");
}

#[test]
fn reading_as_another_dtype_names_astype_and_the_line() {
    let x = array![1.0, 2.0];
    let (e, line) = (x.to_vec::<f64>().unwrap_err(), line!());
    assert_eq!(e.location().map(|l| l.line()), Some(line), "{e}");
    assert!(
        e.to_string().starts_with("to_vec at ")
            && e.to_string().ends_with("cannot read an array of float32 as float64: call astype(DType::F64) first"),
        "{e}"
    );
    let (e, line) = (x.item::<f32>().unwrap_err(), line!());
    assert_eq!(e.location().map(|l| l.line()), Some(line), "{e}");
    assert!(e.to_string().ends_with("it needs an array of one element, this one has shape [2]"), "{e}");
    assert_eq!(x.astype(nuvec::DType::F64).to_vec::<f64>().unwrap(), vec![1.0, 2.0]);
}
