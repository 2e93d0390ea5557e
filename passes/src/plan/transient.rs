//! What a stage's backward holds on top of its stashed activations: the gradients of one
//! microbatch while it runs backward, walked layer by layer in the order the lowering
//! runs them (a stage's layers in reverse).
//!
//! At layer `l`'s backward a rank holds:
//! * the input gradient `l` writes (and, under ZeRO, the weights and gradients it holds
//!   whole while it runs);
//! * the output gradients `l` receives from consumers in later stages;
//! * the input gradients of the stage's later layers that a producer not yet run backward
//!   still reads (a branch's gradient waits for its producer);
//!
//! less the stash of the stage's later layers on that microbatch: their backward has run,
//! so their activations are gone (unless, under zb-h1, a weight pass of their own reads
//! them later, and the gradients of their output); and, when a step runs one microbatch, less the weight
//! gradients of the stage's earlier layers: their backward has not run, so their
//! gradients do not exist yet (the rank's state counts them; the runtime makes them in
//! backward and spends them in the step). With several microbatches every backward after
//! the first finds them all, so nothing is taken off, and the gradients `l` makes are held
//! beside their sums so far until added to them.

use super::costs::Costs;
use super::layout::output_share;
use super::Strategy;
use crate::layers::Producer;

/// One layer's part in its stage's backward, per microbatch.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct LayerBytes {
    /// The input gradient its backward writes (its share).
    pub input_gradient: f64,
    /// What its backward holds whole on top (ZeRO's gathered weights and gradients).
    pub whole: f64,
    /// What its stash frees once its backward ran.
    pub freed: f64,
    /// Its weights' gradients (its share), which its backward makes.
    pub gradients: f64,
    /// Whether a weight pass of its own makes them (zb-h1), later: its backward then
    /// frees nothing it kept, nor the gradients of its output it read.
    pub weight_pass: bool,
}

/// Per layer, the bytes of its output's gradient that each of its ranks receives from later
/// stages per microbatch.
pub(super) fn received_gradients(
    costs: &Costs<'_>,
    strategy: &Strategy,
    stage_of: &[usize],
) -> Vec<f64> {
    let graph = costs.graph;
    let m = f64::from(strategy.microbatches.max(1));
    let mut received = vec![0.0f64; graph.layers.len()];
    for (c, layer) in graph.layers.iter().enumerate() {
        for e in &layer.inputs {
            if let Producer::Layer(p) = e.from {
                let p = p.0 as usize;
                if stage_of[p] < stage_of[c] {
                    let share = output_share(graph.layers[p].kind, strategy.layers[p]);
                    received[p] += e.bytes as f64 / m * share;
                }
            }
        }
    }
    received
}

/// Per rank, the most its backward holds on top of its stashes and state (less than
/// nothing when the gradients not yet made outweigh what it holds).
pub(super) fn backward_peak(
    costs: &Costs<'_>,
    strategy: &Strategy,
    stage_of: &[usize],
    layers: &[LayerBytes],
) -> Vec<f64> {
    let graph = costs.graph;
    let ranks = |l: usize| {
        let first = strategy.stages[stage_of[l]].first_rank;
        first..first + strategy.layers[l].degree()
    };
    // The earliest producer in its own stage that reads layer `c`'s input gradient: the
    // last backward of the stage that needs it.
    let released_at = |c: usize| -> Option<usize> {
        graph.layers[c]
            .inputs
            .iter()
            .filter_map(|e| match e.from {
                Producer::Layer(p) if stage_of[p.0 as usize] == stage_of[c] => Some(p.0 as usize),
                _ => None,
            })
            .min()
    };
    // Whether a producer of layer `c` in its own stage has a weight pass.
    // The last weight pass (its earliest layer) of a producer of layer `c` in its own
    // stage, if any: it reads `c`'s input gradient.
    let last_weight_reader = |c: usize| {
        (graph.layers[c].inputs.iter())
            .filter_map(|e| match e.from {
                Producer::Layer(p) => Some(p.0 as usize),
                Producer::Input(_) => None,
            })
            .filter(|&p| stage_of[p] == stage_of[c] && layers[p].weight_pass)
            .min()
    };
    let received = received_gradients(costs, strategy, stage_of);
    let mut peak = vec![f64::NEG_INFINITY; costs.gpus as usize];
    let one_microbatch = strategy.microbatches <= 1;
    for stage in &strategy.stages {
        let mut freed = vec![0.0f64; costs.gpus as usize];
        let mut pending = vec![0.0f64; costs.gpus as usize];
        // The weight gradients of the stage's layers not yet run backward.
        let mut unborn = vec![0.0f64; costs.gpus as usize];
        if one_microbatch {
            let stage_layers = stage.first_layer..=stage.last_layer;
            for (l, layer) in stage_layers.clone().zip(&layers[stage_layers]) {
                for r in ranks(l) {
                    unborn[r as usize] += layer.gradients;
                }
            }
        }
        // Input gradients waiting for a producer: (the producer, the consumer, bytes); and
        // those waiting for a producer's weight pass.
        let mut waiting: Vec<(usize, usize, f64)> = Vec::new();
        let mut kept_for_weights: Vec<(usize, usize, f64)> = Vec::new();
        for l in (stage.first_layer..=stage.last_layer).rev() {
            let bytes = layers[l];
            if one_microbatch && !bytes.weight_pass {
                for r in ranks(l) {
                    unborn[r as usize] -= bytes.gradients;
                }
            }
            // After the first microbatch, the gradients its backward makes are added to the
            // sums so far once made: both are held a while (ZeRO-2 and 3 count theirs whole).
            let fresh = match one_microbatch || strategy.zero >= 2 || bytes.weight_pass {
                true => 0.0,
                false => bytes.gradients,
            };
            for r in ranks(l) {
                let r = r as usize;
                let held = pending[r] + bytes.input_gradient + bytes.whole + fresh + received[l];
                peak[r] = peak[r].max(held - freed[r] - unborn[r]);
            }
            // After `l`'s backward: the gradients it read are gone, its own waits for its
            // producers, its stash is freed (all kept for its weight pass, if it has one).
            if bytes.weight_pass {
                for r in ranks(l) {
                    pending[r as usize] += received[l];
                }
            }
            waiting.retain(|&(at, c, b)| {
                if at == l {
                    for r in ranks(c) {
                        pending[r as usize] -= b;
                    }
                }
                at != l
            });
            if let Some(at) = released_at(l) {
                for r in ranks(l) {
                    pending[r as usize] += bytes.input_gradient;
                }
                // A producer's weight pass reads it after this microbatch's backwards.
                match last_weight_reader(l) {
                    Some(reader) => kept_for_weights.push((reader, l, bytes.input_gradient)),
                    None => waiting.push((at, l, bytes.input_gradient)),
                }
            }
            if !bytes.weight_pass {
                for r in ranks(l) {
                    freed[r as usize] += bytes.freed;
                }
            }
        }
        // Under zb-h1 the weight passes of the microbatch follow in the same order (at once
        // on the first stage, later on the others, whose waiting ones the stage's memory
        // counts): each makes its gradients, then lets go of what it kept.
        for l in (stage.first_layer..=stage.last_layer).rev() {
            let bytes = layers[l];
            if !bytes.weight_pass {
                continue;
            }
            let fresh = match one_microbatch || strategy.zero >= 2 {
                true => 0.0,
                false => bytes.gradients,
            };
            for r in ranks(l) {
                let r = r as usize;
                if one_microbatch {
                    unborn[r] -= bytes.gradients;
                }
                // (Under ZeRO it holds its gradients whole while it makes them.)
                let held = pending[r] + fresh + bytes.whole;
                peak[r] = peak[r].max(held - freed[r] - unborn[r]);
                freed[r] += bytes.freed;
                pending[r] -= received[l];
            }
            kept_for_weights.retain(|&(reader, c, b)| {
                if reader == l {
                    for r in ranks(c) {
                        pending[r as usize] -= b;
                    }
                }
                reader != l
            });
        }
    }
    peak.iter()
        .map(|&p| if p.is_finite() { p } else { 0.0 })
        .collect()
}
