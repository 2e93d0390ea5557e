//! Inlining the branch an `If` takes when its condition folds to a constant, and unrolling
//! a `Loop` whose trip count does.
//!
//! Exporters guard shape-dependent code with `If` (a sequence of length 1 is squeezed, a
//! stride of one sample skipped): once the inputs are bound, the condition is a known
//! scalar and the `If` is the branch it takes. The graph is rebuilt in topological order
//! with that branch's nodes in place of the `If` and one `Identity` per output, which keeps
//! the output's name and declared type; branches nested in the taken one are inlined in the
//! next round, when their own conditions can be inferred. An `If` whose condition stays
//! unknown is left in place for the verifier to report.
//!
//! TensorFlow's exporter writes every recurrent layer as a `Loop` over the time steps whose
//! condition compares a carried step counter with the sequence length: once the length is
//! bound, each round decides whether one more iteration runs. It runs: the body's nodes
//! are placed before a `Loop` that does the rest, reading the iteration's carried values
//! and condition. It stops: each carried value is the `Loop`'s output, and each scan output
//! is its iterations' values stacked (`Unsqueeze` and `Concat` on a new first axis).

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use crate::dtype::DType;
use crate::graph::{Graph, Provenance};
use crate::ids::{NodeId, ValueId};
use crate::infer::infer_all;
use crate::op::{BranchNode, LoopBody, Op};
use crate::tensor::{Storage, TensorData};

/// Deeper nesting than this is left to the verifier (ONNX sets no limit; exporters nest a
/// few levels).
const MAX_ROUNDS: usize = 64;

/// Iterations unrolled at most, over every `Loop` of a graph (a sequence of a few
/// thousand steps); a longer loop is left for the verifier to report.
const MAX_ITERATIONS: usize = 4096;

/// Nodes a graph may grow to by unrolling: past this, what is left of a loop stays for
/// the verifier to report (a huge body run many times would take memory without bound).
const MAX_UNROLLED_NODES: usize = 1 << 20;

/// What a round does to an `If` or a `Loop` it decided.
#[derive(Clone, Copy, Debug)]
enum Decision {
    /// The branch taken.
    Branch(bool),
    /// `times` more iterations, and what is left of the trip count after them (`None`:
    /// no limit). The first is known to run; each later one runs on the condition the one
    /// before returns, assumed true and checked in the next round ([`inline_taken`]).
    Iterate { left: Option<i64>, times: i64 },
    /// No more iterations.
    Finish,
}

/// Replaces every `If` whose condition folds by the branch it takes, and every `Loop` whose
/// trip count folds by its iterations, nested ones included.
///
/// A round re-infers the whole graph, so unrolling one iteration a round made a loop of
/// `n` iterations cost `n` inferences of a graph that grows with them (4,096 iterations:
/// minutes). A loop that keeps running unrolls as many iterations as it has so far, so
/// rounds double what is unrolled; the conditions between them are assumed true, and if
/// the next round finds one that is not, the graph goes back to before that round and
/// unrolls one iteration a round from there.
pub(crate) fn inline_taken(graph: &mut Graph) {
    let mut rounds = 0;
    let mut speculate = true;
    // The graph before a round that assumed conditions true, and those conditions.
    let mut undo: Option<(Graph, Vec<ValueId>)> = None;
    while rounds < MAX_ROUNDS + MAX_ITERATIONS {
        if !graph
            .node_ids()
            .any(|n| matches!(graph.node(n).op, Op::If(_) | Op::Loop(_)))
        {
            return;
        }
        let Ok(order) = graph.topo_order() else {
            return;
        };
        let (types, _) = infer_all(graph, &order);
        let known = |v: Option<ValueId>| -> Option<f64> {
            match types[v?.index()].as_ref()?.content.as_deref()? {
                [c] => c.as_f64(),
                _ => None,
            }
        };
        if let Some((before, assumed)) = undo.take() {
            if !assumed
                .iter()
                .all(|&v| known(Some(v)).is_some_and(|c| c != 0.0))
            {
                *graph = before;
                speculate = false;
                rounds += 1;
                continue;
            }
        }
        let decided: BTreeMap<NodeId, Decision> = order
            .iter()
            .filter_map(|&n| {
                let node = graph.node(n);
                let input = |slot: usize| node.inputs.get(slot).copied().flatten();
                match &node.op {
                    Op::If(_) => Some((n, Decision::Branch(known(input(0))? != 0.0))),
                    Op::Loop(body) => {
                        let limit = match input(0) {
                            Some(_) => Some(known(input(0))? as i64),
                            None => None,
                        };
                        let go = match input(1) {
                            Some(_) => known(input(1))? != 0.0,
                            None => true,
                        };
                        let stop = !go || limit.is_some_and(|m| m <= 0);
                        match (stop, body.scans() > 0 && body.done == 0) {
                            // Nothing to stack: left for the verifier.
                            (true, true) => None,
                            (true, false) => Some((n, Decision::Finish)),
                            (false, _)
                                if body.done as usize >= MAX_ITERATIONS
                                    || order.len() > MAX_UNROLLED_NODES =>
                            {
                                None
                            }
                            (false, _) => {
                                let room = (MAX_UNROLLED_NODES - order.len())
                                    / body.body.nodes.len().max(1);
                                let times = if speculate {
                                    body.done
                                        .min(limit.unwrap_or(i64::MAX))
                                        .min(MAX_ITERATIONS as i64 - body.done)
                                        .min(room as i64)
                                        .max(1)
                                } else {
                                    1
                                };
                                let left = limit.map(|m| m - times);
                                Some((n, Decision::Iterate { left, times }))
                            }
                        }
                    }
                    _ => None,
                }
            })
            .collect();
        if decided.is_empty() {
            return;
        }
        rounds += 1;
        let (next, assumed) = rebuilt(graph, &order, &decided);
        let before = std::mem::replace(graph, next);
        if !assumed.is_empty() {
            undo = Some((before, assumed));
        }
    }
}

/// `old` in `order`, each `If` of `taken` replaced by the branch it takes, each `Loop` by
/// one more iteration or its outputs.
/// Also the loop conditions it assumed true ([`Decision::Iterate`]).
fn rebuilt(
    old: &Graph,
    order: &[NodeId],
    taken: &BTreeMap<NodeId, Decision>,
) -> (Graph, Vec<ValueId>) {
    let mut assumed = Vec::new();
    let mut g = Graph::new();
    g.rebatch = old.rebatch.clone();
    // Constants only the branches not taken read are dropped with them (a weight there
    // is no weight of the model at these shapes).
    let reads: BTreeMap<NodeId, Vec<String>> = taken
        .iter()
        .filter_map(|(&n, &decision)| match (&old.node(n).op, decision) {
            (Op::If(b), Decision::Branch(cond)) => {
                let branch = if cond { &b.then_branch } else { &b.else_branch };
                Some((n, branch.free_names()))
            }
            _ => None,
        })
        .collect();
    let read_after = |v: ValueId| {
        old.outputs().contains(&v)
            || old.consumers(v).iter().any(|(c, _)| {
                reads
                    .get(c)
                    .is_none_or(|names| names.contains(&old.value(v).name))
            })
    };
    let mut map: Vec<Option<ValueId>> = vec![None; old.value_count()];
    let define = |g: &mut Graph, map: &mut [Option<ValueId>], old_value: ValueId, new| {
        g.value_mut(new).declared = old.value(old_value).declared.clone();
        map[old_value.index()] = Some(new);
    };
    for &n in order {
        let node = old.node(n);
        let inputs: Vec<Option<ValueId>> = node
            .inputs
            .iter()
            .map(|v| v.and_then(|v| map[v.index()]))
            .collect();
        match (&node.op, taken.get(&n)) {
            (Op::Loop(body), Some(&decision)) => {
                let site = old.provenance(n);
                let outputs: Vec<(&str, ValueId)> = node
                    .outputs
                    .iter()
                    .map(|&v| (old.value(v).name.as_str(), v))
                    .collect();
                let made = match decision {
                    Decision::Iterate { left, times } => {
                        let run = Run { left, times };
                        iterate(&mut g, body, site, &inputs, run, &outputs, &mut assumed)
                    }
                    _ => finish(&mut g, body, site, &inputs, &outputs),
                };
                for (out, v) in node.outputs.iter().zip(made) {
                    define(&mut g, &mut map, *out, v);
                }
            }
            (Op::If(branches), Some(&Decision::Branch(cond))) => {
                let branch = if cond {
                    &branches.then_branch
                } else {
                    &branches.else_branch
                };
                let mut scope: HashMap<&str, ValueId> = branches
                    .captures
                    .iter()
                    .zip(inputs.iter().skip(1))
                    .filter_map(|(name, v)| Some((name.as_str(), (*v)?)))
                    .collect();
                place(&mut g, &branch.nodes, &mut scope, None);
                let site = old.provenance(n);
                for (&out, ret) in node.outputs.iter().zip(&branch.outputs) {
                    let name = old.value(out).name.as_str();
                    let prov = Provenance {
                        name: site.name.clone(),
                        op_type: "Identity".into(),
                        module: String::new(),
                    };
                    let id = g.add_node(Op::Identity, prov, &[name]);
                    g.set_inputs(id, vec![scope.get(ret.as_str()).copied()]);
                    let v = g.node(id).outputs[0];
                    define(&mut g, &mut map, out, v);
                }
            }
            (Op::Constant { .. }, _)
                if node
                    .outputs
                    .iter()
                    .all(|&v| !old.consumers(v).is_empty() && !read_after(v)) => {}
            _ => {
                let names: Vec<&str> = node
                    .outputs
                    .iter()
                    .map(|&v| old.value(v).name.as_str())
                    .collect();
                let id = g.add_node(node.op.clone(), old.provenance(n).clone(), &names);
                g.set_inputs(id, inputs);
                for (&out, &v) in node.outputs.iter().zip(&g.node(id).outputs.clone()) {
                    define(&mut g, &mut map, out, v);
                }
            }
        }
    }
    g.set_outputs(
        old.outputs()
            .iter()
            .filter_map(|v| map[v.index()])
            .collect(),
    );
    (g, assumed)
}

/// A constant node named `name` holding one `i64` (or one boolean).
fn scalar(g: &mut Graph, name: &str, value: i64, dtype: DType) -> ValueId {
    let bytes = match dtype {
        DType::Bool => vec![u8::from(value != 0)],
        _ => value.to_le_bytes().to_vec(),
    };
    let tensor = TensorData {
        dtype,
        dims: Vec::new(),
        storage: Storage::Inline(Arc::new(bytes)),
    };
    let prov = Provenance {
        name: name.to_owned(),
        op_type: "Constant".into(),
        module: String::new(),
    };
    let id = g.add_node(
        Op::Constant {
            tensor: Arc::new(tensor),
            initializer: false,
        },
        prov,
        &[name],
    );
    g.node(id).outputs[0]
}

/// The loop's node inputs: trip count, condition, carried, captures, scanned so far.
struct LoopInputs<'a> {
    carried: &'a [Option<ValueId>],
    captures: &'a [Option<ValueId>],
    scanned: &'a [Option<ValueId>],
}

fn loop_inputs<'a>(body: &LoopBody, inputs: &'a [Option<ValueId>]) -> LoopInputs<'a> {
    let k = body.carried();
    let c = body.captures.len();
    let at = |from: usize, to: usize| &inputs[from.min(inputs.len())..to.min(inputs.len())];
    LoopInputs {
        carried: at(2, 2 + k),
        captures: at(2 + k, 2 + k + c),
        scanned: at(2 + k + c, inputs.len()),
    }
}

/// How many iterations a round unrolls, and the trip count left after them.
#[derive(Clone, Copy)]
struct Run {
    left: Option<i64>,
    times: i64,
}

/// `run.times` iterations of `body` placed in `g`, then a `Loop` for the rest; returns the
/// values that stand for the loop's `outputs` (the rest's). The conditions the later
/// iterations run on are pushed to `assumed`.
fn iterate(
    g: &mut Graph,
    body: &LoopBody,
    site: &Provenance,
    inputs: &[Option<ValueId>],
    run: Run,
    outputs: &[(&str, ValueId)],
    assumed: &mut Vec<ValueId>,
) -> Vec<ValueId> {
    let mut body = body.clone();
    let mut inputs = inputs.to_vec();
    for _ in 1..run.times {
        inputs = iteration(g, &body, site, &inputs, None);
        if let Some(cond) = inputs.get(1).copied().flatten() {
            assumed.push(cond);
        }
        body.done += 1;
    }
    let rest_inputs = iteration(g, &body, site, &inputs, run.left);
    let rest = LoopBody {
        done: body.done + 1,
        ..body
    };
    let names: Vec<&str> = outputs.iter().map(|(name, _)| *name).collect();
    let id = g.add_node(Op::Loop(Arc::new(rest)), site.clone(), &names);
    g.set_inputs(id, rest_inputs);
    g.node(id).outputs.clone()
}

/// One iteration of `body` (number `body.done`) placed in `g` on the loop's `inputs`;
/// returns the inputs of a `Loop` for the rest, with `left` as its trip count.
fn iteration(
    g: &mut Graph,
    body: &LoopBody,
    site: &Provenance,
    inputs: &[Option<ValueId>],
    left: Option<i64>,
) -> Vec<Option<ValueId>> {
    let parts = loop_inputs(body, inputs);
    let step = body.done;
    let prefix = format!("{}/iteration{step}", site.name);
    let mut scope: HashMap<&str, ValueId> = HashMap::new();
    let counter = scalar(g, &format!("{prefix}/number"), step, DType::I64);
    if let Some(name) = body.inputs.first() {
        scope.insert(name, counter);
    }
    let cond = match inputs.get(1).copied().flatten() {
        Some(v) => v,
        None => scalar(g, &format!("{prefix}/condition"), 1, DType::Bool),
    };
    if let Some(name) = body.inputs.get(1) {
        scope.insert(name, cond);
    }
    for (name, v) in body.inputs.iter().skip(2).zip(parts.carried) {
        if let Some(v) = v {
            scope.insert(name, *v);
        }
    }
    for (name, v) in body.captures.iter().zip(parts.captures) {
        if let Some(v) = v {
            scope.insert(name, *v);
        }
    }
    place(g, &body.body.nodes, &mut scope, Some(&prefix));
    let returned: Vec<Option<ValueId>> = body
        .body
        .outputs
        .iter()
        .map(|o| scope.get(o.as_str()).copied())
        .collect();
    let limit = left.map(|m| scalar(g, &format!("{prefix}/left"), m, DType::I64));
    let (k, scans) = (body.carried(), body.scans());
    std::iter::once(limit)
        .chain(returned.iter().take(1 + k).copied())
        .chain(parts.captures.iter().copied())
        .chain(parts.scanned.iter().copied())
        .chain(returned.iter().skip(1 + k).take(scans).copied())
        .collect()
}

/// The loop's outputs once no iteration is left: each carried value as it stands, each
/// scan output its iterations' values stacked on a new first axis.
fn finish(
    g: &mut Graph,
    body: &LoopBody,
    site: &Provenance,
    inputs: &[Option<ValueId>],
    outputs: &[(&str, ValueId)],
) -> Vec<ValueId> {
    let parts = loop_inputs(body, inputs);
    let (k, scans) = (body.carried(), body.scans());
    // Each node named for the output it makes: a layer's name must say which it is.
    let provenance = |op_type: &str, made: &str| Provenance {
        name: format!("{}/{made}", site.name),
        op_type: op_type.into(),
        module: site.module.clone(),
    };
    let mut made = Vec::with_capacity(outputs.len());
    for (j, (name, _)) in outputs.iter().enumerate().take(k) {
        let id = g.add_node(Op::Identity, provenance("Identity", name), &[name]);
        g.set_inputs(id, vec![parts.carried.get(j).copied().flatten()]);
        made.push(g.node(id).outputs[0]);
    }
    for (s, (name, _)) in outputs.iter().enumerate().skip(k).take(scans) {
        let s = s - k;
        let stacked: Vec<Option<ValueId>> = parts
            .scanned
            .iter()
            .skip(s)
            .step_by(scans.max(1))
            .enumerate()
            .map(|(i, &v)| {
                let unsqueezed = format!("{name}/{i}");
                let id = g.add_node(
                    Op::Unsqueeze {
                        axes: Some(vec![0]),
                    },
                    provenance("Unsqueeze", &unsqueezed),
                    &[&unsqueezed],
                );
                g.set_inputs(id, vec![v]);
                Some(g.node(id).outputs[0])
            })
            .collect();
        let id = g.add_node(Op::Concat { axis: 0 }, provenance("Concat", name), &[name]);
        g.set_inputs(id, stacked);
        made.push(g.node(id).outputs[0]);
    }
    made
}

/// `nodes` (a branch's or a loop body's) added to `g`, each input found in `scope` by name
/// and each output added to it; with `prefix`, node and value names are `prefix/name`
/// (one loop iteration's apart from another's).
fn place<'n>(
    g: &mut Graph,
    nodes: &'n [BranchNode],
    scope: &mut HashMap<&'n str, ValueId>,
    prefix: Option<&str>,
) {
    let named = |name: &str| match prefix {
        Some(p) => format!("{p}/{name}"),
        None => name.to_owned(),
    };
    for b in nodes {
        let names: Vec<String> = b.outputs.iter().map(|o| named(o)).collect();
        let names: Vec<&str> = names.iter().map(String::as_str).collect();
        let mut provenance = b.provenance.clone();
        provenance.name = named(&provenance.name);
        let id = g.add_node(b.op.clone(), provenance, &names);
        let ins = b
            .inputs
            .iter()
            .map(|i| scope.get(i.as_str()).copied())
            .collect();
        g.set_inputs(id, ins);
        let outs = g.node(id).outputs.clone();
        for (name, v) in b.outputs.iter().zip(outs) {
            scope.insert(name, v);
        }
    }
}
