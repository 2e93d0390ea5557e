//! The e-graph language of placement units, and the facts about the IR that rules consult.

use std::fmt;
use std::sync::Arc;

use egg::{Analysis, DidMerge, EGraph, Id, Language};
use ralpc_ir::{Graph, GraphInfo, Joins, NodeId, Op, OpClass, ValueId};

/// One e-node.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Term {
    /// A tensor from outside the computation: a graph input, a weight, a constant or a
    /// folded value (its IR value index).
    Leaf(u32),
    /// Output `slot` of a multi-output unit.
    Proj(u32, [Id; 1]),
    /// A placement unit: `op` is the ONNX op type for a single node (`Relu`), the
    /// canonical op for a rewritten one (`Gemm`), or the fused ops joined by `+`
    /// (`Conv+Relu`); `members` are the IR nodes it covers in execution order. Patterns
    /// match `op` and arity only.
    Unit {
        /// What it computes.
        op: Arc<str>,
        /// IR node indices, in execution order.
        members: Box<[u32]>,
        /// Its inputs.
        children: Box<[Id]>,
    },
}

impl Language for Term {
    type Discriminant = (u8, Option<Arc<str>>);

    fn discriminant(&self) -> Self::Discriminant {
        match self {
            Term::Leaf(_) => (0, None),
            Term::Proj(..) => (1, None),
            Term::Unit { op, .. } => (2, Some(op.clone())),
        }
    }

    fn matches(&self, other: &Self) -> bool {
        match (self, other) {
            (Term::Leaf(a), Term::Leaf(b)) => a == b,
            (Term::Proj(a, _), Term::Proj(b, _)) => a == b,
            (
                Term::Unit {
                    op: a,
                    children: ca,
                    ..
                },
                Term::Unit {
                    op: b,
                    children: cb,
                    ..
                },
            ) => a == b && ca.len() == cb.len(),
            _ => false,
        }
    }

    fn children(&self) -> &[Id] {
        match self {
            Term::Leaf(_) => &[],
            Term::Proj(_, c) => c,
            Term::Unit { children, .. } => children,
        }
    }

    fn children_mut(&mut self) -> &mut [Id] {
        match self {
            Term::Leaf(_) => &mut [],
            Term::Proj(_, c) => c,
            Term::Unit { children, .. } => children,
        }
    }
}

impl fmt::Display for Term {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Term::Leaf(v) => write!(f, "%{v}"),
            Term::Proj(k, _) => write!(f, "proj{k}"),
            Term::Unit { op, .. } => f.write_str(op),
        }
    }
}

/// Parses pattern operators: any op name is a unit pattern (members are not matched).
impl egg::FromOp for Term {
    type Error = std::convert::Infallible;

    fn from_op(op: &str, children: Vec<Id>) -> Result<Self, Self::Error> {
        Ok(Term::Unit {
            op: op.into(),
            members: Box::new([]),
            children: children.into(),
        })
    }
}

/// What the rules need to know about the IR.
#[derive(Debug)]
pub struct Facts {
    /// ONNX op type per node index.
    pub op_name: Vec<&'static str>,
    /// Op class per node index.
    pub class: Vec<Option<OpClass>>,
    /// How each node's op joins its producer's unit ([`ralpc_ir::OpFacts::joins`]).
    pub joins: Vec<Joins>,
    /// Outputs per node index.
    pub outputs: Vec<Vec<ValueId>>,
    /// Per value: consumers that read its data, counting through `Identity` (an
    /// identity's consumers count instead of it), plus one for a graph output.
    pub uses: Vec<u32>,
    /// Per value: computable from constants alone (weights, their transforms, shapes).
    pub derived: Vec<bool>,
    /// Per value: its content is known (folded shape arithmetic, small constants).
    pub folded: Vec<bool>,
    /// Per value: its shape when fully known.
    pub shape: Vec<Option<Vec<u64>>>,
    /// Per value: a weight (float initializer).
    pub parameter: Vec<bool>,
}

impl Facts {
    /// Collects the facts of a verified graph.
    pub fn new(graph: &Graph, info: &GraphInfo) -> Facts {
        let nodes = graph.node_ids().map(|n| n.index() + 1).max().unwrap_or(0);
        let values = graph.value_count();
        let mut facts = Facts {
            op_name: vec![""; nodes],
            class: vec![None; nodes],
            joins: vec![Joins::Never; nodes],
            outputs: vec![Vec::new(); nodes],
            uses: vec![0; values],
            derived: vec![false; values],
            folded: vec![false; values],
            shape: vec![None; values],
            parameter: vec![false; values],
        };
        let mut weighted = vec![false; values];
        for &n in info.order() {
            let node = graph.node(n);
            let i = n.index();
            facts.op_name[i] = node.op.name();
            let op = node.op.facts();
            facts.class[i] = Some(op.class);
            facts.joins[i] = op.joins;
            facts.outputs[i] = node.outputs.clone();
            let derived = match &node.op {
                Op::Input => false,
                Op::Constant { .. } => true,
                _ => node
                    .inputs
                    .iter()
                    .flatten()
                    .all(|v| facts.derived[v.index()]),
            };
            // A weight seen through a view (a small bias unsqueezed, a generated weight
            // reshaped) is the weight, not a constant, even when its content folds:
            // training changes it, so the view stays a node of the layer reading it.
            let view = matches!(
                node.op,
                Op::Unsqueeze { .. }
                    | Op::Squeeze { .. }
                    | Op::Reshape { .. }
                    | Op::Flatten { .. }
                    | Op::Transpose { .. }
                    | Op::Identity
            );
            let of_weight = view
                && node
                    .inputs
                    .first()
                    .copied()
                    .flatten()
                    .is_some_and(|v| weighted[v.index()]);
            for &v in &node.outputs {
                let ty = info.ty(v);
                weighted[v.index()] = of_weight || ralpc_ir::is_parameter(graph, v);
                facts.folded[v.index()] = ty.content.is_some() && !of_weight;
                facts.derived[v.index()] = derived || ty.content.is_some();
                facts.shape[v.index()] = ty.shape.as_sizes();
                facts.parameter[v.index()] = node.op.is_weight();
            }
        }
        for &v in graph.outputs() {
            facts.uses[v.index()] += 1;
        }
        // Reverse order: a consumer's own uses are final before its inputs are counted.
        for &n in info.order().iter().rev() {
            let node = graph.node(n);
            let weight = match node.op {
                // Reading a shape is not reading the data; nor is computing a value that
                // folds to a constant.
                Op::Shape { .. } => 0,
                _ if node.outputs.iter().all(|v| facts.folded[v.index()]) => 0,
                Op::Identity => node.outputs.first().map_or(0, |v| facts.uses[v.index()]),
                _ => 1,
            };
            for &v in node.inputs.iter().flatten() {
                facts.uses[v.index()] += weight;
            }
        }
        facts
    }

    /// The node's outputs that anything reads.
    pub fn used_outputs(&self, node: usize) -> impl Iterator<Item = (usize, ValueId)> + '_ {
        self.outputs[node]
            .iter()
            .copied()
            .enumerate()
            .filter(|(_, v)| self.uses[v.index()] > 0)
    }
}

/// Per e-class facts, kept up to date by egg.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClassData {
    /// An IR value the class stands for (the smallest index).
    pub value: Option<u32>,
    /// Computable from constants alone.
    pub derived: bool,
    /// Readers of the value (see [`Facts::uses`]); the largest of merged classes, since
    /// merged values share their readers.
    pub uses: u32,
    /// The folded IR value the class equals, when its content is known.
    pub folded: Option<u32>,
}

/// The analysis: folds values with known content into leaves (`fold-shape-arithmetic`).
pub struct Folding {
    /// The IR facts.
    pub facts: Arc<Facts>,
}

/// The IR value of a unit's output `slot`.
pub fn unit_output(facts: &Facts, members: &[u32], slot: usize) -> Option<ValueId> {
    let last = *members.last()? as usize;
    facts.outputs.get(last)?.get(slot).copied()
}

impl Analysis<Term> for Folding {
    type Data = ClassData;

    fn make(egraph: &mut EGraph<Term, Self>, enode: &Term, _id: Id) -> ClassData {
        let facts = &egraph.analysis.facts;
        let value = |v: ValueId| ClassData {
            value: Some(v.index() as u32),
            derived: facts.derived[v.index()],
            uses: facts.uses[v.index()],
            folded: facts.folded[v.index()].then_some(v.index() as u32),
        };
        match enode {
            Term::Leaf(v) => ClassData {
                folded: None,
                ..value(ValueId::from_index(*v as usize))
            },
            Term::Proj(slot, [c]) => {
                let out = egraph[*c].nodes.iter().find_map(|n| match n {
                    Term::Unit { members, .. } => unit_output(facts, members, *slot as usize),
                    _ => None,
                });
                out.map_or(
                    ClassData {
                        value: None,
                        derived: egraph[*c].data.derived,
                        uses: 0,
                        folded: None,
                    },
                    value,
                )
            }
            Term::Unit {
                members, children, ..
            } => {
                let derived =
                    !children.is_empty() && children.iter().all(|c| egraph[*c].data.derived);
                match unit_output(facts, members, 0) {
                    Some(v) => ClassData {
                        derived: derived || facts.derived[v.index()],
                        // A fused unit's inner values are not visible from outside.
                        folded: (members.len() == 1 && facts.folded[v.index()])
                            .then_some(v.index() as u32),
                        ..value(v)
                    },
                    None => ClassData {
                        value: None,
                        derived,
                        uses: 0,
                        folded: None,
                    },
                }
            }
        }
    }

    fn merge(&mut self, a: &mut ClassData, b: ClassData) -> DidMerge {
        let before = a.clone();
        a.value = min_some(a.value, b.value);
        a.derived |= b.derived;
        a.uses = a.uses.max(b.uses);
        a.folded = min_some(a.folded, b.folded);
        DidMerge(*a != before, *a != b)
    }

    fn modify(egraph: &mut EGraph<Term, Self>, id: Id) {
        if let Some(v) = egraph[id].data.folded {
            let leaf = egraph.add(Term::Leaf(v));
            egraph.union(id, leaf);
        }
    }
}

fn min_some(a: Option<u32>, b: Option<u32>) -> Option<u32> {
    match (a, b) {
        (Some(x), Some(y)) => Some(x.min(y)),
        (x, None) => x,
        (None, y) => y,
    }
}

/// The IR node of a member index.
pub fn node_id(member: u32) -> NodeId {
    NodeId::from_index(member as usize)
}
