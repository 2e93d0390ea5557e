//! The plan's `layout`: how each layer is placed, which ops of the model it runs, and which
//! tensors move between layers, by name. With it an executor runs a plan from the plan and
//! the ONNX model alone, without building the planner's layer graph again; without it (a
//! plan lowered from an imported profile, which has no ops) a plan is only simulated.
//!
//! ```json
//! "layout": {
//!   "layers": [
//!     { "kind": "conv", "split": { "sample": 4, "attribute": 1, "parameter": 2 },
//!       "first_rank": 0, "ops": ["/features/features.0/Conv_output_0", …],
//!       "weights": ["features.0.weight", "features.0.bias"] }, …
//!   ],
//!   "edges": [ { "producer": 0, "consumer": 1, "value": "/features/features.1/Relu_output_0",
//!                "scattered": false }, … ],
//!   "aliases": { "onnx::Conv_497": "features.0.weight" },
//!   "recompute": [[3, 7]]
//! }
//! ```
//!
//! An op is named by its first output (ONNX's tensor names are unique; its node names need
//! not be). Edges are listed in the order [`Tags`](crate::tag::Tags) numbers them: by
//! consumer, then that consumer's inputs from other layers.

use std::collections::BTreeMap;

use ralpc_ir::{Graph, ValueId};
use ralpc_passes::layers::{LayerGraph, Producer};

use crate::plan::PlanFileError;
use ralpc_passes::plan::{gathers, regathers, scatters_gradient, shared_gathers, Strategy};
use serde::{Deserialize, Serialize};

/// The vocabulary the layout is written in, shared by the lowering and the executors: a
/// layer's work class and split, which share of a tensor each rank holds, a row window's
/// geometry, which ranks count a replicated result once, and which value carries another
/// after the rewrite (following `aliases`, bounded so a cycle in a hand-edited plan ends).
pub use ralpc_passes::layers::{carrier, LayerKind, Split};
pub use ralpc_passes::plan::{
    edge_kinds, epilogue_reads_as, first_replica, input_gradient_sums, Cut, View, Window,
};

/// How the plan's layers are placed and connected.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Layout {
    /// Per layer, by index as in the plan's `layers`.
    pub layers: Vec<PlacedLayer>,
    /// Tensors between layers, in the order the message tags number them.
    pub edges: Vec<LayoutEdge>,
    /// Values the rewrite has another value carry (an exporter's `Identity` on a merged
    /// weight reads as that weight), by name.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub aliases: BTreeMap<String, String>,
    /// Runs of consecutive layers, `[first, last]`, whose forward pass is run again just
    /// before their backward pass.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub recompute: Vec<[u32; 2]>,
}

/// One layer's placement and ops.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PlacedLayer {
    /// Its work class: which of its ops a split cuts, and how.
    pub kind: LayerKind,
    /// Its SOAP degrees.
    pub split: Split,
    /// The first of its `split.degree()` consecutive ranks.
    pub first_rank: u32,
    /// Its ops, each named by its first output.
    pub ops: Vec<String>,
    /// The weights it reads first: their gradients travel in its bucket.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub weights: Vec<String>,
    /// Split by rows: the window whose rows the pieces exchange.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub halo: Option<LayoutHalo>,
}

/// The rows a row-split convolution or pooling reads around its piece.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct LayoutHalo {
    /// The window op's row axis.
    pub window: Window,
    /// The window op, by its first output.
    pub op: String,
    /// The layer's inputs its window reads, directly or through elementwise ops before it.
    pub inputs: Vec<String>,
}

/// A tensor one layer reads from another.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct LayoutEdge {
    /// The layer writing it.
    pub producer: u32,
    /// The layer reading it.
    pub consumer: u32,
    /// The value, by name (the one carrying it after the rewrite).
    pub value: String,
    /// Its gradient returns as a reduce-scatter over the consumer's ranks (the lowering's
    /// all-gather of the tensor, reversed).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub scattered: bool,
    /// Only ops after the consumer's matrix product read it (a residual, SwiGLU's gate):
    /// a split dense consumer reads it at the share its output holds
    /// ([`epilogue_reads_as`]).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub epilogue: bool,
    /// The earlier edge whose forward all-gather brings this one's tensor too (the same
    /// value gathered the same way for another reader: Q, K and V projections of one
    /// input): it arrives with that edge's, nothing is gathered for it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shares: Option<u32>,
    /// The earlier edge whose gradient's collective returns this one's too: its input
    /// gradient is added to that edge's (the QKV inputs' partial sums reduce-scattered
    /// once; a row-parallel output's sequence pieces all-gathered once to its replicas).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gradient_with: Option<u32>,
    /// Its consumer keeps only its own piece to its backward pass, where the forward
    /// all-gather runs again (Megatron-LM's sequence parallelism; the all-gather of the
    /// edge it `shares`, if any).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub regathered: bool,
}

impl Layout {
    /// The layout of `strategy` on `layers`, built from `graph`; `None` when the layers
    /// carry no ops (an imported profile's).
    pub fn describe(graph: &Graph, layers: &LayerGraph, strategy: &Strategy) -> Option<Layout> {
        let name = |v: ValueId| graph.value(carrier(&layers.aliases, v)).name.clone();
        let op = |n: ralpc_ir::NodeId| {
            let out = graph.node(n).outputs.first().copied();
            out.map(|v| graph.value(v).name.clone())
        };
        let stage_of = strategy.stage_of_layers();
        let place = |l: usize| {
            let stage = strategy.stages.get(*stage_of.get(l)?)?;
            Some((*strategy.layers.get(l)?, stage.first_rank))
        };
        let shared = shared_gathers(layers, strategy);
        let regathered = regathers(layers, strategy).of_edge;
        let mut edges = Vec::new();
        for (c, layer) in layers.layers.iter().enumerate() {
            for e in &layer.inputs {
                let Producer::Layer(p) = e.from else { continue };
                let p = p.0 as usize;
                let (from, to) = (place(p)?, place(c)?);
                let (held, read) = (layers.layers[p].kind, layer.reads_as(e, to.0));
                let scattered = stage_of[p] == stage_of[c]
                    && gathers(held, from, read, to).is_some_and(|ranks| {
                        scatters_gradient(&ranks, edge_kinds(Some(held), read).1, to)
                    });
                let collective = shared.get(edges.len()).copied().flatten();
                edges.push(LayoutEdge {
                    producer: p as u32,
                    consumer: c as u32,
                    value: name(e.value?),
                    scattered,
                    epilogue: e.epilogue,
                    shares: collective.filter(|s| s.forward).map(|s| s.first as u32),
                    gradient_with: collective.filter(|s| s.gradient).map(|s| s.first as u32),
                    regathered: regathered.get(edges.len()).copied().flatten().is_some(),
                });
            }
        }
        let mut weights: BTreeMap<usize, Vec<String>> = BTreeMap::new();
        for (w, owner) in layers.weight_owners(graph) {
            weights
                .entry(owner.0 as usize)
                .or_default()
                .push(graph.value(w).name.clone());
        }
        let mut placed = Vec::with_capacity(layers.layers.len());
        for (l, layer) in layers.layers.iter().enumerate() {
            if layer.parts.is_empty() {
                return None;
            }
            let (split, first_rank) = place(l)?;
            let halo = match &layer.halo {
                Some(h) => Some(LayoutHalo {
                    window: h.window,
                    op: op(h.node)?,
                    inputs: h.inputs.iter().map(|&v| name(v)).collect(),
                }),
                None => None,
            };
            placed.push(PlacedLayer {
                kind: layer.kind,
                split,
                first_rank,
                ops: layer
                    .parts
                    .iter()
                    .map(|p| op(p.node))
                    .collect::<Option<_>>()?,
                weights: weights.remove(&l).unwrap_or_default(),
                halo,
            });
        }
        Some(Layout {
            layers: placed,
            edges,
            aliases: layers
                .aliases
                .iter()
                .map(|(&from, &to)| (graph.value(from).name.clone(), graph.value(to).name.clone()))
                .collect(),
            recompute: strategy
                .recompute
                .iter()
                .map(|&(a, b)| [a as u32, b as u32])
                .collect(),
        })
    }

    /// The run of recomputed layers holding layer `l`, `(first, last)`.
    pub fn recompute_run(&self, l: usize) -> Option<(usize, usize)> {
        self.recompute
            .iter()
            .map(|&[a, b]| (a as usize, b as usize))
            .find(|&(a, b)| a <= l && l <= b)
    }

    /// What is inconsistent in it for a plan of `layers` layers on `ranks` ranks.
    pub(crate) fn check(&self, layers: usize, ranks: u32) -> Result<(), PlanFileError> {
        if self.layers.len() != layers {
            return Err(PlanFileError::Invalid(format!(
                "layout: {} layers where the plan has {layers}",
                self.layers.len()
            )));
        }
        for (l, p) in self.layers.iter().enumerate() {
            let s = p.split;
            if s.sample == 0 || s.context == 0 || s.attribute == 0 || s.parameter == 0 {
                return Err(PlanFileError::Invalid(format!(
                    "layout.layers[{l}].split: a degree of 0"
                )));
            }
            let end = u128::from(p.first_rank)
                + u128::from(s.sample)
                    * u128::from(s.context)
                    * u128::from(s.attribute)
                    * u128::from(s.parameter);
            if end > u128::from(ranks) {
                return Err(PlanFileError::Invalid(format!(
                    "layout.layers[{l}]: ranks {}..{end} where the plan has {ranks}",
                    p.first_rank
                )));
            }
            if p.ops.is_empty() {
                return Err(PlanFileError::Invalid(format!(
                    "layout.layers[{l}].ops: empty"
                )));
            }
        }
        for (i, e) in self.edges.iter().enumerate() {
            if e.producer as usize >= layers || e.consumer as usize >= layers {
                return Err(PlanFileError::Invalid(format!(
                    "layout.edges[{i}]: layers {} → {} where the plan has {layers}",
                    e.producer, e.consumer
                )));
            }
            for (field, first) in [("shares", e.shares), ("gradient_with", e.gradient_with)] {
                let Some(first) = first else { continue };
                let same = (first as usize) < i
                    && self.edges.get(first as usize).is_some_and(|f| {
                        f.producer == e.producer
                            && f.value == e.value
                            && f.shares.is_none()
                            && f.gradient_with.is_none()
                    });
                if !same {
                    return Err(PlanFileError::Invalid(format!(
                        "layout.edges[{i}].{field}: edge {first} is no earlier edge of '{}' \
                         from layer {}",
                        e.value, e.producer
                    )));
                }
            }
        }
        for (i, e) in self.edges.iter().enumerate() {
            let recomputed = self.recompute_run(e.consumer as usize).is_some();
            if e.regathered && (!e.scattered || recomputed) {
                return Err(PlanFileError::Invalid(format!(
                    "layout.edges[{i}].regathered: only an all-gathered input of a layer not \
                     recomputed is gathered again"
                )));
            }
        }
        for (i, &[a, b]) in self.recompute.iter().enumerate() {
            if a > b || b as usize >= layers {
                return Err(PlanFileError::Invalid(format!(
                    "layout.recompute[{i}]: [{a}, {b}] is not a run of layers"
                )));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn two_layers(edge: LayoutEdge) -> Layout {
        let layer = |kind| PlacedLayer {
            kind,
            split: Split::NONE,
            first_rank: 0,
            ops: vec!["y".into()],
            weights: Vec::new(),
            halo: None,
        };
        Layout {
            layers: vec![layer(LayerKind::LayerNorm), layer(LayerKind::Dense)],
            edges: vec![edge],
            aliases: BTreeMap::new(),
            recompute: Vec::new(),
        }
    }

    #[test]
    fn only_an_all_gathered_input_of_a_layer_not_recomputed_is_gathered_again() {
        let edge = LayoutEdge {
            producer: 0,
            consumer: 1,
            value: "x".into(),
            scattered: true,
            epilogue: false,
            shares: None,
            gradient_with: None,
            regathered: true,
        };
        assert!(two_layers(edge.clone()).check(2, 1).is_ok());
        let not_gathered = LayoutEdge {
            scattered: false,
            ..edge.clone()
        };
        let e = two_layers(not_gathered)
            .check(2, 1)
            .unwrap_err()
            .to_string();
        assert!(e.contains("layout.edges[0].regathered"), "{e}");
        let mut recomputed = two_layers(edge);
        recomputed.recompute = vec![[1, 1]];
        assert!(recomputed.check(2, 1).is_err());
    }
}
