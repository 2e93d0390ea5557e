//! All-gathers several readers share. Megatron-LM gathers a LayerNorm's sequence pieces
//! once for the fused QKV projection and once for the MLP; an exporter's separate Q, K
//! and V projections (and SwiGLU's gate and up projections) read the same tensor as
//! layers of their own. Where they are placed alike, the first reader's all-gather
//! brings every later one its input too: the later ones gather nothing in the forward
//! pass (their input gradients still return on their own).

use crate::layers::{LayerGraph, Producer};

use super::layout::{gathers, gathers_gradient};
use super::Strategy;

/// Per edge between layers (by consumer, then the consumer's inputs from layers: the
/// lowering's order), the earlier edge whose forward all-gather it reuses, if any: the
/// same value of the same producer, all-gathered over the same ranks to a consumer placed
/// alike that reads it alike, in the same stage and the same recomputed run (or none).
pub fn shared_gathers(graph: &LayerGraph, strategy: &Strategy) -> Vec<Option<usize>> {
    let stage_of = strategy.stage_of_layers();
    let place = |l: usize| {
        let stage = strategy.stages.get(*stage_of.get(l)?)?;
        Some((*strategy.layers.get(l)?, stage.first_rank))
    };
    // The gathers so far: (producer, value, consumer placement, read as, run) → edge.
    let mut gathered = Vec::new();
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
            let (Some(from), Some(to), Some(value), false) =
                (place(p), place(c), e.value, reads_halo)
            else {
                shared.push(None);
                continue;
            };
            let (held, read) = (graph.layers[p].kind, layer.reads_as(e, to.0));
            let gather = stage_of[p] == stage_of[c]
                && gathers_gradient(held, from, read, to).is_none()
                && gathers(held, from, read, to).is_some();
            if !gather {
                shared.push(None);
                continue;
            }
            let key = (p, value, to, read, strategy.recompute_run(c));
            match gathered.iter().find(|(k, _)| *k == key) {
                Some(&(_, first)) => shared.push(Some(first)),
                None => {
                    gathered.push((key, index));
                    shared.push(None);
                }
            }
        }
    }
    shared
}
