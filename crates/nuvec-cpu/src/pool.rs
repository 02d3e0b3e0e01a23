//! Threads for short parallel loops. A decode step runs a few hundred products of well under
//! a millisecond each; a rayon worker that went to sleep between two of them has to be woken,
//! and on a virtual machine a wake-up costs as much as a small product. These helpers spin for
//! a while after each loop before they sleep, so consecutive loops start at once, and the
//! thread that submits a loop takes a share of it.
//!
//! One loop runs at a time: a caller that finds the helpers busy (another evaluation's loop,
//! or a loop nested in one) runs its loop on rayon instead.

use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicUsize, Ordering::SeqCst};
use std::sync::{Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// How long an idle helper spins before it sleeps.
const SPIN: Duration = Duration::from_millis(2);

/// Calls `f(i)` for every `i` in `0..n`, in parallel on the calling thread and the helpers.
pub fn for_each(n: usize, f: &(dyn Fn(usize) + Sync)) {
    let pool = pool();
    if n <= 1 || pool.helpers == 0 {
        // Nothing to share: rayon would hand even this to its pool and back.
        return (0..n).for_each(f);
    }
    let Ok(owner) = pool.owner.try_lock() else {
        use rayon::prelude::*;
        return (0..n).into_par_iter().for_each(f);
    };
    let parts = pool.helpers + 1;
    let next = (0..parts).map(|p| Padded(AtomicUsize::new(n * p / parts))).collect();
    let job = Job { f, n, next, done: AtomicUsize::new(0), panicked: AtomicBool::new(false) };
    pool.job.store(&job as *const Job as *mut Job<'static>, SeqCst);
    pool.epoch.fetch_add(1, SeqCst);
    if *pool.sleepers.lock().unwrap_or_else(|e| e.into_inner()) > 0 {
        pool.wake.notify_all();
    }
    job.work(0);
    wait_until(|| job.done.load(SeqCst) >= n);
    // Helpers that took the job's address have finished with it once none is active.
    pool.job.store(std::ptr::null_mut(), SeqCst);
    wait_until(|| pool.active.load(SeqCst) == 0);
    drop(owner);
    if job.panicked.load(SeqCst) {
        panic!("a parallel loop's body panicked");
    }
}

/// Spins until `done()`, giving the core away now and then: a helper that was preempted
/// mid-loop may need it.
fn wait_until(done: impl Fn() -> bool) {
    let mut spins = 0u32;
    while !done() {
        spins = spins.wrapping_add(1);
        if spins.is_multiple_of(4096) {
            std::thread::yield_now();
        } else {
            std::hint::spin_loop();
        }
    }
}

/// Calls `f(i, chunk)` for chunk `i` of `chunk` elements of `out`, as [`for_each`].
pub fn for_each_chunk<T: Send>(out: &mut [T], chunk: usize, f: &(dyn Fn(usize, &mut [T]) + Sync)) {
    let (len, chunk) = (out.len(), chunk.max(1));
    let base = SendPtr(out.as_mut_ptr());
    for_each(len.div_ceil(chunk), &|i| {
        let start = i * chunk;
        // SAFETY: each index is called once, and the chunks of distinct indices are disjoint
        // ranges of `out`, which the caller lends mutably for the whole loop.
        let part = unsafe { std::slice::from_raw_parts_mut(base.get().add(start), chunk.min(len - start)) };
        f(i, part);
    });
}

/// A pointer the loop's threads share (each touches a range of its own).
struct SendPtr<T>(*mut T);

// SAFETY: the pointer is only used for the disjoint ranges of `for_each_chunk`.
unsafe impl<T: Send> Sync for SendPtr<T> {}

impl<T> SendPtr<T> {
    fn get(&self) -> *mut T {
        self.0
    }
}

/// One loop. Its indices are cut into one contiguous part per thread, taken in order, so
/// that each thread streams through memory of its own; a thread done with its part takes
/// indices from the others'.
struct Job<'a> {
    f: &'a (dyn Fn(usize) + Sync),
    n: usize,
    /// The next index of each part, each on a cache line of its own: threads taking indices
    /// from their own parts do not contend for one line.
    next: Vec<Padded>,
    /// Indices done, added once per thread and part.
    done: AtomicUsize,
    panicked: AtomicBool,
}

/// An atomic counter alone on its cache line (two lines: adjacent-line prefetch pairs them).
#[repr(align(128))]
struct Padded(AtomicUsize);

impl Job<'_> {
    /// Takes indices from part `home`, then from the others.
    fn work(&self, home: usize) {
        let parts = self.next.len();
        for p in (0..parts).map(|j| (home + j) % parts) {
            let end = self.n * (p + 1) / parts;
            let mut done = 0;
            loop {
                let i = self.next[p].0.fetch_add(1, SeqCst);
                if i >= end {
                    break;
                }
                if std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| (self.f)(i))).is_err() {
                    self.panicked.store(true, SeqCst);
                }
                done += 1;
            }
            if done > 0 {
                self.done.fetch_add(done, SeqCst);
            }
        }
    }
}

struct Pool {
    helpers: usize,
    /// Held by the thread whose loop is running.
    owner: Mutex<()>,
    /// The running loop, or null; valid while `active` counts a helper that read it.
    job: AtomicPtr<Job<'static>>,
    /// Bumped for every loop.
    epoch: AtomicUsize,
    /// Helpers between reading `job` and finishing with it.
    active: AtomicUsize,
    /// Helpers asleep, and their wake-up.
    sleepers: Mutex<usize>,
    wake: Condvar,
}

fn pool() -> &'static Pool {
    static POOL: OnceLock<&'static Pool> = OnceLock::new();
    POOL.get_or_init(|| {
        let pool: &'static Pool = Box::leak(Box::new(Pool {
            helpers: rayon::current_num_threads().saturating_sub(1),
            owner: Mutex::new(()),
            job: AtomicPtr::new(std::ptr::null_mut()),
            epoch: AtomicUsize::new(0),
            active: AtomicUsize::new(0),
            sleepers: Mutex::new(0),
            wake: Condvar::new(),
        }));
        for i in 0..pool.helpers {
            // A helper that cannot start is one fewer: a loop never waits for helpers, only for
            // its indices, which the caller takes too.
            let _ = std::thread::Builder::new().name(format!("nuvec-cpu-{i}")).spawn(move || pool.help(i + 1));
        }
        pool
    })
}

impl Pool {
    /// A helper's life: wait for a new loop, take indices from it, repeat.
    fn help(&self, home: usize) {
        let mut seen = self.epoch.load(SeqCst);
        loop {
            seen = self.next_epoch(seen);
            self.active.fetch_add(1, SeqCst);
            let job = self.job.load(SeqCst);
            if !job.is_null() {
                // SAFETY: the submitter keeps the job alive until `active` drops to zero after
                // it cleared `job`; this helper counted itself active before reading it.
                unsafe { &*job }.work(home);
            }
            self.active.fetch_sub(1, SeqCst);
        }
    }

    /// Spins until the epoch moves past `seen`, then sleeps until it does.
    fn next_epoch(&self, seen: usize) -> usize {
        let start = Instant::now();
        let mut spins = 0u32;
        loop {
            let epoch = self.epoch.load(SeqCst);
            if epoch != seen {
                return epoch;
            }
            spins = spins.wrapping_add(1);
            if spins.is_multiple_of(1024) && start.elapsed() > SPIN {
                break;
            }
            std::hint::spin_loop();
        }
        let mut sleepers = self.sleepers.lock().unwrap_or_else(|e| e.into_inner());
        *sleepers += 1;
        while self.epoch.load(SeqCst) == seen {
            sleepers = self.wake.wait(sleepers).unwrap_or_else(|e| e.into_inner());
        }
        *sleepers -= 1;
        self.epoch.load(SeqCst)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_index_runs_once_across_loops_and_callers() {
        let threads: Vec<_> = (0..4)
            .map(|t| {
                std::thread::spawn(move || {
                    for n in [0, 1, 2, 7, 100] {
                        let hits: Vec<AtomicUsize> = (0..n).map(|_| AtomicUsize::new(0)).collect();
                        for_each(n, &|i| {
                            hits[i].fetch_add(t + 1, SeqCst);
                        });
                        assert!(hits.iter().all(|h| h.load(SeqCst) == t + 1), "loop of {n} on caller {t}");
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().expect("no caller panics");
        }
    }

    #[test]
    fn nested_loops_complete() {
        let sum = AtomicUsize::new(0);
        for_each(8, &|i| for_each(8, &|j| _ = sum.fetch_add(i * 8 + j, SeqCst)));
        assert_eq!(sum.load(SeqCst), (0..64).sum::<usize>());
    }
}
