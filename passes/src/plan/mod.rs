//! The partition search: for a layer graph, a cluster and a global batch, how every layer
//! is spread over the GPUs so that an iteration trains fastest within memory and within the
//! user's GPU-time budget.
//!
//! One search space, several families ([`Family`]):
//! * **data parallel** — every layer on all GPUs, samples split, gradients all-reduced: the
//!   baseline every plan is compared with;
//! * **burst** (DeepPool) — each layer picks its own GPU count, samples split;
//! * **SOAP** (FlexFlow, RALP) — each convolution and dense layer also picks attribute
//!   (spatial rows / a dense layer's input features) and parameter (output channels or
//!   features) splits; pooling and elementwise layers follow their producer;
//! * **pipeline** (GPipe, PipeDream, 2BW, Piper) — consecutive stages on disjoint GPU groups
//!   of any width, microbatches, a 1F1B, zero-bubble (ZB-H1), GPipe or asynchronous
//!   schedule.
//!
//! `auto` runs them all and keeps the fastest plan within the constraints; it is never
//! worse than any family it contains because every family's result is priced by the same
//! [`evaluate`].

mod buckets;
mod costs;
mod evaluate;
mod file;
mod frontier;
mod halo;
mod layered;
mod layout;
pub mod order;
mod pipeline;
mod regather;
mod search;
mod shared;
mod tied;
mod transient;

use serde::{Deserialize, Serialize};

pub use buckets::{buckets, Bucket, BUCKET_CAPS};
pub use costs::{CostOptions, Costs};
pub use evaluate::{evaluate, even_pipeline_bubble, Evaluation, LayerCost, StageCost};
pub use file::{
    FileSplit, StrategyFile, StrategyFileLayer, StrategyFileRun, StrategyFileStage, FORMAT,
};
pub use halo::Window;
pub use layout::{
    class_pieces, context_pieces, edge_kinds, epilogue_reads_as, first_replica, gathers,
    gathers_gradient, gradient_transfers, input_gradient_sums, input_share, output_share,
    partial_sums, replicas, scatters_gradient, scatters_partial_sums, splits_attributes,
    splits_attributes_into, splits_freely, transfers, weight_replicas, Cut, Transfer, View,
};
pub use regather::{regathers, Regather, Regathers};
pub use search::{plan, Candidate, Planned, Request};
pub use shared::{shared_gathers, SharedGather};
pub use tied::{separately_reduced, tied_reductions, TiedReduction};

use crate::layers::{LayerKind, Split};

/// How microbatches flow through pipeline stages.
#[derive(
    Clone,
    Copy,
    Debug,
    PartialEq,
    Eq,
    Hash,
    PartialOrd,
    Ord,
    Serialize,
    Deserialize,
    schemars::JsonSchema,
)]
pub enum Schedule {
    /// One forward, one backward (PipeDream-Flush / Megatron): synchronous, at most `P−k`
    /// microbatches in flight at stage `k`.
    #[serde(rename = "1f1b")]
    OneFOneB,
    /// All forwards, then all backwards: synchronous, `M` microbatches in flight.
    #[serde(rename = "gpipe")]
    GPipe,
    /// PipeDream's asynchronous 1F1B with weight stashing: no flush, weights updated per
    /// microbatch, one weight version per in-flight microbatch.
    #[serde(rename = "async")]
    Async,
    /// Zero-bubble ZB-H1 (Qi et al., ICLR 2024): 1F1B with each backward split into its
    /// input gradients and its weight gradients, the weight passes run later to fill the
    /// pipeline's drain ([`order::passes`]); 1F1B's microbatches in flight, and what the
    /// owed weight passes read ([`Strategy::weights_waiting`]) on top.
    #[serde(rename = "zb-h1")]
    ZeroBubble,
    /// Zero-bubble ZB-V (Qi et al., ICLR 2024, §6): two chunks per pipeline group laid out
    /// as a V (group `g` holds stages `g` and `2P − 1 − g`), each backward split as under
    /// ZB-H1, in the order [`order::group_passes`] gives: ZB-H1's bubble about halved at
    /// 1F1B's activation memory.
    #[serde(rename = "zb-v")]
    ZeroBubbleV,
}

impl Schedule {
    /// Its name on the command line and in files.
    pub fn name(self) -> &'static str {
        match self {
            Schedule::OneFOneB => "1f1b",
            Schedule::GPipe => "gpipe",
            Schedule::Async => "async",
            Schedule::ZeroBubble => "zb-h1",
            Schedule::ZeroBubbleV => "zb-v",
        }
    }

    /// Whether it runs each backward's weight gradients as a pass of their own (the
    /// zero-bubble schedules).
    pub fn splits_backward(self) -> bool {
        matches!(self, Schedule::ZeroBubble | Schedule::ZeroBubbleV)
    }

    /// Parses `1f1b`, `gpipe`, `async`, `zb-h1`, `zb-v`.
    pub fn parse(name: &str) -> Option<Schedule> {
        Some(match name {
            "1f1b" => Schedule::OneFOneB,
            "gpipe" => Schedule::GPipe,
            "async" => Schedule::Async,
            "zb-h1" => Schedule::ZeroBubble,
            "zb-v" => Schedule::ZeroBubbleV,
            _ => return None,
        })
    }
}

/// A family of strategies the search can be limited to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Family {
    /// The best of all families.
    Auto,
    /// Data parallel on every GPU.
    Dp,
    /// Per-layer GPU counts, samples split.
    Burst,
    /// Per-layer GPU counts and SOAP splits.
    Soap,
    /// Pipeline stages with replicas.
    Pipeline,
    /// Tensor × pipeline × data parallelism of a transformer language model (Megatron-LM's
    /// space, [`crate::transformer`]).
    ThreeD,
}

impl Family {
    /// Its name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Family::Auto => "auto",
            Family::Dp => "dp",
            Family::Burst => "burst",
            Family::Soap => "soap",
            Family::Pipeline => "pipeline",
            Family::ThreeD => "3d",
        }
    }

    /// Parses a family name.
    pub fn parse(name: &str) -> Option<Family> {
        Some(match name {
            "auto" => Family::Auto,
            "dp" => Family::Dp,
            "burst" => Family::Burst,
            "soap" => Family::Soap,
            "pipeline" => Family::Pipeline,
            "3d" => Family::ThreeD,
            _ => return None,
        })
    }
}

/// Consecutive layers on a group of consecutive ranks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
pub struct Stage {
    /// Index of its first layer.
    pub first_layer: usize,
    /// Index of its last layer (inclusive).
    pub last_layer: usize,
    /// Its first rank.
    pub first_rank: u32,
    /// Its GPUs (ranks `first_rank..first_rank + gpus`).
    pub gpus: u32,
}

/// A complete placement: stages, and for every layer its split over the first
/// `split.degree()` ranks of its stage.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize)]
pub struct Strategy {
    /// How microbatches flow.
    pub schedule: Schedule,
    /// Microbatches per iteration.
    pub microbatches: u32,
    /// Stages in layer order.
    pub stages: Vec<Stage>,
    /// Per layer, its split (the product of the degrees is its GPU count).
    pub layers: Vec<Split>,
    /// How the optimizer state is held: 0, every replica updates its whole copy of the
    /// weights; 1, each replica group shards it (ZeRO-1, Megatron-LM's distributed
    /// optimizer): the gradients are reduce-scattered, each replica updates its share of
    /// the weights, and the weights are all-gathered; 2, the gradients are sharded too
    /// (each microbatch's are reduce-scattered into the shard); 3, the weights too (each
    /// bucket's are all-gathered before every forward and backward pass over it).
    pub zero: u8,
    /// Under ZeRO, how many groups each replica group is cut into (hybrid sharding, FSDP2's
    /// HSDP; Megatron-Core's distributed optimizer instances): runs of consecutive
    /// replicas, each sharding a whole copy of the state among its members, whose members
    /// holding the same shard all-reduce their gradient shards once an iteration. 1: one
    /// group, ZeRO over every replica.
    pub shard_groups: u32,
    /// Runs of consecutive layers of one stage, `(first, last)` inclusive, whose
    /// activations are recomputed: a run's forward pass keeps only the run's inputs, and
    /// the run's forward is run again just before its backward.
    pub recompute: Vec<(usize, usize)>,
}

/// Why planning failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PlanError {
    /// A strategy (from a file or a caller) does not fit the model or the cluster.
    #[error("invalid strategy: {0}")]
    Strategy(String),
    /// No plan fits in memory.
    #[error(
        "the model does not fit: the smallest per-GPU memory any plan found needs is {need:.3} GiB, \
         above the {capacity:.3} GiB available (try more GPUs, --microbatches{})",
        if *limited { ", or a larger --memory-limit" } else { "" },
        need = need / GIB,
        capacity = capacity / GIB
    )]
    OutOfMemory {
        /// The smallest per-GPU need found, bytes.
        need: f64,
        /// The per-GPU capacity, bytes.
        capacity: f64,
        /// Whether `--memory-limit` set the capacity (below the GPUs' own memory).
        limited: bool,
    },
    /// No plan stays within the GPU-time budget.
    #[error(
        "no {family} plan {}{}",
        if budget.is_finite() {
            format!("keeps GPU-sec amplification within 1 + tolerance = {budget:.3}")
        } else {
            "fits these options".to_owned()
        },
        if least.is_finite() && budget.is_finite() {
            format!(
                ": the least any plan that fits reaches is {least:.3} (raise --tolerance to at \
                 least {:.3}, or give --tolerance inf for no budget)",
                // Rounded up, so that the value printed is enough.
                ((least - 1.0) * 1e3).ceil() / 1e3
            )
        } else {
            String::new()
        }
    )]
    OverBudget {
        /// The family searched.
        family: &'static str,
        /// 1 + tolerance.
        budget: f64,
        /// The least amplification of the plans found that fit in memory.
        least: f64,
    },
    /// A request that cannot be planned (no layers, zero GPUs, a bad batch).
    #[error("{0}")]
    Request(String),
    /// The model's layer graph could not be built.
    #[error(transparent)]
    Layers(#[from] crate::layers::LayerError),
}

const GIB: f64 = (1u64 << 30) as f64;

impl Strategy {
    /// Every layer on all `gpus` ranks, samples split: data parallelism.
    pub fn data_parallel(layers: usize, gpus: u32) -> Strategy {
        Strategy::single_stage(vec![Split::samples(gpus); layers])
    }

    /// One stage holding every layer, with the given splits; the stage has as many GPUs as
    /// its widest layer uses.
    pub fn single_stage(layers: Vec<Split>) -> Strategy {
        Strategy {
            schedule: Schedule::OneFOneB,
            microbatches: 1,
            stages: vec![Stage {
                first_layer: 0,
                last_layer: layers.len().saturating_sub(1),
                first_rank: 0,
                gpus: layers.iter().map(Split::degree).max().unwrap_or(1),
            }],
            layers,
            zero: 0,
            shard_groups: 1,
            recompute: Vec::new(),
        }
    }

    /// One replica group's `ranks` (in order) under hybrid sharding: the shard groups
    /// (runs of consecutive replicas, each sharding the state among its members) and the
    /// groups of replicas holding the same shard in each run. Without it, the replicas are
    /// one shard group and there are no such groups.
    pub fn hybrid_groups(&self, ranks: &[u32]) -> (Vec<Vec<u32>>, Vec<Vec<u32>>) {
        let groups = self.shard_groups.max(1) as usize;
        if groups == 1 || ranks.len() < groups || ranks.len() % groups != 0 {
            return (vec![ranks.to_vec()], Vec::new());
        }
        let size = ranks.len() / groups;
        let shards = ranks.chunks(size).map(<[u32]>::to_vec).collect();
        let across = (0..size)
            .map(|i| (0..groups).map(|j| ranks[j * size + i]).collect())
            .collect();
        (shards, across)
    }

    /// The stage index of every layer.
    pub fn stage_of_layers(&self) -> Vec<usize> {
        let mut of = vec![0; self.layers.len()];
        for (k, s) in self.stages.iter().enumerate() {
            for slot in of.iter_mut().take(s.last_layer + 1).skip(s.first_layer) {
                *slot = k;
            }
        }
        of
    }

    /// Microbatches whose activations stage `k` keeps at once: its schedule's count
    /// ([`Schedule::in_flight`]); interleaved (`v` chunks per GPU, `p` GPUs deep),
    /// Megatron-LM's warm-up on the chunk's GPU `d` — `(p − d − 1)·2 + (v − 1)·p` forward
    /// chunks ahead of the first backward, one more in the steady state, at most `M·v` —
    /// shared by its `v` chunks, the earlier ones holding the remainder; under ZB-V each
    /// chunk's own peak in its group's order ([`order::group_passes`]): `min(2p − d, M)`
    /// for the first, `min(d + 1, M)` for the second (their sum is one more than the
    /// group's `2p` at once, so a group is priced one chunk-microbatch high).
    pub fn in_flight(&self, k: usize) -> u32 {
        let (m, stages, v) = (self.microbatches, self.stages.len(), self.virtual_stages());
        if v <= 1 {
            return self.schedule.in_flight(m, stages, k);
        }
        let p = stages / v;
        let (d, chunk) = order::group_of_stage(self.schedule, p, k);
        if self.schedule == Schedule::ZeroBubbleV {
            let peak = match chunk {
                0 => 2 * p - d,
                _ => d + 1,
            };
            return (peak as u32).min(m).max(1);
        }
        let ahead = (p - d - 1) * 2 + (v - 1) * p + 1;
        let total = ahead.min(m as usize * v);
        (total / v + usize::from(chunk < total % v)).max(1) as u32
    }

    /// Microbatches whose weight passes stage `k` still owes at its busiest, beyond those
    /// in flight: under `zb-h1` a weight pass runs `k` backwards after its backward
    /// ([`order::passes`]), so just before a backward every microbatch from the oldest
    /// owed weight pass to the newest forward — `min(P, M)` of them — keeps what its
    /// weight pass reads, `min(P − k, M)` of them everything. Under ZB-V, the most its
    /// chunk owes at once in its group's order (in the cool-down, when its activations
    /// are mostly gone: counted on top of them all the same).
    pub fn weights_waiting(&self, k: usize) -> u32 {
        let (m, stages) = (self.microbatches, self.stages.len());
        match self.schedule {
            Schedule::ZeroBubble => {
                let stages = stages as u32;
                stages.min(m) - self.in_flight(k).min(stages.min(m))
            }
            Schedule::ZeroBubbleV => {
                let p = stages / 2;
                let (g, chunk) = order::group_of_stage(self.schedule, p, k);
                let order = order::group_passes(self.schedule, p, 2, g, m);
                order::peak_held(&order, 2)
                    .get(chunk)
                    .map_or(0, |held| held.1)
            }
            _ => 0,
        }
    }

    /// The virtual stages per GPU of a pipeline whose GPUs hold several stages: two under
    /// ZB-V, whose stage `k` and `2P − 1 − k` share ranks; interleaved (Narayanan et al.),
    /// as many as there are stages over the first `P`, which hold ranks of their own and
    /// every later stage `k` is on stage `k − P`'s ranks again; 1 when no stage shares
    /// ranks.
    pub fn virtual_stages(&self) -> usize {
        let Some(first) = self.stages.first() else {
            return 1;
        };
        let same = |a: &Stage, b: &Stage| a.first_rank == b.first_rank && a.gpus == b.gpus;
        let n = self.stages.len();
        if self.schedule == Schedule::ZeroBubbleV && n % 2 == 0 {
            let p = n / 2;
            let mirrored = (0..p).all(|k| same(&self.stages[k], &self.stages[n - 1 - k]));
            let apart = (1..p).all(|k| !same(&self.stages[k], first));
            // (Any other layout is no V: its stages share no ranks as ZB-V runs them.)
            return if mirrored && apart { 2 } else { 1 };
        }
        let devices = (1..n).find(|&k| same(&self.stages[k], first)).unwrap_or(n);
        let cyclic =
            n % devices == 0 && (0..n).all(|k| same(&self.stages[k], &self.stages[k % devices]));
        if cyclic {
            n / devices
        } else {
            1
        }
    }

    /// Checks the strategy against the layers and the ranks of `costs`.
    ///
    /// # Errors
    /// The first problem, naming the stage or layer.
    pub fn validate(&self, costs: &Costs<'_>) -> Result<(), PlanError> {
        let bad = |m: String| Err(PlanError::Strategy(m));
        let graph = costs.graph;
        let n = graph.layers.len();
        if self.layers.len() != n {
            return bad(format!(
                "it places {} layers; the model has {n}",
                self.layers.len()
            ));
        }
        if self.stages.is_empty() {
            return bad("it has no stages".into());
        }
        if self.microbatches == 0 || u64::from(self.microbatches) > graph.batch {
            return bad(format!(
                "microbatches is {}; it must be between 1 and the batch {}",
                self.microbatches, graph.batch
            ));
        }
        let mut next_layer = 0;
        let mut next_rank = 0u32;
        let v = self.virtual_stages();
        let devices = self.stages.len() / v;
        if self.schedule == Schedule::ZeroBubbleV && v != 2 {
            return bad(format!(
                "zb-v runs two stages on each GPU, stage k and stage 2P − 1 − k of 2P (a V); \
                 its {} stages are not laid out so",
                self.stages.len()
            ));
        }
        if v > 1 && self.schedule != Schedule::ZeroBubbleV {
            if self.schedule != Schedule::OneFOneB {
                return bad(format!(
                    "its stages take {v} virtual stages per GPU, which run the interleaved \
                     1f1b schedule, not {}",
                    self.schedule.name()
                ));
            }
            if self.microbatches % devices as u32 != 0 {
                return bad(format!(
                    "the interleaved schedule runs microbatches in groups of its {devices} \
                     pipeline ranks; {} is not a multiple",
                    self.microbatches
                ));
            }
        }
        for (k, s) in self.stages.iter().enumerate() {
            if s.first_layer != next_layer || s.last_layer < s.first_layer || s.last_layer >= n {
                return bad(format!(
                    "stage {k} covers layers {}..={}; stages must cover every layer in order, \
                     one after the other",
                    s.first_layer, s.last_layer
                ));
            }
            let again = k >= devices && v > 1;
            if s.gpus == 0 || (s.first_rank < next_rank && !again) {
                return bad(format!(
                    "stage {k} starts at rank {} with {} GPUs; stages need at least one GPU \
                     and ranks of their own",
                    s.first_rank, s.gpus
                ));
            }
            next_layer = s.last_layer + 1;
            let Some(end) = s.first_rank.checked_add(s.gpus) else {
                return bad(format!(
                    "stage {k} starts at rank {} with {} GPUs, past any cluster",
                    s.first_rank, s.gpus
                ));
            };
            next_rank = next_rank.max(end);
            for l in s.first_layer..=s.last_layer {
                let split = self.layers[l];
                let layer = &graph.layers[l];
                if split.sample == 0
                    || split.context == 0
                    || split.attribute == 0
                    || split.parameter == 0
                {
                    return bad(format!("layer {}: split degrees must be ≥ 1", layer.name));
                }
                if split.context > 1
                    && layer.kind == LayerKind::Attention
                    && reads_beside_projections(graph, layer)
                {
                    return bad(format!(
                        "layer {}: a context-parallel attention core gathers its projections' \
                         rows, but it also reads a mask, a position table or a graph input, \
                         which would reach it in pieces of the sequence",
                        layer.name
                    ));
                }
                // Context parallelism cuts a sequence's tokens: convolutions, pooling,
                // batch norms and recurrences have none to cut.
                if split.context > 1
                    && matches!(
                        layer.kind,
                        LayerKind::Conv | LayerKind::Pool | LayerKind::Norm | LayerKind::Recurrent
                    )
                {
                    return bad(format!(
                        "layer {} ({}): context {} cuts a sequence's tokens, which a {} layer \
                         does not hold (context parallelism is for transformer layers)",
                        layer.name,
                        layer.kind.name(),
                        split.context,
                        layer.kind.name()
                    ));
                }
                if split.degree() > s.gpus {
                    return bad(format!(
                        "layer {} uses {} GPUs; its stage {k} has {}",
                        layer.name,
                        split.degree(),
                        s.gpus
                    ));
                }
                if matches!(layer.kind, LayerKind::Conv | LayerKind::Pool) {
                    if split.attribute > 1 && !splits_attributes(layer) {
                        return bad(format!(
                            "layer {}: its rows cannot be split (it has no convolution or \
                             pooling window over them, or changes their shape before it); \
                             split it by samples or parameters",
                            layer.name
                        ));
                    }
                    if !splits_attributes_into(layer, split.attribute) {
                        return bad(format!(
                            "layer {}: its {} rows cannot be cut into {} pieces",
                            layer.name,
                            layer.halo.as_ref().map_or(0, |h| h.window.output),
                            split.attribute
                        ));
                    }
                }
                if let Some(r) = layer.recurrence.as_ref() {
                    if u64::from(split.parameter) > r.hidden {
                        return bad(format!(
                            "layer {}: its {} hidden units cannot be split into {} pieces \
                             (`parameter`): a piece would hold none",
                            layer.name, r.hidden, split.parameter
                        ));
                    }
                }
                let gates = layer.recurrence.is_some() && split.attribute == 1;
                if !splits_freely(layer.kind) && !gates && split.parameter > 1 {
                    return bad(format!(
                        "layer {} ({}) can only split samples (or be held whole by \
                         `attribute` replicas){}",
                        layer.name,
                        layer.kind.name(),
                        match layer.recurrence {
                            Some(_) => ", or samples and gates (`parameter`)",
                            None => "",
                        }
                    ));
                }
                if u64::from(split.sample) * u64::from(self.microbatches) > graph.batch {
                    return bad(format!(
                        "layer {} splits the batch {} into {} microbatches × {} samples",
                        layer.name, graph.batch, self.microbatches, split.sample
                    ));
                }
            }
        }
        if next_layer != n {
            return bad(format!("the stages end at layer {next_layer} of {n}"));
        }
        if next_rank > costs.gpus {
            return bad(format!(
                "it needs {next_rank} GPUs; {} are available",
                costs.gpus
            ));
        }
        if self.zero > 3 {
            return bad(format!(
                "zero is {}; ZeRO shards the optimizer state (1), the gradients too (2) and \
                 the weights too (3), or nothing (0)",
                self.zero
            ));
        }
        if self.schedule.splits_backward() && !self.recompute.is_empty() {
            return bad(format!(
                "{} runs each weight pass after its backward, which a recomputed run's \
                 activations would have to outlive; recompute under 1f1b or gpipe",
                self.schedule.name()
            ));
        }
        if self.shard_groups != 1 {
            if self.zero == 0 || self.shard_groups == 0 {
                return bad(format!(
                    "shard_groups is {}; hybrid sharding cuts ZeRO's replicas into groups of \
                     one sharded copy each, so it needs zero 1 to 3 and at least one group",
                    self.shard_groups
                ));
            }
            // A weight's replicas: its data-parallel and context-parallel ranks.
            let replicas = |l: usize| self.layers[l].sample * self.layers[l].context.max(1);
            let uneven = (0..n).find(|&l| {
                let samples = replicas(l);
                graph.layers[l].param_bytes > 0
                    && (samples % self.shard_groups != 0 || samples / self.shard_groups < 2)
            });
            if let Some(l) = uneven {
                return bad(format!(
                    "layer {} has {} sample replicas, which {} shard groups do not cut into \
                     groups of two or more",
                    graph.layers[l].name,
                    replicas(l),
                    self.shard_groups
                ));
            }
        }
        if self.zero > 0 && self.schedule == Schedule::Async {
            return bad(format!(
                "zero {} needs a synchronous schedule (1f1b or gpipe): the asynchronous \
                 one updates every replica's weights after each microbatch",
                self.zero
            ));
        }
        let stage_of = self.stage_of_layers();
        let mut after = 0;
        for (i, &(first, last)) in self.recompute.iter().enumerate() {
            if first < after || last < first || last >= n || stage_of[first] != stage_of[last] {
                return bad(format!(
                    "recompute run {i} covers layers {first}..={last}; runs must be in order, \
                     apart, and each inside one stage"
                ));
            }
            after = last + 1;
        }
        Ok(())
    }

    /// The recomputed run holding layer `l`, if any.
    pub fn recompute_run(&self, l: usize) -> Option<(usize, usize)> {
        self.recompute
            .iter()
            .copied()
            .find(|&(first, last)| first <= l && l <= last)
    }
}

/// Whether an attention core reads anything but its projections (a mask or a rotary table
/// another layer computes, a graph input): what a context-parallel core, which gathers its
/// projections' rows, cannot lower yet.
pub(crate) fn reads_beside_projections(
    graph: &crate::layers::LayerGraph,
    layer: &crate::layers::Layer,
) -> bool {
    layer.inputs.iter().any(|e| match e.from {
        crate::layers::Producer::Layer(p) => graph.layers[p.0 as usize].kind != LayerKind::Dense,
        crate::layers::Producer::Input(_) => true,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Hybrid sharding cuts a replica group into runs of consecutive replicas, and pairs
    /// the replicas holding the same shard across the runs; a group it cannot cut evenly
    /// (or an empty one) stays whole.
    #[test]
    fn hybrid_groups_are_runs_of_replicas_and_their_counterparts() {
        let mut strategy = Strategy::data_parallel(1, 8);
        strategy.shard_groups = 2;
        let (shards, across) = strategy.hybrid_groups(&[0, 2, 4, 6]);
        assert_eq!(shards, [vec![0, 2], vec![4, 6]]);
        assert_eq!(across, [vec![0, 4], vec![2, 6]]);
        assert_eq!(
            strategy.hybrid_groups(&[1, 3, 5]),
            (vec![vec![1, 3, 5]], vec![])
        );
        assert_eq!(strategy.hybrid_groups(&[]), (vec![vec![]], vec![]));
        strategy.shard_groups = 1;
        assert_eq!(strategy.hybrid_groups(&[0, 1]), (vec![vec![0, 1]], vec![]));
    }

    /// Under zb-v only a V of stages (group g holding stages g and 2P − 1 − g) takes two
    /// stages a group; the interleaved layout of the same ranks is no V.
    #[test]
    fn zb_v_takes_only_a_v_of_stages() {
        let stage = |first_layer, first_rank| Stage {
            first_layer,
            last_layer: first_layer,
            first_rank,
            gpus: 1,
        };
        let mut strategy = Strategy::data_parallel(4, 1);
        strategy.schedule = Schedule::ZeroBubbleV;
        strategy.stages = vec![stage(0, 0), stage(1, 1), stage(2, 1), stage(3, 0)];
        assert_eq!(strategy.virtual_stages(), 2);
        strategy.stages = vec![stage(0, 0), stage(1, 1), stage(2, 0), stage(3, 1)];
        assert_eq!(strategy.virtual_stages(), 1);
        strategy.schedule = Schedule::OneFOneB;
        assert_eq!(strategy.virtual_stages(), 2);
        // Stages past the V's are no one's mirror.
        assert_eq!(order::group_of_stage(Schedule::ZeroBubbleV, 1, 2), (0, 2));
    }
}
