//! Lowering a strategy into per-rank instruction streams.
//!
//! Each stage's ranks run its microbatches in the schedule's order (GPipe: every forward,
//! then every backward; 1F1B and PipeDream's asynchronous schedule: `P−k−1` warm-up
//! forwards at stage `k`, then one forward and one backward alternately, then the
//! remaining backwards). For one microbatch:
//! * **forward**, layer by layer: receive the parts of each input the rank does not hold
//!   (exact box intersections, [`transfers`]), compute, sum a row-parallel layer's partial
//!   outputs, and send what later stages read;
//! * **backward**, in reverse: receive the output's gradient from later stages, compute, sum
//!   a parameter-split layer's input gradient over its slices, and send input gradients back
//!   along the forward messages, reversed.
//!
//! Then the gradients: one all-reduce per bucket (consecutive layers with the same
//! placement) and weight-slice group, and the optimizer step — once per iteration for the
//! synchronous schedules, after every microbatch for the asynchronous one.
//!
//! A message's tag is `((edge · M + microbatch) · 2 + direction)`, with edges numbered over
//! all (consumer, input) pairs, so a send and its receive agree without a global order.

use std::collections::BTreeMap;

use ralpc_passes::cost::Comm;
use ralpc_passes::layers::{Producer, Split};
use ralpc_passes::plan::{
    evaluate, input_gradient_sums, partial_sums, transfers, weight_replicas, Costs, PlanError,
    Schedule, Strategy, StrategyFile, Transfer,
};

use crate::plan::{Instruction, ModelRef, Plan, Predicted, FORMAT};

/// A stage's work item.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Pass {
    Forward(u32),
    Backward(u32),
}

/// The order of one stage's passes.
fn order(schedule: Schedule, stages: usize, k: usize, microbatches: u32) -> Vec<Pass> {
    let m = microbatches;
    match schedule {
        Schedule::GPipe => (0..m)
            .map(Pass::Forward)
            .chain((0..m).map(Pass::Backward))
            .collect(),
        Schedule::OneFOneB | Schedule::Async => {
            let warm = ((stages - k - 1) as u32).min(m);
            let mut out: Vec<Pass> = (0..warm).map(Pass::Forward).collect();
            for i in 0..m - warm {
                out.push(Pass::Forward(warm + i));
                out.push(Pass::Backward(i));
            }
            out.extend((m - warm..m).map(Pass::Backward));
            out
        }
    }
}

struct Edge {
    producer: usize,
    consumer: usize,
    bytes: f64,
}

struct Lowering<'c, 'a> {
    costs: &'c Costs<'a>,
    strategy: &'c Strategy,
    comm: Comm<'a>,
    stage_of: Vec<usize>,
    edges: Vec<Edge>,
    programs: Vec<Vec<Instruction>>,
    groups: BTreeMap<Vec<u32>, u32>,
    /// Per layer, forward and backward µs per microbatch (the evaluator's).
    forward_us: Vec<f64>,
    backward_us: Vec<f64>,
    /// Optimizer state bytes per weight byte.
    optimizer_state: f64,
    /// Per edge, its forward messages.
    messages: Vec<Vec<Transfer>>,
}

impl Lowering<'_, '_> {
    fn place(&self, l: usize) -> (Split, u32) {
        (
            self.strategy.layers[l],
            self.strategy.stages[self.stage_of[l]].first_rank,
        )
    }

    fn ranks(&self, l: usize) -> std::ops::Range<u32> {
        let (split, first) = self.place(l);
        first..first + split.degree()
    }

    /// The messages of edge `ei` (computed once per edge).
    fn messages(&self, ei: usize) -> Vec<Transfer> {
        self.messages[ei].clone()
    }

    fn tag(&self, edge: usize, microbatch: u32, backward: bool) -> u64 {
        (edge as u64 * u64::from(self.strategy.microbatches) + u64::from(microbatch)) * 2
            + u64::from(backward)
    }

    fn bytes(&self, e: &Edge, t: &Transfer) -> u64 {
        (t.fraction * e.bytes / f64::from(self.strategy.microbatches)).round() as u64
    }

    fn send(&mut self, from: u32, to: u32, bytes: u64, tag: u64) {
        let link = self.costs.cluster.link(from, to);
        self.programs[from as usize].push(Instruction::Send {
            to,
            bytes,
            tag,
            us: link.transfer_us(bytes as f64),
            latency_us: link.latency_us,
        });
    }

    fn recv(&mut self, from: u32, to: u32, bytes: u64, tag: u64) {
        let link = self.costs.cluster.link(from, to);
        self.programs[to as usize].push(Instruction::Recv {
            from,
            bytes,
            tag,
            us: link.transfer_us(bytes as f64),
            latency_us: link.latency_us,
        });
    }

    /// An all-reduce of `bytes` over every group `groups` (each a list of ranks).
    fn all_reduce(&mut self, groups: Vec<Vec<u32>>, bytes: f64) {
        for mut ranks in groups {
            ranks.sort_unstable();
            if ranks.len() < 2 || bytes <= 0.0 {
                continue;
            }
            let us = self.comm.all_reduce(&ranks, bytes).us;
            let next = self.groups.len() as u32;
            let group = *self.groups.entry(ranks.clone()).or_insert(next);
            for &r in &ranks {
                self.programs[r as usize].push(Instruction::AllReduce {
                    group,
                    bytes: bytes.round() as u64,
                    us,
                });
            }
        }
    }

    /// The copies of rank 0's group (`ranks`) that together cover `all`: the same pattern
    /// shifted to each rank not yet in a copy.
    fn copies(ranks: &[u32], all: std::ops::Range<u32>) -> Vec<Vec<u32>> {
        let mut used = vec![false; (all.end - all.start) as usize];
        let mut out = Vec::new();
        for start in all.clone() {
            if used[(start - all.start) as usize] {
                continue;
            }
            let shift = start - ranks[0];
            let copy: Vec<u32> = ranks.iter().map(|r| r + shift).collect();
            if copy
                .iter()
                .any(|&r| r >= all.end || used[(r - all.start) as usize])
            {
                continue;
            }
            for &r in &copy {
                used[(r - all.start) as usize] = true;
            }
            out.push(copy);
        }
        out
    }

    fn forward(&mut self, k: usize, mb: u32) {
        let stage = self.strategy.stages[k];
        for l in stage.first_layer..=stage.last_layer {
            for ei in 0..self.edges.len() {
                let e = &self.edges[ei];
                if e.consumer != l {
                    continue;
                }
                let same_stage = self.stage_of[e.producer] == k;
                let tag = self.tag(ei, mb, false);
                for t in self.messages(ei) {
                    let bytes = self.bytes(&self.edges[ei], &t);
                    if same_stage {
                        self.send(t.from, t.to, bytes, tag);
                    }
                    self.recv(t.from, t.to, bytes, tag);
                }
            }
            let us = self.forward_us[l];
            for r in self.ranks(l) {
                self.programs[r as usize].push(Instruction::Forward {
                    layer: l as u32,
                    microbatch: mb,
                    us,
                });
            }
            let layer = &self.costs.graph.layers[l];
            let (split, first) = self.place(l);
            if let Some((ranks, share)) = partial_sums(layer.kind, split, first) {
                let bytes =
                    layer.output_bytes as f64 * share / f64::from(self.strategy.microbatches);
                let groups = Self::copies(&ranks, self.ranks(l));
                self.all_reduce(groups, bytes);
            }
            // What later stages read from this layer leaves now.
            for ei in 0..self.edges.len() {
                let e = &self.edges[ei];
                if e.producer != l || self.stage_of[e.consumer] == k {
                    continue;
                }
                let tag = self.tag(ei, mb, false);
                for t in self.messages(ei) {
                    let bytes = self.bytes(&self.edges[ei], &t);
                    self.send(t.from, t.to, bytes, tag);
                }
            }
        }
    }

    fn backward(&mut self, k: usize, mb: u32) {
        let stage = self.strategy.stages[k];
        for l in (stage.first_layer..=stage.last_layer).rev() {
            // Gradients of this layer's output from later stages.
            for ei in 0..self.edges.len() {
                let e = &self.edges[ei];
                if e.producer != l || self.stage_of[e.consumer] == k {
                    continue;
                }
                let tag = self.tag(ei, mb, true);
                for t in self.messages(ei) {
                    let bytes = self.bytes(&self.edges[ei], &t);
                    self.recv(t.to, t.from, bytes, tag);
                }
            }
            let us = self.backward_us[l];
            for r in self.ranks(l) {
                self.programs[r as usize].push(Instruction::Backward {
                    layer: l as u32,
                    microbatch: mb,
                    us,
                });
            }
            let layer = &self.costs.graph.layers[l];
            let (split, first) = self.place(l);
            for ei in 0..self.edges.len() {
                if self.edges[ei].consumer != l {
                    continue;
                }
                if let Some((ranks, share)) = input_gradient_sums(layer.kind, split, first) {
                    let bytes =
                        self.edges[ei].bytes * share / f64::from(self.strategy.microbatches);
                    let groups = Self::copies(&ranks, self.ranks(l));
                    self.all_reduce(groups, bytes);
                }
                let same_stage = self.stage_of[self.edges[ei].producer] == k;
                let tag = self.tag(ei, mb, true);
                for t in self.messages(ei) {
                    let bytes = self.bytes(&self.edges[ei], &t);
                    self.send(t.to, t.from, bytes, tag);
                    if same_stage {
                        self.recv(t.to, t.from, bytes, tag);
                    }
                }
            }
        }
    }

    /// Gradient buckets and the optimizer step of stage `k`.
    fn update(&mut self, k: usize) {
        let stage = self.strategy.stages[k];
        let graph = self.costs.graph;
        let mut l = stage.first_layer;
        let mut weights = vec![0.0f64; self.programs.len()];
        while l <= stage.last_layer {
            // A bucket: consecutive layers placed alike.
            let split = self.strategy.layers[l];
            let mut end = l;
            while end < stage.last_layer && self.strategy.layers[end + 1] == split {
                end += 1;
            }
            let kind = graph.layers[l].kind;
            let (ranks, share) = weight_replicas(kind, split, stage.first_rank);
            let bytes: f64 = (l..=end)
                .map(|i| graph.layers[i].param_bytes as f64 * share)
                .sum();
            if bytes > 0.0 {
                let all = stage.first_rank..stage.first_rank + split.degree();
                for r in all.clone() {
                    weights[r as usize] += bytes;
                }
                let groups = Self::copies(&ranks, all);
                self.all_reduce(groups, bytes);
            }
            l = end + 1;
        }
        let state = self.optimizer_state;
        for r in stage.first_rank..stage.first_rank + stage.gpus {
            let bytes = weights[r as usize];
            // Read weights, gradients and state; write weights and state.
            let moved = bytes * (3.0 + 2.0 * state);
            let us = moved / self.costs.cluster.gpu(r).hbm_bandwidth * 1e6;
            self.programs[r as usize].push(Instruction::Step {
                bytes: bytes.round() as u64,
                us,
            });
        }
    }
}

/// Lowers `strategy` into a plan for `model`.
///
/// # Errors
/// [`PlanError::Strategy`] when the strategy does not fit the model or the cluster.
pub fn lower(costs: &Costs<'_>, strategy: &Strategy, model: ModelRef) -> Result<Plan, PlanError> {
    let evaluation = evaluate(costs, strategy)?;
    let graph = costs.graph;
    let edges: Vec<Edge> = graph
        .layers
        .iter()
        .enumerate()
        .flat_map(|(consumer, layer)| {
            layer.inputs.iter().filter_map(move |e| match e.from {
                Producer::Layer(p) => Some(Edge {
                    producer: p.0 as usize,
                    consumer,
                    bytes: e.bytes as f64,
                }),
                Producer::Input(_) => None,
            })
        })
        .collect();
    let ranks = strategy
        .stages
        .iter()
        .map(|s| s.first_rank + s.gpus)
        .max()
        .unwrap_or(1);
    let stage_of = strategy.stage_of_layers();
    let place = |l: usize| (strategy.layers[l], strategy.stages[stage_of[l]].first_rank);
    let messages = edges
        .iter()
        .map(|e| {
            let kind = |l: usize| graph.layers[l].kind;
            transfers(
                kind(e.producer),
                place(e.producer),
                kind(e.consumer),
                place(e.consumer),
            )
        })
        .collect();
    let mut lowering = Lowering {
        costs,
        strategy,
        comm: Comm::new(costs.cluster),
        stage_of,
        edges,
        messages,
        programs: vec![Vec::new(); ranks as usize],
        groups: BTreeMap::new(),
        forward_us: evaluation.layers.iter().map(|l| l.forward_us).collect(),
        backward_us: evaluation.layers.iter().map(|l| l.backward_us).collect(),
        optimizer_state: costs.optimizer().state_factor(),
    };
    let stages = strategy.stages.len();
    for k in 0..stages {
        for pass in order(strategy.schedule, stages, k, strategy.microbatches) {
            match pass {
                Pass::Forward(mb) => lowering.forward(k, mb),
                Pass::Backward(mb) => {
                    lowering.backward(k, mb);
                    if strategy.schedule == Schedule::Async {
                        lowering.update(k);
                    }
                }
            }
        }
        if strategy.schedule != Schedule::Async {
            lowering.update(k);
        }
    }
    let mut groups: Vec<(u32, Vec<u32>)> = lowering
        .groups
        .into_iter()
        .map(|(ranks, i)| (i, ranks))
        .collect();
    groups.sort();
    Ok(Plan {
        format: FORMAT.to_owned(),
        model,
        cluster: costs.cluster.name.clone(),
        ranks,
        batch: graph.batch,
        microbatches: strategy.microbatches,
        schedule: strategy.schedule.name().to_owned(),
        strategy: StrategyFile::of(graph, strategy),
        layers: graph.layers.iter().map(|l| l.name.clone()).collect(),
        groups: groups.into_iter().map(|(_, r)| r).collect(),
        programs: lowering.programs,
        predicted: Predicted {
            iteration_time_us: evaluation.iteration_time_us,
            peak_memory_bytes: evaluation.peak_memory_bytes,
        },
    })
}
