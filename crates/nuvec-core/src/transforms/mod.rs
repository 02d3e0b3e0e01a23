//! Transforms: `vjp`, `jvp`, `grad`, `value_and_grad`, `vmap`, `custom_function`,
//! `checkpoint`, `compile`.
//!
//! They trace the function on the lazy graph (its inputs are marked with an identity node) and
//! walk the recorded graph with each primitive's rule (`primitive::rules`). The rules build
//! ordinary operations, so transforms nest in any order: grad of grad, vmap of grad, jvp of
//! vjp. Arrays recorded while a transform traces keep their graph even when evaluated, so a
//! function may evaluate intermediate results.

pub(crate) mod compile;
mod custom;

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::sync::Arc;

pub use crate::primitive::custom::CustomFn;
pub use crate::tree::{GradOutput, IntoResult, Tree};
pub use compile::{
    CompileOptions, DeviceGraph, compile, compile_enabled, compile_flat, compile_flat_with, compile_with,
    compile_with_state, compiled_graph, cuda_graphs_recorded, disable_compile, enable_compile, write_into,
};
pub use custom::{CustomFunction, checkpoint, checkpoint_flat, custom_function, custom_function_flat};

use crate::array::{Array, Node};
use crate::error::{Error, Result};
use crate::primitive::Primitive;
use std::panic::Location;

thread_local! {
    static DEPTH: Cell<usize> = const { Cell::new(0) };
    /// Per open trace, the outputs kept alive for its walk ([`keep_for_transforms`]).
    static KEPT: RefCell<Vec<Vec<Array>>> = const { RefCell::new(Vec::new()) };
}

/// Keeps `x` alive until the innermost open trace ends, when a transform is tracing. For an
/// output the caller never receives but a derivative rule reads (attention's log-sum-exp):
/// outputs no one holds are otherwise gone by the time the walk reaches their node.
pub(crate) fn keep_for_transforms(x: &Array) {
    if tracing() {
        KEPT.with(|k| k.borrow_mut().last_mut().map(|top| top.push(x.clone())));
    }
}

/// Whether a transform is tracing on this thread (arrays recorded now are tracers).
pub(crate) fn tracing() -> bool {
    DEPTH.with(|d| d.get() > 0)
}

/// Marks this thread as tracing while alive.
struct Trace;

impl Trace {
    fn start() -> Trace {
        DEPTH.with(|d| d.set(d.get() + 1));
        KEPT.with(|k| k.borrow_mut().push(Vec::new()));
        Trace
    }
}

impl Drop for Trace {
    fn drop(&mut self) {
        DEPTH.with(|d| d.set(d.get() - 1));
        // Dropped outside the borrow: dropping arrays may end other traces' arrays.
        let kept = KEPT.with(|k| k.borrow_mut().pop());
        drop(kept);
    }
}

/// A traced input: the identity of `x`, so the walk knows where to stop.
fn tracer(x: &Array) -> Array {
    Array::from_op("identity", Primitive::Identity, vec![x.clone()])
}

type Key = *const crate::array::Inner;

fn key(a: &Array) -> Key {
    Arc::as_ptr(&a.inner)
}

/// The nodes between `outputs` and `leaves`, inputs first, with the output arrays seen for each.
struct Tape {
    nodes: Vec<(Arc<Node>, Vec<Option<Array>>)>,
}

impl Tape {
    fn record(outputs: &[Array], leaves: &[Array]) -> Tape {
        let leaf: std::collections::HashSet<Key> = leaves.iter().map(key).collect();
        // depends[node] = whether the node reads a leaf, directly or not.
        let mut depends: HashMap<*const Node, bool> = HashMap::new();
        let mut seen_outputs: HashMap<*const Node, Vec<Option<Array>>> = HashMap::new();
        let mut order: Vec<Arc<Node>> = Vec::new();
        // Iterative post-order walk (graphs can be deep).
        let mut stack: Vec<(Arc<Node>, usize)> = Vec::new();
        let note = |a: &Array, seen: &mut HashMap<*const Node, Vec<Option<Array>>>| -> Option<Arc<Node>> {
            if leaf.contains(&key(a)) {
                return None;
            }
            let (node, index) = a.node()?;
            let outs = seen.entry(Arc::as_ptr(&node)).or_insert_with(|| vec![None; node.outputs.len()]);
            if outs[index].is_none() {
                outs[index] = Some(a.clone());
            }
            Some(node)
        };
        for out in outputs {
            let Some(node) = note(out, &mut seen_outputs) else { continue };
            if depends.contains_key(&Arc::as_ptr(&node)) {
                continue;
            }
            depends.insert(Arc::as_ptr(&node), false);
            stack.push((node, 0));
            while let Some((node, next)) = stack.last_mut() {
                if *next < node.inputs.len() {
                    let input = node.inputs[*next].clone();
                    *next += 1;
                    if leaf.contains(&key(&input)) {
                        depends.insert(Arc::as_ptr(node), true);
                        continue;
                    }
                    if let Some(child) = note(&input, &mut seen_outputs) {
                        match depends.get(&Arc::as_ptr(&child)) {
                            Some(true) => {
                                depends.insert(Arc::as_ptr(node), true);
                            }
                            Some(false) => {}
                            None => {
                                depends.insert(Arc::as_ptr(&child), false);
                                stack.push((child, 0));
                            }
                        }
                    }
                } else {
                    let (done, _) = stack.pop().expect("stack is not empty");
                    let d = depends[&Arc::as_ptr(&done)];
                    if d {
                        if let Some((parent, _)) = stack.last() {
                            depends.insert(Arc::as_ptr(parent), true);
                        }
                        order.push(done);
                    }
                }
            }
        }
        let nodes = order
            .into_iter()
            .map(|n| {
                let outs = seen_outputs.remove(&Arc::as_ptr(&n)).unwrap_or_default();
                (n, outs)
            })
            .collect();
        Tape { nodes }
    }
}

/// The outputs of a node, recovering the ones the walk did not see from the node's siblings.
fn node_outputs(node: &Node, seen: &[Option<Array>]) -> Vec<Array> {
    let siblings: Vec<Option<Array>> = match node.siblings.get() {
        Some(w) => w.iter().map(|w| w.upgrade().map(|inner| Array { inner })).collect(),
        None => vec![None; node.outputs.len()],
    };
    (0..node.outputs.len())
        .map(|i| {
            seen.get(i).cloned().flatten().or_else(|| siblings[i].clone()).unwrap_or_else(|| {
                // An output no one holds: zeros stand in (its cotangent is zero anyway).
                crate::ops::zeros(&node.outputs[i].shape, node.outputs[i].dtype)
            })
        })
        .collect()
}

fn add_into(map: &mut HashMap<Key, Array>, at: &Array, value: Array) {
    match map.remove(&key(at)) {
        Some(prev) => {
            map.insert(key(at), prev + value);
        }
        None => {
            map.insert(key(at), value);
        }
    }
}

/// Reverse mode over flat lists: `(f(primals), cotangents of primals)` for output cotangents
/// `cotangents` (one per output, of the output's shape).
///
/// ```
/// use nuvec::{array, transforms::vjp_flat};
/// let (outs, grads) = vjp_flat(|x| Ok(vec![&x[0] * &x[0]]), &[array![3.0]], &[array![1.0]]).unwrap();
/// assert_eq!(outs[0].to_vec::<f32>().unwrap(), vec![9.0]);
/// assert_eq!(grads[0].to_vec::<f32>().unwrap(), vec![6.0]);
/// ```
pub fn vjp_flat(
    f: impl FnOnce(&[Array]) -> Result<Vec<Array>>,
    primals: &[Array],
    cotangents: &[Array],
) -> Result<(Vec<Array>, Vec<Array>)> {
    vjp_seeded(f, primals, Seeds::Given(cotangents))
}

/// Where the output cotangents come from.
enum Seeds<'a> {
    Given(&'a [Array]),
    /// Ones of each output's shape (the gradient of a scalar loss).
    Ones,
}

fn vjp_seeded(
    f: impl FnOnce(&[Array]) -> Result<Vec<Array>>,
    primals: &[Array],
    seeds: Seeds<'_>,
) -> Result<(Vec<Array>, Vec<Array>)> {
    for p in primals {
        if let Some(e) = p.error() {
            return Err(e);
        }
    }
    let trace = Trace::start();
    let tracers: Vec<Array> = primals.iter().map(tracer).collect();
    let outputs = f(&tracers)?;
    if let Some(e) = outputs.iter().find_map(|o| o.error()) {
        return Err(e);
    }
    let cotangents: Vec<Array> = match seeds {
        Seeds::Ones => outputs.iter().map(|o| o.ones_like()).collect(),
        Seeds::Given(c) => {
            if outputs.len() != c.len() {
                return Err(Error::InvalidArgument(format!(
                    "vjp: the function returned {} outputs but {} cotangents were given",
                    outputs.len(),
                    c.len()
                )));
            }
            for (o, c) in outputs.iter().zip(c) {
                if let Some(e) = c.error() {
                    return Err(e);
                }
                if o.shape() != c.shape() {
                    return Err(Error::InvalidArgument(format!(
                        "vjp: a cotangent of shape {:?} was given for an output of shape {:?}",
                        c.shape(),
                        o.shape()
                    )));
                }
            }
            c.to_vec()
        }
    };
    let grads = backward(&outputs, &cotangents, &tracers);
    drop(trace);
    let grads = grads.into_iter().zip(primals).map(|(g, p)| g.unwrap_or_else(|| p.zeros_like())).collect();
    Ok((outputs, grads))
}

fn backward(outputs: &[Array], cotangents: &[Array], tracers: &[Array]) -> Vec<Option<Array>> {
    let tape = Tape::record(outputs, tracers);
    let mut cots: HashMap<Key, Array> = HashMap::new();
    for (o, c) in outputs.iter().zip(cotangents) {
        add_into(&mut cots, o, c.astype(if o.dtype().is_inexact() { o.dtype() } else { c.dtype() }));
    }
    let leaf: std::collections::HashSet<Key> = tracers.iter().map(key).collect();
    for (node, seen) in tape.nodes.iter().rev() {
        let outs = node_outputs(node, seen);
        let gs: Vec<Option<Array>> = outs.iter().map(|o| cots.remove(&key(o))).collect();
        if gs.iter().all(Option::is_none) {
            continue;
        }
        let gs: Vec<Array> = gs.into_iter().zip(&outs).map(|(g, o)| g.unwrap_or_else(|| o.zeros_like())).collect();
        let argnums: Vec<usize> = (0..node.inputs.len()).collect();
        let input_cots = node.primitive.vjp(&node.inputs, &outs, &gs, &argnums);
        for (i, c) in input_cots.into_iter().enumerate() {
            if let Some(c) = c {
                let input = &node.inputs[i];
                // Only inputs on a path to a traced input need their cotangent.
                if leaf.contains(&key(input)) || input.node().is_some() {
                    add_into(&mut cots, input, c);
                }
            }
        }
    }
    tracers.iter().map(|t| cots.remove(&key(t))).collect()
}

/// Forward mode over flat lists: `(f(primals), output tangents)` for input `tangents`.
///
/// ```
/// use nuvec::{array, transforms::jvp_flat};
/// let (_, t) = jvp_flat(|x| Ok(vec![x[0].sin()]), &[array![0.0]], &[array![2.0]]).unwrap();
/// assert_eq!(t[0].to_vec::<f32>().unwrap(), vec![2.0]);
/// ```
pub fn jvp_flat(
    f: impl FnOnce(&[Array]) -> Result<Vec<Array>>,
    primals: &[Array],
    tangents: &[Array],
) -> Result<(Vec<Array>, Vec<Array>)> {
    if primals.len() != tangents.len() {
        return Err(Error::InvalidArgument(format!("jvp: {} primals but {} tangents", primals.len(), tangents.len())));
    }
    for (p, t) in primals.iter().zip(tangents) {
        if let Some(e) = p.error().or_else(|| t.error()) {
            return Err(e);
        }
        if p.shape() != t.shape() {
            return Err(Error::InvalidArgument(format!(
                "jvp: a tangent of shape {:?} was given for a primal of shape {:?}",
                t.shape(),
                p.shape()
            )));
        }
    }
    let trace = Trace::start();
    let tracers: Vec<Array> = primals.iter().map(tracer).collect();
    let outputs = f(&tracers)?;
    let tape = Tape::record(&outputs, &tracers);
    let mut tans: HashMap<Key, Array> = HashMap::new();
    for (tr, t) in tracers.iter().zip(tangents) {
        tans.insert(key(tr), t.astype(if tr.dtype().is_inexact() { tr.dtype() } else { t.dtype() }));
    }
    for (node, seen) in &tape.nodes {
        let ins: Vec<Option<Array>> = node.inputs.iter().map(|i| tans.get(&key(i)).cloned()).collect();
        if ins.iter().all(Option::is_none) {
            continue;
        }
        let outs = node_outputs(node, seen);
        let out_tans = node.primitive.jvp(&node.inputs, &outs, &ins);
        for (o, t) in outs.iter().zip(out_tans) {
            if let Some(t) = t {
                tans.insert(key(o), t);
            }
        }
    }
    drop(trace);
    let out_tans = outputs.iter().map(|o| tans.get(&key(o)).cloned().unwrap_or_else(|| o.zeros_like())).collect();
    Ok((outputs, out_tans))
}

/// The gradient of a scalar-valued `f` with respect to the arguments in `argnums` (MLX's
/// `grad(fun, argnums)` over a list of arrays): the returned function takes every argument and
/// gives one gradient per entry of `argnums`, in that order.
///
/// ```
/// use nuvec::{array, transforms::grad_flat};
/// let df = grad_flat(|x| Ok((&x[0] * &x[1]).sum(..)), &[1]);
/// let g = df(&[array![1.0, 2.0], array![3.0, 4.0]]).unwrap();
/// assert_eq!(g[0].to_vec::<f32>().unwrap(), vec![1.0, 2.0]);
/// ```
#[track_caller]
pub fn grad_flat<F>(f: F, argnums: &[usize]) -> impl Fn(&[Array]) -> Result<Vec<Array>>
where
    F: Fn(&[Array]) -> Result<Array>,
{
    let vg = flat_value_and_grad("grad", Location::caller(), f, argnums);
    move |args| vg(args).map(|(_, g)| g)
}

/// The value and gradient of a scalar-valued `f` with respect to the arguments in `argnums`.
#[track_caller]
pub fn value_and_grad_flat<F>(f: F, argnums: &[usize]) -> impl Fn(&[Array]) -> Result<(Array, Vec<Array>)>
where
    F: Fn(&[Array]) -> Result<Array>,
{
    flat_value_and_grad("value_and_grad", Location::caller(), f, argnums)
}

fn flat_value_and_grad<F>(
    op: &'static str,
    at: &'static Location<'static>,
    f: F,
    argnums: &[usize],
) -> impl Fn(&[Array]) -> Result<(Array, Vec<Array>)>
where
    F: Fn(&[Array]) -> Result<Array>,
{
    let argnums = argnums.to_vec();
    move |args: &[Array]| {
        if let Some(&bad) = argnums.iter().find(|&&i| i >= args.len()) {
            return Err(Error::misuse(op, at, format!("argnum {bad} but only {} arguments", args.len())));
        }
        let primals: Vec<Array> = argnums.iter().map(|&i| args[i].clone()).collect();
        let call = |traced: &[Array]| -> Result<Vec<Array>> {
            let mut full = args.to_vec();
            for (slot, t) in argnums.iter().zip(traced) {
                full[*slot] = t.clone();
            }
            let loss = f(&full)?;
            if let Some(e) = loss.error() {
                return Err(e);
            }
            if loss.size() != 1 {
                return Err(Error::misuse(
                    op,
                    at,
                    format!("the function must return a single value, it returned shape {:?}", loss.shape()),
                ));
            }
            Ok(vec![loss])
        };
        let (mut outs, grads) = vjp_seeded(call, &primals, Seeds::Ones)?;
        Ok((outs.remove(0), grads))
    }
}

/// Reverse mode over trees: `(f(primals), cotangent of each primal leaf)` for the output
/// cotangents `cotangents` (shaped like the output).
///
/// ```
/// use nuvec::{array, transforms::vjp, Array};
/// let x = array![1.0, 2.0];
/// let (y, dx) = vjp(|x: &Array| x.exp(), &x, &array![1.0, 1.0]).unwrap();
/// assert_eq!(dx.to_vec::<f32>().unwrap(), y.to_vec::<f32>().unwrap());
/// ```
pub fn vjp<P, O, F, R>(f: F, primals: &P, cotangents: &O) -> Result<(O, P)>
where
    P: Tree,
    O: Tree,
    F: FnOnce(&P) -> R,
    R: IntoResult<Ok = O>,
{
    let (shape, (outs, grads)) =
        through_flat("vjp", f, primals, |g| vjp_flat(g, &primals.flatten(), &cotangents.flatten()))?;
    Ok((shape.with_leaves(outs), primals.with_leaves(grads)))
}

/// Runs a tree transform through its flat form: `flat` receives `f` as a function of the
/// primals' leaves, and the output's tree structure comes back beside `flat`'s result.
fn through_flat<'a, P, O, R, T>(
    transform: &str,
    f: impl FnOnce(&P) -> R + 'a,
    primals: &'a P,
    flat: impl FnOnce(Box<dyn FnOnce(&[Array]) -> Result<Vec<Array>> + '_>) -> Result<T>,
) -> Result<(O, T)>
where
    P: Tree,
    O: Tree,
    R: IntoResult<Ok = O>,
{
    let mut shape: Option<O> = None;
    let result = flat(Box::new(|xs: &[Array]| {
        let o = f(&primals.with_leaves(xs.to_vec())).into_result()?;
        let leaves = o.flatten();
        shape = Some(o);
        Ok(leaves)
    }))?;
    let shape = shape.ok_or_else(|| Error::InvalidArgument(format!("{transform}: the function did not run")))?;
    Ok((shape, result))
}

/// Forward mode over trees: `(f(primals), output tangents)` for `tangents` shaped like the
/// primals.
pub fn jvp<P, O, F, R>(f: F, primals: &P, tangents: &P) -> Result<(O, O)>
where
    P: Tree,
    O: Tree,
    F: FnOnce(&P) -> R,
    R: IntoResult<Ok = O>,
{
    let (shape, (outs, tans)) =
        through_flat("jvp", f, primals, |g| jvp_flat(g, &primals.flatten(), &tangents.flatten()))?;
    Ok((shape.with_leaves(outs), shape.with_leaves(tans)))
}

/// The gradient of a scalar loss with respect to every leaf of its argument, shaped like the
/// argument (integer leaves get zeros). The returned function has the type
/// `impl Fn(&P) -> Result<P>`.
///
/// MLX differentiates argument 0 by default (`argnums=0`): here the argument is one tree, so
/// gather what to differentiate in it (a tuple, a `Vec`, a map) and pass the data with
/// [`grad_args`]. [`grad_flat`] takes MLX's `argnums` over a list of arrays.
///
/// ```
/// use nuvec::{array, transforms::grad, Array};
/// let f = |(w, b): &(Array, Array)| (w * 3.0 + b).sum(..);
/// let (dw, db) = grad(f)(&(array![1.0, 2.0], array![0.5])).unwrap();
/// assert_eq!(dw.to_vec::<f32>().unwrap(), vec![3.0, 3.0]);
/// assert_eq!(db.to_vec::<f32>().unwrap(), vec![2.0]);
/// ```
#[track_caller]
pub fn grad<P, F, R>(f: F) -> impl Fn(&P) -> Result<P>
where
    P: Tree,
    F: Fn(&P) -> R,
    R: IntoResult<Ok = Array>,
{
    let vg = tree_value_and_grad("grad", Location::caller(), move |p: &P, _: &()| f(p));
    move |p| vg(p, &()).map(|(_, g)| g)
}

/// The value (a loss, or `(loss, aux)`) and the gradient of the loss with respect to every
/// leaf of the argument. The returned function has the type `impl Fn(&P) -> Result<(R::Ok, P)>`.
///
/// ```
/// use nuvec::{array, value_and_grad, Array};
/// let vg = value_and_grad(|w: &Array| (w * w).sum(..));
/// let (loss, dw) = vg(&array![1.0, 2.0]).unwrap();
/// assert_eq!(loss.item::<f32>().unwrap(), 5.0);
/// assert_eq!(dw.to_vec::<f32>().unwrap(), vec![2.0, 4.0]);
/// ```
#[track_caller]
pub fn value_and_grad<P, F, R>(f: F) -> impl Fn(&P) -> Result<(R::Ok, P)>
where
    P: Tree,
    F: Fn(&P) -> R,
    R: IntoResult,
    R::Ok: GradOutput,
{
    let vg = tree_value_and_grad("value_and_grad", Location::caller(), move |p: &P, _: &()| f(p));
    move |p| vg(p, &())
}

/// [`grad`] of a function of two arguments, `f(params, data)`, with respect to the first only
/// (MLX's default `argnums=0`): the data (inputs, targets, masks) is passed at each call
/// rather than captured, and gets no gradient. The returned function has the type
/// `impl Fn(&P, &D) -> Result<P>`.
///
/// ```
/// use nuvec::{array, grad_args, Array};
/// let loss = |w: &Array, (x, y): &(Array, Array)| ((x * w - y).square()).mean(..);
/// let dw = grad_args(loss)(&array![2.0], &(array![1.0, 2.0], array![1.0, 2.0])).unwrap();
/// assert_eq!(dw.to_vec::<f32>().unwrap(), vec![5.0]); // d/dw mean((w x - y)^2) at w = 2
/// ```
#[track_caller]
pub fn grad_args<P, D, F, R>(f: F) -> impl Fn(&P, &D) -> Result<P>
where
    P: Tree,
    D: ?Sized,
    F: Fn(&P, &D) -> R,
    R: IntoResult<Ok = Array>,
{
    let vg = tree_value_and_grad("grad", Location::caller(), f);
    move |p, d| vg(p, d).map(|(_, g)| g)
}

/// [`value_and_grad`] of `f(params, data)` with respect to the first argument only; the data
/// is passed at each call and gets no gradient. The returned function has the type
/// `impl Fn(&P, &D) -> Result<(R::Ok, P)>`.
///
/// A training step of linear regression, with the update written with [`crate::tree_map_with`]:
///
/// ```
/// use nuvec::{array, ops, tree_map_with, value_and_grad_args, Array};
///
/// type Params = (Array, Array); // weight and bias
/// fn loss((w, b): &Params, (x, y): &(Array, Array)) -> Array {
///     (x.matmul(w) + b - y).square().mean(..)
/// }
///
/// let x = array![[0.0], [1.0], [2.0], [3.0]];
/// let y = &x * 2.0 + 1.0; // the line to learn
/// let mut params: Params = (ops::zeros([1, 1], nuvec::DType::F32), ops::zeros([1], nuvec::DType::F32));
/// let step = value_and_grad_args(loss);
/// let mut first = None;
/// for _ in 0..200 {
///     let (l, grads) = step(&params, &(x.clone(), y.clone())).unwrap();
///     first.get_or_insert(l.item::<f32>().unwrap());
///     params = tree_map_with(&params, &[&grads], |p, g| p - &g[0] * 0.1);
///     nuvec::eval(&params).unwrap();
/// }
/// let (l, _) = step(&params, &(x, y)).unwrap();
/// assert!(l.item::<f32>().unwrap() < 1e-3 * first.unwrap());
/// assert!((params.0.item::<f32>().unwrap() - 2.0).abs() < 0.05);
/// ```
#[track_caller]
pub fn value_and_grad_args<P, D, F, R>(f: F) -> impl Fn(&P, &D) -> Result<(R::Ok, P)>
where
    P: Tree,
    D: ?Sized,
    F: Fn(&P, &D) -> R,
    R: IntoResult,
    R::Ok: GradOutput,
{
    tree_value_and_grad("value_and_grad", Location::caller(), f)
}

fn tree_value_and_grad<P, D, F, R>(
    op: &'static str,
    at: &'static Location<'static>,
    f: F,
) -> impl Fn(&P, &D) -> Result<(R::Ok, P)>
where
    P: Tree,
    D: ?Sized,
    F: Fn(&P, &D) -> R,
    R: IntoResult,
    R::Ok: GradOutput,
{
    move |p: &P, data: &D| {
        let leaves = p.flatten();
        let argnums: Vec<usize> = (0..leaves.len()).collect();
        let value: std::cell::RefCell<Option<R::Ok>> = std::cell::RefCell::new(None);
        let (_, grads) = flat_value_and_grad(
            op,
            at,
            |xs| {
                let out = f(&p.with_leaves(xs.to_vec()), data).into_result()?;
                let loss = out.loss().clone();
                *value.borrow_mut() = Some(out);
                Ok(loss)
            },
            &argnums,
        )(&leaves)?;
        let value = value.into_inner().ok_or_else(|| Error::misuse(op, at, "the function did not run".into()))?;
        Ok((value, p.with_leaves(grads)))
    }
}

/// Batching axes: one for every leaf, or one per leaf (`None`: not batched).
#[derive(Clone, Debug, PartialEq)]
pub enum AxesSpec {
    /// The same axis for every leaf.
    All(Option<i32>),
    /// One entry per leaf, in order.
    PerLeaf(Vec<Option<i32>>),
}

impl From<i32> for AxesSpec {
    fn from(a: i32) -> Self {
        AxesSpec::All(Some(a))
    }
}
impl From<Option<i32>> for AxesSpec {
    fn from(a: Option<i32>) -> Self {
        AxesSpec::All(a)
    }
}
impl From<Vec<Option<i32>>> for AxesSpec {
    fn from(a: Vec<Option<i32>>) -> Self {
        AxesSpec::PerLeaf(a)
    }
}
impl From<&[Option<i32>]> for AxesSpec {
    fn from(a: &[Option<i32>]) -> Self {
        AxesSpec::PerLeaf(a.to_vec())
    }
}
impl<const N: usize> From<[Option<i32>; N]> for AxesSpec {
    fn from(a: [Option<i32>; N]) -> Self {
        AxesSpec::PerLeaf(a.to_vec())
    }
}

impl AxesSpec {
    fn for_leaves(&self, n: usize, what: &str) -> Result<Vec<Option<i32>>> {
        match self {
            AxesSpec::All(a) => Ok(vec![*a; n]),
            AxesSpec::PerLeaf(v) if v.len() == n => Ok(v.clone()),
            AxesSpec::PerLeaf(v) => Err(Error::InvalidArgument(format!("vmap: {} {what} for {n} arrays", v.len()))),
        }
    }
}

/// Vectorizing map over flat lists: `f` is written for one item; the result maps it over axis
/// `in_axes[i]` of each argument (`None`: shared) and stacks the results on `out_axes[j]`.
///
/// ```
/// use nuvec::{array, transforms::vmap_flat};
/// // A dot product, mapped over rows.
/// let rows = vmap_flat(|x| Ok(vec![(&x[0] * &x[1]).sum(..)]), &[Some(0), None], &[0]);
/// let out = rows(&[array![[1.0, 2.0], [3.0, 4.0]], array![1.0, 1.0]]).unwrap();
/// assert_eq!(out[0].to_vec::<f32>().unwrap(), vec![3.0, 7.0]);
/// ```
pub fn vmap_flat<F>(f: F, in_axes: &[Option<i32>], out_axes: &[i32]) -> impl Fn(&[Array]) -> Result<Vec<Array>>
where
    F: Fn(&[Array]) -> Result<Vec<Array>>,
{
    let (in_axes, out_axes) = (in_axes.to_vec(), out_axes.to_vec());
    move |args: &[Array]| {
        vmap_impl(
            &f,
            args,
            &AxesSpec::PerLeaf(in_axes.clone()),
            &AxesSpec::PerLeaf(out_axes.iter().map(|&a| Some(a)).collect()),
        )
    }
}

pub(crate) fn vmap_impl(
    f: &dyn Fn(&[Array]) -> Result<Vec<Array>>,
    args: &[Array],
    in_axes: &AxesSpec,
    out_axes: &AxesSpec,
) -> Result<Vec<Array>> {
    let axes = in_axes.for_leaves(args.len(), "input axes")?;
    let mut size: Option<i32> = None;
    let mut batched: Vec<Option<Array>> = Vec::with_capacity(args.len());
    for (a, ax) in args.iter().zip(&axes) {
        if let Some(e) = a.error() {
            return Err(e);
        }
        match ax {
            None => batched.push(None),
            Some(ax) => {
                let n = a.ndim() as i32;
                if *ax < -n || *ax >= n {
                    return Err(Error::InvalidArgument(format!(
                        "vmap: input axis {ax} is out of range for an array of shape {:?}",
                        a.shape()
                    )));
                }
                let moved = a.moveaxis(*ax, 0);
                let b = moved.shape()[0];
                if size.is_some_and(|s| s != b) {
                    return Err(Error::InvalidArgument(format!(
                        "vmap: inputs map over axes of different sizes ({} and {b})",
                        size.unwrap_or(0)
                    )));
                }
                size = Some(b);
                batched.push(Some(moved));
            }
        }
    }
    let b = size.ok_or_else(|| Error::InvalidArgument("vmap: no input is mapped".into()))?;
    let trace = Trace::start();
    // One item of each mapped input stands in for all of them while `f` records its graph.
    let mut placeholders = Vec::with_capacity(args.len());
    for (a, m) in args.iter().zip(&batched) {
        placeholders.push(match m {
            Some(moved) => {
                let mut stop = moved.shape().to_vec();
                stop[0] = b.min(1);
                tracer(&moved.slice(&vec![0; moved.ndim()], &stop, &[]).squeeze(0))
            }
            None => tracer(a),
        });
    }
    let outputs = f(&placeholders)?;
    if let Some(e) = outputs.iter().find_map(|o| o.error()) {
        return Err(e);
    }
    let leaves: Vec<Array> =
        placeholders.iter().zip(&batched).filter(|(_, m)| m.is_some()).map(|(p, _)| p.clone()).collect();
    let tape = Tape::record(&outputs, &leaves);
    // Batched value (batch on axis 0) of every array that depends on a mapped input.
    let mut values: HashMap<Key, Array> = HashMap::new();
    for (p, m) in placeholders.iter().zip(&batched) {
        if let Some(moved) = m {
            values.insert(key(p), moved.clone());
        }
    }
    for (node, seen) in &tape.nodes {
        let ins: Vec<(Array, bool)> = node
            .inputs
            .iter()
            .map(|i| match values.get(&key(i)) {
                Some(v) => (v.clone(), true),
                None => (i.clone(), false),
            })
            .collect();
        if ins.iter().all(|(_, m)| !m) {
            continue;
        }
        let outs = node_outputs(node, seen);
        let (xs, mapped): (Vec<Array>, Vec<bool>) = ins.into_iter().unzip();
        for (o, (v, m)) in outs.iter().zip(node.primitive.vmap(&xs, &mapped, &outs)) {
            if m {
                values.insert(key(o), v);
            }
        }
    }
    drop(trace);
    let out_axes = out_axes.for_leaves(outputs.len(), "output axes")?;
    outputs
        .iter()
        .zip(out_axes)
        .map(|(o, ax)| {
            let ax = ax.unwrap_or(0);
            let rank = o.ndim() as i32 + 1;
            if ax < -rank || ax >= rank {
                return Err(Error::InvalidArgument(format!(
                    "vmap: output axis {ax} is out of range for a batched output of {rank} dimensions"
                )));
            }
            Ok(match values.get(&key(o)) {
                Some(v) => v.moveaxis(0, ax),
                // An output that does not depend on the mapped inputs repeats along the batch.
                None => {
                    let mut shape: Vec<i32> = std::iter::once(b).chain(o.shape().iter().copied()).collect();
                    let e = o.expand_dims(0);
                    shape[0] = b;
                    e.broadcast_to(shape).moveaxis(0, ax)
                }
            })
        })
        .collect()
}

/// A vectorizing map over trees (see [`vmap`]).
pub struct Vmap<F> {
    f: F,
    in_axes: AxesSpec,
    out_axes: AxesSpec,
}

/// Vectorizes `f` (written for one item) over an axis of its inputs: by default axis 0 of
/// every input leaf, results stacked on axis 0. Set `in_axes` / `out_axes` per leaf.
///
/// ```
/// use nuvec::{array, transforms::vmap, Array};
/// let norms = vmap(|x: &Array| (x * x).sum(..).sqrt());
/// let n = norms.call(&array![[3.0, 4.0], [6.0, 8.0]]).unwrap();
/// assert_eq!(n.to_vec::<f32>().unwrap(), vec![5.0, 10.0]);
/// ```
pub fn vmap<I, O, F, R>(f: F) -> Vmap<F>
where
    I: Tree,
    O: Tree,
    F: Fn(&I) -> R,
    R: IntoResult<Ok = O>,
{
    Vmap { f, in_axes: AxesSpec::All(Some(0)), out_axes: AxesSpec::All(Some(0)) }
}

impl<F> Vmap<F> {
    /// Axes mapped over in the inputs (one for all leaves, or one per leaf; `None`: shared).
    pub fn in_axes(mut self, axes: impl Into<AxesSpec>) -> Self {
        self.in_axes = axes.into();
        self
    }

    /// Axes of the outputs that hold the batch.
    pub fn out_axes(mut self, axes: impl Into<AxesSpec>) -> Self {
        self.out_axes = axes.into();
        self
    }

    /// Runs the mapped function.
    pub fn call<I, O, R>(&self, input: &I) -> Result<O>
    where
        I: Tree,
        O: Tree,
        F: Fn(&I) -> R,
        R: IntoResult<Ok = O>,
    {
        let shape: std::cell::RefCell<Option<O>> = std::cell::RefCell::new(None);
        let f = |xs: &[Array]| -> Result<Vec<Array>> {
            let o = (self.f)(&input.with_leaves(xs.to_vec())).into_result()?;
            let leaves = o.flatten();
            *shape.borrow_mut() = Some(o);
            Ok(leaves)
        };
        let outs = vmap_impl(&f, &input.flatten(), &self.in_axes, &self.out_axes)?;
        let shape =
            shape.into_inner().ok_or_else(|| Error::InvalidArgument("vmap: the function did not run".into()))?;
        Ok(shape.with_leaves(outs))
    }
}
