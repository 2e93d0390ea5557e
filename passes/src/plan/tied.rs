//! Tied weights under a strategy: how the gradient of a weight several layers read is
//! summed over its uses.
//!
//! Where every layer reading it runs in the same stage with the same split, each rank holds
//! the same piece for all of them: the uses add into one gradient in place, and it is
//! all-reduced in the bucket of its first layer (whose backward, being first in layer
//! order, runs after all the others'). Otherwise — a tied embedding and LM head on
//! different pipeline stages, merged initializers of layers on different GPU counts — each
//! holder adds its own uses and one all-reduce over every holder, just before the optimizer
//! step, makes the total, as Megatron-LM all-reduces the word embeddings between its first
//! and last stages. That all-reduce carries whole weights: every holder keeps a whole copy
//! and cuts from it the piece each of its layers' splits reads.

use super::Strategy;
use crate::layers::LayerGraph;

/// One tied weight's own all-reduce.
#[derive(Clone, Debug, PartialEq)]
pub struct TiedReduction {
    /// Index into [`LayerGraph::tied`].
    pub weight: usize,
    /// Every rank holding it, ascending.
    pub ranks: Vec<u32>,
    /// Its bytes.
    pub bytes: f64,
}

/// The tied weights of `graph` that need their own all-reduce under `strategy`, in the
/// order of [`LayerGraph::tied`].
///
/// Cost: O(tied weights × their layers).
pub fn tied_reductions(graph: &LayerGraph, strategy: &Strategy) -> Vec<TiedReduction> {
    if graph.tied.is_empty() {
        return Vec::new();
    }
    let stage_of = strategy.stage_of_layers();
    let mut out = Vec::new();
    for (weight, tied) in graph.tied.iter().enumerate() {
        let uses: Vec<usize> = tied
            .layers
            .iter()
            .map(|l| l.0 as usize)
            .filter(|&l| l < strategy.layers.len())
            .collect();
        let Some(&first) = uses.first() else { continue };
        let placement = |l: usize| (stage_of[l], strategy.layers[l]);
        if uses.iter().all(|&l| placement(l) == placement(first)) {
            continue;
        }
        let mut ranks = Vec::new();
        for &l in &uses {
            let stage = &strategy.stages[stage_of[l]];
            ranks.extend(stage.first_rank..stage.first_rank + strategy.layers[l].degree());
        }
        ranks.sort_unstable();
        ranks.dedup();
        out.push(TiedReduction {
            weight,
            ranks,
            bytes: tied.bytes as f64,
        });
    }
    out
}

/// Per layer, the bytes of its `param_bytes` that a [`TiedReduction`] synchronizes rather
/// than its gradient bucket.
pub fn separately_reduced(graph: &LayerGraph, reductions: &[TiedReduction]) -> Vec<u64> {
    let mut out = vec![0u64; graph.layers.len()];
    for r in reductions {
        let tied = &graph.tied[r.weight];
        if let Some(slot) = tied.layers.first().and_then(|l| out.get_mut(l.0 as usize)) {
            *slot += tied.bytes;
        }
    }
    out
}
