//! Rewrites a verified graph into placement units with equality saturation (egg).
//!
//! Every IR node becomes a single-op unit in an e-graph; values with known content (the
//! exporters' shape arithmetic, already evaluated by shape inference) fold into leaves;
//! the rules in [`rules`] add equivalent groupings (a fused `Conv+Relu`, a canonical
//! `Gemm`); extraction keeps, for every tensor the model computes, the cheapest form —
//! the one with the fewest placement units. Limits on iterations and e-nodes are explicit,
//! so the result never depends on machine speed; the stop reason is reported.

mod attention;
mod experts;
mod lang;
mod rules;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use egg::{CostFunction, EGraph, Extractor, Id, Language, Runner, SimpleScheduler, StopReason};
use ralpc_ir::{Graph, GraphInfo, NodeId, Op, ValueId};

pub use attention::ATTENTION;
pub use experts::EXPERTS;
pub use lang::Facts;
use lang::{node_id, unit_output, Folding, Term};

/// Bounds on the rewrite search.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Rewrite iterations (a fused chain grows by one op per iteration).
    pub iterations: usize,
    /// E-nodes.
    pub nodes: usize,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            iterations: 64,
            nodes: 2_000_000,
        }
    }
}

/// One unit of placement after rewriting.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Unit {
    /// What it computes: `Conv`, `Gemm`, `Conv+Relu`.
    pub op: String,
    /// The IR nodes it runs, in order.
    pub members: Vec<NodeId>,
    /// Tensors it reads: other units' outputs, graph inputs, weights, constants.
    pub inputs: Vec<ValueId>,
    /// Tensors it produces that something reads.
    pub outputs: Vec<ValueId>,
    /// It computes on weights and constants only (a transposed or cast weight): part of
    /// the layer that reads it, not a layer of its own.
    pub weight_only: bool,
}

/// How the rewrite went.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Report {
    /// Times each rule fired (including in iterations that only confirmed saturation).
    pub applied: Vec<(String, usize)>,
    /// Iterations run.
    pub iterations: usize,
    /// E-nodes at the end.
    pub egraph_nodes: usize,
    /// Why the search stopped: `saturated`, or the limit it hit.
    pub stop_reason: String,
    /// IR nodes in the model (sources included).
    pub ir_nodes: usize,
}

/// The result: units in topological order and where each IR value went.
#[derive(Clone, Debug)]
pub struct Rewritten {
    /// Units, producers before consumers.
    pub units: Vec<Unit>,
    /// IR values that no longer exist, mapped to the value that carries them now (an
    /// identity's output to its input, a folded value to itself is not listed).
    pub aliases: BTreeMap<ValueId, ValueId>,
    /// Search statistics.
    pub report: Report,
    /// The IR facts the rules used.
    pub facts: Arc<Facts>,
}

/// Extraction cost: placement units (weight-only units are free: they join their reader).
struct UnitCount<'a> {
    egraph: &'a EGraph<Term, Folding>,
}

impl CostFunction<Term> for UnitCount<'_> {
    type Cost = f64;

    fn cost<C: FnMut(Id) -> f64>(&mut self, enode: &Term, mut costs: C) -> f64 {
        let own = match enode {
            Term::Unit { children, .. }
                if children.is_empty()
                    || !children.iter().all(|&c| self.egraph[c].data.derived) =>
            {
                1.0
            }
            _ => 0.0,
        };
        enode.fold(own, |sum, id| sum + costs(id))
    }
}

/// Rewrites `graph` into units.
pub fn rewrite(graph: &Graph, info: &GraphInfo, limits: Limits) -> Rewritten {
    let facts = Arc::new(Facts::new(graph, info));
    let mut egraph = EGraph::new(Folding {
        facts: facts.clone(),
    });
    let mut class_of: Vec<Option<Id>> = vec![None; graph.value_count()];
    for &n in info.order() {
        let node = graph.node(n);
        if matches!(node.op, Op::Input | Op::Constant { .. }) {
            for &v in &node.outputs {
                class_of[v.index()] = Some(egraph.add(Term::Leaf(v.index() as u32)));
            }
            continue;
        }
        let children: Box<[Id]> = node
            .inputs
            .iter()
            .flatten()
            .filter_map(|v| class_of[v.index()])
            .collect();
        // Identity(x) = x for a weight, constant or input x: an exporter's alias of a
        // merged initializer is the weight itself. An Identity of a computed value stays a
        // unit, which `fuse-view` joins to its producer: as an e-graph union it put a unit
        // in the class it reads, and the fusions multiplied through that cycle (a Paddle
        // export with 191 Identities took 39 s to plan).
        if let (Op::Identity, [only], [out]) = (&node.op, &children[..], &node.outputs[..]) {
            if egraph[*only]
                .nodes
                .iter()
                .all(|t| matches!(t, Term::Leaf(_)))
            {
                class_of[out.index()] = Some(*only);
                continue;
            }
        }
        let unit = egraph.add(Term::Unit {
            op: Arc::from(node.op.name()),
            members: Box::new([n.index() as u32]),
            children,
        });
        let used: Vec<(usize, ValueId)> = facts.used_outputs(n.index()).collect();
        let direct = node.outputs.len() == 1 || used.iter().all(|&(slot, _)| slot == 0);
        for (slot, &v) in node.outputs.iter().enumerate() {
            class_of[v.index()] = Some(if direct {
                unit
            } else {
                egraph.add(Term::Proj(slot as u32, [unit]))
            });
        }
    }
    egraph.rebuild();

    let rules = rules::all();
    let runner = Runner::<Term, Folding, ()>::new(Folding {
        facts: facts.clone(),
    })
    .with_egraph(egraph)
    .with_scheduler(SimpleScheduler)
    .with_iter_limit(limits.iterations)
    .with_node_limit(limits.nodes)
    // Not a real limit: the iteration and node limits bound the work.
    .with_time_limit(Duration::from_secs(24 * 3600))
    .run(&rules);

    let mut applied: BTreeMap<String, usize> =
        rules.iter().map(|r| (r.name.to_string(), 0)).collect();
    for iteration in &runner.iterations {
        for (name, count) in &iteration.applied {
            *applied.entry(name.to_string()).or_default() += count;
        }
    }
    let stop_reason = match &runner.stop_reason {
        Some(StopReason::Saturated) | None => "saturated".to_owned(),
        Some(StopReason::IterationLimit(n)) => format!("iteration limit ({n})"),
        Some(StopReason::NodeLimit(n)) => format!("e-node limit ({n})"),
        Some(StopReason::TimeLimit(s)) => format!("time limit ({s} s)"),
        Some(StopReason::Other(why)) => why.clone(),
    };
    let report = Report {
        applied: rules
            .iter()
            .map(|r| (r.name.to_string(), applied[&r.name.to_string()]))
            .collect(),
        iterations: runner.iterations.len(),
        egraph_nodes: runner.egraph.total_size(),
        stop_reason,
        ir_nodes: graph.node_count(),
    };
    let egraph = &runner.egraph;
    let extractor = Extractor::new(egraph, UnitCount { egraph });
    let mut rewritten = extract(
        graph,
        info,
        facts.clone(),
        egraph,
        &extractor,
        &class_of,
        report,
    );
    rewritten.units = attention::merge(graph, info, &facts, rewritten.units);
    rewritten.units = experts::merge(graph, info, &facts, rewritten.units);
    rewritten
}

/// Walks the chosen terms from the graph outputs and lists the units they form.
fn extract(
    graph: &Graph,
    info: &GraphInfo,
    facts: Arc<Facts>,
    egraph: &EGraph<Term, Folding>,
    extractor: &Extractor<UnitCount<'_>, Term, Folding>,
    class_of: &[Option<Id>],
    report: Report,
) -> Rewritten {
    // The value each chosen class produces, and the unit producing it.
    let mut value_of: BTreeMap<Id, ValueId> = BTreeMap::new();
    let mut units: Vec<(Id, Unit)> = Vec::new();
    let roots: Vec<Id> = graph
        .outputs()
        .iter()
        .filter_map(|v| class_of[v.index()])
        .map(|c| egraph.find(c))
        .collect();
    // Iterative post-order: graphs can be deep.
    let mut stack: Vec<(Id, bool)> = roots.iter().rev().map(|&c| (c, false)).collect();
    while let Some((class, expanded)) = stack.pop() {
        if value_of.contains_key(&class) {
            continue;
        }
        let term = extractor.find_best_node(class);
        if !expanded {
            stack.push((class, true));
            for &c in term.children().iter().rev() {
                let c = egraph.find(c);
                if !value_of.contains_key(&c) {
                    stack.push((c, false));
                }
            }
            continue;
        }
        let value = match term {
            Term::Leaf(v) => ValueId::from_index(*v as usize),
            Term::Proj(slot, [c]) => {
                let best = extractor.find_best_node(egraph.find(*c));
                let Term::Unit { members, .. } = best else {
                    continue;
                };
                let Some(v) = unit_output(&facts, members, *slot as usize) else {
                    continue;
                };
                v
            }
            Term::Unit {
                op,
                members,
                children,
            } => {
                let Some(out) = unit_output(&facts, members, 0) else {
                    continue;
                };
                let mut inputs: Vec<ValueId> = Vec::new();
                for &c in children.iter() {
                    if let Some(&v) = value_of.get(&egraph.find(c)) {
                        if !inputs.contains(&v) {
                            inputs.push(v);
                        }
                    }
                }
                let last = *members.last().expect("units have members") as usize;
                units.push((
                    class,
                    Unit {
                        op: op.to_string(),
                        members: members.iter().map(|&m| node_id(m)).collect(),
                        inputs,
                        outputs: facts.used_outputs(last).map(|(_, v)| v).collect(),
                        weight_only: !children.is_empty()
                            && children.iter().all(|&c| egraph[c].data.derived),
                    },
                ));
                out
            }
        };
        value_of.insert(class, value);
    }
    // Producers before consumers, in the IR's order: sort by each unit's last member.
    let position = info.positions();
    let mut units: Vec<Unit> = units.into_iter().map(|(_, u)| u).collect();
    units.sort_by_key(|u| u.members.last().map(|m| position[m]));
    let mut aliases = BTreeMap::new();
    for v in graph.value_ids() {
        let Some(c) = class_of[v.index()] else {
            continue;
        };
        if let Some(&carrier) = value_of.get(&egraph.find(c)) {
            // Folded values are constants of their own, but a weight's alias (an exporter's
            // `Identity` on a merged initializer) stays the weight: it trains as one.
            if carrier != v && (!facts.folded[v.index()] || facts.parameter[carrier.index()]) {
                aliases.insert(v, carrier);
            }
        }
    }
    Rewritten {
        units,
        aliases,
        report,
        facts,
    }
}

/// `units` with each of `groups` (indices into `units`, producers before consumers) merged
/// into one unit of op `op`: its members in the graph's order, what it reads from outside,
/// and what anything outside it (or the graph's output) reads; the others kept, all in the
/// order of their last members.
fn merge_groups(
    graph: &Graph,
    info: &GraphInfo,
    units: &[Unit],
    groups: &[BTreeSet<usize>],
    op: &str,
) -> Vec<Unit> {
    let mut readers: BTreeMap<ValueId, Vec<usize>> = BTreeMap::new();
    for (i, u) in units.iter().enumerate() {
        for &v in &u.inputs {
            readers.entry(v).or_default().push(i);
        }
    }
    let merged: BTreeSet<usize> = groups.iter().flatten().copied().collect();
    let graph_outputs: BTreeSet<ValueId> = graph.outputs().iter().copied().collect();
    let position = info.positions();
    let mut out: Vec<Unit> = units
        .iter()
        .enumerate()
        .filter(|(i, _)| !merged.contains(i))
        .map(|(_, u)| u.clone())
        .collect();
    for group in groups {
        let made: BTreeSet<ValueId> = group
            .iter()
            .flat_map(|&u| units[u].outputs.iter().copied())
            .collect();
        let mut members: Vec<NodeId> = group
            .iter()
            .flat_map(|&u| units[u].members.iter().copied())
            .collect();
        members.sort_by_key(|m| position[m]);
        let mut inputs: Vec<ValueId> = Vec::new();
        for &u in group {
            for &v in &units[u].inputs {
                if !made.contains(&v) && !inputs.contains(&v) {
                    inputs.push(v);
                }
            }
        }
        let outputs = made
            .iter()
            .copied()
            .filter(|v| {
                graph_outputs.contains(v)
                    || readers
                        .get(v)
                        .is_some_and(|r| r.iter().any(|c| !group.contains(c)))
            })
            .collect();
        out.push(Unit {
            op: op.to_owned(),
            members,
            inputs,
            outputs,
            weight_only: false,
        });
    }
    out.sort_by_key(|u| u.members.last().map(|m| position[m]));
    out
}
