//! Inlining the branch an `If` takes when its condition folds to a constant.
//!
//! Exporters guard shape-dependent code with `If` (a sequence of length 1 is squeezed, a
//! stride of one sample skipped): once the inputs are bound, the condition is a known
//! scalar and the `If` is the branch it takes. The graph is rebuilt in topological order
//! with that branch's nodes in place of the `If` and one `Identity` per output, which keeps
//! the output's name and declared type; branches nested in the taken one are inlined in the
//! next round, when their own conditions can be inferred. An `If` whose condition stays
//! unknown is left in place for the verifier to report.

use std::collections::{BTreeMap, HashMap};

use crate::graph::{Graph, Provenance};
use crate::ids::{NodeId, ValueId};
use crate::infer::infer_all;
use crate::op::Op;

/// Deeper nesting than this is left to the verifier (ONNX sets no limit; exporters nest a
/// few levels).
const MAX_ROUNDS: usize = 64;

/// Replaces every `If` whose condition folds by the branch it takes, nested ones included.
pub(crate) fn inline_taken(graph: &mut Graph) {
    for _ in 0..MAX_ROUNDS {
        if !graph
            .node_ids()
            .any(|n| matches!(graph.node(n).op, Op::If(_)))
        {
            return;
        }
        let Ok(order) = graph.topo_order() else {
            return;
        };
        let (types, _) = infer_all(graph, &order);
        let taken: BTreeMap<NodeId, bool> = order
            .iter()
            .filter(|&&n| matches!(graph.node(n).op, Op::If(_)))
            .filter_map(|&n| {
                let cond = graph.node(n).inputs.first().copied().flatten()?;
                match types[cond.index()].as_ref()?.content.as_deref()? {
                    [c] => Some((n, c.as_f64()? != 0.0)),
                    _ => None,
                }
            })
            .collect();
        if taken.is_empty() {
            return;
        }
        *graph = rebuilt(graph, &order, &taken);
    }
}

/// `old` in `order`, each `If` of `taken` replaced by the branch it takes.
fn rebuilt(old: &Graph, order: &[NodeId], taken: &BTreeMap<NodeId, bool>) -> Graph {
    let mut g = Graph::new();
    g.rebatch = old.rebatch.clone();
    // Constants only the branches not taken read are dropped with them (a weight there
    // is no weight of the model at these shapes).
    let reads: BTreeMap<NodeId, Vec<String>> = taken
        .iter()
        .filter_map(|(&n, &cond)| match &old.node(n).op {
            Op::If(b) => {
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
            (Op::If(branches), Some(&cond)) => {
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
                for b in &branch.nodes {
                    let names: Vec<&str> = b.outputs.iter().map(String::as_str).collect();
                    let id = g.add_node(b.op.clone(), b.provenance.clone(), &names);
                    let ins = b
                        .inputs
                        .iter()
                        .map(|i| scope.get(i.as_str()).copied())
                        .collect();
                    g.set_inputs(id, ins);
                    for (name, &v) in b.outputs.iter().zip(&g.node(id).outputs) {
                        scope.insert(name, v);
                    }
                }
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
    g
}
