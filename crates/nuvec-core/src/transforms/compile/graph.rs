//! A traced function as data: the nodes between its inputs and its outputs, in order, which a
//! compiled function simplifies once and then replays on new inputs.

use std::collections::HashMap;
use std::sync::Arc;

use crate::array::{Array, Node, State};
use crate::primitive::Primitive;
use crate::storage::Spec;
use crate::transforms::Tape;

/// Where a node's input (or the graph's output) comes from.
#[derive(Clone)]
pub(crate) enum Ref {
    /// The function's `i`-th input.
    Input(usize),
    /// An array that does not depend on the inputs: captured from the environment, or a part
    /// of the graph computed once (constant folding) and kept with the graph.
    Const(Array),
    /// Output `k` of node `j`.
    Node(usize, usize),
}

impl PartialEq for Ref {
    fn eq(&self, other: &Ref) -> bool {
        match (self, other) {
            (Ref::Input(a), Ref::Input(b)) => a == b,
            (Ref::Const(a), Ref::Const(b)) => a.is_same(b),
            (Ref::Node(a, i), Ref::Node(b, j)) => a == b && i == j,
            _ => false,
        }
    }
}

impl Ref {
    /// A hashable identity (constants by array).
    fn id(&self) -> (u8, usize, usize) {
        match self {
            Ref::Input(i) => (0, *i, 0),
            Ref::Const(a) => (1, Arc::as_ptr(&a.inner) as *const u8 as usize, 0),
            Ref::Node(j, k) => (2, *j, *k),
        }
    }
}

/// What equal nodes share: the primitive's name and the inputs' identities.
type NodeKey = (&'static str, Vec<(u8, usize, usize)>);

/// One recorded operation.
#[derive(Clone)]
pub(crate) struct GraphNode {
    pub(crate) primitive: Primitive,
    pub(crate) inputs: Vec<Ref>,
    pub(crate) outputs: Vec<Spec>,
}

/// A traced function.
#[derive(Clone)]
pub(crate) struct Graph {
    pub(crate) inputs: Vec<Spec>,
    /// In dependency order: a node reads inputs, constants and earlier nodes only.
    pub(crate) nodes: Vec<GraphNode>,
    pub(crate) outputs: Vec<Ref>,
}

impl Graph {
    /// The graph from `tracers` (the marked inputs) to `outputs`.
    pub(crate) fn trace(outputs: &[Array], tracers: &[Array]) -> Graph {
        let tape = Tape::record(outputs, tracers);
        let mut index: HashMap<*const Node, usize> = HashMap::new();
        for (j, (node, _)) in tape.nodes.iter().enumerate() {
            index.insert(Arc::as_ptr(node), j);
        }
        let inputs: HashMap<*const crate::array::Inner, usize> =
            tracers.iter().enumerate().map(|(i, t)| (Arc::as_ptr(&t.inner), i)).collect();
        let refer = |a: &Array| -> Ref {
            if let Some(&i) = inputs.get(&Arc::as_ptr(&a.inner)) {
                return Ref::Input(i);
            }
            match a.node() {
                Some((node, k)) if index.contains_key(&Arc::as_ptr(&node)) => Ref::Node(index[&Arc::as_ptr(&node)], k),
                _ => Ref::Const(a.clone()),
            }
        };
        let nodes = tape
            .nodes
            .iter()
            .map(|(node, _)| GraphNode {
                primitive: node.primitive.clone(),
                inputs: node.inputs.iter().map(refer).collect(),
                outputs: node.outputs.to_vec(),
            })
            .collect();
        Graph { inputs: tracers.iter().map(Array::spec).collect(), nodes, outputs: outputs.iter().map(refer).collect() }
    }

    /// Common subexpressions: a node equal to an earlier one (same primitive, inputs and
    /// outputs) reads as that one, and equal evaluated scalar constants as one constant.
    pub(crate) fn merge_common(&mut self) {
        let mut consts: HashMap<(crate::dtype::DType, Vec<u8>), Array> = HashMap::new();
        let mut canon = |r: &Ref| -> Ref {
            let Ref::Const(a) = r else { return r.clone() };
            if a.size() != 1 || a.ndim() != 0 {
                return r.clone();
            }
            // Host scalars only: reading a device scalar would wait for the GPU.
            let bytes = match &*a.inner.lock() {
                State::Ready(d) => d.storage.host_buffer().and_then(|h| {
                    let at = d.layout.offset * a.itemsize();
                    h.bytes().get(at..at + a.itemsize()).map(<[u8]>::to_vec)
                }),
                _ => None,
            };
            match bytes {
                Some(b) => Ref::Const(consts.entry((a.dtype(), b)).or_insert_with(|| a.clone()).clone()),
                None => r.clone(),
            }
        };
        let mut seen: HashMap<NodeKey, Vec<usize>> = HashMap::new();
        let mut same_as: Vec<usize> = Vec::with_capacity(self.nodes.len());
        let fix = |r: &Ref, same_as: &[usize]| match r {
            Ref::Node(j, k) => Ref::Node(same_as[*j], *k),
            other => other.clone(),
        };
        for j in 0..self.nodes.len() {
            let inputs: Vec<Ref> = self.nodes[j].inputs.iter().map(|r| canon(&fix(r, &same_as))).collect();
            self.nodes[j].inputs = inputs;
            let node = &self.nodes[j];
            let key = (node.primitive.name(), node.inputs.iter().map(Ref::id).collect::<Vec<_>>());
            let candidates = seen.entry(key).or_default();
            let twin = candidates.iter().copied().find(|&c| {
                let other = &self.nodes[c];
                other.primitive == node.primitive && other.outputs == node.outputs
            });
            match twin {
                Some(c) if deterministic(&node.primitive) => same_as.push(c),
                _ => {
                    candidates.push(j);
                    same_as.push(j);
                }
            }
        }
        self.outputs = self.outputs.iter().map(|r| canon(&fix(r, &same_as))).collect();
        self.prune();
    }

    /// Drops the nodes no output depends on, renumbering the rest.
    pub(crate) fn prune(&mut self) {
        let mut live = vec![false; self.nodes.len()];
        let mark = |r: &Ref, live: &mut Vec<bool>| {
            if let Ref::Node(j, _) = r {
                live[*j] = true;
            }
        };
        for r in &self.outputs {
            mark(r, &mut live);
        }
        for j in (0..self.nodes.len()).rev() {
            if live[j] {
                for r in &self.nodes[j].inputs {
                    mark(r, &mut live);
                }
            }
        }
        let mut new_index = vec![usize::MAX; self.nodes.len()];
        let mut kept = Vec::new();
        for (j, node) in std::mem::take(&mut self.nodes).into_iter().enumerate() {
            if live[j] {
                new_index[j] = kept.len();
                kept.push(node);
            }
        }
        let fix = |r: &mut Ref| {
            if let Ref::Node(j, _) = r {
                *j = new_index[*j];
            }
        };
        for node in &mut kept {
            node.inputs.iter_mut().for_each(fix);
        }
        self.outputs.iter_mut().for_each(fix);
        self.nodes = kept;
    }

    /// Records the graph again on `args`. Shapes come from the trace, or (`shapeless`) from
    /// each primitive's shape rule on the new inputs, with the sizes a broadcast or reshape
    /// fixed at trace time replaced by the sizes the inputs now have in their place. A replay
    /// that does not fit gives failed arrays.
    pub(crate) fn replay(&self, args: &[Array], shapeless: bool) -> Vec<Array> {
        let sizes = if shapeless {
            match self.new_sizes(args) {
                Some(s) => s,
                None => {
                    let e =
                        crate::error::Error::InvalidArgument("compile: inputs' sizes disagree with the trace".into());
                    return vec![Array::from_error(e); self.outputs.len()];
                }
            }
        } else {
            HashMap::new()
        };
        let resize = |shape: &crate::shape::Shape| -> crate::shape::Shape {
            shape.iter().map(|d| *sizes.get(d).unwrap_or(d)).collect()
        };
        let refit = |p: &Primitive| -> Primitive {
            match p {
                Primitive::Broadcast(s) if shapeless => Primitive::Broadcast(resize(s)),
                Primitive::Reshape(s) if shapeless => Primitive::Reshape(resize(s)),
                p => p.clone(),
            }
        };
        let mut values: Vec<Vec<Array>> = Vec::with_capacity(self.nodes.len());
        let get = |r: &Ref, values: &[Vec<Array>]| -> Array {
            match r {
                Ref::Input(i) => args[*i].clone(),
                // A constant broadcast (a weak scalar, say) takes the new sizes too.
                Ref::Const(a) if shapeless => match a.node() {
                    Some((node, 0)) if matches!(node.primitive, Primitive::Broadcast(_)) => {
                        Array::from_op_multi("broadcast_to", refit(&node.primitive), node.inputs.clone()).remove(0)
                    }
                    _ => a.clone(),
                },
                Ref::Const(a) => a.clone(),
                Ref::Node(j, k) => values[*j][*k].clone(),
            }
        };
        for node in &self.nodes {
            let inputs: Vec<Array> = node.inputs.iter().map(|r| get(r, &values)).collect();
            let mut outs = if shapeless {
                Array::from_op_multi(node.primitive.name(), refit(&node.primitive), inputs)
            } else {
                Array::from_node(node.primitive.clone(), inputs, node.outputs.clone())
            };
            if outs.len() < node.outputs.len() {
                let failed = outs.pop().unwrap_or_default();
                outs = vec![failed; node.outputs.len()];
            }
            values.push(outs);
        }
        self.outputs.iter().map(|r| get(r, &values)).collect()
    }

    /// Each traced size (other than 1) with the size `args` now have in its place, or `None`
    /// when one traced size now stands for two.
    fn new_sizes(&self, args: &[Array]) -> Option<HashMap<i32, i32>> {
        let mut sizes = HashMap::new();
        for (spec, a) in self.inputs.iter().zip(args) {
            for (&t, &n) in spec.shape.iter().zip(a.shape()) {
                if t != 1 && *sizes.entry(t).or_insert(n) != n {
                    return None;
                }
            }
        }
        Some(sizes)
    }
}

/// Whether two nodes with equal primitives and inputs always compute the same thing.
fn deterministic(p: &Primitive) -> bool {
    // A custom kernel may keep state or read memory its inputs do not name.
    !matches!(p, Primitive::CustomKernel(_))
}

impl std::fmt::Display for Graph {
    /// One line per node, e.g. `n1 = exp(in0) : float32[4, 8]`; a fused node lists its program.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let name = |r: &Ref| match r {
            Ref::Input(i) => format!("in{i}"),
            Ref::Const(a) => format!("const{:?}", a.shape()),
            Ref::Node(j, 0) => format!("n{j}"),
            Ref::Node(j, k) => format!("n{j}.{k}"),
        };
        for (j, node) in self.nodes.iter().enumerate() {
            let args: Vec<String> = node.inputs.iter().map(name).collect();
            let outs: Vec<String> =
                node.outputs.iter().map(|s| format!("{}{:?}", s.dtype.name(), s.shape.as_slice())).collect();
            writeln!(f, "n{j} = {}({}) : {}", node.primitive.name(), args.join(", "), outs.join(", "))?;
            if let Primitive::Compiled(c) = &node.primitive {
                for line in c.0.to_string().lines() {
                    writeln!(f, "    {line}")?;
                }
            }
        }
        let outs: Vec<String> = self.outputs.iter().map(name).collect();
        write!(f, "outputs: {}", outs.join(", "))
    }
}
