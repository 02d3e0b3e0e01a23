//! The speed of loading a sharded safetensors checkpoint onto the default device:
//! `load_safetensors_index` (the shards memory-mapped, each tensor read into host memory),
//! then a copy of every tensor on the device, evaluated. `bench/load_checkpoint.py` writes the
//! checkpoint (Llama-3-8B-shaped, random bfloat16), drops it from the page cache and measures
//! the disk's read speed in the same run.
//!
//! Prints `load_GBps<TAB>x` (the whole load, GB of tensors per second) and `read_GBps<TAB>x`
//! (to host memory only).
//!
//! ```text
//! python3 bench/load_checkpoint.py write /tmp/ckpt && python3 bench/load_checkpoint.py drop /tmp/ckpt
//! cargo run --release -p nuvec --example bench_load -- /tmp/ckpt/model.safetensors.index.json
//! ```

use std::time::Instant;

use nuvec::Array;

fn main() -> nuvec::Result<()> {
    let index = std::env::args().nth(1).expect("usage: bench_load INDEX_JSON");
    let device = nuvec::default_device();
    let start = Instant::now();
    let tensors = nuvec::io::load_safetensors_index(&index)?;
    let read = start.elapsed().as_secs_f64();
    let bytes: usize = tensors.values().map(Array::nbytes).sum();
    let on_device: Vec<Array> = nuvec::with_stream(device, || tensors.values().map(|a| a.copy()).collect());
    nuvec::eval(&on_device)?;
    // Reading one element back waits for every copy queued before it.
    if let Some(last) = on_device.last() {
        last.flatten(0, -1).slice(&[0], &[1], &[1]).sum(..).astype(nuvec::DType::F32).item::<f32>()?;
    }
    let total = start.elapsed().as_secs_f64();
    let gb = bytes as f64 / 1e9;
    eprintln!("{} tensors, {gb:.2} GB onto {device}: read {read:.2} s, total {total:.2} s", tensors.len());
    println!("read_GBps\t{:.2}", gb / read);
    println!("load_GBps\t{:.2}", gb / total);
    Ok(())
}
