//! `compile` (MLX's `mx.compile`): trace a function once per input signature, simplify the
//! traced graph (common subexpressions, constants, dead nodes), fuse its element-wise regions
//! into `Primitive::Compiled` nodes, and replay the result on later calls.
//!
//! A traced function's arrays that do not depend on its inputs (captured arrays, and whatever
//! is computed from them alone) are constants: computed once, on the first call, and kept.

mod capture;
mod fuse;
mod graph;

use std::cell::Cell;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use crate::array::Array;
use crate::device::Device;
use crate::dtype::DType;
use crate::error::Result;
use crate::shape::Shape;

use super::{IntoResult, Trace, Tree, tracer};
pub use capture::{DeviceGraph, cuda_graphs_recorded, write_into};
pub(crate) use capture::{note_reads, note_writes, recording_holds};
use graph::Graph;

static DISABLED: AtomicBool = AtomicBool::new(false);

/// Turns compilation off: compiled functions then run their function directly, each call
/// recording its ops anew (for debugging; `NUVEC_COMPILE=0` does the same).
pub fn disable_compile() {
    DISABLED.store(true, Ordering::Relaxed);
}

/// Turns compilation back on after [`disable_compile`] (not over `NUVEC_COMPILE=0`).
pub fn enable_compile() {
    DISABLED.store(false, Ordering::Relaxed);
}

/// Whether compiled functions trace and replay (neither [`disable_compile`] nor
/// `NUVEC_COMPILE=0`).
pub fn compile_enabled() -> bool {
    static ENV: OnceLock<bool> = OnceLock::new();
    !DISABLED.load(Ordering::Relaxed) && *ENV.get_or_init(|| std::env::var("NUVEC_COMPILE").map_or(true, |v| v != "0"))
}

/// How [`compile_with`] traces.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CompileOptions {
    /// Trace once per dtype and rank, not per shape: a call with new sizes replays the graph
    /// with each primitive's shape rule. A function whose ops fix a shape (a reshape to given
    /// sizes, say) is traced again for the new shape when the replay does not fit.
    pub shapeless: bool,
    /// Skip element-wise fusion (simplification still runs).
    pub no_fusion: bool,
    /// On a GPU, record each signature's device work as a CUDA graph on its second call and
    /// launch that graph on later calls (PyTorch's "reduce-overhead"). Those calls evaluate
    /// their results before returning. The graph keeps its intermediates' memory for as long
    /// as the compiled function lives. Work that cannot be recorded (a wait for the device
    /// inside, say) runs op by op; `NUVEC_COMPILE_LOG=1` prints why.
    pub cuda_graph: bool,
}

/// What a traced graph is cached under: each input's dtype, device and shape (its rank only
/// when shapeless).
#[derive(Clone, PartialEq, Eq, Hash)]
struct Signature(Vec<(DType, Device, Shape)>, bool);

fn signature(args: &[Array], shapeless: bool) -> Signature {
    let leaf = |a: &Array| {
        let shape = if shapeless { a.shape().iter().map(|_| -1).collect() } else { Shape::from_slice(a.shape()) };
        (a.dtype(), a.device(), shape)
    };
    Signature(args.iter().map(leaf).collect(), shapeless)
}

thread_local! {
    /// Set while a compiled function traces: a compiled function called inside traces inline.
    static TRACING: Cell<bool> = const { Cell::new(false) };
}

/// The traced graphs of one compiled function.
struct Cache {
    options: CompileOptions,
    graphs: Mutex<HashMap<Signature, Arc<Graph>>>,
    /// Per exact signature, its CUDA graph (with `cuda_graph`).
    captures: Mutex<HashMap<Signature, capture::Capture>>,
}

impl Cache {
    fn new(options: CompileOptions) -> Cache {
        Cache { options, graphs: Mutex::new(HashMap::new()), captures: Mutex::new(HashMap::new()) }
    }

    /// Runs the graph cached for `args`' signature, tracing `f` first on a miss. Also gives
    /// the graph that ran (callers key what they keep per graph by it).
    fn call(
        &self,
        args: &[Array],
        f: &mut dyn FnMut(&[Array]) -> Result<Vec<Array>>,
    ) -> Result<(Vec<Array>, Arc<Graph>)> {
        if let Some(e) = args.iter().find_map(Array::error) {
            return Err(e);
        }
        let exact = signature(args, false);
        let rank = self.options.shapeless.then(|| signature(args, true));
        for key in rank.iter().chain([&exact]) {
            let graph = self.graphs.lock().unwrap_or_else(|e| e.into_inner()).get(key).cloned();
            if let Some(graph) = graph {
                if let Some(outs) = self.graphed(&graph, &exact, args, key.1) {
                    return Ok((outs, graph));
                }
                let outs = graph.replay(args, key.1);
                // A shapeless replay that does not fit the new shapes falls to an exact trace.
                if !key.1 || outs.iter().all(|o| !o.is_failed()) {
                    return Ok((outs, graph));
                }
            }
        }
        let graph = Arc::new(self.trace(args, f)?);
        let outs = graph.replay(args, false);
        let mut graphs = self.graphs.lock().unwrap_or_else(|e| e.into_inner());
        // The rank key keeps the first graph traced for it; a retrace for shapes it does not
        // fit is kept under their exact signature only.
        if let Some(rank) = rank {
            graphs.entry(rank).or_insert_with(|| graph.clone());
        }
        graphs.insert(exact, graph.clone());
        Ok((outs, graph))
    }

    fn captures_lock(&self) -> std::sync::MutexGuard<'_, HashMap<Signature, capture::Capture>> {
        self.captures.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The call's results through the signature's CUDA graph (recorded now if due), or `None`
    /// to replay op by op.
    fn graphed(&self, graph: &Graph, exact: &Signature, args: &[Array], shapeless: bool) -> Option<Vec<Array>> {
        if !self.options.cuda_graph {
            return None;
        }
        let device = capture::device_of(args)?;
        let mut captures = self.captures_lock();
        let state = captures.entry(exact.clone()).or_insert(capture::Capture::Warm { attempts: 0 });
        match state {
            capture::Capture::Ready(c) => match capture::run(c, graph, args, device) {
                Ok(outs) => Some(outs),
                Err(e) => {
                    capture::log(|| format!("a recorded graph failed to launch, replaying op by op: {e}"));
                    *state = capture::Capture::Off;
                    None
                }
            },
            capture::Capture::Warm { attempts } => match capture::record(graph, args, shapeless, device) {
                Ok((c, outs)) => {
                    *state = capture::Capture::Ready(c);
                    Some(outs)
                }
                Err(e) => {
                    let tries = *attempts + 1;
                    capture::log(|| format!("cannot record a CUDA graph (attempt {tries}), replaying op by op: {e}"));
                    *state = if tries < 2 { capture::Capture::Warm { attempts: tries } } else { capture::Capture::Off };
                    None
                }
            },
            capture::Capture::Off => None,
        }
    }

    fn trace(&self, args: &[Array], f: &mut dyn FnMut(&[Array]) -> Result<Vec<Array>>) -> Result<Graph> {
        let outer = TRACING.with(|t| t.replace(true));
        let trace = Trace::start();
        let tracers: Vec<Array> = args.iter().map(tracer).collect();
        let outputs = f(&tracers);
        TRACING.with(|t| t.set(outer));
        let outputs = outputs?;
        if let Some(e) = outputs.iter().find_map(Array::error) {
            return Err(e);
        }
        let mut graph = Graph::trace(&outputs, &tracers);
        drop(trace);
        graph.merge_common();
        if !self.options.no_fusion {
            fuse::fuse(&mut graph);
            graph.prune();
        }
        if let Some(dir) = std::env::var_os("NUVEC_COMPILE_DUMP") {
            dump(&graph, std::path::Path::new(&dir));
        }
        Ok(graph)
    }
}

/// Writes each fused program of `graph` as text, `compiled_<digest>.txt` (the CUDA backend
/// writes the kernels it generates beside them).
fn dump(graph: &Graph, dir: &std::path::Path) {
    let _ = std::fs::create_dir_all(dir);
    for node in &graph.nodes {
        if let crate::primitive::Primitive::Compiled(c) = &node.primitive {
            let _ = std::fs::write(dir.join(format!("compiled_{:016x}.txt", c.0.digest())), c.0.to_string());
        }
    }
}

/// The graph `compile` makes of `f` on `args`, as text: one line per node after
/// simplification and fusion, each fused node followed by its program (for debugging and
/// tests; MLX's `export_to_dot` serves the same need).
///
/// ```
/// use nuvec::{array, transforms::{CompileOptions, compiled_graph}};
/// let text = compiled_graph(|x| Ok(vec![(&x[0] + 1.0).exp() * 2.0]), &[array![1.0]], CompileOptions::default()).unwrap();
/// assert_eq!(text.lines().filter(|l| l.starts_with('n')).count(), 1); // one fused node
/// assert!(text.contains("compiled"));
/// ```
pub fn compiled_graph<F>(f: F, args: &[Array], options: CompileOptions) -> Result<String>
where
    F: Fn(&[Array]) -> Result<Vec<Array>>,
{
    Ok(Cache::new(options).trace(args, &mut |x| f(x))?.to_string())
}

/// Whether a compiled call should run `f` directly: compilation is off, or a compiled
/// function is tracing already (the outer trace records this one's ops).
fn direct() -> bool {
    !compile_enabled() || TRACING.with(Cell::get)
}

/// [`compile`] over flat lists of arrays.
///
/// ```
/// use nuvec::{array, transforms::compile_flat};
/// let f = compile_flat(|x| Ok(vec![(&x[0] * 2.0 + 1.0).exp()]));
/// let y = f(&[array![0.0, 0.5]]).unwrap();
/// let expect = [1.0f32.exp(), 2.0f32.exp()];
/// assert_eq!(y[0].to_vec::<f32>().unwrap(), expect);
/// ```
pub fn compile_flat<F>(f: F) -> impl Fn(&[Array]) -> Result<Vec<Array>>
where
    F: Fn(&[Array]) -> Result<Vec<Array>>,
{
    compile_flat_with(f, CompileOptions::default())
}

/// [`compile_with`] over flat lists of arrays.
pub fn compile_flat_with<F>(f: F, options: CompileOptions) -> impl Fn(&[Array]) -> Result<Vec<Array>>
where
    F: Fn(&[Array]) -> Result<Vec<Array>>,
{
    let cache = Cache::new(options);
    move |args: &[Array]| {
        if direct() {
            return f(args);
        }
        cache.call(args, &mut |x| f(x)).map(|(outs, _)| outs)
    }
}

/// [`compile_flat_with`] for a function that reads and replaces arrays held outside its
/// arguments (MLX's `inputs=` and `outputs=`): a model's weights and an optimizer's state
/// updated by a compiled training step, say. `get` returns the state's arrays and `set`
/// replaces them, both in one fixed order.
///
/// Each call reads the state with `get` and passes it into the graph as extra inputs; the
/// state `f` leaves behind (read with `get` after tracing) is an extra output, stored with
/// `set` after every call. While `f` traces, the state holds traced arrays.
///
/// ```
/// use std::{cell::RefCell, rc::Rc};
/// use nuvec::{array, Array, transforms::{CompileOptions, compile_with_state}};
/// let w = Rc::new(RefCell::new(array![1.0, 2.0]));
/// let (get, set, read) = (w.clone(), w.clone(), w.clone());
/// // One step of "w <- w * x"; returns the sum.
/// let step = compile_with_state(
///     move |x: &[Array]| {
///         let next = &*read.borrow() * &x[0];
///         *read.borrow_mut() = next.clone();
///         Ok(vec![next.sum(..)])
///     },
///     move || vec![get.borrow().clone()],
///     move |s: Vec<Array>| *set.borrow_mut() = s[0].clone(),
///     CompileOptions::default(),
/// );
/// step(&[array![2.0, 3.0]]).unwrap();
/// let total = step(&[array![2.0, 3.0]]).unwrap();
/// assert_eq!(w.borrow().to_vec::<f32>().unwrap(), vec![4.0, 18.0]);
/// assert_eq!(total[0].item::<f32>().unwrap(), 22.0);
/// ```
pub fn compile_with_state<F, G, S>(
    f: F,
    get: G,
    set: S,
    options: CompileOptions,
) -> impl Fn(&[Array]) -> Result<Vec<Array>>
where
    F: Fn(&[Array]) -> Result<Vec<Array>>,
    G: Fn() -> Vec<Array>,
    S: Fn(Vec<Array>),
{
    let cache = Cache::new(options);
    move |args: &[Array]| {
        if direct() {
            return f(args);
        }
        let state = get();
        let n = args.len();
        let mut all = args.to_vec();
        all.extend(state.iter().cloned());
        // The number of f's own outputs, for splitting off the new state.
        let mut returned = None;
        let result = cache.call(&all, &mut |x| {
            set(x[n..].to_vec());
            let mut outs = f(&x[..n])?;
            returned = Some(outs.len());
            outs.extend(get());
            Ok(outs)
        });
        let mut outs = match result {
            Ok((outs, ..)) => outs,
            Err(e) => {
                set(state);
                return Err(e);
            }
        };
        // On a replay, the state's arrays follow f's outputs in the same number.
        let ours = returned.unwrap_or(outs.len() - state.len().min(outs.len()));
        let new_state = outs.split_off(ours);
        set(new_state);
        Ok(outs)
    }
}

/// `f` compiled (MLX's `mx.compile`): the first call with a new signature (each input's
/// shape, dtype and device) traces `f` and keeps the simplified, fused graph; later calls with
/// that signature replay it on their inputs without running `f`. The results are the ones `f`
/// gives: fused kernels compute every step in the dtype the unfused op would.
///
/// Only `f`'s arrays flow through the replay, so `f` must be a function of its arguments:
/// arrays it captures are constants of the trace, and side effects (printing, counters) happen
/// on the tracing call only. Compiled functions compose with every transform, both ways.
///
/// ```
/// use nuvec::{array, Array, transforms::{compile, grad}};
/// let gelu = compile(|x: &Array| x * ((x * 1.702).sigmoid()));
/// let x = array![-1.0, 0.0, 2.0];
/// let y = gelu(&x).unwrap();
/// assert_eq!(y.to_vec::<f32>().unwrap(), (&x * (&x * 1.702).sigmoid()).to_vec::<f32>().unwrap());
/// // Gradients go through the compiled function (and a compiled gradient works too).
/// let dy = grad(|x: &Array| gelu(x).unwrap().sum(..))(&x).unwrap();
/// assert_eq!(dy.shape(), &[3]);
/// ```
pub fn compile<P, O, F, R>(f: F) -> impl Fn(&P) -> Result<O>
where
    P: Tree,
    O: Tree,
    F: Fn(&P) -> R,
    R: IntoResult<Ok = O>,
{
    compile_with(f, CompileOptions::default())
}

/// [`compile`] with options (shapeless tracing, fusion off).
pub fn compile_with<P, O, F, R>(f: F, options: CompileOptions) -> impl Fn(&P) -> Result<O>
where
    P: Tree,
    O: Tree,
    F: Fn(&P) -> R,
    R: IntoResult<Ok = O>,
{
    let cache = Cache::new(options);
    // The output tree of each traced graph (keyed by the graph), with placeholder leaves.
    let templates: Mutex<HashMap<*const Graph, O>> = Mutex::new(HashMap::new());
    move |p: &P| {
        if direct() {
            return f(p).into_result();
        }
        let leaves = p.flatten();
        let mut traced: Option<O> = None;
        let (outs, graph) = cache.call(&leaves, &mut |x| {
            let out = f(&p.with_leaves(x.to_vec())).into_result()?;
            let flat = out.flatten();
            traced = Some(out.with_leaves(vec![Array::default(); flat.len()]));
            Ok(flat)
        })?;
        let mut templates = templates.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(t) = traced {
            templates.insert(Arc::as_ptr(&graph), t);
        }
        match templates.get(&Arc::as_ptr(&graph)) {
            Some(t) => Ok(t.with_leaves(outs)),
            None => Err(crate::error::Error::InvalidArgument("compile: no output structure for this call".into())),
        }
    }
}
