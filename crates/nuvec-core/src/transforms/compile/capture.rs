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
use crate::storage::{Operand, Output};

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
    let outputs = graph.replay(&inputs, shapeless);
    backend.begin_capture(stream)?;
    let ran = eval_arrays(&outputs);
    // The recording always ends, also when evaluation failed inside it.
    let exec = backend.end_capture(stream);
    let exec = match (ran, exec) {
        (Ok(()), Ok(exec)) => exec,
        (Err(e), _) | (Ok(()), Err(e)) => return Err(e),
    };
    exec.launch(stream)?;
    RECORDED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    log(|| format!("recorded a graph of {} operations for {} nodes", exec.len(), graph.nodes.len()));
    let captured = Captured { exec, inputs, outputs };
    let results = results(&captured, graph, args, backend, stream)?;
    Ok((captured, results))
}

/// Launches a recorded graph on `args`: refills its inputs, launches it, copies out.
pub(crate) fn run(captured: &Captured, graph: &Graph, args: &[Array], device: Device) -> Result<Vec<Array>> {
    let backend = backend_for(device)?;
    let stream = default_stream();
    eval_arrays(args)?;
    for (a, fixed) in args.iter().zip(&captured.inputs) {
        let dense = a.data()?.layout.flags.row_contiguous;
        let src = if dense { a.clone() } else { fresh(backend, stream, a)? };
        let operand = Operand { shape: src.spec().shape, dtype: src.dtype(), data: src.data()?, donated: false };
        backend.copy_into(stream, &operand, &fixed.data()?)?;
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
