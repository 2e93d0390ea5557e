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
//!   along the forward messages, reversed (to replicas, every piece each lacks:
//!   [`gradient_transfers`]).
//!
//! The gradients are all-reduced in buckets ([`buckets`], the evaluator's choice of size),
//! each launched in the last backward pass as soon as its earliest layer is done, so that
//! it overlaps the rest of backward; then the optimizer step — once per iteration for the
//! synchronous schedules, after every backward pass for the asynchronous one. Under ZeRO-1
//! a bucket is reduce-scattered instead, each replica updates its share (a `step` naming
//! the group) and the bucket's weights are all-gathered.
//!
//! A recomputed run's forward passes are emitted as usual; just before the backward of
//! its last layer, `recompute` instructions run the run's forward again, from the run's
//! kept inputs, and the backward passes read what they made.
//!
//! Every instruction records the buffers it reads and writes ([`buffers`]), which give
//! each rank's memory over time and every data dependency.
//!
//! A convolution or pooling split by rows exchanges halo rows between its pieces: each
//! receives the rows around its own that its windows read from the pieces holding them
//! before its forward pass, and returns their gradient after its backward pass ([`halo`]).
//!
//! A message's tag says what it carries ([`Tags`]): an edge's tensor or its gradient, a
//! recomputation's copy, halo rows — numbered over all (consumer, input) pairs, so a send
//! and its receive agree without a global order.

mod buffers;
mod comm;
mod halo;
mod step;

use std::collections::BTreeMap;

use ralpc_passes::cost::Comm;
use ralpc_passes::layers::{LayerKind, Producer, Split};
use ralpc_passes::plan::order::{group_passes, passes, stage_of_chunk, Pass};
use ralpc_passes::plan::{
    buckets, class_pieces, edge_kinds, evaluate, gathers, gathers_gradient, gradient_transfers,
    input_gradient_sums, input_share, partial_sums, regathers, scatters_gradient,
    scatters_partial_sums, separately_reduced, shared_gathers, tied_reductions, transfers, Bucket,
    Costs, PlanError, Regathers, Schedule, SharedGather, Strategy, StrategyFile, TiedReduction,
    Transfer,
};

use crate::plan::{BufferKind, Instruction, ModelRef, Plan, Predicted, Site, FORMAT};
use crate::tag::{HaloPass, Tag, Tags};
use buffers::{Key, Tracker};

/// How a tensor (or its gradient) moves from a producer kind placed so to a consumer kind
/// placed so: [`transfers`] or [`gradient_transfers`].
type Router = fn(LayerKind, (Split, u32), LayerKind, (Split, u32)) -> Vec<Transfer>;

/// How an edge's tensor moves between layers of one stage.
#[derive(Clone, Debug, PartialEq)]
enum Pattern {
    /// Point-to-point messages (or nothing).
    Messages,
    /// An all-gather over these ranks; its gradient a reduce-scatter when `scatter`.
    Gather { ranks: Vec<u32>, scatter: bool },
    /// Every rank of the group sends the same share to every other.
    AllToAll { ranks: Vec<u32>, fraction: f64 },
    /// Nothing moves forward; the gradient is an all-gather over these ranks (replicas
    /// gathering their box's gradient from the consumer's pieces).
    GatherGradient { ranks: Vec<u32> },
}

/// Whether `messages` are an all-to-all: every ordered pair of a group, equal shares.
fn all_to_all(messages: &[Transfer]) -> Option<(Vec<u32>, f64)> {
    let mut ranks: Vec<u32> = messages.iter().flat_map(|t| [t.from, t.to]).collect();
    ranks.sort_unstable();
    ranks.dedup();
    let n = ranks.len();
    let first = messages.first()?;
    let mut pairs: Vec<(u32, u32)> = messages.iter().map(|t| (t.from, t.to)).collect();
    pairs.sort_unstable();
    pairs.dedup();
    let equal = messages
        .iter()
        .all(|t| (t.fraction - first.fraction).abs() <= 1e-9 * first.fraction);
    (n >= 2 && pairs.len() == messages.len() && messages.len() == n * (n - 1) && equal)
        .then_some((ranks, first.fraction))
}

struct Edge {
    producer: usize,
    consumer: usize,
    /// The kind its consumer reads it as ([`Layer::reads_as`](ralpc_passes::layers::Layer::reads_as)).
    reads_as: LayerKind,
    bytes: f64,
    /// Its consumer's window reads rows around each piece of it when split by rows.
    halo: bool,
}

struct Lowering<'c, 'a> {
    costs: &'c Costs<'a>,
    strategy: &'c Strategy,
    comm: Comm<'a>,
    stage_of: Vec<usize>,
    edges: Vec<Edge>,
    /// Per layer, the edges it reads and the edges it makes, in edge order: a layer's
    /// lowering visits its own (all edges per layer made large graphs quadratic).
    into: Vec<Vec<usize>>,
    out_of: Vec<Vec<usize>>,
    /// Per edge, the earlier edge whose collective it shares ([`shared_gathers`]).
    shared: Vec<Option<SharedGather>>,
    /// The inputs kept as pieces and gathered again for the backward pass.
    regathers: Regathers,
    programs: Vec<Vec<Instruction>>,
    groups: BTreeMap<Vec<u32>, u32>,
    /// Per layer, forward and backward µs per microbatch (the evaluator's), and the
    /// weight gradients' part of the backward.
    forward_us: Vec<f64>,
    backward_us: Vec<f64>,
    weight_us: Vec<f64>,
    /// Optimizer state bytes per weight byte.
    optimizer_state: f64,
    /// Per edge, its forward messages.
    messages: Vec<Vec<Transfer>>,
    /// Per edge, the messages returning its gradient (consumer rank to producer rank).
    gradient_messages: Vec<Vec<Transfer>>,
    /// Per edge, the collective its messages are, if any.
    patterns: Vec<Pattern>,
    /// Per stage, its gradient buckets in launch order.
    buckets: Vec<Vec<Bucket>>,
    /// The tied weights with their own all-reduce.
    tied: Vec<TiedReduction>,
    /// Per layer, the bytes of its weights those all-reduce (see [`separately_reduced`]).
    separate: Vec<u64>,
    buffers: Tracker,
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

    fn tags(&self) -> Tags {
        Tags {
            edges: self.edges.len(),
            microbatches: self.strategy.microbatches,
        }
    }

    fn tag(&self, edge: usize, microbatch: u32, backward: bool) -> u64 {
        self.tags().encode(Tag::Edge {
            edge,
            microbatch,
            backward,
        })
    }

    /// Where edge `ei`'s tensor arrives for microbatch `mb`: its own received buffer, or
    /// that of the edge whose forward all-gather it shares ([`shared_gathers`]).
    fn received(&self, ei: usize, mb: u32) -> Key {
        let from = self.shared[ei]
            .filter(|s| s.forward)
            .map_or(ei, |s| s.first);
        Key::received(self.edges[from].consumer, mb, self.tag(from, mb, false))
    }

    /// As [`Lowering::received`], for a recomputation's gathers.
    fn received_again(&self, ei: usize, mb: u32) -> Key {
        let from = self.shared[ei]
            .filter(|s| s.forward)
            .map_or(ei, |s| s.first);
        Key::received_again(self.edges[from].consumer, mb, self.tag_again(from, mb))
    }

    /// The tag of edge `edge`'s forward messages sent again for a recomputation.
    fn tag_again(&self, edge: usize, microbatch: u32) -> u64 {
        self.tags().encode(Tag::Again { edge, microbatch })
    }

    fn bytes(&self, e: &Edge, t: &Transfer) -> u64 {
        (t.fraction * e.bytes / f64::from(self.strategy.microbatches)).round() as u64
    }

    /// Appends `instruction` to `rank`'s program; its index.
    fn push(&mut self, rank: u32, instruction: Instruction) -> usize {
        let program = &mut self.programs[rank as usize];
        program.push(instruction);
        program.len() - 1
    }

    /// The bytes of layer `l`'s activation one of its ranks keeps per microbatch.
    fn activation_bytes(&self, l: usize) -> f64 {
        let split = self.strategy.layers[l];
        (self.costs.stash_bytes(l, split) - self.regathers.saved[l])
            / f64::from(self.strategy.microbatches)
    }

    /// The bytes of layer `l`'s input gradient one of its ranks computes per microbatch.
    fn input_gradient_bytes(&self, l: usize) -> f64 {
        let split = self.strategy.layers[l];
        self.into[l]
            .iter()
            .map(|&ei| &self.edges[ei])
            .map(|e| {
                e.bytes * input_share(e.reads_as, split) / f64::from(self.strategy.microbatches)
            })
            .sum()
    }

    fn forward(&mut self, k: usize, mb: u32) {
        let stage = self.strategy.stages[k];
        let mut gathered = vec![false; self.buckets[k].len()];
        for l in stage.first_layer..=stage.last_layer {
            self.gather_weights(k, l..=l, &mut gathered);
            // Inputs from this stage move now; from earlier stages they were sent there.
            let mut inputs: Vec<Key> = Vec::new();
            for ei in self.into[l].clone() {
                let e = &self.edges[ei];
                let producer = e.producer;
                let same_stage = self.stage_of[producer] == k;
                let tag = self.tag(ei, mb, false);
                let payload = self.received(ei, mb);
                inputs.push(payload);
                inputs.push(Key::pass(BufferKind::Activation, producer, mb));
                let arrived = self.shared[ei].is_some_and(|s| s.forward);
                if arrived || self.collective_edge(ei, mb, false) {
                    continue;
                }
                for t in self.messages(ei) {
                    let bytes = self.bytes(&self.edges[ei], &t);
                    if same_stage {
                        let source = Key::pass(BufferKind::Activation, producer, mb);
                        self.send(t.from, t.to, bytes, tag, source);
                    }
                    self.recv(t.from, t.to, bytes, tag, payload);
                }
            }
            self.halos_forward(l, mb, HaloPass::Forward, &mut inputs);
            let output = Key::pass(BufferKind::Activation, l, mb);
            self.run_forward(l, mb, &inputs, output);
            self.reduce_partial_sums(l, output);
            // What later stages read from this layer leaves now.
            for ei in self.out_of[l].clone() {
                let e = &self.edges[ei];
                if self.stage_of[e.consumer] == k {
                    continue;
                }
                let tag = self.tag(ei, mb, false);
                for t in self.messages(ei) {
                    let bytes = self.bytes(&self.edges[ei], &t);
                    self.send(t.from, t.to, bytes, tag, output);
                }
            }
        }
    }

    /// Before the backward of the model's last layer `l` on a microbatch, when its
    /// ranks hold its rows' classes in pieces (a vocabulary-parallel head): the all-gather
    /// of each row's max, sum of exponentials and label logit (three floats per row and
    /// piece) that the parallel cross-entropy combines, in place on its output `output`.
    fn loss_statistics(&mut self, l: usize, output: Key) {
        if self.costs.graph.outputs.first().map(|o| o.0 as usize) != Some(l) {
            return;
        }
        let layer = &self.costs.graph.layers[l];
        let (split, first) = self.place(l);
        let Some(ranks) = class_pieces(layer.kind, split, first) else {
            return;
        };
        // Rows = output elements / classes, the last axis of its last op's output; without
        // shapes (a layer graph read from a file), FLOPs / (2 × weights): a dense layer does
        // 2 FLOPs per weight per row.
        let elements = layer.output_bytes / self.costs.graph.float_bytes.max(1);
        let all_rows = match layer
            .parts
            .iter()
            .rev()
            .find_map(|p| p.signature.as_ref()?.output.last().copied())
        {
            Some(classes) => (elements / classes.max(1)) as f64,
            None => layer.fwd_flops as f64 / (2.0 * layer.params.max(1) as f64),
        };
        let rows = all_rows
            / f64::from(split.sample.max(1) * split.context.max(1) * self.strategy.microbatches);
        let bytes = rows * 12.0 * ranks.len() as f64;
        let groups = Self::copies(&ranks, self.ranks(l));
        self.all_gather(groups, bytes, &[output]);
    }

    /// Where the gradient of layer `l`'s output arrives on microbatch `mb`: from later
    /// stages by message, from consumers in its stage by message or in place.
    fn output_gradients(&self, l: usize, mb: u32) -> Vec<Key> {
        (self.out_of[l].iter())
            .flat_map(|&ei| {
                let consumer = self.edges[ei].consumer;
                [
                    Key::received(l, mb, self.tag(ei, mb, true)),
                    Key::pass(BufferKind::InputGradient, consumer, mb),
                ]
            })
            .collect()
    }

    /// Layer `l`'s inputs gathered again for its backward on microbatch `mb`
    /// ([`regathers`]): the gathered whole and the rank's own piece.
    fn regathered(&self, l: usize, mb: u32) -> Vec<Key> {
        (self.into[l].iter())
            .filter_map(|&ei| {
                let r = &self.regathers.list[self.regathers.of_edge[ei]?];
                let own = Key::pass(BufferKind::Activation, r.producer, mb);
                Some([self.received_again(r.first, mb), own])
            })
            .flatten()
            .collect()
    }

    /// What layer `l`'s backward reads of its forward on microbatch `mb`: its kept or
    /// recomputed activations.
    fn kept(&self, l: usize, mb: u32) -> Key {
        let kind = match self.strategy.recompute_run(l) {
            Some(_) => BufferKind::Recomputed,
            None => BufferKind::Activation,
        };
        Key::pass(kind, l, mb)
    }

    /// Whether backward passes leave the weight gradients to passes of their own
    /// ([`Pass::Weight`]).
    fn splits_backward(&self) -> bool {
        self.strategy.schedule.splits_backward()
    }

    /// Whether layer `l` has a weight pass of its own: under the zero-bubble schedules,
    /// where its backward makes weight gradients at a cost the evaluator runs apart (not a
    /// norm's or an embedding's reductions, nor a layer reading an input gathered again).
    fn has_weight_pass(&self, l: usize) -> bool {
        self.splits_backward() && self.weight_us[l] > 0.0
    }

    /// One backward pass of stage `k`; `last` when it is the stage's last before the
    /// update, which launches the gradient buckets (unless weight passes make the
    /// gradients: [`Lowering::weight_pass`]).
    fn backward(&mut self, k: usize, mb: u32, last: bool) {
        let stage = self.strategy.stages[k];
        let mut next_bucket = 0;
        let mut gathered = vec![false; self.buckets[k].len()];
        for l in (stage.first_layer..=stage.last_layer).rev() {
            let gradients = self.output_gradients(l, mb);
            for ei in self.out_of[l].clone() {
                let tag = self.tag(ei, mb, true);
                if self.stage_of[self.edges[ei].consumer] == k {
                    continue;
                }
                for t in self.gradient_messages[ei].clone() {
                    let bytes = self.bytes(&self.edges[ei], &t);
                    self.recv(t.from, t.to, bytes, tag, Key::received(l, mb, tag));
                }
            }
            let run = self.strategy.recompute_run(l);
            let rerun = run.filter(|&(_, last)| last == l);
            self.gather_weights(k, rerun.map_or(l, |(first, _)| first)..=l, &mut gathered);
            if let Some((first, last)) = rerun {
                self.recompute(first, last, mb);
            }
            let kept = self.kept(l, mb);
            self.loss_statistics(l, kept);
            self.regather(l, mb);
            let regathered = self.regathered(l, mb);
            let apart = self.has_weight_pass(l);
            let us = self.backward_us[l] - if apart { self.weight_us[l] } else { 0.0 };
            let input_gradient = Key::pass(BufferKind::InputGradient, l, mb);
            let input_gradient_bytes = self.input_gradient_bytes(l);
            for r in self.ranks(l) {
                let at = self.push(
                    r,
                    Instruction::Backward {
                        layer: l as u32,
                        microbatch: mb,
                        us,
                    },
                );
                for key in [kept, Key::layer(BufferKind::Weights, l)]
                    .into_iter()
                    .chain(gradients.iter().copied())
                    .chain(regathered.iter().copied())
                {
                    self.buffers.read(r, key, at);
                }
                if !apart {
                    self.write_weight_gradients(r, l, mb, at);
                }
                if input_gradient_bytes > 0.0 {
                    self.buffers.grow(r, input_gradient, input_gradient_bytes);
                    self.buffers.write(r, input_gradient, at);
                }
            }
            self.halos_backward(l, mb, input_gradient);
            let (split, first) = self.place(l);
            for ei in self.into[l].clone() {
                // A reduce-scatter sums the input gradient on its way back.
                let scattered = matches!(self.patterns[ei], Pattern::Gather { scatter: true, .. });
                let producer_kind = self.costs.graph.layers[self.edges[ei].producer].kind;
                let (_, read_as) = edge_kinds(Some(producer_kind), self.edges[ei].reads_as);
                if let Some((ranks, share)) =
                    input_gradient_sums(read_as, split, first).filter(|_| !scattered)
                {
                    let bytes =
                        self.edges[ei].bytes * share / f64::from(self.strategy.microbatches);
                    let groups = Self::copies(&ranks, self.ranks(l));
                    self.all_reduce(groups, bytes, &[input_gradient]);
                }
                // Summed into the gradient of the edge whose collective it shares.
                let folded = self.shared[ei].is_some_and(|s| s.gradient);
                if folded || self.collective_edge(ei, mb, true) {
                    continue;
                }
                let producer = self.edges[ei].producer;
                let same_stage = self.stage_of[producer] == k;
                let tag = self.tag(ei, mb, true);
                for t in self.gradient_messages[ei].clone() {
                    let bytes = self.bytes(&self.edges[ei], &t);
                    self.send(t.from, t.to, bytes, tag, input_gradient);
                    if same_stage {
                        self.recv(t.from, t.to, bytes, tag, Key::received(producer, mb, tag));
                    }
                }
            }
            if !self.splits_backward() {
                self.launch_buckets(k, l, last, &mut next_bucket);
            }
        }
    }

    /// What making layer `l`'s weight gradients on microbatch `mb` writes on rank `r` at
    /// instruction `at`: the sums, and after the first microbatch the fresh gradients
    /// added to them.
    fn write_weight_gradients(&mut self, r: u32, l: usize, mb: u32, at: usize) {
        self.buffers
            .write(r, Key::layer(BufferKind::Gradients, l), at);
        let fresh_gradient_bytes = self.fresh_gradient_bytes(l, mb);
        if fresh_gradient_bytes > 0.0 {
            let fresh_gradient = Key::pass(BufferKind::Gradients, l, mb);
            self.buffers.grow(r, fresh_gradient, fresh_gradient_bytes);
            self.buffers.write(r, fresh_gradient, at);
        }
        let gathered_bytes = self.gathered_weight_bytes(l);
        if gathered_bytes > 0.0 {
            let gathered = Key::gathered(l, mb);
            self.buffers.grow(r, gathered, gathered_bytes);
            self.buffers.write(r, gathered, at);
        }
    }

    /// The weight pass of stage `k` on microbatch `mb` (zero-bubble schedules): each
    /// weighted layer's weight gradients, in backward order, from what its backward read
    /// (its kept activations and its output's gradient); `last` when it is the stage's
    /// last before the update, which launches the gradient buckets.
    fn weight_pass(&mut self, k: usize, mb: u32, last: bool) {
        let stage = self.strategy.stages[k];
        let mut next_bucket = 0;
        for l in (stage.first_layer..=stage.last_layer).rev() {
            if self.has_weight_pass(l) {
                let reads: Vec<Key> = [self.kept(l, mb)]
                    .into_iter()
                    .chain(self.output_gradients(l, mb))
                    .chain(self.regathered(l, mb))
                    .collect();
                for r in self.ranks(l) {
                    let at = self.push(
                        r,
                        Instruction::WeightGradient {
                            layer: l as u32,
                            microbatch: mb,
                            us: self.weight_us[l],
                        },
                    );
                    for &key in &reads {
                        self.buffers.read(r, key, at);
                    }
                    self.write_weight_gradients(r, l, mb, at);
                }
            }
            self.launch_buckets(k, l, last, &mut next_bucket);
        }
    }

    /// After layer `l`'s gradients: the gradient buckets of stage `k` whose layers are all
    /// done, from `next`, on the stage's `last` microbatch (every microbatch under ZeRO-2
    /// and 3, which reduce-scatter each).
    fn launch_buckets(&mut self, k: usize, l: usize, last: bool, next: &mut usize) {
        while (last || self.strategy.zero >= 2) && *next < self.buckets[k].len() {
            let bucket = self.buckets[k][*next].clone();
            if *bucket.layers.start() != l {
                break;
            }
            let data: Vec<Key> = bucket
                .layers
                .clone()
                .map(|j| Key::layer(BufferKind::Gradients, j))
                .collect();
            // Gradients travel at their own width (16-bit under mixed precision).
            let bytes = bucket.bytes * self.costs.model_state().gradients;
            if self.strategy.zero > 0 {
                let shard_groups = self.shard_groups(&bucket);
                let shard = bytes / shard_groups[0].len() as f64;
                self.reduce_scatter(shard_groups, bytes, &data);
                // Hybrid sharding: the groups' shards summed once, after the last.
                let across = self.across_shard_groups(&bucket);
                if last && !across.is_empty() {
                    self.all_reduce(across, shard, &data);
                }
            } else {
                let groups = Self::copies(&bucket.ranks, bucket.all.clone());
                self.all_reduce(groups, bytes, &data);
            }
            *next += 1;
        }
    }

    /// Before layer `l`'s backward pass on microbatch `mb`: the all-gathers of the inputs
    /// later readers kept as pieces ([`regathers`]), launched to overlap it.
    fn regather(&mut self, l: usize, mb: u32) {
        let due: Vec<_> = (self.regathers.list.iter())
            .filter(|r| r.before == l)
            .map(|r| (r.first, r.producer, r.ranks.clone(), r.bytes))
            .collect();
        for (first, producer, ranks, bytes) in due {
            let source = Key::pass(BufferKind::Activation, producer, mb);
            let target = self.received_again(first, mb);
            let all = self.ranks(self.edges[first].consumer);
            let bytes = bytes / f64::from(self.strategy.microbatches);
            self.gather_in_groups(&ranks, all, bytes, false, source, target);
        }
    }

    /// Runs the forward of layers `first..=last` (a recomputed run) again on microbatch
    /// `mb`, from the run's kept inputs, making what their backward passes read.
    fn recompute(&mut self, first: usize, last: usize, mb: u32) {
        for l in first..=last {
            let mut inputs: Vec<Key> = Vec::new();
            for ei in self.into[l].clone() {
                let e = &self.edges[ei];
                let producer = e.producer;
                if producer >= first {
                    let tag = self.tag_again(ei, mb);
                    // Inside the run, what moved in the forward moves again (the tensor-
                    // parallel layers' gathers).
                    let source = Key::pass(BufferKind::Recomputed, producer, mb);
                    let payload = self.received_again(ei, mb);
                    inputs.extend([source, payload]);
                    if self.shared[ei].is_some_and(|s| s.forward) {
                        continue;
                    }
                    if !self.collective_between(ei, false, source, payload) {
                        for t in self.messages(ei) {
                            let bytes = self.bytes(&self.edges[ei], &t);
                            self.send(t.from, t.to, bytes, tag, source);
                            self.recv(t.from, t.to, bytes, tag, payload);
                        }
                    }
                } else {
                    inputs.push(self.received(ei, mb));
                    inputs.push(Key::pass(BufferKind::Activation, producer, mb));
                }
            }
            self.halos_forward(l, mb, HaloPass::Again, &mut inputs);
            let output = Key::pass(BufferKind::Recomputed, l, mb);
            self.run_forward(l, mb, &inputs, output);
            self.reduce_partial_sums(l, output);
        }
    }

    /// A row-parallel layer `l`'s partial outputs, summed in place in `output`: reduce-
    /// scattered by rows when every reader reads only its rows on the same ranks
    /// ([`scatters_partial_sums`]), else all-reduced.
    fn reduce_partial_sums(&mut self, l: usize, output: Key) {
        let layer = &self.costs.graph.layers[l];
        let (split, first) = self.place(l);
        let Some((ranks, share)) = partial_sums(layer.kind, split, first) else {
            return;
        };
        let bytes = layer.output_bytes as f64 * share / f64::from(self.strategy.microbatches);
        let groups = Self::copies(&ranks, self.ranks(l));
        let is_output = self.costs.graph.outputs.iter().any(|o| o.0 as usize == l);
        let mut readers = self.out_of[l].iter().map(|&ei| &self.edges[ei]).peekable();
        let scatter = !is_output
            && readers.peek().is_some()
            && readers.all(|e| {
                let c = e.consumer;
                self.stage_of[c] == self.stage_of[l]
                    && scatters_partial_sums(layer.kind, (split, first), e.reads_as, self.place(c))
            });
        if scatter {
            self.reduce_scatter(groups, bytes, &[output]);
        } else {
            self.all_reduce(groups, bytes, &[output]);
        }
    }

    /// Layer `l`'s forward on microbatch `mb` on each of its ranks, reading `inputs` and
    /// writing `output`: a `recompute` when `output` is what a recomputation makes.
    fn run_forward(&mut self, l: usize, mb: u32, inputs: &[Key], output: Key) {
        let (layer, microbatch, us) = (l as u32, mb, self.forward_us[l]);
        let again = output == Key::pass(BufferKind::Recomputed, l, mb);
        let activation = self.activation_bytes(l);
        for r in self.ranks(l) {
            let instruction = if again {
                Instruction::Recompute {
                    layer,
                    microbatch,
                    us,
                }
            } else {
                Instruction::Forward {
                    layer,
                    microbatch,
                    us,
                }
            };
            let at = self.push(r, instruction);
            self.buffers.read(r, Key::layer(BufferKind::Weights, l), at);
            for &key in inputs {
                self.buffers.read(r, key, at);
            }
            self.buffers.grow(r, output, activation);
            self.buffers.write(r, output, at);
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
                    reads_as: layer.reads_as(e, strategy.layers[consumer]),
                    bytes: e.bytes as f64,
                    halo: layer
                        .halo
                        .as_ref()
                        .is_some_and(|h| e.value.is_some_and(|v| h.inputs.contains(&v))),
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
    let kind = |l: usize| graph.layers[l].kind;
    let moves = |how: Router| {
        edges
            .iter()
            .map(|e| {
                how(
                    kind(e.producer),
                    place(e.producer),
                    e.reads_as,
                    place(e.consumer),
                )
            })
            .collect::<Vec<_>>()
    };
    let messages = moves(transfers);
    let gradient_messages = moves(gradient_transfers);
    let patterns = edges
        .iter()
        .zip(&messages)
        .map(|(e, m)| {
            if stage_of[e.producer] != stage_of[e.consumer] {
                return Pattern::Messages;
            }
            let (from, to) = (place(e.producer), place(e.consumer));
            if let Some(ranks) = gathers_gradient(kind(e.producer), from, e.reads_as, to) {
                return Pattern::GatherGradient { ranks };
            }
            if let Some(ranks) = gathers(kind(e.producer), from, e.reads_as, to) {
                let (_, read_as) = edge_kinds(Some(kind(e.producer)), e.reads_as);
                let scatter = scatters_gradient(&ranks, read_as, to);
                return Pattern::Gather { ranks, scatter };
            }
            all_to_all(m).map_or(Pattern::Messages, |(ranks, fraction)| Pattern::AllToAll {
                ranks,
                fraction,
            })
        })
        .collect();
    let tied = tied_reductions(graph, strategy);
    let separate = separately_reduced(graph, &tied);
    let mut into = vec![Vec::new(); graph.layers.len()];
    let mut out_of = vec![Vec::new(); graph.layers.len()];
    for (ei, e) in edges.iter().enumerate() {
        into[e.consumer].push(ei);
        out_of[e.producer].push(ei);
    }
    let mut lowering = Lowering {
        into,
        out_of,
        patterns,
        costs,
        strategy,
        comm: Comm::new(costs.cluster),
        stage_of,
        edges,
        shared: shared_gathers(graph, strategy),
        regathers: regathers(graph, strategy),
        messages,
        gradient_messages,
        programs: vec![Vec::new(); ranks as usize],
        groups: BTreeMap::new(),
        forward_us: evaluation.layers.iter().map(|l| l.forward_us).collect(),
        backward_us: evaluation.layers.iter().map(|l| l.backward_us).collect(),
        weight_us: evaluation.layers.iter().map(|l| l.weight_us).collect(),
        optimizer_state: costs.optimizer().state_factor(),
        buckets: strategy
            .stages
            .iter()
            .zip(&evaluation.stages)
            .map(|(stage, cost)| buckets(graph, strategy, stage, cost.bucket_bytes, &separate))
            .collect(),
        separate,
        tied,
        buffers: Tracker::new(ranks as usize),
    };
    lowering.persistent_buffers();
    let stages = strategy.stages.len();
    let v = strategy.virtual_stages();
    if v > 1 {
        // Each pipeline rank runs its virtual stages' passes in its schedule's order
        // (interleaved 1F1B, ZB-V), a stage's last pass launching its gradient buckets.
        let devices = stages / v;
        for g in 0..devices {
            let order: Vec<(usize, Pass)> =
                group_passes(strategy.schedule, devices, v, g, strategy.microbatches)
                    .into_iter()
                    .map(|(chunk, pass)| {
                        let k = stage_of_chunk(strategy.schedule, devices, chunk, g);
                        (k, pass)
                    })
                    .collect();
            let mut final_pass = vec![0; stages];
            for (i, &(k, _)) in order.iter().enumerate() {
                final_pass[k] = i;
            }
            for (i, &(k, pass)) in order.iter().enumerate() {
                let last = final_pass[k] == i;
                match pass {
                    Pass::Forward(mb) => lowering.forward(k, mb),
                    Pass::Backward(mb) => lowering.backward(k, mb, last),
                    Pass::Weight(mb) => lowering.weight_pass(k, mb, last),
                }
            }
            for chunk in 0..v {
                lowering.step(stage_of_chunk(strategy.schedule, devices, chunk, g));
            }
        }
    }
    for k in (0..stages).filter(|_| v == 1) {
        let order = passes(strategy.schedule, stages, k, strategy.microbatches);
        let asynchronous = strategy.schedule == Schedule::Async;
        for (i, &pass) in order.iter().enumerate() {
            let last = asynchronous || i + 1 == order.len();
            match pass {
                Pass::Forward(mb) => lowering.forward(k, mb),
                Pass::Backward(mb) => {
                    lowering.backward(k, mb, last);
                    if asynchronous {
                        lowering.step(k);
                    }
                }
                Pass::Weight(mb) => lowering.weight_pass(k, mb, last),
            }
        }
        if !asynchronous {
            lowering.step(k);
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
        inputs: model.blake3.clone(),
        model,
        cluster: costs.cluster.name.clone(),
        ranks,
        batch: graph.batch,
        microbatches: strategy.microbatches,
        schedule: strategy.schedule.name().to_owned(),
        precision: costs.precision(),
        optimizer: costs.optimizer(),
        fused_attention: costs.fused_attention(),
        strategy: StrategyFile::of(graph, strategy),
        layers: graph.layers.iter().map(|l| l.name.clone()).collect(),
        sites: (0..ranks)
            .map(|r| {
                let node = costs.cluster.locate(r).map_or(0, |l| l.node);
                Site {
                    node,
                    rack: costs.cluster.rack_of(node),
                    nic: if costs.cluster.flat.is_some() {
                        r
                    } else {
                        node
                    },
                }
            })
            .collect(),
        groups: groups.into_iter().map(|(_, r)| r).collect(),
        buffers: lowering
            .buffers
            .finish(&lowering.programs.iter().map(Vec::len).collect::<Vec<_>>()),
        programs: lowering.programs,
        predicted: Predicted {
            iteration_time_us: evaluation.iteration_time_us,
            peak_memory_bytes: evaluation.peak_memory_bytes,
            single_gpu_time_us: costs.single_gpu_time_us(),
        },
        layout: None,
        background: None,
    })
}
