//! Attention as one placement unit.
//!
//! Between a transformer block's QKV projection and its output projection, exporters write
//! the attention core as a dozen weightless ops: a split of the fused QKV, reshapes of the
//! hidden dimension into heads and transposes, the scores product, its scale and mask, the
//! softmax, the context product, and the transpose and reshape merging the heads. Each
//! one alone has no axis a tensor-parallel split can cut — the reshape moves the hidden
//! dimension into another axis — but together they are independent per head: the unit
//! they form reads the QKV projection's columns and writes the output projection's input
//! features, both cut by heads. Merging them lets the planner place attention as Megatron
//! does (heads over the tensor-parallel group, nothing moved in between), whatever names,
//! order or view ops an exporter chose.
//!
//! A unit joins a Softmax's attention core when every op it runs is one of [`CORE_OPS`]
//! (with rotary positions, a grouped-query repeat of the key and value heads and a causal
//! mask built in the graph), its products multiply two activations (not a weight), and it
//! is connected to the Softmax through such units. A core needs two products (scores and context) and must be
//! convex: nothing outside it both reads from it and feeds it.

use std::collections::{BTreeMap, BTreeSet};

use ralpc_ir::{Graph, GraphInfo, ValueId};

use super::lang::Facts;
use super::Unit;

/// The op of a merged attention unit.
pub const ATTENTION: &str = "Attention";

/// Ops an attention core is made of.
const CORE_OPS: &[&str] = &[
    "Split",
    "Slice",
    "Reshape",
    "Transpose",
    "Squeeze",
    "Unsqueeze",
    "MatMul",
    "Mul",
    "Div",
    "Add",
    "Sub",
    "Where",
    "Softmax",
    "Cast",
    "Sqrt",
    "Dropout",
    "Identity",
    // Rotary positions: the angles' cos and sin, rotate-half (a negated half concatenated
    // before the other).
    "Neg",
    "Concat",
    "Cos",
    "Sin",
    // Grouped-query attention's key and value heads repeated for the query heads, and the
    // shapes the repeat is built from.
    "Expand",
    "Shape",
    // A causal mask built in the graph, and the exporter's guard of a softmax over a row
    // masked whole.
    "Range",
    "Trilu",
    "Equal",
    "IsNaN",
    // BLOOM's fused projection viewed as `[b, s, heads, 3, d]`, Q, K and V picked from it.
    "Gather",
    // Gemma 2's soft-capped scores: `cap · tanh(scores / cap)`.
    "Tanh",
];

/// Merges each attention core of `units` (producers before consumers) into one unit.
pub(super) fn merge(graph: &Graph, info: &GraphInfo, facts: &Facts, units: Vec<Unit>) -> Vec<Unit> {
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
    let in_core = |u: &Unit| {
        !u.weight_only
            && u.members.iter().all(|&m| {
                let op = facts.op_name[m.index()];
                // A product of two activations, a pick from one (by constant indices);
                // one of a weight is a layer's own.
                let activations = match op {
                    "MatMul" => 2,
                    "Gather" => 1,
                    _ => 0,
                };
                let node = graph.node(m);
                CORE_OPS.contains(&op)
                    && node
                        .inputs
                        .iter()
                        .take(activations)
                        .all(|v| v.is_some_and(|v| !facts.derived[v.index()]))
                    && (op != "Gather" || picks_beside_head_dim(node, facts))
            })
    };
    let softmax = |u: &Unit| {
        u.members
            .iter()
            .any(|&m| facts.op_name[m.index()] == "Softmax")
    };

    let mut merged_into: Vec<Option<usize>> = vec![None; units.len()];
    let mut cores: Vec<BTreeSet<usize>> = Vec::new();
    for seed in 0..units.len() {
        if merged_into[seed].is_some() || !softmax(&units[seed]) || !in_core(&units[seed]) {
            continue;
        }
        let mut core = BTreeSet::from([seed]);
        let mut stack = vec![seed];
        while let Some(u) = stack.pop() {
            let neighbours = units[u]
                .inputs
                .iter()
                .filter_map(|v| producer.get(v).copied())
                .chain(
                    units[u]
                        .outputs
                        .iter()
                        .flat_map(|v| readers.get(v).into_iter().flatten().copied()),
                );
            for n in neighbours.collect::<Vec<_>>() {
                if merged_into[n].is_none() && in_core(&units[n]) && core.insert(n) {
                    stack.push(n);
                }
            }
        }
        let products = core
            .iter()
            .flat_map(|&u| units[u].members.iter())
            .filter(|&&m| facts.op_name[m.index()] == "MatMul")
            .count();
        if products < 2 || !convex(&units, &producer, &core) {
            continue;
        }
        for &u in &core {
            merged_into[u] = Some(cores.len());
        }
        cores.push(core);
    }
    if cores.is_empty() {
        return units;
    }

    super::merge_groups(graph, info, &units, &cores, ATTENTION)
}

/// Whether Gather `node` picks along the axis before its input's last, as from BLOOM's
/// `[b, s, heads, 3, d]`: the heads come before the pick, so a rank's contiguous columns
/// of the fused projection are whole heads. A pick before the heads (Swin's `qkv[0]` of
/// `[3, b, heads, n, d]`) takes Q, K and V apart from columns cut otherwise: its own layer.
fn picks_beside_head_dim(node: &ralpc_ir::Node, facts: &Facts) -> bool {
    let ralpc_ir::Op::Gather { axis } = node.op else {
        return false;
    };
    let rank = node
        .inputs
        .first()
        .copied()
        .flatten()
        .and_then(|x| facts.shape[x.index()].as_ref())
        .map_or(0, |s| s.len() as i64);
    rank >= 2 && (if axis < 0 { axis + rank } else { axis }) == rank - 2
}

/// Whether no unit outside `core` lies on a path between two of its units: no input of
/// the core is computed from one of its outputs.
fn convex(units: &[Unit], producer: &BTreeMap<ValueId, usize>, core: &BTreeSet<usize>) -> bool {
    let mut seen: BTreeSet<usize> = BTreeSet::new();
    let mut stack: Vec<usize> = core
        .iter()
        .flat_map(|&u| units[u].inputs.iter())
        .filter_map(|v| producer.get(v).copied())
        .filter(|p| !core.contains(p))
        .collect();
    while let Some(u) = stack.pop() {
        if !seen.insert(u) {
            continue;
        }
        for v in &units[u].inputs {
            if let Some(&p) = producer.get(v) {
                if core.contains(&p) {
                    return false;
                }
                stack.push(p);
            }
        }
    }
    true
}
