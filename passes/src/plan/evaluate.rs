//! Prices one strategy: iteration time, GPU time, memory. Every plan ralpc reports —
//! searched, baseline, or read from a strategy file — goes through [`evaluate`], so plans
//! are always compared under the same costs.
//!
//! With `P` stages, `M` microbatches, per-microbatch stage times `tₛ`, cut transfer times
//! `x꜀` and per-iteration exposed gradient synchronizations plus optimizer steps `yₛ`
//! (gradients are all-reduced in buckets launched during the last backward pass, see
//! [`buckets`]; only the part that outlasts that pass is exposed):
//! * synchronous schedules (GPipe, 1F1B, ZB-H1): played pass by pass in the order the
//!   lowering emits ([`played_us`]): each stage runs its forwards, backwards (and under
//!   ZB-H1 its weight passes, the backward's weight-gradient part run later) one at a time
//!   as their inputs arrive, each cut carries one message at a time each way, and stage `k`
//!   synchronizes once its last pass is done (its last gradient for the stage before may
//!   wait behind the buckets it launched). With equal stages and free cuts this is
//!   `(M + P − 1)·t` (the fill and drain, then one microbatch per stage time; the bubble is
//!   `(P−1)/M` of the steady state) for GPipe and 1F1B (with cuts, GPipe's
//!   `Σₛ tₛ + Σ꜀ x꜀ + (M−1)·max(tₛ, x꜀)`; 1F1B's steady state also waits for each
//!   gradient's round trip),
//!   and ZB-H1 leaves a third of that bubble when a stage's forward, input gradients and
//!   weight gradients take alike;
//! * PipeDream's asynchronous schedule (weights updated per microbatch, stashed per
//!   in-flight microbatch): played as 1F1B with each backward followed by its stage's
//!   synchronization and step, as its executable plan runs an iteration (PipeDream's
//!   steady state, `M · max(tₛ + yₛ, x꜀)`, needs minibatches flowing across iterations,
//!   which ralpc's programs do not do: each fills and drains its pipeline);
//! * the interleaved 1F1B schedule (`v` stages per GPU): played alike over its GPUs' orders;
//!   with `t` a GPU's microbatch over its stages, equal stages and free cuts give
//!   `T = M·t + (P/v − 1)·t/v`, then each GPU's stages synchronize (summed: an
//!   overestimate where an early chunk's buckets hide behind later chunks' backwards).
//!
//! One stage with `M = 1` gives `T = t + y`: the sequential sum over layers of compute,
//! resharding and gradient synchronization that data-parallel and burst-parallel plans have.
//!
//! GPU time: for one stage, the busy time of each layer times the GPUs it uses (idle GPUs
//! can run other work, DeepPool's argument); for pipelines, every stage's GPUs for the whole
//! iteration. Amplification = GPU time / the single-GPU iteration time.
//!
//! Memory per rank: for each layer it hosts, weights, gradients and optimizer state of its
//! slice, the weight versions an asynchronous stage stashes, and the activations of its
//! in-flight microbatches (1F1B and async: `min(M, P−k)` at stage `k`; GPipe: `M`;
//! interleaved: Megatron-LM's warm-up, [`Strategy::in_flight`]; ZB-H1: 1F1B's, and what
//! the weight passes read of `min(P, M) − min(P−k, M)` more, [`Strategy::weights_waiting`]),
//! plus what one microbatch's backward holds on top — the gradients it writes, receives
//! and keeps for a producer, less the stash of the layers its backward already ran
//! ([`transient`](super::transient)) — plus the workspace.

use serde::Serialize;

use super::buckets::{buckets, Bucket, BUCKET_CAPS};
use super::costs::{Costs, Sync};
use super::order::{self, Pass};
use super::tied::{separately_reduced, tied_reductions};
use super::transient::{backward_peak, received_gradients, LayerBytes};
use super::{PlanError, Schedule, Strategy};
use crate::layers::Producer;

/// One layer's share of the predicted time.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct LayerCost {
    /// Forward compute per microbatch, µs.
    pub forward_us: f64,
    /// Backward compute per microbatch, µs.
    pub backward_us: f64,
    /// The part of `backward_us` making weight gradients (a pass of its own under
    /// `zb-h1`), µs.
    pub weight_us: f64,
    /// Its forward run again before its backward per microbatch (recomputation), µs.
    pub recompute_us: f64,
    /// Gradient synchronization per iteration, µs (a bucket's latency on its first layer).
    pub sync_us: f64,
    /// Moving its inputs per microbatch, forward and backward, µs.
    pub transfer_us: f64,
}

/// One stage's figures.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct StageCost {
    /// Compute and resharding of one microbatch, µs.
    pub microbatch_us: f64,
    /// Its backward part, µs.
    pub backward_us: f64,
    /// The weight gradients' part of `backward_us` (a pass of its own under `zb-h1`), µs.
    pub weight_us: f64,
    /// Gradient synchronization not hidden behind the last backward pass, plus the
    /// optimizer step, per iteration (async: per microbatch), µs.
    pub sync_us: f64,
    /// Moving activations into this stage per microbatch (forward and backward), µs.
    pub receive_us: f64,
    /// The most memory any of its GPUs holds, bytes.
    pub memory_bytes: f64,
    /// How long its last backward's gradient for the previous stage waits behind its
    /// gradient all-reduces, µs.
    pub send_delay_us: f64,
    /// Gradient all-reduces (buckets) per iteration.
    pub buckets: u32,
    /// The bucket size cap chosen, bytes; `None`: one bucket per replica group.
    pub bucket_bytes: Option<f64>,
}

/// A strategy's predicted figures.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Evaluation {
    /// Predicted time of one iteration (a global batch), µs.
    pub iteration_time_us: f64,
    /// The busy GPU time of one iteration, µs.
    pub gpu_time_us: f64,
    /// GPU time / single-GPU iteration time.
    pub gpu_sec_amplification: f64,
    /// GPUs the plan uses.
    pub gpus_used: u32,
    /// The most memory any GPU holds, bytes.
    pub peak_memory_bytes: f64,
    /// Whether every GPU's memory fits its capacity.
    pub fits: bool,
    /// Per stage.
    pub stages: Vec<StageCost>,
    /// Per layer.
    pub layers: Vec<LayerCost>,
}

/// Prices `strategy` (validated against the graph and the cluster first).
///
/// Cost: O(layers · inputs · ranks) for the resharding boxes, cached across calls.
///
/// # Errors
/// [`PlanError::Strategy`] when the strategy does not fit the model or the cluster.
pub fn evaluate(costs: &Costs<'_>, strategy: &Strategy) -> Result<Evaluation, PlanError> {
    strategy.validate(costs)?;
    let graph = costs.graph;
    let m = strategy.microbatches;
    let stages = strategy.stages.len();
    let stage_of = strategy.stage_of_layers();
    let mut layers = Vec::with_capacity(graph.layers.len());
    let mut stage_cost = vec![StageCost::default(); stages];
    let mut busy_gpu_us = 0.0;
    let mut syncs = Vec::with_capacity(graph.layers.len());
    let mut memory = vec![0.0f64; costs.gpus as usize];
    let mut backward_bytes = vec![LayerBytes::default(); graph.layers.len()];
    let reductions = tied_reductions(graph, strategy);
    let separate = separately_reduced(graph, &reductions);
    // Per rank, the weight bytes its optimizer step updates (its share under ZeRO-1).
    let mut stepped = vec![0.0f64; costs.gpus as usize];
    // Per (recomputed run, rank), one microbatch's activations of the run: alive while
    // the run is recomputed and its backward runs.
    let mut recomputing: std::collections::BTreeMap<(usize, u32), f64> = Default::default();
    // Edges between layers, in order: which reuse an earlier edge's forward all-gather.
    let shared = super::shared::shared_gathers(graph, strategy);
    // Inputs kept as pieces and gathered again for the backward pass.
    let regathers = super::regather::regathers(graph, strategy);
    let mut edge_index = 0;
    for (l, layer) in graph.layers.iter().enumerate() {
        let k = stage_of[l];
        let stage = &strategy.stages[k];
        let split = strategy.layers[l];
        let g = split.degree();
        let mut work = costs.work(l, split, stage.first_rank, m);
        let mut regathered = false;
        let own_bytes = layer.param_bytes.saturating_sub(separate[l]);
        syncs.push(if strategy.zero > 0 && strategy.shard_groups > 1 {
            costs.hybrid_sync(strategy, l, split, stage.first_rank, own_bytes)
        } else if strategy.zero > 0 {
            costs.sharded_sync(l, split, stage.first_rank, own_bytes)
        } else {
            costs.sync(l, split, stage.first_rank, own_bytes)
        });
        let run = strategy.recompute_run(l);
        let recompute_us = if run.is_some() { work.fwd_us } else { 0.0 };
        let mut transfer = 0.0;
        for edge in &layer.inputs {
            let Producer::Layer(p) = edge.from else {
                continue;
            };
            let p = p.0 as usize;
            let from = (strategy.layers[p], strategy.stages[stage_of[p]].first_rank);
            let (f, b) = costs.edge(
                p,
                from,
                layer.reads_as(edge, split),
                (split, stage.first_rank),
                edge.bytes as f64 / f64::from(m),
            );
            // What a shared collective moves is priced once, on the first edge.
            let (f, b) = match shared.get(edge_index).copied().flatten() {
                Some(s) => (
                    if s.forward { 0.0 } else { f },
                    if s.gradient { 0.0 } else { b },
                ),
                None => (f, b),
            };
            regathered |= regathers
                .of_edge
                .get(edge_index)
                .is_some_and(Option::is_some);
            edge_index += 1;
            // Halo rows move inside the consumer's ranks, forward and their gradient back.
            let reads_halo = layer
                .halo
                .as_ref()
                .is_some_and(|h| edge.value.is_some_and(|v| h.inputs.contains(&v)));
            if reads_halo {
                let h = costs.halo_us(
                    l,
                    (split, stage.first_rank),
                    edge.bytes as f64 / f64::from(m),
                );
                transfer += 2.0 * h;
                busy_gpu_us += f64::from(g) * 2.0 * h * f64::from(m);
            }
            if stage_of[p] == k {
                transfer += f + b;
                busy_gpu_us += f64::from(g.max(from.0.degree())) * (f + b) * f64::from(m);
            } else {
                stage_cost[k].receive_us += f + b;
            }
        }
        // Under zb-h1 a layer runs its weight gradients apart where its backward makes
        // any and reads no input gathered again (whose whole would be held until then).
        if strategy.schedule.splits_backward() && regathered {
            work.weight_us = 0.0;
        }
        stage_cost[k].microbatch_us += work.fwd_us + recompute_us + work.bwd_us + transfer;
        stage_cost[k].backward_us += recompute_us + work.bwd_us + transfer / 2.0;
        stage_cost[k].weight_us += work.weight_us;
        busy_gpu_us += f64::from(g) * (work.fwd_us + recompute_us + work.bwd_us) * f64::from(m);
        let in_flight = strategy.in_flight(k);
        let versions = if strategy.schedule == Schedule::Async {
            in_flight - 1
        } else {
            0
        };
        let (replicas, share) = super::layout::weight_replicas(layer.kind, split, 0);
        let weight_bytes = layer.param_bytes as f64 * share;
        // ZeRO keeps a 1/n share on each of the n replicas (of a shard group): of the
        // optimizer state (1), the gradients too (2), the weights too (3).
        let shards = if strategy.zero > 0 {
            strategy.hybrid_groups(&replicas).0[0].len() as f64
        } else {
            1.0
        };
        let state = costs.model_state();
        let sharded = weight_bytes
            * (state.optimizer
                + if strategy.zero >= 2 {
                    state.gradients
                } else {
                    0.0
                }
                + if strategy.zero >= 3 {
                    state.weights
                } else {
                    0.0
                });
        let mut bytes =
            costs.memory(l, split, m, in_flight, versions) - sharded * (1.0 - 1.0 / shards);
        // What a sharded state keeps whole while the layer runs: its gathered weights and
        // its gradients before their reduce-scatter.
        let whole = if shards > 1.0 {
            sharded - weight_bytes * state.optimizer
        } else {
            0.0
        };
        let mut freed = costs.stash_per_microbatch(l, split, m);
        if let Some((first, _)) = run {
            // A recomputed layer keeps only the run's inputs per microbatch in flight.
            let stash = freed;
            bytes -= stash * f64::from(in_flight);
            let kept: f64 = layer
                .inputs
                .iter()
                .filter(|e| !matches!(e.from, Producer::Layer(p) if (p.0 as usize) >= first))
                .map(|e| {
                    e.bytes as f64 / f64::from(m)
                        * super::layout::input_share(layer.reads_as(e, split), split)
                })
                .sum();
            bytes += kept * f64::from(in_flight);
            freed = kept;
            for r in stage.first_rank..stage.first_rank + g {
                *recomputing.entry((first, r)).or_default() += stash;
            }
        }
        if run.is_none() {
            // An input an earlier reader keeps for both backward passes is kept once on the
            // same ranks alike split; placed otherwise, this reader keeps its own copy.
            let own_copies: f64 = layer
                .inputs
                .iter()
                .filter(|e| {
                    e.stash_kept_by.is_some_and(|keeper| {
                        let keeper = keeper.0 as usize;
                        stage_of[keeper] != k || strategy.layers[keeper] != split
                    })
                })
                .map(|e| {
                    e.bytes as f64 / f64::from(m)
                        * super::layout::input_share(layer.reads_as(e, split), split)
                })
                .sum();
            bytes += own_copies * f64::from(in_flight);
            freed += own_copies;
            // Inputs gathered again are kept as this rank's piece.
            let saved = regathers.saved[l] / f64::from(m);
            bytes -= saved * f64::from(in_flight);
            freed -= saved;
        }
        // Its backward writes its input gradient while its activation is still held.
        let input_gradient: f64 = layer
            .inputs
            .iter()
            .filter(|e| matches!(e.from, Producer::Layer(_)))
            .map(|e| {
                e.bytes as f64 / f64::from(m)
                    * super::layout::input_share(layer.reads_as(e, split), split)
            })
            .sum();
        for r in stage.first_rank..stage.first_rank + g {
            memory[r as usize] += bytes;
            stepped[r as usize] += own_bytes as f64 * share / shards;
        }
        let gradient_shards = if strategy.zero >= 2 { shards } else { 1.0 };
        backward_bytes[l] = LayerBytes {
            input_gradient,
            whole,
            freed,
            gradients: weight_bytes * state.gradients / gradient_shards,
            weight_pass: strategy.schedule.splits_backward() && work.weight_us > 0.0,
        };
        layers.push(LayerCost {
            forward_us: work.fwd_us,
            backward_us: work.bwd_us,
            weight_us: work.weight_us,
            recompute_us,
            sync_us: 0.0,
            transfer_us: transfer,
        });
    }
    // An input gathered again overlaps the backward pass that runs before its last
    // reader's, and is held from there to its first reader's backward.
    for r in &regathers.list {
        let last = r.last_reader();
        let us = costs.all_gather_us(&r.ranks, r.bytes / f64::from(m));
        let hidden = match r.before != last {
            true => layers[r.before].backward_us,
            false => 0.0,
        };
        let exposed = (us - hidden).max(0.0);
        let k = stage_of[last];
        layers[last].transfer_us += exposed;
        stage_cost[k].microbatch_us += exposed;
        stage_cost[k].backward_us += exposed;
        busy_gpu_us += f64::from(strategy.layers[last].degree()) * exposed * f64::from(m);
        let n = r.ranks.len() as f64;
        let received = r.bytes * (n - 1.0) / n / f64::from(m);
        let first = r.readers.first().copied().unwrap_or(r.before);
        for held in &mut backward_bytes[first..=r.before.max(last)] {
            held.whole += received;
        }
    }
    // A tied weight's other holders keep a copy, its gradient and its optimizer state too,
    // and every holder waits for its all-reduce before the step.
    // The run being recomputed holds one microbatch's activations on top (the largest).
    let mut recompute_peak = vec![0.0f64; costs.gpus as usize];
    for (&(_, r), &run_bytes) in &recomputing {
        recompute_peak[r as usize] = recompute_peak[r as usize].max(run_bytes);
    }
    let mut tied_us = vec![0.0f64; costs.gpus as usize];
    for r in &reductions {
        let owner = graph.tied[r.weight].layers[0].0 as usize;
        let first = strategy.stages[stage_of[owner]].first_rank;
        let owners = first..first + strategy.layers[owner].degree();
        let us = costs.all_reduce_us(&r.ranks, r.bytes * costs.model_state().gradients);
        for &rank in &r.ranks {
            if !owners.contains(&rank) {
                let m = costs.model_state();
                memory[rank as usize] += r.bytes * (m.weights + m.gradients + m.optimizer);
            }
            // Every holder updates its whole copy after the weight's own all-reduce.
            stepped[rank as usize] += r.bytes;
            tied_us[rank as usize] += us;
        }
    }
    for (k, stage) in strategy.stages.iter().enumerate() {
        let mut slowest: f64 = 0.0;
        let mut tied: f64 = 0.0;
        for r in stage.first_rank..stage.first_rank + stage.gpus {
            tied = tied.max(tied_us[r as usize]);
        }
        busy_gpu_us += tied * f64::from(stage.gpus);
        for r in stage.first_rank..stage.first_rank + stage.gpus {
            let step = costs.step_us(stepped[r as usize], r);
            slowest = slowest.max(step);
            busy_gpu_us += step;
        }
        // The bucketing that hides the most: small buckets overlap backward, big ones pay
        // the all-reduce latency fewer times.
        // A later stage also counts how long its gradient for the stage before waits.
        // (Under zb-h1 the weight passes launch them, after every backward.)
        let apart = strategy.schedule.splits_backward();
        let weigh_delay = if k > 0 && !apart { 1.0 } else { 0.0 };
        // Under ZeRO each bucket's weights are all-gathered after the step; under ZeRO-3
        // before every pass over it as well (forward, recomputation, backward).
        let passes = match strategy.zero {
            0 => 0.0,
            1 | 2 => 1.0,
            _ => {
                let recomputes = (stage.first_layer..=stage.last_layer)
                    .any(|l| strategy.recompute_run(l).is_some());
                1.0 + f64::from(m) * if recomputes { 3.0 } else { 2.0 }
            }
        };
        // ZeRO-2 and 3 reduce-scatter every microbatch's gradients; the buckets' exposure
        // below is the last microbatch's. Each earlier microbatch's reduce-scatters run on
        // the communication stream while the stage works on the microbatches after it, so
        // they cost only what they exceed the work between two of them by (a stage whose
        // communication outruns its computation): a forward and a backward under 1F1B, a
        // backward under GPipe (its forwards all came first), a weight pass under zb-h1
        // (whose weight passes launch them, back to back at the end).
        let earlier = if strategy.zero >= 2 {
            f64::from(m.saturating_sub(1))
        } else {
            0.0
        };
        let slot = match strategy.schedule {
            Schedule::ZeroBubble | Schedule::ZeroBubbleV => stage_cost[k].weight_us,
            Schedule::GPipe => stage_cost[k].backward_us,
            Schedule::OneFOneB | Schedule::Async => stage_cost[k].microbatch_us,
        };
        let gathers = |bs: &[Bucket]| -> f64 {
            let gathered: f64 = bs
                .iter()
                .map(|b| {
                    passes
                        * costs.sharded_gather_us(&strategy.hybrid_groups(&b.ranks).0[0], b.bytes)
                })
                .sum();
            let scattered: f64 = bs
                .iter()
                .flat_map(|b| b.layers.clone().map(|l| bucket_layer_us(b, l, &syncs)))
                .sum();
            gathered + earlier * (scattered - slot).max(0.0)
        };
        let (exposed, delay, gather, chosen) = BUCKET_CAPS
            .into_iter()
            .map(|cap| {
                let bs = buckets(graph, strategy, stage, cap, &separate);
                let t = bucket_times(&bs, &syncs, &layers, stage, apart);
                (t.exposed_us, t.delay_us, gathers(&bs), bs)
            })
            .min_by(|a, b| {
                (a.0 + a.2 + weigh_delay * a.1).total_cmp(&(b.0 + b.2 + weigh_delay * b.1))
            })
            .unwrap_or_default();
        for b in &chosen {
            for l in b.layers.clone() {
                layers[l].sync_us = bucket_layer_us(b, l, &syncs);
            }
        }
        // Synchronization hidden behind backward costs no GPU time; the exposed tail
        // holds the GPUs of the last bucket.
        if let Some(last) = chosen.last() {
            busy_gpu_us += (exposed + gather) * f64::from(last.all.end - last.all.start);
        }
        stage_cost[k].sync_us = exposed + tied + slowest + gather;
        stage_cost[k].send_delay_us = if k > 0 { delay } else { 0.0 };
        stage_cost[k].buckets = chosen.len() as u32;
        stage_cost[k].bucket_bytes = chosen_cap(&chosen);
    }
    owed_weight_passes(costs, strategy, &stage_of, &backward_bytes, &mut memory);
    let transient = backward_peak(costs, strategy, &stage_of, &backward_bytes);
    let mut fits = true;
    let mut peak: f64 = 0.0;
    for (k, stage) in strategy.stages.iter().enumerate() {
        for r in stage.first_rank..stage.first_rank + stage.gpus {
            let used = memory[r as usize]
                + transient[r as usize]
                + recompute_peak[r as usize]
                + costs.workspace();
            fits &= used <= costs.capacity(r);
            peak = peak.max(used);
            stage_cost[k].memory_bytes = stage_cost[k].memory_bytes.max(used);
        }
    }
    let v = strategy.virtual_stages();
    let iteration = strategy.schedule.iteration_us(&stage_cost, m, v);
    // Interleaved, every GPU runs `v` stages.
    let gpus_used: u32 = strategy.stages.iter().map(|s| s.gpus).sum::<u32>() / v as u32;
    let gpu_time = if stages == 1 {
        busy_gpu_us
    } else {
        f64::from(gpus_used) * iteration
    };
    let single = costs.single_gpu_time_us();
    Ok(Evaluation {
        iteration_time_us: iteration,
        gpu_time_us: gpu_time,
        gpu_sec_amplification: if single > 0.0 { gpu_time / single } else { 1.0 },
        gpus_used,
        peak_memory_bytes: peak,
        fits,
        stages: stage_cost,
        layers,
    })
}

/// Layer `l`'s part of bucket `b`'s all-reduce: its bandwidth part, plus the latency on
/// the layer that launches the bucket (its earliest).
fn bucket_layer_us(b: &Bucket, l: usize, syncs: &[Sync]) -> f64 {
    let s = syncs[l];
    s.bandwidth_us
        + if l == *b.layers.start() {
            s.latency_us
        } else {
            0.0
        }
}

/// A stage's last backward pass with its gradient buckets.
#[derive(Clone, Debug, Default)]
pub(crate) struct BucketTimes {
    /// How much later the pass and its all-reduces end than the pass alone.
    pub exposed_us: f64,
    /// How long the pass's input gradient for the previous stage waits for the
    /// communication stream behind buckets launched before it.
    pub delay_us: f64,
}

/// A stage's last backward pass with its gradient all-reduces.
///
/// In that pass each layer computes its backward (`bₗ`), then sends its input gradient
/// (`xₗ/2`) on the communication stream, which the next layer's backward waits for; a
/// bucket is launched when its earliest layer is done and holds the communication stream
/// for its all-reduce, delaying the input-gradient transfers behind it.
pub(crate) fn bucket_times(
    buckets: &[Bucket],
    syncs: &[Sync],
    layers: &[LayerCost],
    stage: &super::Stage,
    apart: bool,
) -> BucketTimes {
    let (mut alone, mut computed, mut communicated, mut delay) = (0.0, 0.0f64, 0.0f64, 0.0);
    let mut next = buckets.iter().peekable();
    for l in (stage.first_layer..=stage.last_layer).rev() {
        // The last pass that makes gradients: the backward, or under zb-h1 the weight
        // pass, which moves nothing.
        let (transfer, backward) = match apart {
            true => (0.0, layers[l].weight_us),
            false => (
                layers[l].transfer_us / 2.0,
                layers[l].recompute_us + layers[l].backward_us,
            ),
        };
        alone += backward + transfer;
        computed += backward;
        if transfer > 0.0 {
            communicated = communicated.max(computed) + transfer;
            computed = communicated;
        }
        if l == stage.first_layer {
            delay = (communicated - computed).max(0.0);
        }
        while let Some(b) = next.next_if(|b| *b.layers.start() == l) {
            let us: f64 = b.layers.clone().map(|j| bucket_layer_us(b, j, syncs)).sum();
            communicated = communicated.max(computed) + us;
        }
    }
    BucketTimes {
        exposed_us: (communicated.max(computed) - alone).max(0.0),
        delay_us: delay,
    }
}

/// The cap a bucketing used: `None` when unbounded.
fn chosen_cap(buckets: &[Bucket]) -> Option<f64> {
    buckets.first().and_then(|b| b.cap)
}

impl Schedule {
    /// Microbatches whose activations stage `k` of `stages` holds at once.
    pub fn in_flight(self, microbatches: u32, stages: usize, k: usize) -> u32 {
        let behind = (stages - k) as u32;
        match self {
            // The asynchronous schedule's plan runs each iteration's microbatches in 1F1B's
            // order, so it holds as many (PipeDream's steady state holds `P − k`).
            // ZB-V's two chunks a group are counted by the strategy.
            Schedule::OneFOneB | Schedule::ZeroBubble | Schedule::ZeroBubbleV | Schedule::Async => {
                behind.min(microbatches).max(1)
            }
            Schedule::GPipe => microbatches.max(1),
        }
    }

    /// The iteration time from per-stage figures (see the module docs), of stages that
    /// are `virtual_stages` chunks per GPU when interleaved.
    pub fn iteration_us(
        self,
        stages: &[StageCost],
        microbatches: u32,
        virtual_stages: usize,
    ) -> f64 {
        match self {
            Schedule::OneFOneB | Schedule::GPipe | Schedule::ZeroBubble | Schedule::ZeroBubbleV => {
                played_us(self, stages, microbatches, virtual_stages)
            }
            // PipeDream's steady state (`m` times the bottleneck stage) needs minibatches to
            // flow across iterations; the executable plan runs each iteration's `m` through
            // the 1F1B order with no flush, each backward followed by its stage's
            // synchronization and step, so the pipeline fills and drains every iteration:
            // priced as it runs.
            Schedule::Async => played_us(self, stages, microbatches, virtual_stages),
        }
    }
}

/// The bubble rate of a pipeline of `groups` equal GPU groups (Qi et al.'s §5.3
/// definition: the iteration less `m` microbatches of one group's work, over the
/// iteration), each microbatch taking `forward_us`, `backward_us` (input gradients) and
/// `weight_us` (weight gradients) on a group and `message_us` between groups, played in
/// `schedule`'s order: under ZB-V each group's work in two equal chunks.
pub fn even_pipeline_bubble(
    schedule: Schedule,
    groups: usize,
    microbatches: u32,
    forward_us: f64,
    backward_us: f64,
    weight_us: f64,
    message_us: f64,
) -> f64 {
    let v = if schedule == Schedule::ZeroBubbleV {
        2
    } else {
        1
    };
    let share = 1.0 / v as f64;
    let stage = StageCost {
        microbatch_us: (forward_us + backward_us + weight_us) * share,
        backward_us: (backward_us + weight_us) * share,
        weight_us: weight_us * share,
        // A message each way.
        receive_us: 2.0 * message_us,
        ..StageCost::default()
    };
    let stages = vec![stage; groups * v];
    let iteration = schedule.iteration_us(&stages, microbatches, v);
    let work = f64::from(microbatches) * (forward_us + backward_us + weight_us);
    (iteration - work) / iteration
}

/// Under the zero-bubble schedules, what stage `k`'s owed weight passes hold ([`Strategy::weights_waiting`]
/// microbatches of them): each weight-passing layer's kept activations and the gradients
/// of its output it reads — from later stages as received, from its own stage as each
/// consumer's input-gradient buffer (whole: one buffer holds all that consumer's inputs).
fn owed_weight_passes(
    costs: &Costs<'_>,
    strategy: &Strategy,
    stage_of: &[usize],
    layers: &[LayerBytes],
    memory: &mut [f64],
) {
    if !strategy.schedule.splits_backward() {
        return;
    }
    let graph = costs.graph;
    let owed: Vec<f64> = (0..strategy.stages.len())
        .map(|k| f64::from(strategy.weights_waiting(k)))
        .collect();
    let waiting = |l: usize| owed[stage_of[l]];
    let ranks = |l: usize| {
        let first = strategy.stages[stage_of[l]].first_rank;
        first..first + strategy.layers[l].degree()
    };
    for (c, consumer) in graph.layers.iter().enumerate() {
        // A consumer's input-gradient buffer (one for all its inputs, on its ranks) is
        // kept until the last weight pass of a same-stage producer reads it.
        let kept_by = (consumer.inputs.iter())
            .filter_map(|e| match e.from {
                Producer::Layer(p) => Some(p.0 as usize),
                Producer::Input(_) => None,
            })
            .find(|&p| layers[p].weight_pass && stage_of[p] == stage_of[c]);
        if let Some(p) = kept_by {
            for r in ranks(c) {
                memory[r as usize] += layers[c].input_gradient * waiting(p);
            }
        }
    }
    // Each weight pass's kept activations and the gradient of its output received from
    // later stages.
    let received = received_gradients(costs, strategy, stage_of);
    for (l, bytes) in layers.iter().enumerate() {
        if bytes.weight_pass {
            for r in ranks(l) {
                memory[r as usize] += (bytes.freed + received[l]) * waiting(l);
            }
        }
    }
}

/// A synchronous schedule's iteration (GPipe, 1F1B, ZB-H1, ZB-V, interleaved 1F1B), played
/// pass by pass as the lowering orders them ([`order::group_passes`]): stage `k` of `P·v`
/// runs on GPU group `k mod P` (under ZB-V, group `k` or `2P − 1 − k`), which runs its
/// stages' passes in its order, one at a time. A forward waits for the stage before's forward of the same microbatch, a
/// backward for the stage after's backward (the last stage's for its own forward), a weight
/// pass for its own backward. A stage's forward takes `microbatch_us − backward_us`, its
/// backward `backward_us` (less `weight_us` when the schedule runs the weight gradients
/// apart) and its weight pass `weight_us`. Each cut carries one message at a time each
/// way, for half its `receive_us`, from when its pass ends; a stage's last backward's
/// gradient leaves after `send_delay_us` (the gradient buckets it launched go first) unless
/// weight passes launch them. Each group synchronizes its stages' gradients after its last
/// pass.
///
/// With equal stages of `F`, `B` and `W` and free cuts, 1F1B and GPipe take
/// `(M + P − 1)(F + B + W)`, ZB-H1 `M(F + B + W) + (P − 1)(F + B − W)` where `W ≤ F` (Qi et
/// al. §3.1), and interleaving `v` stages a group `M·t + (P − 1)·t/v` with `t` a group's
/// microbatch (Narayanan et al. §2.2). ZB-V with equal chunks of `f`, `b` and `w`, `M ≥ 2P −
/// 1`, takes `2M(f + b + w) + (P − 1)·max(f, b)` when `w` is no longer than either: the
/// last group's first forward and the first group's last backward wait `P − 1` chunk
/// passes.
fn played_us(schedule: Schedule, stages: &[StageCost], microbatches: u32, v: usize) -> f64 {
    let n = stages.len();
    if n == 0 {
        return 0.0;
    }
    let m = microbatches.max(1);
    let groups = (n / v.max(1)).max(1);
    let apart = schedule.splits_backward();
    // The asynchronous schedule synchronizes and steps a stage after each of its backward
    // passes (its gradients already sent on), not once at the end.
    let steps_each = schedule == Schedule::Async;
    let orders: Vec<Vec<(usize, Pass)>> = (0..groups)
        .map(|g| {
            (order::group_passes(schedule, groups, v, g, m).into_iter())
                .map(|(chunk, pass)| (order::stage_of_chunk(schedule, groups, chunk, g), pass))
                .collect()
        })
        .collect();
    let mut forward_end = vec![vec![None; m as usize]; n];
    let mut backward_end = vec![vec![None; m as usize]; n];
    // When each cut (into stage k, from stage k − 1) is next free, each way.
    let (mut forward_link, mut backward_link) = (vec![0.0f64; n], vec![0.0f64; n]);
    // When each message arrives: a forward's output at stage k + 1, a gradient at k − 1.
    let mut forward_arrival = vec![vec![None; m as usize]; n];
    let mut backward_arrival = vec![vec![None; m as usize]; n];
    let mut next = vec![0; groups];
    let mut free = vec![0.0f64; groups];
    // Groups run until each waits on another; the orders never wait in a cycle, so each
    // round runs at least one pass until all are done.
    loop {
        let mut ran = false;
        for g in 0..groups {
            while let Some(&(k, pass)) = orders[g].get(next[g]) {
                let s = &stages[k];
                let forward_us = s.microbatch_us - s.backward_us;
                let weight_us = if apart { s.weight_us } else { 0.0 };
                let (ready, us) = match pass {
                    Pass::Forward(j) => (
                        match k {
                            0 => Some(0.0),
                            _ => forward_arrival[k][j as usize],
                        },
                        forward_us,
                    ),
                    Pass::Backward(j) => (
                        match k + 1 == n {
                            true => forward_end[k][j as usize],
                            false => backward_arrival[k][j as usize],
                        },
                        s.backward_us - weight_us,
                    ),
                    Pass::Weight(j) => (backward_end[k][j as usize], weight_us),
                };
                let Some(ready) = ready else { break };
                let end = free[g].max(ready) + us;
                free[g] = end;
                next[g] += 1;
                ran = true;
                match pass {
                    Pass::Forward(j) => {
                        forward_end[k][j as usize] = Some(end);
                        if let Some(after) = stages.get(k + 1) {
                            let sent = end.max(forward_link[k + 1]) + after.receive_us / 2.0;
                            forward_link[k + 1] = sent;
                            forward_arrival[k + 1][j as usize] = Some(sent);
                        }
                    }
                    Pass::Backward(j) => {
                        backward_end[k][j as usize] = Some(end);
                        if steps_each {
                            free[g] += s.sync_us;
                        }
                        if k > 0 {
                            // Its gradient buckets are launched in this backward: the last
                            // one, or every one under the asynchronous schedule.
                            let delay = match !apart && (steps_each || j + 1 == m) {
                                true => s.send_delay_us,
                                false => 0.0,
                            };
                            let sent = (end + delay).max(backward_link[k]) + s.receive_us / 2.0;
                            backward_link[k] = sent;
                            backward_arrival[k - 1][j as usize] = Some(sent);
                        }
                    }
                    Pass::Weight(_) => {}
                }
            }
        }
        if !ran {
            break;
        }
    }
    // The orders never wait in a cycle; were one to, the plan would never end.
    if next.iter().zip(&orders).any(|(n, o)| *n != o.len()) {
        debug_assert!(false, "a schedule's passes wait on each other in a cycle");
        return f64::INFINITY;
    }
    (0..groups)
        .map(|g| match steps_each {
            true => free[g],
            false => {
                free[g]
                    + (stages.iter().enumerate())
                        .filter(|&(k, _)| order::group_of_stage(schedule, groups, k).0 == g)
                        .map(|(_, s)| s.sync_us)
                        .sum::<f64>()
            }
        })
        .fold(0.0, f64::max)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stage(forward: f64, backward: f64, weight: f64) -> StageCost {
        StageCost {
            microbatch_us: forward + backward,
            backward_us: backward,
            weight_us: weight,
            ..StageCost::default()
        }
    }

    #[test]
    fn zero_bubble_leaves_a_third_of_1f1bs_bubble_when_its_passes_take_alike() {
        // Qi et al. §3.1: with T_F = T_B = T_W, 1F1B's bubble is (P − 1)·3 and ZB-H1's
        // (P − 1)·(T_F + T_B − T_W) = P − 1.
        let (p, m) = (4, 8);
        let stages = vec![stage(1.0, 2.0, 1.0); p];
        let one_f_one_b = Schedule::OneFOneB.iteration_us(&stages, m, 1);
        let zero_bubble = Schedule::ZeroBubble.iteration_us(&stages, m, 1);
        assert_eq!(one_f_one_b, 3.0 * f64::from(m) + 3.0 * (p as f64 - 1.0));
        assert_eq!(zero_bubble, 3.0 * f64::from(m) + (p as f64 - 1.0));
        // Without weight gradients there is nothing to move: 1F1B's time.
        let unweighted = vec![stage(1.0, 2.0, 0.0); p];
        assert_eq!(
            Schedule::ZeroBubble.iteration_us(&unweighted, m, 1),
            Schedule::OneFOneB.iteration_us(&unweighted, m, 1)
        );
        // One stage runs its passes back to back.
        assert_eq!(
            Schedule::ZeroBubble.iteration_us(&stages[..1], m, 1),
            3.0 * 8.0
        );
    }

    #[test]
    fn interleaving_shrinks_the_bubble_by_the_virtual_stages() {
        // Narayanan et al. §2.2: P groups of v stages each, a group's microbatch t: the
        // bubble is (P − 1)·t/v.
        let (p, v, m) = (4usize, 2usize, 8u32);
        let stages = vec![stage(1.0, 2.0, 1.0); p * v];
        let t = 3.0 * v as f64;
        let interleaved = Schedule::OneFOneB.iteration_us(&stages, m, v);
        assert_eq!(
            interleaved,
            f64::from(m) * t + (p as f64 - 1.0) * t / v as f64
        );
        let plain = Schedule::OneFOneB.iteration_us(&vec![stage(2.0, 4.0, 2.0); p], m, 1);
        assert_eq!(plain, f64::from(m) * t + (p as f64 - 1.0) * t);
    }

    #[test]
    fn zb_v_halves_zb_h1s_bubble_at_equal_passes() {
        // P groups of two chunks of f = b = w = 1: ZB-H1 on the same groups (each stage
        // the two chunks' work, F = B = W = 2) leaves (P − 1)·(F + B − W) = 2(P − 1); ZB-V
        // leaves (P − 1)·max(f, b) = P − 1, and 1F1B 6(P − 1).
        for (p, m) in [(4usize, 8u32), (4, 16), (8, 32), (2, 3)] {
            let work = 6.0 * f64::from(m);
            let v = Schedule::ZeroBubbleV.iteration_us(&vec![stage(1.0, 2.0, 1.0); 2 * p], m, 2);
            let h1 = Schedule::ZeroBubble.iteration_us(&vec![stage(2.0, 4.0, 2.0); p], m, 1);
            let plain = Schedule::OneFOneB.iteration_us(&vec![stage(2.0, 4.0, 2.0); p], m, 1);
            let bubble = |t: f64| t - work;
            assert_eq!(bubble(v), (p - 1) as f64, "P {p} M {m}");
            assert_eq!(bubble(h1), 2.0 * (p - 1) as f64, "P {p} M {m}");
            assert_eq!(bubble(plain), 6.0 * (p - 1) as f64, "P {p} M {m}");
        }
        // A longer backward sets the wait: (P − 1)·b.
        let v = Schedule::ZeroBubbleV.iteration_us(&vec![stage(1.0, 3.0, 1.0); 8], 8, 2);
        assert_eq!(v - 8.0 * 2.0 * 4.0, 3.0 * 2.0);
    }

    #[test]
    fn zero_bubble_waits_for_cuts_and_the_slowest_stage() {
        // The slowest stage sets the steady state; a cut delays its first forward by half
        // its time (the other half is the gradient's way back, hidden here by stage 0's
        // weight passes).
        let mut stages = vec![stage(1.0, 2.0, 1.0), stage(2.0, 4.0, 2.0)];
        let alone = Schedule::ZeroBubble.iteration_us(&stages, 4, 1);
        assert!(alone >= 4.0 * 6.0, "{alone}");
        stages[1].receive_us = 1.0;
        let with_cut = Schedule::ZeroBubble.iteration_us(&stages, 4, 1);
        assert_eq!(with_cut, alone + 0.5);
        // The synchronization follows each stage's last pass.
        stages[0].sync_us = 10.0;
        assert!(Schedule::ZeroBubble.iteration_us(&stages, 4, 1) >= with_cut + 10.0 - 6.0);
    }
}
