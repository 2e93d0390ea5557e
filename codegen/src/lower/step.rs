//! The end of an iteration: the tied weights' all-reduces, the optimizer step with the
//! ZeRO shards' gathers, and the buffers that live throughout (weights, gradients,
//! optimizer state, stashed weight versions, workspace).

use std::ops::RangeInclusive;

use ralpc_passes::plan::{weight_replicas, Bucket, Schedule, TiedReduction};

use super::{Key, Lowering};
use crate::plan::{BufferKind, Instruction};

impl Lowering<'_, '_> {
    /// The layers reading tied weight `t` that run on rank `r`.
    pub(super) fn tied_uses(&self, t: &TiedReduction, r: u32) -> Vec<usize> {
        self.costs.graph.tied[t.weight]
            .layers
            .iter()
            .map(|l| l.0 as usize)
            .filter(|&l| self.ranks(l).contains(&r))
            .collect()
    }

    /// Whether rank `r` holds tied weight `t` through a layer other than the one counting
    /// its bytes.
    pub(super) fn holds_tied_copy(&self, t: &TiedReduction, r: u32) -> bool {
        let owner = self.costs.graph.tied[t.weight].layers[0].0 as usize;
        t.ranks.contains(&r) && !self.ranks(owner).contains(&r)
    }

    /// Stage `k`'s part of the tied weights' all-reduces, each followed by the weight's
    /// update, in weight order on every holder (the rest of the update does not wait for
    /// the other stages).
    pub(super) fn tied_all_reduces(&mut self, k: usize) {
        let stage = self.strategy.stages[k];
        for t in self.tied.clone() {
            let name = self.costs.graph.tied[t.weight].name.clone();
            let gradient_bytes = t.bytes * self.costs.model_state().gradients;
            let reduction = self.comm.all_reduce(&t.ranks, gradient_bytes);
            let group = self.group(&t.ranks);
            for r in stage.first_rank..stage.first_rank + stage.gpus {
                // Once per rank: with virtual stages, at the first stage on it.
                let first_stage = self
                    .strategy
                    .stages
                    .iter()
                    .position(|s| (s.first_rank..s.first_rank + s.gpus).contains(&r));
                if !t.ranks.contains(&r) || first_stage != Some(k) {
                    continue;
                }
                let at = self.push(
                    r,
                    Instruction::AllReduce {
                        group,
                        bytes: gradient_bytes.round() as u64,
                        us: reduction.us,
                        latency_us: reduction.latency_us,
                        tied: Some(name.clone()),
                    },
                );
                let uses = self.tied_uses(&t, r);
                for &l in &uses {
                    let key = Key::layer(BufferKind::Gradients, l);
                    self.buffers.read(r, key, at);
                    self.buffers.write(r, key, at);
                }
                let moved = t.bytes * (3.0 + 2.0 * self.optimizer_state);
                let at = self.push(
                    r,
                    Instruction::Step {
                        bytes: t.bytes.round() as u64,
                        us: moved / self.costs.cluster.gpu(r).hbm_bandwidth * 1e6,
                        tied: Some(name.clone()),
                        group: None,
                    },
                );
                for &l in &uses {
                    self.step_buffers(r, l, at);
                }
            }
        }
    }

    /// What layer `l`'s backward on microbatch `mb` holds of weight gradients beside the
    /// sums so far, on each of its ranks: without ZeRO-2, after the first microbatch, the
    /// gradients it makes before they are added; under ZeRO-2 and 3, where its sums are a
    /// shard of several replicas', on every microbatch its whole gradients before their
    /// reduce-scatter (as the evaluator's `whole`, while the layer runs), and where they
    /// are not sharded (one replica) nothing: the sums are the gradients' own.
    pub(super) fn fresh_gradient_bytes(&self, l: usize, mb: u32) -> f64 {
        let layer = &self.costs.graph.layers[l];
        let (replicas, share) = weight_replicas(layer.kind, self.strategy.layers[l], 0);
        let fresh = match self.strategy.zero >= 2 {
            true => replicas.len() > 1,
            false => mb > 0,
        };
        if !fresh || layer.param_bytes == 0 {
            return 0.0;
        }
        layer.param_bytes as f64 * share * self.costs.model_state().gradients
    }

    /// What layer `l`'s backward holds of its weights gathered whole beside its shard, on
    /// each of its ranks: under ZeRO-3, where they are sharded over several replicas, the
    /// whole weights (as the evaluator's `whole`, while the layer runs).
    pub(super) fn gathered_weight_bytes(&self, l: usize) -> f64 {
        let layer = &self.costs.graph.layers[l];
        let (replicas, share) = weight_replicas(layer.kind, self.strategy.layers[l], 0);
        if self.strategy.zero < 3 || replicas.len() < 2 {
            return 0.0;
        }
        layer.param_bytes as f64 * share * self.costs.model_state().weights
    }

    /// The buffers an update of layer `l`'s weights on rank `r` touches.
    pub(super) fn step_buffers(&mut self, r: u32, l: usize, at: usize) {
        for kind in [
            BufferKind::Weights,
            BufferKind::Gradients,
            BufferKind::OptimizerState,
        ] {
            self.buffers.read(r, Key::layer(kind, l), at);
        }
        self.buffers
            .write(r, Key::layer(BufferKind::Weights, l), at);
        self.buffers
            .write(r, Key::layer(BufferKind::OptimizerState, l), at);
    }

    /// Under ZeRO-3, before a pass over `layers` of stage `k`: the all-gather of the
    /// weights of each of its buckets holding any of them and not yet `gathered` in this
    /// pass.
    pub(super) fn gather_weights(
        &mut self,
        k: usize,
        layers: RangeInclusive<usize>,
        gathered: &mut [bool],
    ) {
        if self.strategy.zero < 3 {
            return;
        }
        for (i, done) in gathered.iter_mut().enumerate() {
            let bucket = &self.buckets[k][i];
            if *done || bucket.layers.start() > layers.end() || layers.start() > bucket.layers.end()
            {
                continue;
            }
            *done = true;
            let bucket = bucket.clone();
            self.gather_bucket(&bucket);
        }
    }

    /// The all-gather of a sharded bucket's weights over its replica groups.
    pub(super) fn gather_bucket(&mut self, bucket: &Bucket) {
        if bucket.ranks.len() < 2 || bucket.bytes <= 0.0 {
            return;
        }
        let weights: Vec<Key> = bucket
            .layers
            .clone()
            .map(|l| Key::layer(BufferKind::Weights, l))
            .collect();
        let groups = self.shard_groups(bucket);
        let bytes = bucket.bytes * self.costs.model_state().weights;
        self.all_gather(groups, bytes, &weights);
    }

    /// The groups sharding `bucket`'s state: its replica groups, or under hybrid sharding
    /// their runs of consecutive replicas
    /// ([`ralpc_passes::plan::Strategy::hybrid_groups`]).
    pub(super) fn shard_groups(&self, bucket: &Bucket) -> Vec<Vec<u32>> {
        Self::copies(&bucket.ranks, bucket.all.clone())
            .into_iter()
            .flat_map(|ranks| self.strategy.hybrid_groups(&ranks).0)
            .collect()
    }

    /// Under hybrid sharding, the groups of `bucket`'s replicas holding the same shard,
    /// which all-reduce it; none without.
    pub(super) fn across_shard_groups(&self, bucket: &Bucket) -> Vec<Vec<u32>> {
        Self::copies(&bucket.ranks, bucket.all.clone())
            .into_iter()
            .flat_map(|ranks| self.strategy.hybrid_groups(&ranks).1)
            .collect()
    }

    /// The optimizer step of stage `k`'s ranks: under ZeRO-1 first each replicated
    /// bucket's sharded update and weight all-gather, then the update of the rest.
    pub(super) fn step(&mut self, k: usize) {
        let stage = self.strategy.stages[k];
        let graph = self.costs.graph;
        let mut sharded = vec![false; graph.layers.len()];
        if self.strategy.zero > 0 {
            for bucket in self.buckets[k].clone() {
                if bucket.ranks.len() < 2 || bucket.bytes <= 0.0 {
                    continue;
                }
                let groups = self.shard_groups(&bucket);
                let share = bucket.bytes / groups[0].len() as f64;
                for mut ranks in groups {
                    ranks.sort_unstable();
                    let group = self.group(&ranks);
                    for &r in &ranks {
                        let at = self.push(
                            r,
                            Instruction::Step {
                                bytes: share.round() as u64,
                                us: self.costs.step_us(share, r),
                                tied: None,
                                group: Some(group),
                            },
                        );
                        for l in bucket.layers.clone() {
                            self.step_buffers(r, l, at);
                        }
                    }
                }
                self.gather_bucket(&bucket);
                for l in bucket.layers.clone() {
                    sharded[l] = true;
                }
            }
        }
        for r in stage.first_rank..stage.first_rank + stage.gpus {
            let mut bytes = 0.0;
            let mut touched = Vec::new();
            let stage_layers = stage.first_layer..=stage.last_layer;
            for (l, &sharded) in stage_layers.clone().zip(&sharded[stage_layers]) {
                if sharded || !self.ranks(l).contains(&r) || graph.layers[l].param_bytes == 0 {
                    continue;
                }
                let (_, share) = weight_replicas(graph.layers[l].kind, self.strategy.layers[l], 0);
                let own = graph.layers[l].param_bytes.saturating_sub(self.separate[l]);
                bytes += own as f64 * share;
                touched.push(l);
            }
            let at = self.push(
                r,
                Instruction::Step {
                    bytes: bytes.round() as u64,
                    us: self.costs.step_us(bytes, r),
                    tied: None,
                    group: None,
                },
            );
            for l in touched {
                self.step_buffers(r, l, at);
            }
        }
        self.tied_all_reduces(k);
    }

    /// The buffers that live throughout: each layer's weights, gradients and optimizer
    /// state on its ranks, stashed weight versions, and the workspace.
    pub(super) fn persistent_buffers(&mut self) {
        let graph = self.costs.graph;
        let stages = self.strategy.stages.len();
        let mut weights = vec![0.0f64; self.programs.len()];
        for (l, layer) in graph.layers.iter().enumerate() {
            if layer.param_bytes == 0 {
                continue;
            }
            let (replicas, share) = weight_replicas(layer.kind, self.strategy.layers[l], 0);
            let bytes = layer.param_bytes as f64 * share;
            // ZeRO: each of the replicas (of a shard group) holds a share of the optimizer
            // state (1), of the gradients too (2), of the weights too (3).
            let shard = self.strategy.hybrid_groups(&replicas).0[0].len() as f64;
            let shards = |stage: u8| {
                if self.strategy.zero >= stage {
                    shard
                } else {
                    1.0
                }
            };
            for r in self.ranks(l) {
                let m = self.costs.model_state();
                let held = bytes * m.weights / shards(3);
                weights[r as usize] += held;
                self.buffers
                    .grow(r, Key::layer(BufferKind::Weights, l), held);
                self.buffers.grow(
                    r,
                    Key::layer(BufferKind::Gradients, l),
                    bytes * m.gradients / shards(2),
                );
                self.buffers.grow(
                    r,
                    Key::layer(BufferKind::OptimizerState, l),
                    bytes * m.optimizer / shards(1),
                );
            }
        }
        for t in self.tied.clone() {
            for &r in &t.ranks {
                let Some(&l) = self.tied_uses(&t, r).first() else {
                    continue;
                };
                if !self.holds_tied_copy(&t, r) {
                    continue;
                }
                weights[r as usize] += t.bytes * self.costs.model_state().weights;
                let m = self.costs.model_state();
                self.buffers
                    .grow(r, Key::layer(BufferKind::Weights, l), t.bytes * m.weights);
                self.buffers.grow(
                    r,
                    Key::layer(BufferKind::Gradients, l),
                    t.bytes * m.gradients,
                );
                self.buffers.grow(
                    r,
                    Key::layer(BufferKind::OptimizerState, l),
                    t.bytes * m.optimizer,
                );
            }
        }
        // One workspace per GPU, however many (virtual) stages it runs.
        let mut has_workspace = vec![false; weights.len()];
        for (k, stage) in self.strategy.stages.iter().enumerate() {
            let in_flight = self
                .strategy
                .schedule
                .in_flight(self.strategy.microbatches, stages, k);
            for r in stage.first_rank..stage.first_rank + stage.gpus {
                if self.strategy.schedule == Schedule::Async && in_flight > 1 {
                    let versions = weights[r as usize] * f64::from(in_flight - 1);
                    self.buffers
                        .grow(r, Key::rank(BufferKind::WeightVersions), versions);
                }
                let workspace = self.costs.workspace();
                if workspace > 0.0 && !std::mem::replace(&mut has_workspace[r as usize], true) {
                    self.buffers
                        .grow(r, Key::rank(BufferKind::Workspace), workspace);
                }
            }
        }
    }
}
