//! Out-of-memory as a failed array, never an abort: under `ulimit -v` (the system refuses) and
//! under `memory::set_limit` (nuvec refuses). Both run in a child process of this test binary,
//! because a limit is process-wide and the other tests run in parallel threads.

use nuvec::{DType, Error, array, memory, ops};

const CHILD_ENV: &str = "NUVEC_TEST_MEMORY_CHILD";

#[test]
fn out_of_memory_fails_the_array_not_the_process() {
    let exe = std::env::current_exe().unwrap();
    // 4 GiB of address space: the test binary and its threads fit, a 6 GiB array does not.
    let out = std::process::Command::new("sh")
        .arg("-c")
        .arg(r#"ulimit -v 4194304 && exec "$0" "$@""#)
        .arg(&exe)
        .args(["--exact", "memory::child_under_limits", "--ignored", "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, "1")
        .env("NUVEC_DEVICE", "cpu")
        .output()
        .expect("run the test binary under sh");
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "child failed ({:?}):\n{text}", out.status);
    assert!(text.contains("memory child: all cases held"), "child did not run its cases:\n{text}");
}

/// The cases, run only as the child of the test above (`ulimit -v` set, CPU device).
#[test]
#[ignore = "run by out_of_memory_fails_the_array_not_the_process in a child process"]
fn child_under_limits() {
    if std::env::var_os(CHILD_ENV).is_none() {
        return;
    }
    // 4 TiB: beyond any machine. The op that needed the memory is named, with the bytes.
    let huge = ops::zeros([1 << 20, 1 << 20], DType::F32).exp() + 1.0;
    let err = huge.eval().unwrap_err();
    assert!(matches!(err, Error::OutOfMemory { op: "exp", bytes: 4398046511104, limit: None, .. }), "{err:#?}");
    assert_eq!(
        err.to_string(),
        "out of memory: exp on cpu could not allocate 4398046511104 bytes (4.0 TiB): the system refused it"
    );
    // 6 GiB: a machine has it, the 4 GiB address-space limit does not.
    let big = ops::zeros([3 << 29], DType::F32).sin();
    let err = big.eval().unwrap_err();
    assert!(matches!(err, Error::OutOfMemory { op: "sin", limit: None, .. }), "{err:#?}");
    // Nothing else is harmed.
    assert_eq!((array![1.0, 2.0] * 2.0).to_vec::<f32>().unwrap(), vec![2.0, 4.0]);

    // nuvec's own limit: 64 MiB of arrays.
    let old = memory::set_limit(64 << 20);
    let over = ops::ones([32 << 20], DType::F32).cos(); // 128 MiB
    let err = over.eval().unwrap_err();
    assert!(matches!(err, Error::OutOfMemory { op: "cos", limit: Some(l), .. } if l == 64 << 20), "{err:#?}");
    assert!(
        err.to_string().ends_with("it would pass the memory limit of 64.0 MiB (nuvec::memory::set_limit)"),
        "{err}"
    );
    let under = ops::ones([1 << 20], DType::F32).cos(); // 4 MiB
    let want = (1 << 20) as f64 * 1f64.cos();
    assert!((under.sum(..).item::<f32>().unwrap() as f64 - want).abs() < 1e-4 * want);
    // Arrays built from host data count too.
    let host: Vec<f32> = std::iter::repeat_n(0.0, 32 << 20).collect();
    let from_host = nuvec::Array::from_slice(&host, [32 << 20]);
    assert!(matches!(from_host.eval().unwrap_err(), Error::OutOfMemory { limit: Some(_), .. }));
    memory::set_limit(old);
    ops::ones([32 << 20], DType::F32).cos().eval().unwrap();
    println!("memory child: all cases held");
}
