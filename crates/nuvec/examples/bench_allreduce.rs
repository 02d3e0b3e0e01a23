//! All-reduce bus bandwidth over the GPUs of this machine: one rank per GPU, threads of one
//! process (`Group::local`, each rank on its GPU through `with_stream`), sums through NCCL.
//! `bench/allreduce_peers.py` measures PyTorch's `all_reduce` (NCCL) on the same GPUs.
//!
//! Prints `allreduce_<bytes><TAB>busbw GB/s` per size, 1 MiB to 1 GiB of bfloat16: bus
//! bandwidth as nccl-tests defines it, `2 (n − 1) / n · bytes / seconds`, the best of 5 timed
//! runs after 2 warm-up runs. Needs two GPUs or more and NCCL (it says so and exits otherwise).
//!
//! ```text
//! cargo run --release -p nuvec --example bench_allreduce -- [RANKS]
//! ```

use std::time::Instant;

use nuvec::distributed::Group;
use nuvec::{DType, Device, ops};

fn main() -> nuvec::Result<()> {
    let gpus = nuvec::cuda::device_count();
    let n: usize = std::env::args().nth(1).and_then(|a| a.parse().ok()).unwrap_or(gpus);
    if n < 2 || n > gpus {
        eprintln!("bench_allreduce: needs 2 or more GPUs ({gpus} here, {n} asked)");
        return Ok(());
    }
    if let Some(why) = nuvec::cuda::nccl::nccl_unavailable_reason() {
        eprintln!("bench_allreduce: {why}");
        return Ok(());
    }
    let sizes: Vec<usize> = (20..=30).step_by(2).map(|p| 1usize << p).collect();
    let results: Vec<Vec<f64>> = std::thread::scope(|s| {
        let jobs: Vec<_> = Group::local(n)
            .into_iter()
            .map(|g| {
                let sizes = &sizes;
                s.spawn(move || {
                    nuvec::with_stream(Device::gpu(g.rank() as u32), || -> nuvec::Result<Vec<f64>> {
                        let mut best = Vec::new();
                        for &bytes in sizes {
                            let x = ops::ones([(bytes / 2) as i32], DType::BF16).contiguous();
                            x.eval()?;
                            let mut times = Vec::new();
                            for run in 0..7 {
                                let t = Instant::now();
                                // Each sum waits for its completion (the group's time-out bound).
                                g.all_sum(&x)?;
                                if run >= 2 {
                                    times.push(t.elapsed().as_secs_f64());
                                }
                            }
                            best.push(times.iter().cloned().fold(f64::INFINITY, f64::min));
                        }
                        Ok(best)
                    })
                })
            })
            .collect();
        jobs.into_iter().map(|j| j.join().expect("a rank panicked")).collect::<nuvec::Result<Vec<_>>>()
    })?;
    eprintln!("{n} ranks over NCCL, bfloat16, best of 5");
    for (i, &bytes) in sizes.iter().enumerate() {
        // The slowest rank's time is the collective's.
        let t = results.iter().map(|r| r[i]).fold(0.0, f64::max);
        let bus = 2.0 * (n - 1) as f64 / n as f64 * bytes as f64 / t / 1e9;
        println!("allreduce_{bytes}\t{bus:.1}");
    }
    Ok(())
}
