//! The cost terms every plan is priced with, shared by the searches and the evaluator so
//! that a searched plan and the same plan read from a strategy file get the same figures.
//!
//! Conventions (DESIGN §3), all per iteration unless stated:
//! * a layer's compute is its share at the local batch (`B / (M·s)` samples);
//! * gradient synchronization is not overlapped with compute (as PipeDream's and DeepPool's
//!   planners assume); consecutive layers on the same ranks with the same split share one
//!   fused all-reduce (a DDP bucket): its latency is paid once, its bandwidth per byte;
//! * the optimizer step runs after it, memory-bound ([`Costs::step_us`]);
//! * a tensor that changes placement moves as one group of point-to-point messages (NCCL
//!   runs them concurrently): one α and the busiest rank's bytes at the slowest link it
//!   spans, forward and (reversed, as gradients) backward.

use rustc_hash::FxHashMap as HashMap;
use std::cell::RefCell;

use crate::cluster::{Cluster, Link, LinkLevel, Precision};
use crate::cost::memory::DEFAULT_WORKSPACE_BYTES;
use crate::cost::{Comm, ComputeModel, Efficiency, FusedAttention, Optimizer};
use crate::layers::{Layer, LayerGraph, LayerKind, Producer, Split};
use crate::profile::Profile;

use super::layout::{self, View};

/// A redistribution's movement and the busiest server's share of it (`None`: nothing
/// moves).
type Moved = Option<(layout::Movement, f64)>;

/// Ranks `first, first + stride, …` (`count` of them): (first, stride, count).
type RankProgression = (u32, u32, u32);

/// What a plan is priced against.
#[derive(Clone, Debug)]
pub struct CostOptions<'a> {
    /// Math precision of the compute.
    pub precision: Precision,
    /// Measured layer costs.
    pub profile: Option<&'a Profile>,
    /// Optimizer (its state counts in memory).
    pub optimizer: Optimizer,
    /// Bytes per GPU reserved for the context and workspaces.
    pub workspace_bytes: f64,
    /// A per-GPU memory limit below the GPUs' own, bytes.
    pub memory_limit: Option<u64>,
    /// The fraction of peak each layer kind reaches where no profile says (default:
    /// [`Efficiency::default`]).
    pub efficiency: Option<Efficiency>,
    /// The fraction of HBM bandwidth memory-bound kernels reach (default: all of it).
    pub hbm_efficiency: Option<f64>,
    /// Price attention cores as one fused causal kernel at these rates (default: op by op).
    pub fused_attention: Option<FusedAttention>,
}

impl Default for CostOptions<'_> {
    fn default() -> Self {
        CostOptions {
            precision: Precision::Tf32,
            profile: None,
            optimizer: Optimizer::default(),
            workspace_bytes: DEFAULT_WORKSPACE_BYTES,
            memory_limit: None,
            efficiency: None,
            hbm_efficiency: None,
            fused_attention: None,
        }
    }
}

/// Bytes kept per byte of exported weights (see [`Costs::model_state`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ModelState {
    /// The weights the kernels read.
    pub weights: f64,
    /// Their gradients.
    pub gradients: f64,
    /// Optimizer state, with mixed precision's fp32 master copy.
    pub optimizer: f64,
}

/// [`Costs::model_state`] for `graph` priced under `options`.
fn model_state(graph: &LayerGraph, options: &CostOptions<'_>) -> ModelState {
    let factor = options.optimizer.state_factor();
    let params: u64 = graph.layers.iter().map(|l| l.params).sum();
    let width = if params > 0 {
        graph.param_bytes() as f64 / params as f64
    } else {
        4.0
    };
    if options.precision.activation_bytes() < 4 && width > 2.0 {
        ModelState {
            weights: 2.0 / width,
            gradients: 2.0 / width,
            optimizer: 4.0 * (1.0 + factor) / width,
        }
    } else {
        ModelState {
            weights: 1.0,
            gradients: 1.0,
            optimizer: factor,
        }
    }
}

/// A layer's compute for one microbatch on one rank, µs.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Work {
    pub fwd_us: f64,
    pub bwd_us: f64,
    /// The part of `bwd_us` making weight gradients ([`Layer::weight_gradient_share`]).
    ///
    /// [`Layer::weight_gradient_share`]: crate::layers::Layer::weight_gradient_share
    pub weight_us: f64,
}

/// A gradient all-reduce split into the part paid once per fused bucket and the part paid
/// per layer.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(crate) struct Sync {
    pub latency_us: f64,
    pub bandwidth_us: f64,
}

/// The cost model of one plan search: a layer graph on the first `gpus` ranks of a cluster.
pub struct Costs<'a> {
    /// The layers.
    pub graph: &'a LayerGraph,
    /// The machines.
    pub cluster: &'a Cluster,
    /// Ranks the plan may use: `0..gpus`.
    pub gpus: u32,
    pub(crate) options: CostOptions<'a>,
    comm: Comm<'a>,
    /// Per rank, the index of its GPU type's compute model.
    model_of_rank: Vec<usize>,
    models: Vec<ComputeModel<'a>>,
    /// The layer whose placement each layer's first input comes from.
    pub(crate) first_producer: Vec<Option<usize>>,
    min_capacity: f64,
    /// Reshardings already costed, by (producer view, consumer view).
    /// Per (held, needed) views: the movement, and the busiest server's share of it.
    movements: RefCell<HashMap<(View, View), Moved>>,
    /// All-reduce costs already computed, by (first rank, stride, count).
    reductions: RefCell<HashMap<RankProgression, (f64, f64)>>,
    model_state: ModelState,
}

impl<'a> Costs<'a> {
    /// Costs of `graph` on ranks `0..gpus` of `cluster` (`gpus` ≤ the cluster's GPUs).
    pub fn new(
        graph: &'a LayerGraph,
        cluster: &'a Cluster,
        gpus: u32,
        options: CostOptions<'a>,
    ) -> Costs<'a> {
        let gpus = gpus.clamp(1, cluster.gpu_count().max(1));
        let mut models: Vec<ComputeModel<'a>> = Vec::new();
        let mut model_of_rank = Vec::with_capacity(gpus as usize);
        for r in 0..gpus {
            let gpu = cluster.gpu(r);
            let index = match models.iter().position(|m| m.gpu.name == gpu.name) {
                Some(i) => i,
                None => {
                    let mut m = ComputeModel::new(gpu, options.precision);
                    if let Some(e) = &options.efficiency {
                        m.efficiency = e.clone();
                    }
                    if let Some(e) = options.hbm_efficiency {
                        m.hbm_efficiency = e;
                    }
                    m.fused_attention = options.fused_attention;
                    if let Some(p) = options.profile {
                        m = m.with_profile(p);
                    }
                    models.push(m);
                    models.len() - 1
                }
            };
            model_of_rank.push(index);
        }
        let first_producer = graph
            .layers
            .iter()
            .map(|l| {
                l.inputs.iter().find_map(|e| match e.from {
                    Producer::Layer(p) => Some(p.0 as usize),
                    Producer::Input(_) => None,
                })
            })
            .collect();
        let own = (0..gpus)
            .map(|r| cluster.gpu(r).memory_bytes)
            .min()
            .unwrap_or(0);
        let min_capacity = options.memory_limit.map_or(own, |l| l.min(own)) as f64;
        Costs {
            model_state: model_state(graph, &options),
            graph,
            cluster,
            gpus,
            min_capacity,
            options,
            comm: Comm::new(cluster),
            model_of_rank,
            models,
            first_producer,
            movements: RefCell::default(),
            reductions: RefCell::default(),
        }
    }

    /// The per-GPU memory capacity of rank `r`, bytes.
    pub fn capacity(&self, r: u32) -> f64 {
        let own = self.cluster.gpu(r).memory_bytes;
        self.options.memory_limit.map_or(own, |l| l.min(own)) as f64
    }

    /// The smallest capacity over ranks `lo..hi`.
    pub(crate) fn capacity_of(&self, lo: u32, hi: u32) -> f64 {
        (lo..hi.max(lo + 1))
            .map(|r| self.capacity(r))
            .fold(f64::INFINITY, f64::min)
    }

    /// The smallest capacity of any rank (what searches prune with).
    pub(crate) fn min_capacity(&self) -> f64 {
        self.min_capacity
    }

    /// The compute model of the slowest GPU among ranks `lo..lo+n`.
    fn model(&self, lo: u32, n: u32) -> &ComputeModel<'a> {
        let hi = (lo + n.max(1)).min(self.gpus).max(lo + 1);
        let index = (lo..hi)
            .map(|r| self.model_of_rank[(r.min(self.gpus - 1)) as usize])
            .min_by(|&a, &b| self.models[a].peak.total_cmp(&self.models[b].peak))
            .unwrap_or(0);
        &self.models[index]
    }

    /// One rank's compute of layer `l` under `split` on ranks from `first`, for one of
    /// `microbatches` microbatches.
    pub(crate) fn work(&self, l: usize, split: Split, first: u32, microbatches: u32) -> Work {
        let layer = &self.graph.layers[l];
        let local = Split {
            sample: split.sample.max(1) * microbatches.max(1),
            ..split
        };
        let t = self
            .model(first, split.degree())
            .layer(layer, local, self.graph.batch);
        let (fwd, bwd) = self.state_exchanges_us(l, split, first, microbatches);
        Work {
            fwd_us: t.fwd_us + fwd,
            bwd_us: t.bwd_us + bwd,
            weight_us: t.bwd_us * layer.weight_gradient_share(),
        }
    }

    /// Layer `l`'s forward, backward and weight-gradient part of the backward for one of
    /// `microbatches` microbatches, unsplit on one GPU of rank `rank`'s type, µs: what a
    /// split of the pass shares among its ranks at one GPU's efficiency.
    pub fn one_gpu_pass_us(&self, l: usize, rank: u32, microbatches: u32) -> (f64, f64, f64) {
        let w = self.work(l, Split::NONE, rank, microbatches);
        (w.fwd_us, w.bwd_us, w.weight_us)
    }

    /// What a recurrent layer split by its gates spends exchanging its state, forward and
    /// backward: every step, each of its parameter groups all-reduces the whole state of
    /// its samples (the rank's piece, zeros elsewhere: a gather), once per exchange; a
    /// backward step replays the forward step and sums as many gradients. Latency-bound
    /// for the small states of most recurrent layers, and paid in sequence.
    fn state_exchanges_us(
        &self,
        l: usize,
        split: Split,
        first: u32,
        microbatches: u32,
    ) -> (f64, f64) {
        let Some(rec) = self.graph.layers[l].recurrence else {
            return (0.0, 0.0);
        };
        let p = split.parameter.max(1);
        if p <= 1 {
            return (0.0, 0.0);
        }
        let samples = f64::from(split.sample.max(1) * split.attribute.max(1) * microbatches.max(1));
        let state = self.all_reduce_strided(first, 1, p, rec.state_bytes as f64 / samples);
        let per_step = state.latency_us + state.bandwidth_us;
        let forward = rec.steps as f64 * rec.exchanges as f64 * per_step;
        (forward, 2.0 * forward)
    }

    /// A single GPU's time for the whole iteration, µs: every layer's forward and backward
    /// pass and the optimizer step over every weight — what every plan's GPU time counts
    /// too, so that one GPU's own plan amplifies nothing. On ranks of several GPU types,
    /// the fastest type's: a plan on the slower ones then amplifies its GPU time by as much
    /// as it costs against the best GPU at hand.
    pub fn single_gpu_time_us(&self) -> f64 {
        let on = |rank: u32| {
            let compute: f64 = (0..self.graph.layers.len())
                .map(|l| {
                    let w = self.work(l, Split::NONE, rank, 1);
                    w.fwd_us + w.bwd_us
                })
                .sum();
            compute + self.step_us(self.graph.param_bytes() as f64, rank)
        };
        // The first rank of each run of one GPU model.
        (0..self.gpus)
            .filter(|&r| {
                r == 0 || self.model_of_rank[r as usize] != self.model_of_rank[r as usize - 1]
            })
            .map(on)
            .fold(f64::INFINITY, f64::min)
    }

    /// All-reduce of `bytes` over `ranks` (an arithmetic progression) as (latency,
    /// bandwidth) parts.
    fn all_reduce(&self, ranks: &[u32], bytes: f64) -> Sync {
        if ranks.len() <= 1 || bytes <= 0.0 {
            return Sync::default();
        }
        self.all_reduce_strided(ranks[0], ranks[1] - ranks[0], ranks.len() as u32, bytes)
    }

    /// All-reduce of `bytes` over ranks `first, first + stride, …` (`count` of them).
    fn all_reduce_strided(&self, first: u32, stride: u32, count: u32, bytes: f64) -> Sync {
        if count <= 1 || bytes <= 0.0 {
            return Sync::default();
        }
        let (latency, per_byte) = *self
            .reductions
            .borrow_mut()
            .entry((first, stride, count))
            .or_insert_with(|| {
                let ranks: Vec<u32> = (0..count).map(|i| first + i * stride).collect();
                // The 1-byte cost is the latency; the slope up to 1 GB the bandwidth.
                let one = self.comm.all_reduce(&ranks, 1.0).us;
                let big = self.comm.all_reduce(&ranks, 1e9).us;
                (one, (big - one) / (1e9 - 1.0))
            });
        Sync {
            latency_us: latency,
            bandwidth_us: per_byte * bytes,
        }
    }

    /// One fused all-reduce over ranks `first..first + gpus` as (latency µs, µs per byte).
    pub(crate) fn replicas_sync(&self, first: u32, gpus: u32) -> (f64, f64) {
        let s = self.all_reduce_strided(first, 1, gpus, 1e9);
        (s.latency_us, s.bandwidth_us / 1e9)
    }

    /// The gradient synchronization of `param_bytes` of layer `l`'s weights (all of them, or
    /// those its gradient bucket carries) under `split` on ranks from `first`.
    pub(crate) fn sync(&self, l: usize, split: Split, first: u32, param_bytes: u64) -> Sync {
        if param_bytes == 0 {
            return Sync::default();
        }
        let (ranks, share) = layout::weight_replicas(self.graph.layers[l].kind, split, first);
        // Gradients travel at their own width (16-bit under mixed precision).
        let bytes = param_bytes as f64 * share * self.model_state.gradients;
        self.all_reduce(&ranks, bytes)
    }

    /// ZeRO-1's gradient synchronization of `param_bytes` of layer `l`'s weights: a
    /// reduce-scatter over its replicas, priced as the first half of their all-reduce (what
    /// NCCL's ring and hierarchical all-reduces are made of).
    pub(crate) fn sharded_sync(
        &self,
        l: usize,
        split: Split,
        first: u32,
        param_bytes: u64,
    ) -> Sync {
        let s = self.sync(l, split, first, param_bytes);
        Sync {
            latency_us: s.latency_us / 2.0,
            bandwidth_us: s.bandwidth_us / 2.0,
        }
    }

    /// [`Costs::sharded_sync`] under hybrid sharding: the reduce-scatter over the shard
    /// group of `strategy`'s (the first of the layer's replicas), then the all-reduce of
    /// the shard across the groups.
    pub(crate) fn hybrid_sync(
        &self,
        strategy: &super::Strategy,
        l: usize,
        split: Split,
        first: u32,
        param_bytes: u64,
    ) -> Sync {
        if param_bytes == 0 {
            return Sync::default();
        }
        let (ranks, share) = layout::weight_replicas(self.graph.layers[l].kind, split, first);
        let (shards, across) = strategy.hybrid_groups(&ranks);
        let bytes = param_bytes as f64 * share * self.model_state.gradients;
        let scatter = self.all_reduce(&shards[0], bytes);
        let (latency_us, bandwidth_us) = match across.first() {
            Some(across) => {
                let all = self.all_reduce(across, bytes / shards[0].len() as f64);
                (all.latency_us, all.bandwidth_us)
            }
            None => (0.0, 0.0),
        };
        Sync {
            latency_us: scatter.latency_us / 2.0 + latency_us,
            bandwidth_us: scatter.bandwidth_us / 2.0 + bandwidth_us,
        }
    }

    /// ZeRO-1's all-gather of `bytes` of updated weights (as exported) over `ranks` (each
    /// holds a `1/n` share), priced as the second half of their all-reduce at the width
    /// the kernels read them, µs.
    pub fn sharded_gather_us(&self, ranks: &[u32], bytes: f64) -> f64 {
        let s = self.all_reduce(ranks, bytes * self.model_state.weights);
        (s.latency_us + s.bandwidth_us) / 2.0
    }

    /// One microbatch's stashed activations of layer `l` on one of its ranks under
    /// `split`, bytes.
    pub(crate) fn stash_per_microbatch(&self, l: usize, split: Split, microbatches: u32) -> f64 {
        self.stash_bytes(l, split) / f64::from(microbatches.max(1))
    }

    /// Layer `l`'s stashed activations for the whole batch on one of its ranks under
    /// `split`: an attention core's as the fused kernel the costs price keeps them.
    pub fn stash_bytes(&self, l: usize, split: Split) -> f64 {
        let fused = self.options.fused_attention.is_some();
        self.graph.layers[l].local_as(split, fused).stash_bytes
    }

    /// All-gather of `bytes` (the gathered whole) over any set of ranks, µs.
    pub(crate) fn all_gather_us(&self, ranks: &[u32], bytes: f64) -> f64 {
        self.comm.all_gather(ranks, bytes).us
    }

    /// All-reduce of `bytes` over any set of ranks, µs.
    pub fn all_reduce_us(&self, ranks: &[u32], bytes: f64) -> f64 {
        self.comm.all_reduce(ranks, bytes).us
    }

    /// The α and β of the slowest link among ranks `lo..=hi`.
    fn link(&self, lo: u32, hi: u32) -> Link {
        self.cluster.link(lo, hi)
    }

    /// Forward and backward µs of moving the tensor of `bytes` (for one microbatch) that
    /// `producer` writes under `from` into a consumer placed `to` that reads it as a
    /// `reads_as` layer ([`Layer::reads_as`](crate::layers::Layer::reads_as)): the partial
    /// sums of a row-parallel producer are reduced first, the consumer receives what it
    /// lacks (an all-gather when that is what it is, with a reduce-scatter for its
    /// gradient), and a parameter-split consumer's input gradient is summed over its slices.
    pub(crate) fn edge(
        &self,
        producer: usize,
        from: (Split, u32),
        reads_as: LayerKind,
        to: (Split, u32),
        bytes: f64,
    ) -> (f64, f64) {
        if bytes <= 0.0 {
            return (0.0, 0.0);
        }
        let (pk, ck) = layout::edge_kinds(Some(self.kind(producer)), reads_as);
        let mut fwd = 0.0;
        let mut bwd = 0.0;
        if let Some((ranks, share)) = layout::partial_sums(pk, from.0, from.1) {
            fwd += if layout::scatters_partial_sums(pk, from, ck, to) {
                self.comm.reduce_scatter(&ranks, bytes * share).us
            } else {
                let s = self.all_reduce(&ranks, bytes * share);
                s.latency_us + s.bandwidth_us
            };
        }
        // Resharding that is an all-gather runs as one (NCCL's ring), and its gradient as
        // a reduce-scatter when the consumer's input gradient is summed over its ranks.
        if let Some(ranks) = layout::gathers(pk, from, ck, to) {
            // Each group gathers the box its consumers read.
            let gathered = bytes * layout::input_share(ck, to.0);
            fwd += self.comm.all_gather(&ranks, gathered).us;
            if layout::scatters_gradient(&ranks, ck, to) {
                bwd += self.comm.reduce_scatter(&ranks, gathered).us;
                return (fwd, bwd);
            }
            // Otherwise every rank ends with the whole gradient and keeps its piece.
            if let Some((ranks, share)) = layout::input_gradient_sums(ck, to.0, to.1) {
                let s = self.all_reduce(&ranks, bytes * share);
                bwd += s.latency_us + s.bandwidth_us;
            }
            return (fwd, bwd);
        }
        let held = View::output(pk, from.0, from.1);
        let needed = View::input(ck, to.0, to.1);
        let forward = self.moving_us(held, needed, bytes);
        fwd += forward;
        // The gradient returns the same way, but to replicas it returns whole: each
        // gathers the pieces the consumer's ranks computed (an all-gather where the
        // pieces tile the replicas' box on their ranks).
        bwd += if let Some(ranks) = layout::gathers_gradient(pk, from, ck, to) {
            let gathered = bytes * layout::output_share(pk, from.0);
            self.comm.all_gather(&ranks, gathered).us
        } else if held.replication() > 1 {
            self.moving_us(needed, held, bytes)
        } else {
            forward
        };
        if let Some((ranks, share)) = layout::input_gradient_sums(ck, to.0, to.1) {
            let s = self.all_reduce(&ranks, bytes * share);
            bwd += s.latency_us + s.bandwidth_us;
        }
        (fwd, bwd)
    }

    /// µs of the halo exchange before consumer `consumer`'s forward pass (and of its
    /// gradient's return after the backward pass) when it is split by rows as `to` and
    /// reads a tensor of `bytes` (one microbatch) through its window: the piece with the
    /// largest halo receives its rows, from every neighbour at once.
    pub(crate) fn halo_us(&self, consumer: usize, to: (Split, u32), bytes: f64) -> f64 {
        let layer = &self.graph.layers[consumer];
        let (split, first) = to;
        let (Some(halo), true) = (&layer.halo, split.attribute > 1) else {
            return 0.0;
        };
        let a = split.attribute;
        let rows = (0..a)
            .map(|i| halo.window.halo_rows((i, a)))
            .max()
            .unwrap_or(0);
        if rows == 0 {
            return 0.0;
        }
        let row = bytes * layout::input_share(layer.kind, split) * f64::from(a)
            / halo.window.input.max(1) as f64;
        self.link(first, first + split.degree() - 1)
            .transfer_us(rows as f64 * row)
    }

    /// Microseconds to move a tensor of `bytes` held as `held` to where `needed` reads it.
    fn moving_us(&self, held: View, needed: View, bytes: f64) -> f64 {
        let moved = *self
            .movements
            .borrow_mut()
            .entry((held, needed))
            .or_insert_with(|| {
                let m = layout::movement(&held, &needed)?;
                // Across servers, a server's network interface carries all its GPUs'
                // traffic.
                // (A flat network gives every GPU its own link.)
                let across = self.cluster.flat.is_none()
                    && self.cluster.level(&[m.span.0, m.span.1]) >= LinkLevel::InterNode;
                let node_of = |r: u32| self.cluster.locate(r).map_or(0, |l| l.node);
                let node = if across {
                    layout::node_busiest(&held, &needed, &node_of)
                } else {
                    0.0
                };
                Some((m, node))
            });
        moved.map_or(0.0, |(m, node)| {
            self.link(m.span.0, m.span.1)
                .transfer_us(m.busiest.max(node) * bytes)
        })
    }

    /// A layer's kind, as placement sees it (kinds that cannot split freely split samples).
    pub(crate) fn kind(&self, l: usize) -> LayerKind {
        self.graph.layers[l].kind
    }

    /// Bytes one rank holds for layer `l` under `split`: weights, gradients, optimizer
    /// state, `extra_weight_versions` stashed weight copies, and `in_flight` microbatches'
    /// stashed activations (each `1/microbatches` of the batch).
    pub(crate) fn memory(
        &self,
        l: usize,
        split: Split,
        microbatches: u32,
        in_flight: u32,
        extra_weight_versions: u32,
    ) -> f64 {
        let layer: &Layer = &self.graph.layers[l];
        let (_, share) = layout::weight_replicas(layer.kind, split, 0);
        let weights = layer.param_bytes as f64 * share;
        let m = self.model_state();
        let state = weights * (m.weights + m.gradients + m.optimizer)
            + weights * m.weights * f64::from(extra_weight_versions);
        state + self.stash_per_microbatch(l, split, microbatches) * f64::from(in_flight.max(1))
    }

    /// The optimizer step on rank `rank` holding `weight_bytes` of weights, µs: it reads
    /// weights, gradients and optimizer state and writes weights and state, at HBM speed.
    pub fn step_us(&self, weight_bytes: f64, rank: u32) -> f64 {
        let moved = weight_bytes * (3.0 + 2.0 * self.options.optimizer.state_factor());
        moved / self.cluster.gpu(rank).hbm_bandwidth * 1e6
    }

    /// Bytes of weights, gradients and optimizer state a rank keeps per byte of the
    /// model's weights as exported: the weights' own width and the optimizer's state, or
    /// in mixed precision (fp16, bf16) 16-bit weights and gradients with an fp32 master copy
    /// and fp32 state (16 B per parameter with Adam).
    pub fn model_state(&self) -> ModelState {
        self.model_state
    }

    /// The math precision priced.
    pub fn precision(&self) -> Precision {
        self.options.precision
    }

    /// The optimizer priced.
    pub fn optimizer(&self) -> Optimizer {
        self.options.optimizer
    }

    /// Whether attention cores are priced as one fused kernel.
    pub fn fused_attention(&self) -> bool {
        self.options.fused_attention.is_some()
    }

    /// The workspace every used GPU reserves.
    pub fn workspace(&self) -> f64 {
        self.options.workspace_bytes
    }
}
