//! The collectives against their definitions on groups of threads (1 to 4 ranks, float32,
//! float64, bfloat16 and int32) and of processes over loopback TCP; sends and receives around a
//! ring; mismatched arrays failing on every rank; a rank that leaves, exits or stalls ending
//! the group with an error on every other rank, not a hang.

use std::time::{Duration, Instant};

use nuvec::distributed::{Group, init, launch};
use nuvec::{Array, DType};

/// `f` on every rank of a group of `n` threads, each owning its rank (dropped when `f` returns).
fn on_threads<T: Send>(n: usize, timeout: Duration, f: impl Fn(Group) -> T + Sync) -> Vec<T> {
    let groups = Group::local_with_timeout(n, timeout);
    std::thread::scope(|s| {
        let f = &f;
        let hs: Vec<_> = groups.into_iter().map(|g| s.spawn(move || f(g))).collect();
        hs.into_iter().map(|h| h.join().expect("a rank panicked")).collect()
    })
}

/// Rank `r`'s values: small integers, exact in every dtype tested and in their sums.
fn values(r: usize, len: usize) -> Vec<f64> {
    (0..len).map(|i| ((r * 7 + i * 3) % 11) as f64 - 5.0).collect()
}

fn f64s(a: &Array) -> Vec<f64> {
    a.astype(DType::F64).to_vec::<f64>().unwrap()
}

#[test]
fn collectives_match_their_definitions() {
    for n in 1..=4usize {
        for dtype in [DType::F32, DType::F64, DType::BF16, DType::I32] {
            let rows = 2 * n;
            let len = rows * 3;
            let outs = on_threads(n, Duration::from_secs(60), |g| {
                let x = Array::from_slice(&values(g.rank(), len), [rows as i32, 3]).astype(dtype);
                let sum = g.all_sum(&x).unwrap();
                let max = g.all_max(&x).unwrap();
                let min = g.all_min(&x).unwrap();
                let all = g.all_gather(&x).unwrap();
                let part = g.sum_scatter(&x).unwrap();
                let scalar =
                    g.all_gather(&Array::from_slice(&[g.rank() as f64], [] as [i32; 0]).astype(dtype)).unwrap();
                [sum, max, min, all, part, scalar]
            });
            let ranks: Vec<Vec<f64>> = (0..n).map(|r| values(r, len)).collect();
            let fold = |f: fn(f64, f64) -> f64| {
                (0..len).map(|i| ranks.iter().map(|v| v[i]).reduce(f).unwrap()).collect::<Vec<_>>()
            };
            let (sum, max, min) = (fold(|a, b| a + b), fold(f64::max), fold(f64::min));
            let gathered: Vec<f64> = ranks.concat();
            for (r, [s, mx, mn, all, part, scalar]) in outs.iter().enumerate() {
                let what = format!("{n} ranks, {dtype}, rank {r}");
                assert_eq!(s.dtype(), dtype, "{what}");
                assert_eq!(s.shape(), &[rows as i32, 3], "{what}");
                assert_eq!(f64s(s), sum, "all_sum {what}");
                assert_eq!(f64s(mx), max, "all_max {what}");
                assert_eq!(f64s(mn), min, "all_min {what}");
                assert_eq!(all.shape(), &[(n * rows) as i32, 3], "all_gather {what}");
                assert_eq!(f64s(all), gathered, "all_gather {what}");
                assert_eq!(part.shape(), &[2, 3], "sum_scatter {what}");
                assert_eq!(f64s(part), sum[r * 6..(r + 1) * 6].to_vec(), "sum_scatter {what}");
                assert_eq!(f64s(scalar), (0..n).map(|r| r as f64).collect::<Vec<_>>(), "all_gather of a scalar {what}");
                // Every rank reduced the same values in the same order.
                assert_eq!(s.to_bytes().unwrap(), outs[0][0].to_bytes().unwrap(), "{what}: bits of all_sum");
            }
        }
    }
}

#[test]
fn sends_and_receives_go_around_a_ring() {
    let n = 4;
    let got = on_threads(n, Duration::from_secs(60), |g| {
        let (next, prev) = ((g.rank() + 1) % n, (g.rank() + n - 1) % n);
        let x = Array::from_slice(&values(g.rank(), 6), [2, 3]).astype(DType::BF16);
        g.send(&x, next).unwrap();
        let y = g.recv_like(&x, prev).unwrap();
        (prev, f64s(&y))
    });
    for (prev, y) in got {
        assert_eq!(y, values(prev, 6));
    }
    let errs = on_threads(2, Duration::from_secs(5), |g| {
        let x = Array::from_slice(&[1.0f32, 2.0], [2]);
        let own = g.send(&x, g.rank()).unwrap_err().to_string();
        let out = g.send(&x, 7).unwrap_err().to_string();
        if g.rank() == 0 {
            g.send(&x, 1).unwrap();
        } else {
            let wrong = g.recv(&[3], DType::F32, 0).unwrap_err().to_string();
            assert!(wrong.contains("recv") && wrong.contains("[2]"), "{wrong}");
        }
        (own, out)
    });
    for (own, out) in errs {
        assert!(own.contains("send") && own.contains("not another rank"), "{own}");
        assert!(out.contains("rank 7"), "{out}");
    }
}

#[test]
fn mismatched_arrays_fail_on_every_rank() {
    let errs = on_threads(3, Duration::from_secs(30), |g| {
        let len = if g.rank() == 1 { 3 } else { 4 };
        let x = Array::from_slice(&values(g.rank(), len), [len as i32]).astype(DType::F32);
        g.all_sum(&x).unwrap_err().to_string()
    });
    for e in errs {
        assert!(e.contains("all_sum") && e.contains("rank 1") && e.contains("[3]"), "{e}");
    }
    let errs = on_threads(2, Duration::from_secs(30), |g| {
        let x = Array::from_slice(&[1.0f32, 2.0, 3.0], [3]);
        g.sum_scatter(&x).unwrap_err().to_string()
    });
    for e in errs {
        assert!(e.contains("sum_scatter") && e.contains("divide"), "{e}");
    }
}

#[test]
fn a_rank_that_leaves_or_stalls_fails_the_others_in_time() {
    for stall in [false, true] {
        let start = Instant::now();
        let outs = on_threads(3, Duration::from_secs(2), |g| {
            if g.rank() == 2 {
                if stall {
                    std::thread::sleep(Duration::from_secs(4));
                }
                return None;
            }
            let x = Array::from_slice(&[1.0f32; 8], [8]);
            Some(g.all_sum(&x).map(|_| ()).unwrap_err().to_string())
        });
        for e in outs.into_iter().flatten() {
            assert!(e.contains("rank"), "{e}");
            if stall {
                assert!(e.contains("nothing came") || e.contains("left"), "{e}");
            }
        }
        assert!(start.elapsed() < Duration::from_secs(20), "stall {stall}: {:?}", start.elapsed());
    }
}

#[test]
fn a_group_of_one_returns_its_input() {
    let g = init(false).unwrap();
    if std::env::var(nuvec::distributed::RANK_VAR).is_err() {
        assert_eq!((g.rank(), g.size()), (0, 1));
        assert!(init(true).unwrap_err().to_string().contains("launch"));
    }
    let x = Array::from_slice(&[1.5f32, -2.0], [2]);
    assert_eq!(f64s(&Group::singleton().all_sum(&x).unwrap()), vec![1.5, -2.0]);
    assert_eq!(Group::singleton().all_gather(&x).unwrap().shape(), &[2]);
}

/// A rank of [`ranks_as_processes_over_tcp`] (run by it with `--ignored`): collectives over
/// the group [`init`] builds; the rank named by `NUVEC_DIST_TEST_EXIT` exits at once, and the
/// others then check that their collective fails.
#[test]
#[ignore = "a rank of ranks_as_processes_over_tcp, which runs it"]
fn tcp_rank() {
    let g = init(true).unwrap();
    let (r, n) = (g.rank(), g.size());
    if std::env::var("NUVEC_DIST_TEST_EXIT").ok().and_then(|v| v.parse::<usize>().ok()) == Some(r) {
        std::process::exit(3);
    }
    let x = Array::from_slice(&values(r, 12), [4, 3]).astype(DType::F32);
    if std::env::var("NUVEC_DIST_TEST_EXIT").is_ok() {
        let e = g.all_sum(&x).unwrap_err().to_string();
        assert!(e.contains("rank"), "{e}");
        return;
    }
    let sum: Vec<f64> = (0..12).map(|i| (0..n).map(|q| values(q, 12)[i]).sum()).collect();
    assert_eq!(f64s(&g.all_sum(&x).unwrap()), sum);
    assert_eq!(f64s(&g.all_gather(&x).unwrap()), (0..n).flat_map(|q| values(q, 12)).collect::<Vec<_>>());
    let big = Array::from_slice(&vec![r as f32; 1 << 20], [1 << 20]);
    assert_eq!(f64s(&g.all_sum(&big).unwrap())[12345], (0..n).sum::<usize>() as f64);
    g.send(&x, (r + 1) % n).unwrap();
    assert_eq!(f64s(&g.recv_like(&x, (r + n - 1) % n).unwrap()), values((r + n - 1) % n, 12));
}

#[test]
fn ranks_as_processes_over_tcp() {
    let exe = std::env::current_exe().unwrap();
    let args: Vec<String> =
        ["--ignored", "--exact", "tcp_rank", "--test-threads=1", "--quiet"].map(String::from).to_vec();
    launch(3, &exe, &args, &[("NUVEC_DIST_TIMEOUT", "60")], Duration::from_secs(30)).unwrap();
    // Rank 2 exits after joining: the launcher names it, and the others end on their own.
    let start = Instant::now();
    let e =
        launch(3, &exe, &args, &[("NUVEC_DIST_TEST_EXIT", "2"), ("NUVEC_DIST_TIMEOUT", "60")], Duration::from_secs(60))
            .unwrap_err()
            .to_string();
    assert!(e.contains("rank 2 of 3"), "{e}");
    assert!(start.elapsed() < Duration::from_secs(30), "{:?}", start.elapsed());
}
