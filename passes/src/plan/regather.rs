//! Inputs gathered again for the backward pass. Under Megatron-LM's sequence parallelism a
//! column-parallel layer reads its input whole, all-gathered from the sequence pieces a
//! LayerNorm left on the tensor-parallel group, but keeps only its own piece to its
//! backward pass: there it all-gathers the input again for its weight gradient, while the
//! input gradient's GEMM runs (Korthikanti et al., 2022, §4.2.2; Megatron-LM's
//! `LinearWithGradAccumulationAndAsyncCommunication`). Activation memory then counts each
//! such input at its `1/t` piece, as the paper's `sbh(34 + 5as/h)/t` does.
//!
//! Here: an input whose producer is split by rows (the sequence) and whose forward
//! all-gather returns its gradient as a reduce-scatter ([`scatters_gradient`]), read by a
//! dense layer's product that is not recomputed (inside a recomputed run the rerun gathers
//! it again; an input entering a run from outside is kept whole, as the run's checkpoint,
//! which is why a module run starts before the norm its gather reads). Samples
//! gathered from a data-parallel producer are kept whole, as before: no reference runtime
//! gathers them twice. Readers sharing the forward all-gather ([`shared_gathers`])
//! share the second one too. It is launched just before the backward pass that runs
//! before its last reader's (in the stage's reverse order), so that it overlaps that pass,
//! and it is held until its first reader's backward is done.

use crate::layers::{LayerGraph, LayerKind, Producer};

use super::layout::{edge_kinds, gathers, input_share, output_share, scatters_gradient};
use super::shared::shared_gathers;
use super::Strategy;

/// An all-gather run again before its readers' backward passes ([`regathers`]).
#[derive(Clone, Debug, PartialEq)]
pub struct Regather {
    /// The edge whose forward all-gather it repeats (the first of those sharing it).
    pub first: usize,
    /// The producer whose pieces it gathers.
    pub producer: usize,
    /// Its readers, in layer order (the first edge's consumer first).
    pub readers: Vec<usize>,
    /// The layer before whose backward pass it is launched: the one whose backward runs
    /// just before the last reader's, in the same stage (the last reader itself when it is
    /// its stage's last layer).
    pub before: usize,
    /// The ranks of one gather group (rank index 0's), as the forward all-gather's.
    pub ranks: Vec<u32>,
    /// Bytes gathered for the whole batch (each reader's box, as forward).
    pub bytes: f64,
    /// Bytes of the whole batch each reader keeps instead: its rank's piece.
    pub kept: f64,
}

impl Regather {
    /// Its last reader, whose backward pass runs first.
    pub fn last_reader(&self) -> usize {
        self.readers.last().copied().unwrap_or(self.before)
    }
}

/// A strategy's inputs gathered again for the backward pass ([`regathers`]).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Regathers {
    /// The all-gathers.
    pub list: Vec<Regather>,
    /// Per edge between layers (in the lowering's order: by consumer, then the consumer's
    /// inputs from layers), the index into `list` of the one bringing its tensor again.
    pub of_edge: Vec<Option<usize>>,
    /// Per layer, the bytes (whole batch, one rank) its stash keeps less: inputs it holds
    /// as its piece instead of the whole it reads ([`Layer::local`](crate::layers::Layer::local)
    /// counts them whole).
    pub saved: Vec<f64>,
}

/// The inputs of `strategy` gathered again for the backward pass.
pub fn regathers(graph: &LayerGraph, strategy: &Strategy) -> Regathers {
    let stage_of = strategy.stage_of_layers();
    let place = |l: usize| (strategy.layers[l], strategy.stages[stage_of[l]].first_rank);
    let shared = shared_gathers(graph, strategy);
    let mut all: Vec<Regather> = Vec::new();
    let mut of_edge: Vec<Option<usize>> = Vec::with_capacity(shared.len());
    let mut saved = vec![0.0; graph.layers.len()];
    for (c, layer) in graph.layers.iter().enumerate() {
        for e in &layer.inputs {
            let Producer::Layer(p) = e.from else { continue };
            let p = p.0 as usize;
            let index = of_edge.len();
            let (from, to) = (place(p), place(c));
            let (held, read) = edge_kinds(Some(graph.layers[p].kind), layer.reads_as(e, to.0));
            let ranks = gathers(held, from, read, to)
                .filter(|ranks| scatters_gradient(ranks, read, to))
                .filter(|_| read == LayerKind::Dense && from.0.attribute > 1)
                .filter(|_| stage_of[p] == stage_of[c])
                .filter(|_| strategy.recompute_run(c).is_none());
            let Some(ranks) = ranks else {
                of_edge.push(None);
                continue;
            };
            let kept = e.bytes as f64 * output_share(held, from.0);
            // Gathered again with the edge whose forward all-gather it shares, if that one
            // is.
            let at = match shared.get(index).copied().flatten().filter(|s| s.forward) {
                Some(s) => {
                    let at = of_edge.get(s.first).copied().flatten();
                    if let Some(at) = at {
                        all[at].readers.push(c);
                    }
                    at
                }
                None => {
                    all.push(Regather {
                        first: index,
                        producer: p,
                        readers: vec![c],
                        before: c,
                        ranks,
                        bytes: e.bytes as f64 * input_share(read, to.0),
                        kept,
                    });
                    Some(all.len() - 1)
                }
            };
            of_edge.push(at);
            if at.is_some() && e.stashed {
                saved[c] += e.bytes as f64 * input_share(layer.kind, to.0) - kept;
            }
        }
    }
    for r in &mut all {
        let last = r.last_reader();
        let stage = &strategy.stages[stage_of[last]];
        r.before = if last < stage.last_layer {
            last + 1
        } else {
            last
        };
    }
    Regathers {
        list: all,
        of_edge,
        saved,
    }
}
