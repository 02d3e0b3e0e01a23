//! CUDA graphs for compiled functions (`CompileOptions::cuda_graph`): a signature's device work
//! is recorded once and then launched whole, so a replay costs a few launches of host time
//! instead of one per kernel.
//!
//! A recorded graph reads and writes fixed memory: its inputs are copies of the arguments it
//! was recorded with, refilled on every call (`Backend::copy_into`), and its results are
//! copied out into fresh arrays, so nothing a caller holds is ever overwritten.

use std::sync::Arc;

use crate::array::Array;
use crate::backend::{Backend, GraphExec, backend_for};
use crate::device::{Device, Stream, default_stream};
use crate::error::{Error, Result};
use crate::eval::eval_arrays;
use crate::primitive::Primitive;
use crate::storage::{Operand, Output, Storage};

use super::graph::{Graph, Ref};

/// Where a signature's recording stands.
pub(crate) enum Capture {
    /// Traced; the next call records (the tracing call's evaluation compiled the kernels).
    Warm { attempts: u8 },
    /// Recorded: launched on every call.
    Ready(Captured),
    /// Recording failed twice: calls replay the graph op by op.
    Off,
}

/// A recorded graph with the arrays whose memory it reads and writes.
pub(crate) struct Captured {
    exec: Arc<dyn GraphExec>,
    inputs: Vec<Array>,
    outputs: Vec<Array>,
    _reads: Vec<Arc<Storage>>,
}

static RECORDED: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// How many CUDA graphs compiled functions have recorded in this process (for tests and
/// benchmarks that must know a graph, not op-by-op replay, ran).
pub fn cuda_graphs_recorded() -> usize {
    RECORDED.load(std::sync::atomic::Ordering::Relaxed)
}

/// Writes `message` to stderr when `NUVEC_COMPILE_LOG` is set (not `0`).
pub(crate) fn log(message: impl FnOnce() -> String) {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    if *ON.get_or_init(|| std::env::var("NUVEC_COMPILE_LOG").is_ok_and(|v| v != "0")) {
        eprintln!("nuvec compile: {}", message());
    }
}

/// The device a call on `args` can record on: all of them on one GPU, which is the thread's
/// default device, and no transform tracing (its arrays must stay a graph).
pub(crate) fn device_of(args: &[Array]) -> Option<Device> {
    let device = default_stream().device;
    let ok = !device.is_cpu() && args.iter().all(|a| a.device() == device) && !crate::transforms::tracing();
    ok.then_some(device)
}

/// A copy of `a` (evaluated) in a fresh row-major buffer of the backend's.
fn fresh(backend: &dyn Backend, stream: Stream, a: &Array) -> Result<Array> {
    let data = a.data()?;
    let input = Operand { shape: a.spec().shape, dtype: a.dtype(), data, donated: false };
    let mut out = [Output { shape: input.shape.clone(), dtype: a.dtype(), data: None }];
    backend.eval(stream, &Primitive::Copy, vec![input], &mut out)?;
    let data = out[0].data.take().ok_or_else(|| Error::Backend("compile: a copy produced no output".into()))?;
    Ok(Array::from_data(a.spec().shape, a.dtype(), data))
}

/// Records `graph` on copies of `args` and launches it once: the record and this call's
/// results.
pub(crate) fn record(graph: &Graph, args: &[Array], shapeless: bool, device: Device) -> Result<(Captured, Vec<Array>)> {
    let backend = backend_for(device)?;
    let stream = default_stream();
    eval_arrays(args)?;
    // Constants are computed once, outside the graph, and read in place by it.
    let consts: Vec<Array> = graph
        .nodes
        .iter()
        .flat_map(|n| &n.inputs)
        .chain(&graph.outputs)
        .filter_map(|r| if let Ref::Const(a) = r { Some(a.clone()) } else { None })
        .collect();
    eval_arrays(&consts)?;
    let inputs = args.iter().map(|a| fresh(backend, stream, a)).collect::<Result<Vec<_>>>()?;
    let recorded = DeviceGraph::record_on(device, graph.replay(&inputs, shapeless))?;
    log(|| format!("recorded a graph of {} operations for {} nodes", recorded.len(), graph.nodes.len()));
    let captured = Captured { exec: recorded.exec, inputs, outputs: recorded.outputs, _reads: recorded.reads };
    let results = results(&captured, graph, args, backend, stream)?;
    Ok((captured, results))
}

/// Device work recorded once and launched whole (a CUDA graph): the evaluation of some lazy
/// arrays, replayed on every [`DeviceGraph::launch`] over the same memory. A launch costs a
/// few microseconds of host time however many kernels it runs.
///
/// Every array the recorded work reads that was evaluated before recording is read where it
/// lies on every launch, so new inputs are written into those arrays in place
/// ([`write_into`]); the outputs are rewritten by every launch (list among them what the work
/// updates in place, so that host copies of it are dropped too). An update whose input was
/// handed over (the only reference dropped before recording) writes into that input's
/// memory, so a buffer such as a key-value cache is updated in place on every launch.
/// Host data must be on the device before recording (evaluate what reads it once first),
/// and the work must not wait for the device.
///
/// ```no_run
/// use nuvec::transforms::{DeviceGraph, write_into};
/// use nuvec::{Array, DType, ops};
/// let x = ops::zeros([4], DType::F32);
/// nuvec::eval(&[x.clone()]).unwrap();
/// // Records `2x + 1` over x's memory (on a GPU; the CPU records nothing and says so).
/// let g = DeviceGraph::record(vec![&(&x * 2.0) + 1.0]).unwrap();
/// write_into(&x, &ops::ones([4], DType::F32)).unwrap();
/// g.launch().unwrap();
/// assert_eq!(g.outputs()[0].to_vec::<f32>().unwrap(), vec![3.0; 4]);
/// ```
pub struct DeviceGraph {
    exec: Arc<dyn GraphExec>,
    device: Device,
    outputs: Vec<Array>,
    /// The memory the work reads that was there before recording (see [`Reads`]).
    reads: Vec<Arc<Storage>>,
}

/// What a recording on this thread reads that it did not write: the graph holds it for its
/// life, since every launch reads it where it lay. Otherwise an array evaluated before
/// recording and dropped during it (a key-value cache's old buffer, when the update could not
/// be done in place) goes back to the allocator, and another thread's work may reuse its
/// memory before a launch reads it.
struct Reads {
    /// Storages the recording's operations wrote (or read), by address; held weakly, so that
    /// no storage the recording did not write takes a freed one's address meanwhile.
    made: std::collections::HashMap<usize, std::sync::Weak<Storage>>,
    /// Storages read before this recording wrote them, by address.
    kept: std::collections::HashMap<usize, Arc<Storage>>,
}

thread_local! {
    static READS: std::cell::RefCell<Option<Reads>> = const { std::cell::RefCell::new(None) };
}

/// Before an operation runs on a device: keeps the storages of `inputs` that this thread's
/// recording (if any) did not write.
pub(crate) fn note_reads(inputs: &[Operand]) {
    READS.with(|r| {
        if let Some(r) = r.borrow_mut().as_mut() {
            for o in inputs {
                let storage = &o.data.storage;
                let id = Arc::as_ptr(storage) as usize;
                if let std::collections::hash_map::Entry::Vacant(e) = r.made.entry(id) {
                    e.insert(Arc::downgrade(storage));
                    r.kept.insert(id, storage.clone());
                }
            }
        }
    })
}

/// Whether this thread's recording holds `storage` (see [`note_reads`]): a donated operand
/// it holds may still be written in place.
pub(crate) fn recording_holds(storage: &Arc<Storage>) -> bool {
    READS.with(|r| r.borrow().as_ref().is_some_and(|r| r.kept.contains_key(&(Arc::as_ptr(storage) as usize))))
}

/// After an operation ran on a device: the storages it wrote belong to this thread's recording.
pub(crate) fn note_writes(outputs: &[Output]) {
    READS.with(|r| {
        if let Some(r) = r.borrow_mut().as_mut() {
            r.made.extend(
                outputs
                    .iter()
                    .filter_map(|o| o.data.as_ref())
                    .map(|d| (Arc::as_ptr(&d.storage) as usize, Arc::downgrade(&d.storage))),
            );
        }
    })
}

impl DeviceGraph {
    /// Records the evaluation of `outputs` on the default stream's device and launches it
    /// once, so the outputs hold this first launch's values. An error says why the work could
    /// not be recorded (the CPU, a wait for the device inside); nothing is left recording.
    pub fn record(outputs: Vec<Array>) -> Result<DeviceGraph> {
        let device = default_stream().device;
        if device.is_cpu() {
            return Err(Error::Backend("DeviceGraph: the CPU records no graphs".into()));
        }
        DeviceGraph::record_on(device, outputs)
    }

    fn record_on(device: Device, outputs: Vec<Array>) -> Result<DeviceGraph> {
        let backend = backend_for(device)?;
        let stream = default_stream();
        backend.begin_capture(stream)?;
        READS.with(|r| *r.borrow_mut() = Some(Reads { made: Default::default(), kept: Default::default() }));
        let ran = eval_arrays(&outputs);
        let reads = READS.with(|r| r.borrow_mut().take()).map_or_else(Vec::new, |r| r.kept.into_values().collect());
        // The recording always ends, also when evaluation failed inside it.
        let exec = backend.end_capture(stream);
        let exec = match (ran, exec) {
            (Ok(()), Ok(exec)) => exec,
            (Err(e), _) | (Ok(()), Err(e)) => return Err(e),
        };
        exec.launch(stream)?;
        RECORDED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Ok(DeviceGraph { exec, device, outputs, reads })
    }

    /// Queues the recorded work on the device's stream, after everything queued before.
    pub fn launch(&self) -> Result<()> {
        // Host copies read from the outputs before are stale once the launch rewrites them.
        for o in &self.outputs {
            if let crate::array::State::Ready(d) = &*o.inner.lock() {
                d.storage.forget_mirrors();
            }
        }
        self.exec.launch(Stream { device: self.device, ..default_stream() })
    }

    /// The recorded arrays, holding the latest launch's values (until the next launch).
    pub fn outputs(&self) -> &[Array] {
        &self.outputs
    }

    /// The number of device operations recorded.
    pub fn len(&self) -> usize {
        self.exec.len()
    }

    /// Whether nothing was recorded.
    pub fn is_empty(&self) -> bool {
        self.exec.is_empty()
    }
}

/// Writes the elements of `src` into the memory of `dst` (evaluated, row-major, on the same
/// device, of the same dtype and size), queued after the work before: how a
/// [`DeviceGraph`]'s inputs take new values. Views and other devices' arrays are refused.
pub fn write_into(dst: &Array, src: &Array) -> Result<()> {
    let device = dst.device();
    let bad = |why: String| Err(Error::Backend(format!("write_into: {why}")));
    if dst.dtype() != src.dtype() || dst.size() != src.size() {
        return bad(format!(
            "src ({} of {:?}) must match dst ({} of {:?}) in dtype and size",
            src.dtype(),
            src.shape(),
            dst.dtype(),
            dst.shape()
        ));
    }
    if device.is_cpu() {
        return bad("dst must be on a device with graphs".into());
    }
    eval_arrays(&[dst.clone(), src.clone()])?;
    let dst_data = dst.data()?;
    if !dst_data.layout.flags.row_contiguous || dst_data.storage.location() != device {
        return bad("dst must be row-major in a device's memory (evaluated there)".into());
    }
    let backend = backend_for(device)?;
    let stream = Stream { device, ..default_stream() };
    let src = if src.data()?.layout.flags.row_contiguous { src.clone() } else { fresh(backend, stream, src)? };
    let mut data = src.data()?;
    // Host values (a new position, say) go to the device first.
    if data.storage.location() != device {
        data = crate::storage::Data { storage: data.storage.on_device(device)?, layout: data.layout };
    }
    let operand = Operand { shape: src.spec().shape, dtype: src.dtype(), data, donated: false };
    dst_data.storage.forget_mirrors();
    backend.copy_into(stream, &operand, &dst_data)
}

/// Launches a recorded graph on `args`: refills its inputs, launches it, copies out.
pub(crate) fn run(captured: &Captured, graph: &Graph, args: &[Array], device: Device) -> Result<Vec<Array>> {
    let backend = backend_for(device)?;
    let stream = default_stream();
    eval_arrays(args)?;
    for (a, fixed) in args.iter().zip(&captured.inputs) {
        write_into(fixed, a)?;
    }
    captured.exec.launch(stream)?;
    results(captured, graph, args, backend, stream)
}

/// The call's results: arguments and constants as they are, the graph's own outputs copied out
/// of its memory (the next launch overwrites it).
fn results(c: &Captured, graph: &Graph, args: &[Array], backend: &dyn Backend, stream: Stream) -> Result<Vec<Array>> {
    graph
        .outputs
        .iter()
        .zip(&c.outputs)
        .map(|(r, out)| match r {
            Ref::Input(i) => Ok(args[*i].clone()),
            Ref::Const(a) => Ok(a.clone()),
            Ref::Node(..) => fresh(backend, stream, out),
        })
        .collect()
}
