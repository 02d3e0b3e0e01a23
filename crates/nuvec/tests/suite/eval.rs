//! Evaluation: laziness, devices, donation, freeing intermediates, threads, deep graphs.

use std::sync::{Mutex, MutexGuard};

use nuvec::{Array, DType, Device, Error, array, ops, with_stream};

/// Memory-accounting tests read process-wide counters: run them one at a time.
fn serial() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

#[test]
fn operations_are_lazy_until_read() {
    let a = array![1.0, 2.0, 3.0];
    let b = a.exp() + 1.0;
    assert!(a.is_evaluated());
    assert!(!b.is_evaluated());
    b.eval().unwrap();
    assert!(b.is_evaluated());
    let want: Vec<f32> = [1.0f32, 2.0, 3.0].iter().map(|v| v.exp() + 1.0).collect();
    assert_eq!(b.to_vec::<f32>().unwrap(), want);
}

#[test]
fn gpu_stream_without_a_gpu_backend_is_a_clear_error() {
    if nuvec::graph::is_available(Device::gpu(0)) {
        return; // Only meaningful on a machine without a usable GPU.
    }
    let y = with_stream(Device::gpu(0), || array![1.0, 2.0] * 2.0);
    assert_eq!(y.device(), Device::gpu(0));
    match y.eval() {
        Err(Error::UnsupportedDevice(d)) => assert_eq!(d, Device::gpu(0)),
        other => panic!("expected UnsupportedDevice, got {other:?}"),
    }
    // Constants made on the GPU stream still read back: they live on the host until used.
    let c = with_stream(Device::gpu(0), || Array::from(3i32));
    assert_eq!(c.item::<i32>().unwrap(), 3);
}

#[test]
fn async_eval_then_read() {
    let x = ops::arange(0, 1000, 1).astype(DType::F32);
    let y = (&x * &x).sum(..);
    nuvec::async_eval(&y).unwrap();
    let want: f32 = (0..1000).map(|i| (i * i) as f32).sum();
    assert!((y.item::<f32>().unwrap() - want).abs() / want < 1e-5);
}

/// Evaluations started one after another, each needing the one before (as decode steps
/// are), give what one evaluation of the whole chain gives; a failure in one is reported by
/// those that wait for it, which do not hang.
#[test]
fn chained_async_evaluations_wait_for_each_other() {
    let chain = |x: &Array, background: bool| {
        let mut steps = Vec::new();
        let mut x = x.clone();
        for _ in 0..40 {
            for _ in 0..20 {
                x = (&x * 0.999).sin() + 0.001;
            }
            if background {
                nuvec::async_eval(&x).unwrap();
            }
            steps.push(x.clone());
        }
        steps
    };
    let x = ops::arange(0, 4096, 1).astype(DType::F32) * 1e-3;
    let background = chain(&x, true);
    let here = chain(&x, false);
    nuvec::eval(&here).unwrap();
    for (i, (b, h)) in background.iter().zip(&here).enumerate() {
        assert_eq!(b.to_vec::<f32>().unwrap(), h.to_vec::<f32>().unwrap(), "step {i}");
    }
    if !nuvec::graph::is_available(Device::gpu(0)) {
        // Nodes on a device without a backend fail when they run.
        let failing = with_stream(Device::gpu(0), || chain(&(array![1.0f32, 2.0] * 2.0), true));
        for s in &failing {
            assert!(matches!(s.eval(), Err(Error::UnsupportedDevice(_))), "{:?}", s.eval());
        }
    }
}

/// Decode attention (bf16, head size 128: the tensor-map kernel on Hopper) evaluated by
/// `async_eval`'s thread equals the same graph evaluated here: every driver call finds the
/// GPU's context on whichever thread evaluates.
#[test]
fn async_eval_of_decode_attention() {
    use nuvec::fast::{AttentionOptions, scaled_dot_product_attention as sdpa};
    let draw = |shape: [i32; 4], seed: u64| {
        nuvec::random::normal(shape, DType::BF16, 0.0, 1.0, Some(&nuvec::random::key(seed)))
    };
    let (q, k, v) = (draw([1, 32, 1, 128], 0), draw([1, 8, 300, 128], 1), draw([1, 8, 300, 128], 2));
    let run = || sdpa(&q, &k, &v, 0.088, &AttentionOptions::default()).astype(DType::F32);
    let background = run();
    nuvec::async_eval(&background).unwrap();
    let here: Vec<f32> = run().to_vec().unwrap();
    assert_eq!(background.to_vec::<f32>().unwrap(), here);
}

#[test]
fn shared_graph_evaluated_from_many_threads() {
    let x = ops::arange(0, 1 << 16, 1).astype(DType::F32);
    let shared = (&x * 0.5).sin().sum(..);
    let outs: Vec<Array> = (0..8).map(|i| &shared + i as f32).collect();
    std::thread::scope(|s| {
        for o in &outs {
            s.spawn(move || o.eval().unwrap());
        }
    });
    let base = shared.item::<f32>().unwrap();
    for (i, o) in outs.iter().enumerate() {
        assert_eq!(o.item::<f32>().unwrap(), base + i as f32);
    }
}

#[test]
fn deep_graphs_do_not_overflow_the_stack() {
    let mut y = Array::from(0.0f32);
    for _ in 0..100_000 {
        y = y + 1.0;
    }
    assert_eq!(y.item::<f32>().unwrap(), 100_000.0);
}

#[test]
fn intermediates_are_freed_and_buffers_donated() {
    let _g = serial();
    let n = 1 << 22; // 16 MiB of f32
    let bytes = n * 4;
    // arange (int32) -> astype (f32) -> five element-wise steps. Each step may write into its
    // input's buffer (no one else holds it), and each input is freed after its consumer, so the
    // peak stays near two buffers however long the chain. Without donation and freeing, the
    // chain would hold three or more buffers at once. Other tests of this binary allocate on the
    // same device alongside, which can only raise the peak: the least of three runs counts.
    let chain = || {
        let mut y = ops::arange(0, n as i32, 1).astype(DType::F32);
        for i in 0..5 {
            y = (y + i as f32) * 0.5;
        }
        y
    };
    let bound = 2 * bytes + bytes / 4;
    // One run: the peak above the memory held before, the value at index 7, and what is still
    // held once the result is dropped. A leak or a missed donation shows in every run; other
    // tests' buffers only add to some, so the least of up to three runs counts.
    let run = || {
        crate::reset_device_peak();
        let before = crate::device_memory().active;
        let y = chain();
        y.eval().unwrap();
        let peak = crate::device_memory().peak - before;
        let v7 = y.to_vec::<f32>().unwrap()[7];
        drop(y);
        (peak, v7, crate::device_memory().active.saturating_sub(before))
    };
    let mut want = 7.0f32;
    for i in 0..5 {
        want = (want + i as f32) * 0.5;
    }
    let (mut peak, mut held) = (usize::MAX, usize::MAX);
    for _ in 0..3 {
        let (p, v7, h) = run();
        assert_eq!(v7, want);
        (peak, held) = (peak.min(p), held.min(h));
        if peak < bound && held < bytes / 4 {
            break;
        }
    }
    assert!(peak < bound, "peak {peak} bytes for {bytes}-byte buffers");
    assert!(held < bytes / 4, "{held} bytes still held");
}

#[test]
fn a_user_held_input_is_never_overwritten() {
    let x = ops::arange(0, 1 << 16, 1).astype(DType::F32);
    x.eval().unwrap();
    let y = &x + 1.0;
    y.eval().unwrap();
    assert_eq!(x.to_vec::<f32>().unwrap()[5], 5.0);
    assert_eq!(y.to_vec::<f32>().unwrap()[5], 6.0);
    assert_ne!(x.buffer_id(), y.buffer_id());
}

#[test]
fn a_donated_scatter_writes_in_place_and_a_held_one_copies() {
    // A cache updated every step (a paged KV pool) keeps its buffer; a user's array is kept.
    let pool = ops::zeros([64, 2, 4, 8], DType::F32).contiguous();
    pool.eval().unwrap();
    let id = pool.buffer_id();
    let new = ops::ones([1, 2, 8], DType::F32);
    let written = nuvec::fast::paged_write(&pool, &new, &Array::from_slice(&[5i32], [1]));
    drop(pool);
    written.eval().unwrap();
    assert_eq!(written.buffer_id(), id);
    assert_eq!(written.sum(..).item::<f32>().unwrap(), 16.0);
    let again = written.put_along_axis(
        &Array::from_slice(&[0i32], [1, 1, 1, 1]),
        ops::full_dtype([1, 1, 1, 1], 3.0, DType::F32),
        0,
    );
    again.eval().unwrap();
    assert_ne!(again.buffer_id(), written.buffer_id());
    assert_eq!(written.sum(..).item::<f32>().unwrap(), 16.0);
}

#[test]
fn views_share_storage() {
    let x = ops::arange(0, 24, 1).reshape([2, 3, 4]);
    x.eval().unwrap();
    let views =
        [x.transpose(&[2, 0, 1]), x.slice(&[0, 1, 0], &[2, 3, 4], &[1, 1, 2]), x.reshape([6, 4]), x.expand_dims(0)];
    for v in &views {
        v.eval().unwrap();
        assert_eq!(v.buffer_id(), x.buffer_id());
    }
    assert_eq!(views[1].to_vec::<i32>().unwrap(), vec![4, 6, 8, 10, 16, 18, 20, 22]);
}
