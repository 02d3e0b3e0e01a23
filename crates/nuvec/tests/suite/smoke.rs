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

/// Binary maps and `where` over rows long enough for the CPU's contiguous-row kernels (operands
/// contiguous or broadcast along each row: `[R, 1]`, `[1, C]`, sliced rows) and over a
/// transposed operand (the strided walk) equal a host loop; integer-valued data keeps them exact.
#[test]
fn broadcast_and_sliced_rows_match_a_host_loop() {
    let (r, c) = (5usize, 37usize);
    let a_host: Vec<f32> = (0..r * c).map(|i| ((i * 7) % 23) as f32 - 11.0).collect();
    let wide: Vec<f32> = (0..r * (c + 3)).map(|i| ((i * 5) % 17) as f32 - 8.0).collect();
    let col: Vec<f32> = (0..r).map(|i| i as f32 * 3.0 - 4.0).collect();
    let row: Vec<f32> = (0..c).map(|j| (j % 9) as f32 - 4.0).collect();
    let a = nuvec::Array::from_slice(&a_host, [r as i32, c as i32]);
    let sliced =
        nuvec::Array::from_slice(&wide, [r as i32, c as i32 + 3]).slice(&[0, 2], &[r as i32, c as i32 + 2], &[1, 1]);
    let col_a = nuvec::Array::from_slice(&col, [r as i32, 1]);
    let row_a = nuvec::Array::from_slice(&row, [1, c as i32]);
    let at = nuvec::Array::from_slice(&a_host, [c as i32, r as i32]).t();
    let sliced_at = |i: usize, j: usize| wide[i * (c + 3) + j + 2];
    let at_at = |i: usize, j: usize| a_host[j * r + i];
    let check = |what: &str, got: &nuvec::Array, want: &dyn Fn(usize, usize) -> f32| {
        let got = got.to_vec::<f32>().unwrap();
        for i in 0..r {
            for j in 0..c {
                assert_eq!(got[i * c + j], want(i, j), "{what} at ({i}, {j})");
            }
        }
    };
    check("a + [R, 1]", &(&a + &col_a), &|i, j| a_host[i * c + j] + col[i]);
    check("[1, C] * a", &(&row_a * &a), &|i, j| row[j] * a_host[i * c + j]);
    check("sliced - [1, C]", &(&sliced - &row_a), &|i, j| sliced_at(i, j) - row[j]);
    check("a^T + sliced", &(&at + &sliced), &|i, j| at_at(i, j) + sliced_at(i, j));
    let cond_col = col_a.greater(0.0);
    let cond_row = row_a.less(0.0);
    check("where([R, 1], a, -1)", &ops::where_(&cond_col, &a, -1.0), &|i, j| {
        if col[i] > 0.0 { a_host[i * c + j] } else { -1.0 }
    });
    check("where([1, C], sliced, [R, 1])", &ops::where_(&cond_row, &sliced, &col_a), &|i, j| {
        if row[j] < 0.0 { sliced_at(i, j) } else { col[i] }
    });
    check("where(a > sliced, a^T, [1, C])", &ops::where_(a.greater(&sliced), &at, &row_a), &|i, j| {
        if a_host[i * c + j] > sliced_at(i, j) { at_at(i, j) } else { row[j] }
    });
}
