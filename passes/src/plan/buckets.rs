//! Gradient buckets: the all-reduces that synchronize a stage's weight gradients, in the
//! order backward makes them ready.
//!
//! Like PyTorch DDP, gradients are fused into buckets of at most [`BUCKET_BYTES`] filled in
//! backward order (last layers first), and a bucket is all-reduced as soon as the backward
//! of its earliest layer has run on the last microbatch, overlapping the rest of backward.
//! A bucket also ends where the replica group changes (a different split, or a layer whose
//! weights replicate differently); layers without weights belong to no bucket, and a tied
//! weight with its own all-reduce ([`super::tied`]) to none.

use std::ops::RangeInclusive;

use super::layout::weight_replicas;
use super::{Stage, Strategy};
use crate::layers::LayerGraph;

/// The bucket size caps the evaluator tries, bytes, keeping whichever exposes the least
/// synchronization: one bucket per layer overlaps backward the most, DDP's default
/// (`bucket_cap_mb = 25`) is the middle ground, and one bucket per replica group (`None`)
/// pays the all-reduce latency once.
pub const BUCKET_CAPS: [Option<f64>; 3] = [Some(0.0), Some(25.0 * 1024.0 * 1024.0), None];

/// One fused all-reduce.
#[derive(Clone, Debug, PartialEq)]
pub struct Bucket {
    /// The layers it holds (some may have no weights).
    pub layers: RangeInclusive<usize>,
    /// The replica group of the stage's first rank index (see [`weight_replicas`]); its
    /// copies cover the rest of the layers' ranks.
    pub ranks: Vec<u32>,
    /// The ranks its layers run on.
    pub all: std::ops::Range<u32>,
    /// Gradient bytes each member holds.
    pub bytes: f64,
    /// The cap it was built under.
    pub cap: Option<f64>,
}

/// The buckets of `stage` under a size `cap` (`None`: unbounded), in the order they are
/// all-reduced (backward order); `separate[l]` of layer `l`'s weight bytes are tied
/// weights reduced on their own ([`super::separately_reduced`]).
///
/// Cost: O(layers of the stage).
pub fn buckets(
    graph: &LayerGraph,
    strategy: &Strategy,
    stage: &Stage,
    cap: Option<f64>,
    separate: &[u64],
) -> Vec<Bucket> {
    let cap_bytes = cap.unwrap_or(f64::INFINITY);
    let mut out: Vec<Bucket> = Vec::new();
    for l in (stage.first_layer..=stage.last_layer).rev() {
        let layer = &graph.layers[l];
        let param_bytes = layer
            .param_bytes
            .saturating_sub(separate.get(l).copied().unwrap_or(0));
        if param_bytes == 0 {
            continue;
        }
        let split = strategy.layers[l];
        let (ranks, share) = weight_replicas(layer.kind, split, stage.first_rank);
        let all = stage.first_rank..stage.first_rank + split.degree();
        let bytes = param_bytes as f64 * share;
        match out.last_mut() {
            Some(b) if b.ranks == ranks && b.all == all && b.bytes + bytes <= cap_bytes => {
                b.layers = l..=*b.layers.end();
                b.bytes += bytes;
            }
            _ => out.push(Bucket {
                layers: l..=l,
                ranks,
                all,
                bytes,
                cap,
            }),
        }
    }
    out
}
