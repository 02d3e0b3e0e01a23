//! Evaluation: run the pending nodes behind some arrays, each once, in dependency order,
//! freeing intermediates after their last consumer and donating buffers no one else holds.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering::SeqCst;
use std::sync::{Arc, Condvar, Mutex};

use crate::array::{Array, Node, State};
use crate::backend::backend_for;
use crate::device::{Device, Stream, with_stream};
use crate::error::{Error, Result};
use crate::fast::Joint;
use crate::primitive::Primitive;
use crate::primitive::view::view_layout;
use crate::storage::{Data, Operand, Output, Spec, internal};
use crate::tree::Leaves;

/// Evaluates every array in `tree` (an `Array`, a tuple, `Vec`, map, ... of arrays).
///
/// ```
/// use nuvec::{array, eval};
/// let a = array![1.0, 2.0];
/// let (b, c) = (a.exp(), &a * 2.0);
/// eval(&(&b, &c)).unwrap();
/// assert!(b.is_evaluated() && c.is_evaluated());
/// ```
pub fn eval<T: Leaves + ?Sized>(tree: &T) -> Result<()> {
    let mut leaves = Vec::new();
    tree.collect_leaves(&mut leaves);
    eval_arrays(&leaves)
}

/// Starts evaluating `tree` on a background thread and returns at once. A later `eval`,
/// `item` or `to_vec` waits for the work in flight and reports its errors.
pub fn async_eval<T: Leaves + ?Sized>(tree: &T) -> Result<()> {
    let mut leaves = Vec::new();
    tree.collect_leaves(&mut leaves);
    if let Some(e) = leaves.iter().find_map(|a| a.error()) {
        return Err(e);
    }
    let idle = IDLE.lock().unwrap_or_else(|e| e.into_inner()).pop();
    let leader = match idle {
        Some(l) => l,
        None => new_leader()?,
    };
    leader.send(leaves).map_err(|_| Error::Backend("an evaluation thread has stopped".into()))
}

/// Evaluation threads waiting for work, each the first worker of a rayon pool of its own.
/// `async_eval` hands its work to an idle one (or starts one), so evaluations start at once,
/// as on threads of their own, and never queue behind another caller's. The parallel loops
/// of the operations a leader runs start on it and share out from there: from a thread
/// outside a pool, each loop is handed to rayon's global pool and back, two thread switches
/// per operation, which dominated small operations (decoding a small model on the CPU). A
/// pool runs nothing but its leader's loop chunks, so a worker waiting in a loop never picks
/// up a whole evaluation (which could block on a node another evaluation holds).
static IDLE: std::sync::Mutex<Vec<std::sync::mpsc::Sender<Vec<Array>>>> = std::sync::Mutex::new(Vec::new());

fn new_leader() -> Result<std::sync::mpsc::Sender<Vec<Array>>> {
    let (tx, rx) = std::sync::mpsc::channel::<Vec<Array>>();
    let me = tx.clone();
    std::thread::Builder::new()
        .name("nuvec-async-eval".into())
        .spawn(move || {
            // Without a pool of its own (it could not be built) loops go to the global pool.
            let pool = rayon::ThreadPoolBuilder::new().use_current_thread().build().ok();
            for leaves in rx {
                // Errors stay in the arrays, for the caller's next read to report.
                match &pool {
                    Some(p) => p.install(|| evaluate(leaves)).ok(),
                    None => evaluate(leaves).ok(),
                };
                IDLE.lock().unwrap_or_else(|e| e.into_inner()).push(me.clone());
            }
        })
        .map_err(|e| Error::Backend(format!("cannot start an evaluation thread: {e}")))?;
    Ok(tx)
}

/// Evaluates `outputs` and everything they depend on.
///
/// The nodes it will run are claimed for this thread first; a node another thread's
/// evaluation claimed is waited for, not walked into. Without claims, an evaluation that
/// needs the result of one in flight (the next decode step, reading the previous token)
/// walked the same nodes in the same order and contended for every one of them.
pub(crate) fn eval_arrays(outputs: &[Array]) -> Result<()> {
    run_order(plan(outputs))?;
    match outputs.iter().find_map(|a| a.error()) {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// [`eval_arrays`] of arrays no one else needs held: each is let go once its node has run
/// (the order holds it until then). A caller that replaces an array with an update of it (a
/// key-value cache) then holds the only reference, so the update can write in place.
fn evaluate(outputs: Vec<Array>) -> Result<()> {
    let order = plan(&outputs);
    drop(outputs);
    run_order(order)
}

/// The steps of evaluating `outputs`, with the nodes to run claimed for this thread.
fn plan(outputs: &[Array]) -> Vec<Step> {
    let me = thread_tag();
    let mut order = schedule(outputs, me);
    for step in order.iter_mut() {
        if let Step::Run(a) = step
            && let Some(n) = pending_node(a)
        {
            // Claimed by another since the walk: both run it, under its lock.
            let _ = n.claim.fetch_update(SeqCst, SeqCst, |c| (c & !WAITED == 0).then_some(c | me));
        }
    }
    order
}

/// Runs the steps of [`plan`], letting each array go once its node has run.
fn run_order(order: Vec<Step>) -> Result<()> {
    let me = thread_tag();
    let mut joint = joint_runs(order.iter().filter_map(|s| match s {
        Step::Run(a) => Some(a),
        Step::Wait(_) => None,
    }));
    // Consume the order as we go: once a node has run, only its consumers hold its outputs,
    // so an intermediate is freed right after its last consumer.
    let mut steps = order.into_iter();
    while let Some(step) = steps.next() {
        let done = match step {
            Step::Wait(array) => wait_for(&array, me),
            Step::Run(array) => {
                if !joint.is_empty()
                    && let Some((grad, rule)) = pending_node(&array).and_then(|n| joint.remove(&Arc::as_ptr(&n)))
                {
                    run_joint(&array, &grad, &rule);
                }
                run(&array)
            }
        };
        if let Err(e) = done {
            // What this evaluation will not run, others may.
            for step in steps {
                if let Step::Run(a) = step
                    && let Some(n) = pending_node(&a)
                {
                    let _ = n.claim.fetch_update(SeqCst, SeqCst, |c| (c & !WAITED == me).then_some(0));
                }
            }
            notify_settled();
            return Err(e);
        }
    }
    Ok(())
}

/// A step of an evaluation: a node to run, or one another evaluation runs.
enum Step {
    Run(Array),
    Wait(Array),
}

/// This thread's tag in claims (never 0).
fn thread_tag() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    thread_local! { static TAG: u64 = NEXT.fetch_add(1, SeqCst); }
    TAG.with(|t| *t)
}

/// The bit of a claim that says another thread waits for the node.
const WAITED: u64 = 1 << 63;

/// Where threads wait for another evaluation's nodes.
static SETTLED: (Mutex<()>, Condvar) = (Mutex::new(()), Condvar::new());

/// Wakes the threads waiting for nodes, after one they wait for settled (or was given up).
fn notify_settled() {
    let _g = SETTLED.0.lock().unwrap_or_else(|e| e.into_inner());
    SETTLED.1.notify_all();
}

/// Waits until another thread's evaluation has run `array`'s node; evaluates it here when
/// that evaluation gave it up.
fn wait_for(array: &Array, me: u64) -> Result<()> {
    loop {
        let Some(node) = pending_node(array) else {
            return array.error().map_or(Ok(()), Err);
        };
        let owner = node.claim.fetch_or(WAITED, SeqCst) & !WAITED;
        if owner == 0 || owner == me {
            return eval_arrays(std::slice::from_ref(array));
        }
        let guard = SETTLED.0.lock().unwrap_or_else(|e| e.into_inner());
        if pending_node(array).is_some() && node.claim.load(SeqCst) & !WAITED == owner {
            // The timeout only guards against a missed wake-up.
            let _ = SETTLED.1.wait_timeout(guard, std::time::Duration::from_millis(5));
        }
    }
}

/// Pending arrays in dependency order (inputs first), one per node: those whose node another
/// thread's evaluation claimed as waits, their inputs not walked.
fn schedule(outputs: &[Array], me: u64) -> Vec<Step> {
    let mut order = Vec::new();
    let mut seen: HashSet<*const Node> = HashSet::new();
    let others = |n: &Node| ![0, me].contains(&(n.claim.load(SeqCst) & !WAITED));
    // Iterative post-order walk: graphs can be deeper than the thread's stack.
    let mut stack: Vec<(Array, Option<Arc<Node>>, usize)> = Vec::new();
    for out in outputs {
        let node = pending_node(out);
        if let Some(n) = &node {
            if !seen.insert(Arc::as_ptr(n)) {
                continue;
            }
            if others(n) {
                order.push(Step::Wait(out.clone()));
                continue;
            }
        } else {
            continue;
        }
        stack.push((out.clone(), node, 0));
        while let Some((array, node, next)) = stack.last_mut() {
            let node_ref = node.as_ref().expect("only pending arrays are stacked");
            if *next < node_ref.inputs.len() {
                let input = node_ref.inputs[*next].clone();
                *next += 1;
                if let Some(n) = pending_node(&input)
                    && seen.insert(Arc::as_ptr(&n))
                {
                    if others(&n) {
                        order.push(Step::Wait(input));
                    } else {
                        stack.push((input, Some(n), 0));
                    }
                }
            } else {
                order.push(Step::Run(array.clone()));
                stack.pop();
            }
        }
    }
    order
}

fn pending_node(a: &Array) -> Option<Arc<Node>> {
    match &*a.inner.lock() {
        State::Pending { node, .. } => Some(node.clone()),
        _ => None,
    }
}

/// Runs the node behind `array` unless it already ran.
fn run(array: &Array) -> Result<()> {
    let node = match &*array.inner.lock() {
        State::Pending { node, .. } => node.clone(),
        State::Failed(e) => return Err(e.clone()),
        _ => return Ok(()),
    };
    let _running = node.run.lock().unwrap_or_else(|e| e.into_inner());
    // Another thread may have run it while we waited.
    match &*array.inner.lock() {
        State::Pending { .. } => {}
        State::Failed(e) => return Err(e.clone()),
        _ => return Ok(()),
    }
    let stream = array.stream();
    let result = gather(&node.inputs, &node.primitive, stream)
        .and_then(|inputs| dispatch_collect(stream, &node.primitive, inputs, &node.outputs));
    settle(&node, array, result)
}

/// Runs `primitive` on `inputs` and returns its outputs' data.
fn dispatch_collect(stream: Stream, primitive: &Primitive, inputs: Vec<Operand>, specs: &[Spec]) -> Result<Vec<Data>> {
    let mut outputs: Vec<Output> =
        specs.iter().map(|s| Output { shape: s.shape.clone(), dtype: s.dtype, data: None }).collect();
    dispatch(stream, primitive, inputs, &mut outputs)?;
    outputs
        .into_iter()
        .map(|o| o.data.ok_or_else(|| internal(format!("{} produced no output", primitive.name()))))
        .collect()
}

/// Stores `node`'s results (or its error) in every live array of its outputs; `array` is one.
fn settle(node: &Arc<Node>, array: &Array, result: Result<Vec<Data>>) -> Result<()> {
    let siblings: Vec<Array> = match node.siblings.get() {
        Some(weak) => weak.iter().filter_map(|w| w.upgrade()).map(|inner| Array { inner }).collect(),
        None => vec![array.clone()],
    };
    match result {
        Ok(datas) => {
            let mut datas: Vec<Option<Data>> = datas.into_iter().map(Some).collect();
            for s in &siblings {
                let mut st = s.inner.lock();
                if let State::Pending { index, .. } = &*st {
                    if s.inner.tracer {
                        // A transform may still need to walk through this node.
                        let _ = s.inner.traced.set((node.clone(), *index));
                    }
                    if let Some(data) = datas[*index].take() {
                        *st = State::Ready(data);
                    }
                }
            }
            if node.claim.load(SeqCst) & WAITED != 0 {
                notify_settled();
            }
            Ok(())
        }
        Err(e) => {
            for s in &siblings {
                *s.inner.lock() = State::Failed(e.clone());
            }
            if node.claim.load(SeqCst) & WAITED != 0 {
                notify_settled();
            }
            Err(e)
        }
    }
}

/// `inputs` of `primitive` as operands on `stream`'s device. An input that only this node
/// still references hands over its bytes (donation).
fn gather(inputs: &[Array], primitive: &Primitive, stream: Stream) -> Result<Vec<Operand>> {
    let view = primitive.is_view();
    let mut operands = Vec::with_capacity(inputs.len());
    for input in inputs {
        let mut st = input.inner.lock();
        let data = match &*st {
            State::Ready(d) => d.clone(),
            State::Failed(e) => return Err(e.clone()),
            State::Pending { .. } => {
                return Err(internal(format!("input of {} was not evaluated", primitive.name())));
            }
            State::Donated => return Err(internal(format!("input of {} was donated", primitive.name()))),
        };
        let mut donated = false;
        let data = if data.storage.location() == stream.device || view {
            // Only this node references the input and nothing else shares its bytes: give the
            // backend the only handle so it may write in place.
            // Tracers keep their graph for transforms, so their bytes stay readable. A device
            // graph being recorded may hold the bytes too (it reads them on every launch).
            if !view
                && !input.inner.tracer
                && Arc::strong_count(&input.inner) == 1
                && Arc::strong_count(&data.storage)
                    == 2 + usize::from(crate::transforms::compile::recording_holds(&data.storage))
            {
                *st = State::Donated;
                donated = true;
                // A copy read earlier (to the host, say) would go stale when the consumer
                // writes these bytes in place.
                data.storage.forget_mirrors();
            }
            data
        } else {
            Data { storage: data.storage.on_device(stream.device)?, layout: data.layout }
        };
        drop(st);
        operands.push(Operand { shape: input.inner.shape.clone(), dtype: input.inner.dtype, data, donated });
    }
    Ok(operands)
}

// ---- Joint runs: a pending derivative and the pending forward whose output it consumes, both
// wanted by one evaluation (a training step's loss and gradient), run as one primitive when the
// backend has it (`FastOp::joint`: cross entropy, whose joint kernel reads the logits once).

/// The pending forwards of `order` whose output a pending derivative in `order` consumes and
/// can be run with, by node: the derivative's array and the joint rule.
fn joint_runs<'a>(order: impl Iterator<Item = &'a Array>) -> HashMap<*const Node, (Array, Joint)> {
    let mut pairs = HashMap::new();
    for array in order {
        let (node, rule) = match &*array.inner.lock() {
            State::Pending { node, .. } => match &node.primitive {
                Primitive::Fast(op) => match op.joint() {
                    Some(rule) => (node.clone(), rule),
                    None => continue,
                },
                _ => continue,
            },
            _ => continue,
        };
        let Some(forward) = node.inputs.get(rule.output_at).and_then(pending_node) else { continue };
        let same = |(a, b): (&Array, &Array)| Arc::ptr_eq(&a.inner, &b.inner);
        if matches!(&forward.primitive, Primitive::Fast(op) if *op == rule.forward)
            && forward.inputs.len() <= rule.output_at
            && forward.inputs.iter().zip(&node.inputs).all(same)
        {
            pairs.insert(Arc::as_ptr(&forward), (array.clone(), rule));
        }
    }
    pairs
}

/// Runs the forward behind `out` and the derivative behind `grad` as `rule.op` when the backend
/// has a kernel for it and the derivative's other inputs do not need the forward (they are
/// evaluated first). Otherwise, or if the joint kernel fails, both stay pending for `run`.
fn run_joint(out: &Array, grad: &Array, rule: &Joint) {
    let (Some(forward), Some(derivative)) = (pending_node(out), pending_node(grad)) else { return };
    let stream = grad.stream();
    if out.stream() != stream {
        return;
    }
    let inputs = derivative.inputs[..rule.output_at].to_vec();
    let op = Primitive::Fast(rule.op.clone());
    let in_specs: Vec<Spec> =
        inputs.iter().map(|a| Spec { shape: a.inner.shape.clone(), dtype: a.inner.dtype }).collect();
    let out_specs: Vec<Spec> = forward.outputs.iter().chain(&derivative.outputs).cloned().collect();
    let Ok(backend) = backend_for(stream.device) else { return };
    if !backend.supports(&op, &in_specs, &out_specs) {
        return;
    }
    let before = schedule(&inputs, thread_tag());
    let array = |s: &Step| match s {
        Step::Run(a) | Step::Wait(a) => a.clone(),
    };
    if before.iter().any(|s| pending_node(&array(s)).is_some_and(|n| Arc::ptr_eq(&n, &forward))) {
        return;
    }
    for step in before {
        let done = match &step {
            Step::Run(a) => run(a),
            Step::Wait(a) => wait_for(a, thread_tag()),
        };
        if done.is_err() {
            return;
        }
    }
    let _forward = forward.run.lock().unwrap_or_else(|e| e.into_inner());
    let _derivative = derivative.run.lock().unwrap_or_else(|e| e.into_inner());
    if pending_node(out).is_none() || pending_node(grad).is_none() {
        return;
    }
    let Ok(mut datas) = gather(&inputs, &op, stream).and_then(|x| dispatch_collect(stream, &op, x, &out_specs)) else {
        return;
    };
    let derivative_datas = datas.split_off(forward.outputs.len());
    // Both succeeded: settling cannot fail.
    let _ = settle(&forward, out, Ok(datas));
    let _ = settle(&derivative, grad, Ok(derivative_datas));
}

/// Runs a primitive on evaluated operands.
pub(crate) fn dispatch(
    stream: Stream,
    primitive: &Primitive,
    inputs: Vec<Operand>,
    outputs: &mut [Output],
) -> Result<()> {
    if primitive.is_view() {
        return eval_view(stream, primitive, inputs, outputs);
    }
    if matches!(primitive, Primitive::Copy) && inputs[0].data.layout.flags.row_contiguous {
        // Arrays are immutable: a row-contiguous input already is its own contiguous copy.
        let x = &inputs[0];
        outputs[0].data = Some(x.data.clone());
        return Ok(());
    }
    let backend = backend_for(stream.device)?;
    let in_specs: Vec<Spec> = inputs.iter().map(|o| Spec { shape: o.shape.clone(), dtype: o.dtype }).collect();
    let out_specs: Vec<Spec> = outputs.iter().map(|o| Spec { shape: o.shape.clone(), dtype: o.dtype }).collect();
    if backend.supports(primitive, &in_specs, &out_specs) {
        crate::transforms::compile::note_reads(&inputs);
        backend.eval(stream, primitive, inputs, outputs).map_err(|e| e.in_op(primitive.name()))?;
        crate::transforms::compile::note_writes(outputs);
        return Ok(());
    }
    if let Some(compose) = composition_of(primitive) {
        return eval_composition(stream, compose, inputs, outputs);
    }
    if !stream.device.is_cpu() {
        // No kernel on this device: run on the CPU. The inputs cross to the host once (their
        // copies are kept) and the output stays there until a device operation needs it.
        let cpu = backend_for(Device::cpu())?;
        if cpu.supports(primitive, &in_specs, &out_specs) {
            let host = inputs
                .into_iter()
                .map(|o| {
                    let storage = o.data.storage.on_device(Device::cpu())?;
                    Ok(Operand { data: Data { storage, layout: o.data.layout }, donated: false, ..o })
                })
                .collect::<Result<Vec<_>>>()?;
            return cpu
                .eval(Stream::default_for(Device::cpu()), primitive, host, outputs)
                .map_err(|e| e.in_op(primitive.name()));
        }
    }
    Err(Error::Backend(format!(
        "the {} backend has no kernel for {} on {:?}",
        backend.name(),
        primitive.name(),
        in_specs.iter().map(|s| s.dtype).collect::<Vec<_>>()
    )))
}

type Composition<'a> = Box<dyn Fn(&[Array]) -> Vec<Array> + 'a>;

/// The composition of ordinary operations a primitive stands for, if it has one: fast
/// operations, compiled programs and custom functions.
fn composition_of(primitive: &Primitive) -> Option<Composition<'_>> {
    match primitive {
        Primitive::Fast(fast) => Some(Box::new(move |x: &[Array]| fast.composition(x))),
        Primitive::Custom(c) => Some(Box::new(move |x: &[Array]| c.body(x))),
        Primitive::Compiled(c) => Some(Box::new(move |x: &[Array]| c.steps(x))),
        _ => None,
    }
}

/// A fast operation the backend does not cover, or a custom function, runs as its composition
/// of ordinary operations.
fn eval_composition(
    stream: Stream,
    compose: Composition<'_>,
    inputs: Vec<Operand>,
    outputs: &mut [Output],
) -> Result<()> {
    let results = with_stream(stream, || {
        let arrays: Vec<Array> = inputs.into_iter().map(|o| Array::from_data(o.shape, o.dtype, o.data)).collect();
        compose(&arrays)
    });
    eval_arrays(&results)?;
    for (out, r) in outputs.iter_mut().zip(&results) {
        out.data = Some(r.data()?);
    }
    Ok(())
}

fn eval_view(stream: Stream, primitive: &Primitive, mut inputs: Vec<Operand>, outputs: &mut [Output]) -> Result<()> {
    let x = inputs.pop().ok_or_else(|| internal("view without input"))?;
    let spec = Spec { shape: x.shape.clone(), dtype: x.dtype };
    let out_shape = outputs[0].shape.clone();
    let layout = match view_layout(primitive, &spec, &x.data.layout, &out_shape) {
        Some(l) => l,
        None => {
            // The strides do not allow a view: copy to row-major first, then view that.
            let mut copy = [Output { shape: x.shape.clone(), dtype: x.dtype, data: None }];
            // Views do not move data between devices: copy where the bytes are.
            let home = x.data.storage.location();
            let at = if home == stream.device { stream } else { Stream::default_for(home) };
            backend_for(home)?.eval(at, &Primitive::Copy, vec![x], &mut copy)?;
            let data = copy[0].data.take().ok_or_else(|| internal("copy produced no output"))?;
            let layout = view_layout(primitive, &spec, &data.layout, &out_shape)
                .ok_or_else(|| internal(format!("{} of a row-major copy is not a view", primitive.name())))?;
            outputs[0].data = Some(Data { storage: data.storage, layout });
            return Ok(());
        }
    };
    outputs[0].data = Some(Data { storage: x.data.storage, layout });
    Ok(())
}
