//! Element-wise fusion on a traced graph: chains and trees of unary, binary, `where` and cast
//! nodes of one shape become one `Primitive::Compiled` node. Also the compiled program's side
//! of evaluation and the transforms: its steps as ordinary primitives (the composition), and
//! its derivative and batching rules.

use std::collections::HashMap;
use std::sync::Arc;

use crate::array::Array;
use crate::primitive::Primitive;
use crate::primitive::compiled::{Compiled, Program, Step};
use crate::primitive::rules::{batch_size, batched};
use crate::storage::Spec;
use crate::transforms::{jvp_flat, vjp_flat};

use super::graph::{Graph, GraphNode, Ref};

fn step_of(p: &Primitive, args: &[usize]) -> Step {
    match *p {
        Primitive::Unary(op) => Step::Unary(op, args[0]),
        Primitive::Binary(op) => Step::Binary(op, args[0], args[1]),
        Primitive::Select => Step::Select(args[0], args[1], args[2]),
        Primitive::AsType(d) => Step::AsType(d, args[0]),
        _ => unreachable!("only element-wise nodes become steps"),
    }
}

fn elementwise(n: &GraphNode) -> bool {
    matches!(n.primitive, Primitive::Unary(_) | Primitive::Binary(_) | Primitive::Select | Primitive::AsType(_))
        && n.outputs.len() == 1
}

/// Fuses the graph's element-wise regions in place. A region may take a node when everything
/// its nodes read from outside it was computed before its first node (or is an input or a
/// constant): the fused node then takes the place of the region's first node, with all it
/// reads already computed, and nothing computed later can feed it. A node joins all the
/// regions of its element-wise inputs at once when the merged region keeps that rule, else the
/// latest one that keeps it, else starts its own. Regions of one node stay as they are.
pub(crate) fn fuse(graph: &mut Graph) {
    let n = graph.nodes.len();
    // region[i]: the region of node i, named by its first node; members by region.
    let mut region: Vec<Option<usize>> = vec![None; n];
    let mut members: HashMap<usize, Vec<usize>> = HashMap::new();
    // Whether every node of `group` reads, from outside `group`, only inputs, constants and
    // nodes before `start`.
    let closed = |group: &[usize], start: usize, region: &[Option<usize>], inside: &dyn Fn(Option<usize>) -> bool| {
        group.iter().all(|&m| {
            graph.nodes[m].inputs.iter().all(|r| match *r {
                Ref::Node(k, _) => k < start || inside(region[k]),
                _ => true,
            })
        })
    };
    for i in 0..n {
        let node = &graph.nodes[i];
        if !elementwise(node) {
            continue;
        }
        let shape = &node.outputs[0].shape;
        let mut candidates: Vec<usize> = node
            .inputs
            .iter()
            .filter_map(|r| if let Ref::Node(j, _) = *r { region[j] } else { None })
            .filter(|&start| graph.nodes[start].outputs[0].shape == *shape)
            .collect();
        candidates.sort_unstable();
        candidates.dedup();
        let mut chosen: Option<Vec<usize>> = None;
        if let Some(&first) = candidates.first() {
            // All of them merged with the node.
            let mut group: Vec<usize> = candidates.iter().flat_map(|c| members[c].iter().copied()).collect();
            group.push(i);
            if closed(&group, first, &region, &|r| r.is_some_and(|r| candidates.contains(&r))) {
                chosen = Some(candidates.clone());
            } else if let Some(&c) = candidates.iter().rev().find(|&&c| closed(&[i], c, &region, &|r| r == Some(c))) {
                chosen = Some(vec![c]);
            }
        }
        match chosen {
            Some(join) => {
                let start = join[0];
                for &c in &join[1..] {
                    let moved = members.remove(&c).unwrap_or_default();
                    for &m in &moved {
                        region[m] = Some(start);
                    }
                    members.entry(start).or_default().extend(moved);
                }
                region[i] = Some(start);
                members.entry(start).or_default().push(i);
            }
            None => {
                region[i] = Some(i);
                members.insert(i, vec![i]);
            }
        }
    }
    // Steps in the graph's order.
    for group in members.values_mut() {
        group.sort_unstable();
    }
    let fused = |i: usize| region[i].is_some_and(|r| members[&r].len() > 1);
    // Which members are read outside their region (by later nodes or as graph outputs).
    let mut used_outside = vec![false; n];
    for (i, node) in graph.nodes.iter().enumerate() {
        for r in &node.inputs {
            if let Ref::Node(j, _) = *r
                && region[j] != region[i]
            {
                used_outside[j] = true;
            }
        }
    }
    for r in &graph.outputs {
        if let Ref::Node(j, _) = *r {
            used_outside[j] = true;
        }
    }
    // Rebuild in order: each region's fused node at its first node's place.
    let old = std::mem::take(&mut graph.nodes);
    // Old node -> (new node, which output of it, when the old node was fused).
    let mut moved: Vec<(usize, Option<usize>)> = vec![(usize::MAX, None); n];
    let fix = |r: &Ref, moved: &[(usize, Option<usize>)]| -> Ref {
        match *r {
            Ref::Node(j, k) => match moved[j] {
                (t, Some(out)) => Ref::Node(t, out),
                (t, None) => Ref::Node(t, k),
            },
            ref other => other.clone(),
        }
    };
    let mut nodes: Vec<GraphNode> = Vec::with_capacity(n);
    for (i, node) in old.iter().enumerate() {
        if !fused(i) {
            let inputs = node.inputs.iter().map(|r| fix(r, &moved)).collect();
            moved[i] = (nodes.len(), None);
            nodes.push(GraphNode { primitive: node.primitive.clone(), inputs, outputs: node.outputs.clone() });
        } else if region[i] == Some(i) {
            let group = &members[&i];
            let (program, externals, outs) = build(&old, &graph.inputs, group, &used_outside);
            let at = nodes.len();
            for (k, &m) in outs.iter().enumerate() {
                moved[m] = (at, Some(k));
            }
            let shape = old[i].outputs[0].shape.clone();
            let outputs =
                program.outputs.iter().map(|&v| Spec { shape: shape.clone(), dtype: program.dtype(v) }).collect();
            let inputs = externals.iter().map(|r| fix(r, &moved)).collect();
            nodes.push(GraphNode { primitive: Primitive::Compiled(Compiled(Arc::new(program))), inputs, outputs });
        }
    }
    graph.outputs = graph.outputs.iter().map(|r| fix(r, &moved)).collect();
    graph.nodes = nodes;
}

fn spec_in(inputs: &[Spec], nodes: &[GraphNode], r: &Ref) -> Spec {
    match r {
        Ref::Input(i) => inputs[*i].clone(),
        Ref::Const(a) => a.spec(),
        Ref::Node(j, k) => nodes[*j].outputs[*k].clone(),
    }
}

/// The program of a region (`group`, in order), the external inputs it reads, and the members
/// it returns.
fn build(
    old: &[GraphNode],
    inputs: &[Spec],
    group: &[usize],
    used_outside: &[bool],
) -> (Program, Vec<Ref>, Vec<usize>) {
    // Values: the external inputs first, then one per member.
    let mut externals: Vec<Ref> = Vec::new();
    let mut input_dtypes = Vec::new();
    let member: HashMap<usize, usize> = group.iter().enumerate().map(|(s, &m)| (m, s)).collect();
    let inside = |r: &Ref| matches!(r, Ref::Node(j, _) if member.contains_key(j));
    for &m in group {
        for r in &old[m].inputs {
            if !inside(r) && !externals.contains(r) {
                externals.push(r.clone());
                input_dtypes.push(spec_in(inputs, old, r).dtype);
            }
        }
    }
    let k = externals.len();
    let value_of = |j: usize| k + member[&j];
    let steps = group
        .iter()
        .map(|&m| {
            let args: Vec<usize> = old[m]
                .inputs
                .iter()
                .map(|r| match r {
                    Ref::Node(j, _) if inside(r) => value_of(*j),
                    r => externals.iter().position(|e| e == r).expect("every external input is listed"),
                })
                .collect();
            (step_of(&old[m].primitive, &args), old[m].outputs[0].dtype)
        })
        .collect();
    let outs: Vec<usize> = group.iter().copied().filter(|&m| used_outside[m]).collect();
    let program = Program { inputs: input_dtypes, steps, outputs: outs.iter().map(|&m| value_of(m)).collect() };
    (program, externals, outs)
}

// The compiled program's side of evaluation and the transforms.
impl Compiled {
    /// The program as its ordinary primitives, on `x` (the composition).
    pub(crate) fn steps(&self, x: &[Array]) -> Vec<Array> {
        let p = &self.0;
        let mut v: Vec<Array> = x.to_vec();
        for (step, _) in &p.steps {
            let y = match *step {
                Step::Unary(op, a) => Array::from_op(op.name(), Primitive::Unary(op), vec![v[a].clone()]),
                Step::Binary(op, a, b) => {
                    Array::from_op(op.name(), Primitive::Binary(op), vec![v[a].clone(), v[b].clone()])
                }
                Step::Select(c, a, b) => {
                    Array::from_op("where", Primitive::Select, vec![v[c].clone(), v[a].clone(), v[b].clone()])
                }
                Step::AsType(d, a) => Array::from_op("astype", Primitive::AsType(d), vec![v[a].clone()]),
            };
            v.push(y);
        }
        p.outputs.iter().map(|&o| v[o].clone()).collect()
    }

    pub(crate) fn vjp(&self, x: &[Array], g: &[Array]) -> Vec<Option<Array>> {
        let op = self.clone();
        match vjp_flat(move |xs| Ok(op.steps(xs)), x, g) {
            Ok((_, d)) => d.into_iter().map(Some).collect(),
            Err(e) => vec![Some(Array::from_error(e)); x.len()],
        }
    }

    pub(crate) fn jvp(&self, x: &[Array], t: &[Option<Array>]) -> Vec<Option<Array>> {
        let tangents: Vec<Array> = t.iter().zip(x).map(|(t, x)| t.clone().unwrap_or_else(|| x.zeros_like())).collect();
        let op = self.clone();
        match jvp_flat(move |xs| Ok(op.steps(xs)), x, &tangents) {
            Ok((_, t)) => t.into_iter().map(Some).collect(),
            Err(e) => vec![Some(Array::from_error(e)); self.0.outputs.len()],
        }
    }

    /// Batched: the unbatched inputs are broadcast along the batch axis (views), and the
    /// program runs fused on the batched shape. (A vmap rule runs only when some input is
    /// mapped.)
    pub(crate) fn vmap(&self, x: &[Array], mapped: &[bool]) -> Vec<(Array, bool)> {
        let b = batch_size(x, mapped);
        let inputs: Vec<Array> = x.iter().zip(mapped).map(|(a, &m)| batched(a, m, b)).collect();
        Array::from_op_multi("compiled", Primitive::Compiled(self.clone()), inputs)
            .into_iter()
            .map(|o| (o, true))
            .collect()
    }
}
