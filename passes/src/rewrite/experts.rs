//! A mixture of experts' routed part as one placement unit.
//!
//! Exporters write a routed MoE MLP as two dozen ops: the router's product and scores,
//! their `TopK`, the chosen weights normalized and scattered into gates, the experts'
//! products on weights stacked by expert (`[E, h, f]`), their activation, and the gated sum
//! over the experts. Apart they are layers no split understands (a product of every token
//! by every expert, a transpose of the gates); together they are one layer that takes each
//! token to its `k` experts and back, the unit the planner prices by the experts a token
//! uses and, later, places by expert.
//!
//! A unit is made for each `TopK` whose scores come from a router (a product by a 2-d
//! weight, through a softmax, a sigmoid or an added bias): every unit on a path from the
//! router's product, or from a product by a weight stacked by the router's experts, to the
//! first reduction after the experts' outputs meet the gates. What reads only the block's
//! input beside it (the experts' view of the tokens, shared experts) stays outside.

use std::collections::{BTreeMap, BTreeSet};

use ralpc_ir::{Graph, GraphInfo, NodeId, ValueId};

use super::lang::Facts;
use super::Unit;

/// The op of a merged mixture-of-experts unit.
pub const EXPERTS: &str = "Experts";

/// Ops that may follow the experts' outputs meeting the gates, up to the sum over experts.
const COMBINE_OPS: &[&str] = &[
    "Mul",
    "ReduceSum",
    "Sum",
    "Squeeze",
    "Unsqueeze",
    "Reshape",
    "Transpose",
];

/// Views by which experts may read the block's input (`[b, s, h]` as `[b, 1, s, h]`).
const VIEWS: &[&str] = &[
    "Unsqueeze",
    "Reshape",
    "Flatten",
    "Squeeze",
    "Expand",
    "Identity",
];

/// Merges each mixture of experts' routed part of `units` (producers before consumers)
/// into one unit.
pub(super) fn merge(graph: &Graph, info: &GraphInfo, facts: &Facts, units: Vec<Unit>) -> Vec<Unit> {
    let units = split_after_sums(graph, facts, units);
    let mut producer: BTreeMap<ValueId, usize> = BTreeMap::new();
    let mut readers: BTreeMap<ValueId, Vec<usize>> = BTreeMap::new();
    for (i, u) in units.iter().enumerate() {
        for &v in &u.outputs {
            producer.insert(v, i);
        }
        for &v in &u.inputs {
            readers.entry(v).or_default().push(i);
        }
    }
    let op = |m: NodeId| facts.op_name[m.index()];
    let consumers = |u: usize| -> Vec<usize> {
        let mut c: Vec<usize> = units[u]
            .outputs
            .iter()
            .flat_map(|v| readers.get(v).into_iter().flatten().copied())
            .collect();
        c.sort_unstable();
        c.dedup();
        c
    };
    let mut taken: Vec<Option<usize>> = vec![None; units.len()];
    let mut regions: Vec<BTreeSet<usize>> = Vec::new();
    for seed in 0..units.len() {
        let Some(top_k) = units[seed]
            .members
            .iter()
            .copied()
            .find(|&m| op(m) == "TopK")
        else {
            continue;
        };
        if taken[seed].is_some() {
            continue;
        }
        let Some((router, experts)) = router(graph, facts, &units, &producer, top_k) else {
            continue;
        };
        // The experts' products: a weight stacked by the router's experts.
        let stacked = |u: &Unit| {
            u.members.iter().any(|&m| {
                op(m) == "MatMul"
                    && graph
                        .node(m)
                        .inputs
                        .get(1)
                        .copied()
                        .flatten()
                        .is_some_and(|w| {
                            facts.derived[w.index()]
                                && facts.shape[w.index()]
                                    .as_ref()
                                    .is_some_and(|d| d.len() == 3 && d[0] == experts)
                        })
            })
        };
        // This block's experts read what its router reads, or a view of it.
        let activations = |u: usize| -> Vec<ValueId> {
            units[u]
                .inputs
                .iter()
                .copied()
                .filter(|v| !facts.derived[v.index()])
                .collect()
        };
        let Some(&x) = activations(router).first() else {
            continue;
        };
        let reads_x = |u: usize| {
            activations(u).iter().any(|&v| {
                v == x
                    || producer.get(&v).is_some_and(|&p| {
                        activations(p) == [x]
                            && units[p].members.iter().all(|&m| VIEWS.contains(&op(m)))
                    })
            })
        };
        let mut sources: Vec<usize> = vec![router];
        sources.extend(
            (0..units.len()).filter(|&u| taken[u].is_none() && stacked(&units[u]) && reads_x(u)),
        );
        if sources.len() == 1 {
            continue;
        }
        // Where they meet: the first unit every source reaches, then the combining ops up to
        // the first sum.
        let reached: Vec<BTreeSet<usize>> = sources
            .iter()
            .map(|&s| descendants(s, &consumers))
            .collect();
        let Some(mut exit) = (0..units.len()).find(|u| reached.iter().all(|r| r.contains(u)))
        else {
            continue;
        };
        for _ in 0..4 {
            let summed = units[exit]
                .members
                .iter()
                .any(|&m| matches!(op(m), "ReduceSum" | "Sum"));
            let next = consumers(exit);
            match next[..] {
                [n] if !summed
                    && units[n]
                        .members
                        .iter()
                        .all(|&m| COMBINE_OPS.contains(&op(m))) =>
                {
                    exit = n
                }
                _ => break,
            }
        }
        // Everything on a path from a source to the exit.
        let upstream = ancestors(exit, &units, &producer);
        let mut region: BTreeSet<usize> = sources
            .iter()
            .flat_map(|&s| descendants(s, &consumers))
            .chain(sources.iter().copied())
            .filter(|u| *u == exit || upstream.contains(u))
            .collect();
        region.insert(exit);
        // The views the experts read the block's input through, read by nothing else.
        let absorbed: Vec<usize> = region
            .iter()
            .flat_map(|&u| units[u].inputs.iter())
            .filter_map(|v| producer.get(v).copied())
            .filter(|&p| {
                !region.contains(&p)
                    && !units[p].weight_only
                    && units[p].members.iter().all(|&m| VIEWS.contains(&op(m)))
                    && consumers(p).iter().all(|c| region.contains(c))
            })
            .collect();
        region.extend(absorbed);
        // One router, and no attention core: a region that reaches further is no block's
        // experts.
        let routers = region
            .iter()
            .filter(|&&u| units[u].members.iter().any(|&m| op(m) == "TopK"))
            .count();
        if routers != 1
            || region.iter().any(|&u| {
                taken[u].is_some() || units[u].weight_only || units[u].op == super::ATTENTION
            })
        {
            continue;
        }
        for &u in &region {
            taken[u] = Some(regions.len());
        }
        regions.push(region);
    }
    if regions.is_empty() {
        return units;
    }
    super::merge_groups(graph, info, &units, &regions, EXPERTS)
}

/// `units` with each unit that sums the experts' outputs and goes on (the residual or
/// shared experts' add fused after the sum: `ReduceSum+Add`) cut after the sum, so that
/// the sum can end the experts' unit: a unit starting with combining ops up to a sum, fed
/// by a product of a weight stacked by expert or a product with one.
fn split_after_sums(graph: &Graph, facts: &Facts, units: Vec<Unit>) -> Vec<Unit> {
    let op = |m: NodeId| facts.op_name[m.index()];
    // The expert counts the graph's TopKs choose among (their scores' last axis): only a
    // weight stacked by one of them is an expert's.
    let experts: BTreeSet<u64> = units
        .iter()
        .flat_map(|u| u.members.iter())
        .filter(|&&m| op(m) == "TopK")
        .filter_map(|&m| graph.node(m).inputs.first().copied().flatten())
        .filter_map(|v| facts.shape[v.index()].as_ref()?.last().copied())
        .collect();
    if experts.is_empty() {
        return units;
    }
    let stacked_product = |u: &Unit| {
        u.members.iter().any(|&m| {
            let weight = graph.node(m).inputs.get(1).copied().flatten();
            op(m) == "MatMul"
                && weight.is_some_and(|w| {
                    facts.derived[w.index()]
                        && facts.shape[w.index()]
                            .as_ref()
                            .is_some_and(|d| d.len() == 3 && experts.contains(&d[0]))
                })
        })
    };
    let mut made_by: BTreeMap<ValueId, usize> = BTreeMap::new();
    let mut out: Vec<Unit> = Vec::with_capacity(units.len());
    for u in units {
        let sum = u
            .members
            .iter()
            .position(|&m| matches!(op(m), "ReduceSum" | "Sum"));
        // Fed by the experts' products, or by a unit they feed (their gating apart).
        let by_experts = |v: &ValueId| made_by.get(v).is_some_and(|&p| stacked_product(&out[p]));
        let fed = u.inputs.iter().any(|v| {
            by_experts(v)
                || made_by
                    .get(v)
                    .is_some_and(|&p| out[p].inputs.iter().any(by_experts))
        });
        let cut = sum.filter(|&i| {
            i + 1 < u.members.len()
                && u.members[..=i]
                    .iter()
                    .all(|&m| COMBINE_OPS.contains(&op(m)))
                && fed
        });
        let Some(i) = cut else {
            for &v in &u.outputs {
                made_by.insert(v, out.len());
            }
            out.push(u);
            continue;
        };
        let (head, tail) = u.members.split_at(i + 1);
        let reads = |members: &[NodeId], v: ValueId| {
            members
                .iter()
                .any(|&m| graph.node(m).inputs.iter().flatten().any(|&x| x == v))
        };
        let head_made: Vec<ValueId> = head
            .iter()
            .flat_map(|&m| graph.node(m).outputs.iter().copied())
            .collect();
        // An input neither part names directly (read through an alias) goes to both.
        let named = |v: ValueId| reads(head, v) || reads(tail, v);
        let first = Unit {
            op: names(facts, head),
            members: head.to_vec(),
            inputs: u
                .inputs
                .iter()
                .copied()
                .filter(|&v| reads(head, v) || !named(v))
                .collect(),
            outputs: head_made
                .iter()
                .copied()
                .filter(|&v| reads(tail, v) || u.outputs.contains(&v))
                .collect(),
            weight_only: false,
        };
        let second = Unit {
            op: names(facts, tail),
            members: tail.to_vec(),
            inputs: u
                .inputs
                .iter()
                .copied()
                .filter(|&v| reads(tail, v) || !named(v))
                .chain(first.outputs.iter().copied().filter(|&v| reads(tail, v)))
                .collect(),
            outputs: u
                .outputs
                .iter()
                .copied()
                .filter(|v| !head_made.contains(v))
                .collect(),
            weight_only: false,
        };
        for &v in &first.outputs {
            made_by.insert(v, out.len());
        }
        out.push(first);
        for &v in &second.outputs {
            made_by.insert(v, out.len());
        }
        out.push(second);
    }
    out
}

/// A unit's op: its members' ops joined by `+`.
fn names(facts: &Facts, members: &[NodeId]) -> String {
    members
        .iter()
        .map(|&m| facts.op_name[m.index()])
        .collect::<Vec<_>>()
        .join("+")
}

/// The unit of the router product behind `top_k`'s scores and the number of experts (the
/// scores' last axis): through the unit scoring them (a softmax, a sigmoid, an added bias)
/// to a product by a 2-d weight.
fn router(
    graph: &Graph,
    facts: &Facts,
    units: &[Unit],
    producer: &BTreeMap<ValueId, usize>,
    top_k: NodeId,
) -> Option<(usize, u64)> {
    let scores = graph.node(top_k).inputs.first().copied().flatten()?;
    let experts = *facts.shape[scores.index()].as_ref()?.last()?;
    let mut v = scores;
    for _ in 0..4 {
        let &u = producer.get(&v)?;
        let product = units[u].members.iter().any(|&m| {
            matches!(facts.op_name[m.index()], "MatMul" | "Gemm")
                && graph.node(m).inputs.iter().flatten().any(|&w| {
                    facts.derived[w.index()]
                        && facts.shape[w.index()]
                            .as_ref()
                            .is_some_and(|d| d.len() == 2 && d.contains(&experts))
                })
        });
        if product {
            return Some((u, experts));
        }
        // Through a scoring unit: its one input that is not a constant.
        let mut activations = units[u]
            .inputs
            .iter()
            .copied()
            .filter(|w| !facts.derived[w.index()]);
        v = activations.next()?;
        if activations.next().is_some() {
            return None;
        }
    }
    None
}

/// The units reachable from `u` by its outputs' readers (`u` not included).
fn descendants(u: usize, consumers: &dyn Fn(usize) -> Vec<usize>) -> BTreeSet<usize> {
    let mut seen = BTreeSet::new();
    let mut stack = consumers(u);
    while let Some(c) = stack.pop() {
        if seen.insert(c) {
            stack.extend(consumers(c));
        }
    }
    seen
}

/// The units `u` is computed from (`u` not included).
fn ancestors(u: usize, units: &[Unit], producer: &BTreeMap<ValueId, usize>) -> BTreeSet<usize> {
    let mut seen = BTreeSet::new();
    let mut stack: Vec<usize> = units[u]
        .inputs
        .iter()
        .filter_map(|v| producer.get(v).copied())
        .collect();
    while let Some(p) = stack.pop() {
        if seen.insert(p) {
            stack.extend(
                units[p]
                    .inputs
                    .iter()
                    .filter_map(|v| producer.get(v).copied()),
            );
        }
    }
    seen
}
