//! All-gathers several readers share. Megatron-LM gathers a LayerNorm's sequence pieces
//! once for the fused QKV projection and once for the MLP; an exporter's separate Q, K
//! and V projections (and SwiGLU's gate and up projections) read the same tensor as
//! layers of their own. Where they are placed alike, the first reader's all-gather
//! brings every later one its input too: the later ones gather nothing in the forward
//! pass, and where the gathers' gradients return as reduce-scatters (each reader's input
//! gradient a partial sum over the group), theirs are added to the first reader's, which
//! is reduce-scattered once: Megatron-LM's traffic for its fused projections. Backward,
//! the readers of a row-parallel output's sequence pieces (a RMSNorm's decomposed ops, the
//! next residual) sum their gradients before the one all-gather that returns them to the
//! producer's replicas, as Megatron-LM's reduce-scatter's backward is one all-gather.

use crate::layers::{LayerGraph, Producer};

use super::layout::{edge_kinds, gathers, gathers_gradient, scatters_gradient, View};
use super::Strategy;

/// An edge whose collective an earlier edge's does ([`shared_gathers`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SharedGather {
    /// The earlier edge, which runs the collective.
    pub first: usize,
    /// Its tensor arrives with the first edge's all-gather.
    pub forward: bool,
    /// Its input gradient is added to the first edge's and returns with it: reduce-
    /// scattered after a shared all-gather, or all-gathered to a producer's replicas
    /// (the gradient of a row-parallel output read in sequence pieces).
    pub gradient: bool,
}

/// Per edge between layers (by consumer, then the consumer's inputs from layers: the
/// lowering's order), the earlier edge whose collective it shares, if any: the same value
/// of the same producer, moved over the same ranks to a consumer that needs the same
/// share of it, in the same stage and the same recomputed run (or none) — an all-gather
/// forward (its gradient's reduce-scatter too), or the all-gather of its gradient to the
/// producer's replicas.
pub fn shared_gathers(graph: &LayerGraph, strategy: &Strategy) -> Vec<Option<SharedGather>> {
    let stage_of = strategy.stage_of_layers();
    let place = |l: usize| {
        let stage = strategy.stages.get(*stage_of.get(l)?)?;
        Some((*strategy.layers.get(l)?, stage.first_rank))
    };
    // The collectives so far: (producer, value, needed share, forward, run) → edge.
    let mut first_of = Vec::new();
    let mut shared = Vec::new();
    for (c, layer) in graph.layers.iter().enumerate() {
        for e in &layer.inputs {
            let Producer::Layer(p) = e.from else { continue };
            let p = p.0 as usize;
            let index = shared.len();
            let reads_halo = layer
                .halo
                .as_ref()
                .is_some_and(|h| e.value.is_some_and(|v| h.inputs.contains(&v)));
            let (Some(from), Some(to), Some(value), false, true) = (
                place(p),
                place(c),
                e.value,
                reads_halo,
                stage_of[p] == stage_of[c],
            ) else {
                shared.push(None);
                continue;
            };
            let (held, read) = edge_kinds(Some(graph.layers[p].kind), layer.reads_as(e, to.0));
            let needed = View::input(read, to.0, to.1);
            // As the lowering moves it: the gradient gathered, or the tensor.
            let (forward, gradient) = if gathers_gradient(held, from, read, to).is_some() {
                (false, true)
            } else if let Some(ranks) = gathers(held, from, read, to) {
                (true, scatters_gradient(&ranks, read, to))
            } else {
                shared.push(None);
                continue;
            };
            let key = (p, value, needed, forward, strategy.recompute_run(c));
            match first_of.iter().find(|(k, _)| *k == key) {
                Some(&(_, first)) => shared.push(Some(SharedGather {
                    first,
                    forward,
                    gradient,
                })),
                None => {
                    first_of.push((key, index));
                    shared.push(None);
                }
            }
        }
    }
    shared
}
