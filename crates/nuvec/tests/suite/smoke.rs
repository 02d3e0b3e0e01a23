//! Smoke test of the public API.
use nuvec::{DType, array, ops};

#[test]
fn basics() {
    let a = array![[1.0, 2.0], [3.0, 4.0]];
    assert_eq!(a.dtype(), DType::F32);
    let b = (&a + 1.0) * &a;
    assert_eq!(b.to_vec::<f32>().unwrap(), vec![2.0, 6.0, 12.0, 20.0]);
    assert_eq!(a.t().to_vec::<f32>().unwrap(), vec![1.0, 3.0, 2.0, 4.0]);
    assert_eq!(a.sum(..).item::<f32>().unwrap(), 10.0);
    assert_eq!(a.sum(0).to_vec::<f32>().unwrap(), vec![4.0, 6.0]);
    assert_eq!(a.sum(1).to_vec::<f32>().unwrap(), vec![3.0, 7.0]);
    assert_eq!(a.matmul(&a).to_vec::<f32>().unwrap(), vec![7.0, 10.0, 15.0, 22.0]);
    let s = a.softmax(-1).to_vec::<f32>().unwrap();
    assert!((s[0] + s[1] - 1.0).abs() < 1e-6);
    assert_eq!(ops::arange(0, 5, 1).cumsum(None).to_vec::<i32>().unwrap(), vec![0, 1, 3, 6, 10]);
    assert_eq!(a.argmax(None).item::<u32>().unwrap(), 3);
    let bad = a.reshape([3]);
    let e = bad.eval().unwrap_err();
    assert_eq!(e.op_name(), Some("reshape"));
    println!("{e}");
    println!("{}", a.exp());
}
