//! The plan's layout read against the model: its ops and tensors, named in the plan, found
//! in the graph the ranks run.

use std::collections::BTreeMap;

use ralpc_codegen::layout::{Layout, Window};
use ralpc_ir::{Graph, NodeId, ValueId};

use super::{setup, RunError};

/// A layer's ops and the weights it carries, found in the model.
pub(super) struct ResolvedLayer {
    pub(super) nodes: Vec<NodeId>,
    /// The weights whose gradients travel in its bucket (those it reads first).
    pub(super) weights: Vec<ValueId>,
    /// Split by rows: its window, the window op and the inputs it reads around its piece.
    pub(super) halo: Option<(Window, NodeId, Vec<ValueId>)>,
}

/// The plan's layout in the model's ids.
pub(super) struct Resolved {
    pub(super) layers: Vec<ResolvedLayer>,
    /// Per edge, the value it carries.
    pub(super) edges: Vec<ValueId>,
    /// Values carried by another.
    pub(super) aliases: BTreeMap<ValueId, ValueId>,
}

impl Resolved {
    /// Finds every name `layout` gives in `graph`; a name the model lacks means the plan
    /// was made for another model.
    pub(super) fn new(layout: &Layout, graph: &Graph) -> Result<Resolved, RunError> {
        let mut by_name: BTreeMap<&str, ValueId> = BTreeMap::new();
        for v in graph.value_ids() {
            by_name.entry(graph.value(v).name.as_str()).or_insert(v);
        }
        let value = |name: &str| {
            by_name.get(name).copied().ok_or_else(|| {
                setup(format!(
                    "the plan's layout names the tensor '{name}', which this model lacks: \
                     plan it again for this model"
                ))
            })
        };
        let node = |name: &str| -> Result<NodeId, RunError> {
            let v = value(name)?;
            let producer = graph.value(v).producer;
            if graph.node(producer).outputs.first() != Some(&v) {
                return Err(setup(format!(
                    "the plan's layout names an op by '{name}', which is not an op's first \
                     output in this model: plan it again for this model"
                )));
            }
            Ok(producer)
        };
        let layers = layout
            .layers
            .iter()
            .map(|l| {
                Ok(ResolvedLayer {
                    nodes: l.ops.iter().map(|n| node(n)).collect::<Result<_, _>>()?,
                    weights: l
                        .weights
                        .iter()
                        .map(|w| value(w))
                        .collect::<Result<_, _>>()?,
                    halo: match &l.halo {
                        Some(h) => Some((
                            h.window,
                            node(&h.op)?,
                            h.inputs
                                .iter()
                                .map(|v| value(v))
                                .collect::<Result<_, _>>()?,
                        )),
                        None => None,
                    },
                })
            })
            .collect::<Result<_, RunError>>()?;
        let edges = layout
            .edges
            .iter()
            .map(|e| value(&e.value))
            .collect::<Result<_, _>>()?;
        let aliases = layout
            .aliases
            .iter()
            .map(|(from, to)| Ok((value(from)?, value(to)?)))
            .collect::<Result<_, RunError>>()?;
        Ok(Resolved {
            layers,
            edges,
            aliases,
        })
    }
}
