//! NCCL collectives on GPUs against their definitions. They skip without a GPU or NCCL, and
//! fail instead under `NUVEC_REQUIRE_GPU=1` (a GPU) and `NUVEC_REQUIRE_NCCL=1` (NCCL). The
//! tests of two GPUs skip on a machine with one.

use std::time::Duration;

use nuvec::cuda::nccl::{Nccl, ReduceOp, nccl_unavailable_reason, nccl_unique_id};
use nuvec::distributed::Group;
use nuvec::{Array, DType, Device};

/// Whether this machine has `gpus` GPUs and NCCL; `false` (skip) unless required.
fn have(gpus: usize) -> bool {
    let require = |v: &str| std::env::var(v).as_deref() == Ok("1");
    if !nuvec::cuda::is_available() {
        assert!(!require("NUVEC_REQUIRE_GPU"), "NUVEC_REQUIRE_GPU=1: {:?}", nuvec::cuda::unavailable_reason());
        eprintln!("SKIPPED: no GPU");
        return false;
    }
    if let Some(why) = nccl_unavailable_reason() {
        assert!(!require("NUVEC_REQUIRE_NCCL"), "NUVEC_REQUIRE_NCCL=1: {why}");
        eprintln!("SKIPPED: {why}");
        return false;
    }
    if nuvec::cuda::device_count() < gpus {
        eprintln!("SKIPPED: needs {gpus} GPUs");
        return false;
    }
    true
}

fn values(n: usize, seed: f32) -> Vec<f32> {
    (0..n).map(|i| ((i as f32 * 0.37 + seed).sin() * 8.0).round()).collect()
}

/// One rank's communicator: every collective gives its definition for one rank, in every
/// dtype NCCL has; bad arguments are errors naming the reason.
#[test]
fn one_rank_collectives_are_their_definitions() {
    if !have(1) {
        return;
    }
    let gpu = Device::gpu(0);
    let c = Nccl::new(gpu, 0, 1, &nccl_unique_id().unwrap(), Duration::from_secs(60)).unwrap();
    assert_eq!((c.rank(), c.size(), c.device()), (0, 1, gpu));
    let x = Array::from_slice(&values(24, 0.5), [4, 6]);
    for dtype in [DType::F32, DType::BF16, DType::F16, DType::I32, DType::F64, DType::U8] {
        let x = x.abs().astype(dtype);
        let want = x.to_bytes().unwrap();
        for op in [ReduceOp::Sum, ReduceOp::Max, ReduceOp::Min] {
            let y = c.all_reduce(&x, op).unwrap();
            assert_eq!((y.shape(), y.dtype()), (x.shape(), dtype));
            assert_eq!(y.to_bytes().unwrap(), want, "{op:?} of {dtype:?}");
            assert_eq!(y.device(), gpu);
        }
        let g = c.all_gather(&x).unwrap();
        assert_eq!(g.shape(), &[1, 4, 6]);
        assert_eq!(g.to_bytes().unwrap(), want);
        assert_eq!(c.reduce_scatter(&x).unwrap().to_bytes().unwrap(), want);
    }
    // A strided view goes as its elements.
    let t = x.transpose(&[1, 0]);
    assert_eq!(c.all_reduce(&t, ReduceOp::Sum).unwrap().to_vec::<f32>().unwrap(), t.to_vec::<f32>().unwrap());
    let complex = Array::from_slice(&[1.0f32, 2.0], [2]).astype(DType::Complex64);
    assert!(c.all_reduce(&complex, ReduceOp::Sum).unwrap_err().to_string().contains("no NCCL type"));
    assert!(c.send(&x, 0).unwrap_err().to_string().contains("cannot exchange with rank 0"));
    let scalar = Array::from_slice(&[1.0f32], [0i32; 0]);
    assert!(c.reduce_scatter(&scalar).unwrap_err().to_string().contains("must divide"));
}

/// Ranks as threads of one process, each driving a GPU of its own through NCCL: the
/// collectives against their definitions, and point-to-point transfers.
#[test]
fn two_gpus_of_one_process_through_nccl() {
    if !have(2) {
        return;
    }
    let groups = Group::local(2);
    let results: Vec<Vec<Vec<f32>>> = std::thread::scope(|s| {
        let jobs: Vec<_> = groups
            .into_iter()
            .map(|g| {
                s.spawn(move || {
                    nuvec::with_stream(Device::gpu(g.rank() as u32), || {
                        let r = g.rank() as f32;
                        let x = Array::from_slice(&values(8, r), [2, 4]).astype(DType::BF16);
                        let sum = g.all_sum(&x).unwrap();
                        assert!(g.uses_nccl(), "rank {}: two GPUs of their own go through NCCL", g.rank());
                        let max = g.all_max(&x).unwrap();
                        let gathered = g.all_gather(&x).unwrap();
                        assert_eq!(gathered.shape(), &[4, 4]);
                        let scattered = g.sum_scatter(&x).unwrap();
                        assert_eq!(scattered.shape(), &[1, 4]);
                        let passed = if g.rank() == 0 {
                            g.send(&x, 1).unwrap();
                            x.clone()
                        } else {
                            g.recv_like(&x, 0).unwrap()
                        };
                        [sum, max, gathered, scattered, passed]
                            .iter()
                            .map(|a| a.astype(DType::F32).to_vec::<f32>().unwrap())
                            .collect()
                    })
                })
            })
            .collect();
        jobs.into_iter().map(|j| j.join().unwrap()).collect()
    });
    let x: Vec<Vec<f32>> = (0..2).map(|r| values(8, r as f32)).collect();
    let sum: Vec<f32> = x[0].iter().zip(&x[1]).map(|(a, b)| a + b).collect();
    let max: Vec<f32> = x[0].iter().zip(&x[1]).map(|(a, b)| a.max(*b)).collect();
    for (r, got) in results.iter().enumerate() {
        assert_eq!(got[0], sum, "rank {r}: all_sum");
        assert_eq!(got[1], max, "rank {r}: all_max");
        assert_eq!(got[2], x.concat(), "rank {r}: all_gather");
        assert_eq!(got[3], sum[r * 4..(r + 1) * 4], "rank {r}: sum_scatter");
        assert_eq!(got[4], x[0], "rank {r}: send and recv");
    }
}

/// Two ranks on one GPU cannot use NCCL: they agree on the host path and still sum.
#[test]
fn ranks_sharing_a_gpu_sum_through_the_host() {
    if !have(1) {
        return;
    }
    let groups = Group::local(2);
    let sums: Vec<(bool, Vec<f32>)> = std::thread::scope(|s| {
        let jobs: Vec<_> = groups
            .into_iter()
            .map(|g| {
                s.spawn(move || {
                    nuvec::with_stream(Device::gpu(0), || {
                        let x = Array::from_slice(&values(5, g.rank() as f32), [5]);
                        let y = g.all_sum(&x).unwrap().to_vec::<f32>().unwrap();
                        (g.uses_nccl(), y)
                    })
                })
            })
            .collect();
        jobs.into_iter().map(|j| j.join().unwrap()).collect()
    });
    let want: Vec<f32> = values(5, 0.0).iter().zip(values(5, 1.0)).map(|(a, b)| a + b).collect();
    for (nccl, y) in sums {
        assert!(!nccl);
        assert_eq!(y, want);
    }
}
