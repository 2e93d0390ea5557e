//! Which share of a tensor each rank holds or needs, and how much has to move between two
//! placements (DESIGN §3, "Resharding").
//!
//! A layer on `g = s·a·p` ranks numbers its ranks `k = (sᵢ·a + aᵢ)·p + pᵢ`: the parameter
//! index varies fastest, so the ranks that exchange the most (a parameter split's
//! all-reduces) are neighbours and sit in the fewest nodes. Each rank's share of a tensor is
//! a box in normalized coordinates over three axes — samples, spatial rows, features — and
//! [`View`] says which rank index cuts which axis. Moving a tensor from a producer's
//! [`View`] to a consumer's is costed from box intersections: every consumer rank receives
//! what it needs and does not already hold.

use std::collections::BTreeMap;

use crate::layers::{LayerKind, Split};

/// Which index of a rank cuts an axis.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Cut {
    /// The axis is whole on every rank.
    Whole,
    /// Cut by the attribute index `aᵢ` into `a` pieces.
    Attribute,
    /// Cut by the parameter index `pᵢ` into `p` pieces.
    Parameter,
    /// Cut by the context index `cᵢ` into `c` pieces (a sequence's pieces under context
    /// parallelism).
    Context,
    /// Cut by the context index, then each piece by the attribute index: piece `cᵢ·a + aᵢ`
    /// of `c·a` (sequence parallelism inside a context-parallel piece, as Megatron-Core
    /// nests them).
    ContextAttribute,
}

/// The share of one tensor each rank of a placement holds (or needs).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct View {
    /// First absolute rank.
    pub first: u32,
    /// The placement's degrees: samples (times `context`), attributes, parameters. A
    /// context-parallel group's ranks are consecutive sample indices: rank index
    /// `k = ((sᵢ·c + cᵢ)·a + aᵢ)·p + pᵢ`, tensor parallelism innermost, then context,
    /// then data, as Megatron-Core orders its groups.
    pub split: (u32, u32, u32),
    /// The context degree `c` folded into the sample degree.
    pub context: u32,
    /// How the spatial-row axis is cut.
    pub rows: Cut,
    /// How the feature (channel) axis is cut.
    pub features: Cut,
}

/// Whether a layer kind can be split along attributes and parameters: convolutions and
/// dense layers choose such splits; pooling and elementwise layers keep their producer's
/// (they work per channel and per row). Every other kind splits samples only, but a
/// recurrent layer that is one op, which also splits its gates ([`crate::layers::Recurrence`]).
pub fn splits_freely(kind: LayerKind) -> bool {
    matches!(
        kind,
        LayerKind::Conv
            | LayerKind::Dense
            | LayerKind::Pool
            | LayerKind::Elementwise
            | LayerKind::Attention
    )
}

/// Whether a layer can be split by attributes: a convolution or pooling of the model cuts
/// its rows only through its window, whose halo the pieces exchange (a transposed
/// convolution, a global pool or a layer reshaping before its window has none); the other
/// kinds that split freely work per row or per input feature. An imported layer graph (a
/// profile) says nothing of its windows: its rows split, as the reference planners take
/// them.
pub fn splits_attributes(layer: &crate::layers::Layer) -> bool {
    let imported = layer.parts.is_empty();
    splits_freely(layer.kind)
        && (!matches!(layer.kind, LayerKind::Conv | LayerKind::Pool)
            || layer.halo.is_some()
            || imported)
}

/// Whether `attributes` pieces of the layer each get rows of their own: a window over
/// fewer rows (a 1×1 convolution after a global pool) cannot be cut into more pieces.
pub fn splits_attributes_into(layer: &crate::layers::Layer, attributes: u32) -> bool {
    attributes <= 1
        || (splits_attributes(layer)
            && layer
                .halo
                .as_ref()
                .is_none_or(|h| u64::from(attributes) <= h.window.output.min(h.window.input)))
}

/// How many ranks of a `kind` layer under `split` compute the same share of it: the
/// degrees its views leave uncut (an attribute degree on a softmax or a data-movement
/// layer is a tensor-parallel group holding it whole on every member). A dense layer's
/// attribute ranks divide its work (they sum partial results), and so do an embedding's
/// (each looks up its piece of the vocabulary: Megatron's vocabulary-parallel embedding),
/// so they have none.
/// Under context parallelism an embedding runs on every rank of the group the whole
/// sequence (the sequence's pieces do not divide its work): they are replicas too.
pub fn replicas(kind: LayerKind, split: Split) -> u32 {
    let view = View::output(kind, split, 0);
    match kind {
        LayerKind::Conv | LayerKind::Dense | LayerKind::Embedding => view.context_replication(),
        _ => view.replication(),
    }
}

/// Into how many pieces a `kind` layer under `split` cuts each sequence's rows of its
/// output (1: it writes them whole on every rank of its context group).
pub fn context_pieces(kind: LayerKind, split: Split) -> u32 {
    match View::output(kind, split, 0).cuts(Cut::Context) {
        true => split.context.max(1),
        false => 1,
    }
}

/// The degrees of a [`View`]: the context degree folded into the samples'.
fn degrees(split: Split) -> (u32, u32, u32) {
    (
        split.sample.max(1) * split.context.max(1),
        split.attribute.max(1),
        split.parameter.max(1),
    )
}

/// Whether a context-parallel group cuts the rows of a `kind` layer's output (`output`)
/// or input: products, norms and elementwise layers work on each token apart; an
/// attention core writes its piece of the queries' rows but reads the whole sequence's
/// keys and values (gathered: the all-gather form Llama 3 trained with), its input's
/// gradient a partial sum over the group ([`input_gradient_sums`]); an embedding (whose
/// table's gradient the sequence's pieces would each add in full) runs whole on every rank
/// of the group.
fn cuts_context(kind: LayerKind, output: bool) -> bool {
    match kind {
        LayerKind::Dense | LayerKind::LayerNorm | LayerKind::Elementwise => true,
        LayerKind::Attention => output,
        _ => false,
    }
}

/// `rows` as a context-parallel `kind` layer cuts them in its output (`output`) or input:
/// by the context index first.
fn with_context(kind: LayerKind, split: Split, rows: Cut, output: bool) -> Cut {
    match (split.context > 1 && cuts_context(kind, output), rows) {
        (true, Cut::Whole) => Cut::Context,
        (true, Cut::Attribute) => Cut::ContextAttribute,
        (_, rows) => rows,
    }
}

impl View {
    /// The share of its output each rank of a `kind` layer writes. A dense layer split by
    /// input features (`a`, row parallel) writes partial sums over `a`; [`partial_sums`]
    /// says how many, and this view is the one after they are reduced.
    pub fn output(kind: LayerKind, split: Split, first: u32) -> View {
        let (rows, features) = match kind {
            LayerKind::Conv | LayerKind::Pool | LayerKind::Elementwise => {
                (Cut::Attribute, Cut::Parameter)
            }
            // A recurrent layer's parameters are its gates' hidden units: each rank
            // writes its units of the state.
            LayerKind::Dense | LayerKind::Attention | LayerKind::Recurrent => {
                (Cut::Whole, Cut::Parameter)
            }
            LayerKind::LayerNorm => (Cut::Attribute, Cut::Whole),
            _ => (Cut::Whole, Cut::Whole),
        };
        View {
            first,
            split: degrees(split),
            context: split.context.max(1),
            rows: with_context(kind, split, rows, true),
            features,
        }
    }

    /// The share of its input each rank of a `kind` layer reads: a convolution reads every
    /// channel of its rows (halos ignored), a row-parallel dense layer its slice of input
    /// features, a column-parallel one every feature.
    pub fn input(kind: LayerKind, split: Split, first: u32) -> View {
        let (rows, features) = match kind {
            LayerKind::Conv => (Cut::Attribute, Cut::Whole),
            LayerKind::Dense => (Cut::Whole, Cut::Attribute),
            // Heads: the QKV projection's columns, per head.
            LayerKind::Attention => (Cut::Whole, Cut::Parameter),
            LayerKind::Pool | LayerKind::Elementwise => (Cut::Attribute, Cut::Parameter),
            LayerKind::LayerNorm => (Cut::Attribute, Cut::Whole),
            _ => (Cut::Whole, Cut::Whole),
        };
        View {
            first,
            split: degrees(split),
            context: split.context.max(1),
            rows: with_context(kind, split, rows, false),
            features,
        }
    }

    /// This view with its rows not cut by the context index: what a context-parallel
    /// attention core computes (every query row of the sequence it gathered) before it
    /// keeps its piece.
    pub fn every_context_row(&self) -> View {
        let rows = match self.rows {
            Cut::Context => Cut::Whole,
            Cut::ContextAttribute => Cut::Attribute,
            rows => rows,
        };
        View { rows, ..*self }
    }

    /// Number of ranks.
    pub fn ranks(&self) -> u32 {
        self.split.0 * self.split.1 * self.split.2
    }

    /// The box of rank index `k`: `[lo, hi)` on samples, rows, features.
    fn rank_box(&self, k: u32) -> [(f64, f64); 3] {
        self.pieces(k).map(|(i, n)| {
            (
                f64::from(i) / f64::from(n.max(1)),
                f64::from(i + 1) / f64::from(n.max(1)),
            )
        })
    }

    /// Rank indices whose boxes may meet `need`, in increasing order: on each axis the
    /// pieces `need` spans, one more on each side for rounding (callers test the boxes).
    /// Replicas (indices that cut no axis) all qualify. So a consumer rank's producers are
    /// found in the pieces it overlaps, not by scanning every producer rank.
    fn meeting(&self, need: &RankBox) -> impl Iterator<Item = u32> {
        let (s, a, p) = self.split;
        let span = |(lo, hi): (f64, f64), n: u32| {
            let last = i64::from(n) - 1;
            let n = f64::from(n);
            let first = ((lo * n).floor() as i64 - 1).clamp(0, last.max(0));
            let end = ((hi * n).ceil() as i64).clamp(0, last.max(0));
            (first as u32, end as u32)
        };
        let mut by_attribute = (0, a.saturating_sub(1));
        let mut by_parameter = (0, p.saturating_sub(1));
        for (axis, cut) in [(1, self.rows), (2, self.features)] {
            let (range, n) = match cut {
                // Nested in the sample index (its context pieces are all candidates).
                Cut::Whole | Cut::Context | Cut::ContextAttribute => continue,
                Cut::Attribute => (&mut by_attribute, a),
                Cut::Parameter => (&mut by_parameter, p),
            };
            let (first, end) = span(need[axis], n);
            *range = (range.0.max(first), range.1.min(end));
        }
        // The sample index holds `c` context pieces of each sample shard: the shards the
        // need spans, each with every context piece (the boxes are tested after).
        let c = self.context.max(1);
        let by_sample = span(need[0], s / c);
        let by_sample = (by_sample.0 * c, by_sample.1 * c + c - 1);
        (by_sample.0..=by_sample.1).flat_map(move |si| {
            (by_attribute.0..=by_attribute.1).flat_map(move |ai| {
                (by_parameter.0..=by_parameter.1).map(move |pi| si * a * p + ai * p + pi)
            })
        })
    }

    /// The pieces rank index `k` holds on samples, rows and features: `(index, count)`,
    /// piece `index` of `count` equal pieces (`(0, 1)` for a whole axis). Executors turn
    /// them into index ranges; the planner's boxes are the same pieces in `[0, 1)`.
    pub fn pieces(&self, k: u32) -> [(u32, u32); 3] {
        let (s, a, p) = self.split;
        let c = self.context.max(1);
        let (si, ai, pi) = (k / (a * p), (k / p) % a, k % p);
        let ci = si % c;
        let cut = |cut: Cut| match cut {
            Cut::Whole => (0, 1),
            Cut::Attribute => (ai, a),
            Cut::Parameter => (pi, p),
            Cut::Context => (ci, c),
            Cut::ContextAttribute => (ci * a + ai, c * a),
        };
        [(si / c, s / c), cut(self.rows), cut(self.features)]
    }

    /// The fraction of the tensor each rank holds (every rank's box has the same volume).
    pub fn share(&self) -> f64 {
        volume(&self.rank_box(0))
    }

    /// How many ranks hold each box (1: every rank holds a different one).
    pub fn replication(&self) -> u32 {
        let (_, a, p) = self.split;
        (if self.cuts(Cut::Attribute) { 1 } else { a })
            * (if self.cuts(Cut::Parameter) { 1 } else { p })
            * self.context_replication()
    }

    /// How many ranks of each context-parallel group hold the same box: the group's
    /// size where the view does not cut the rows by it, else 1.
    fn context_replication(&self) -> u32 {
        match self.cuts(Cut::Context) {
            true => 1,
            false => self.context.max(1),
        }
    }

    /// Whether an axis is cut by the rank index `c` names (a nested cut counts for both
    /// of its indices).
    fn cuts(&self, c: Cut) -> bool {
        [self.rows, self.features].iter().any(|&axis| {
            axis == c
                || (axis == Cut::ContextAttribute && matches!(c, Cut::Context | Cut::Attribute))
        })
    }
}

/// Whether rank index `k` of a `kind` layer under `split` is the first of the
/// [`replicas`] computing its share: the one whose weight gradients count (the others
/// compute the same ones again).
pub fn first_replica(kind: LayerKind, split: Split, k: u32) -> bool {
    if replicas(kind, split) == 1 {
        return true;
    }
    let view = View::output(kind, split, 0);
    let (_, a, p) = view.split;
    let context_index = (k / (a * p)) % view.context.max(1);
    let first_of_context = view.cuts(Cut::Context) || context_index == 0;
    match kind {
        // Their attribute and parameter ranks divide the work ([`replicas`]).
        LayerKind::Conv | LayerKind::Dense | LayerKind::Embedding => first_of_context,
        _ => {
            (view.cuts(Cut::Attribute) || (k / p) % a == 0)
                && (view.cuts(Cut::Parameter) || k % p == 0)
                && first_of_context
        }
    }
}

/// `[lo, hi)` on samples, rows, features.
type RankBox = [(f64, f64); 3];

fn volume(b: &[(f64, f64); 3]) -> f64 {
    b.iter().map(|(lo, hi)| (hi - lo).max(0.0)).product()
}

fn intersect(x: &[(f64, f64); 3], y: &[(f64, f64); 3]) -> [(f64, f64); 3] {
    std::array::from_fn(|i| (x[i].0.max(y[i].0), x[i].1.min(y[i].1)))
}

/// The fractions of a tensor a redistribution moves.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Movement {
    /// The most any one rank receives or sends, as a fraction of the tensor.
    pub busiest: f64,
    /// Absolute ranks spanned by the producers and consumers (for the link class).
    pub span: (u32, u32),
}

/// What moving a tensor from `from` (held) to `to` (needed) takes: every consumer rank
/// receives the part of its box it does not hold itself; senders are assumed to share the
/// load evenly. `None` when nothing moves.
///
/// Cost: O(ranks of `to`).
pub(crate) fn movement(from: &View, to: &View) -> Option<Movement> {
    let (mut busiest_in, mut total) = (0.0f64, 0.0f64);
    for r in 0..to.ranks() {
        let need = to.rank_box(r);
        let absolute = to.first + r;
        let own = if absolute >= from.first && absolute < from.first + from.ranks() {
            volume(&intersect(&need, &from.rank_box(absolute - from.first)))
        } else {
            0.0
        };
        let incoming = (volume(&need) - own).max(0.0);
        busiest_in = busiest_in.max(incoming);
        total += incoming;
    }
    if busiest_in < 1e-12 {
        return None;
    }
    // A box held by several replicas is sent by any of them: the distinct holders share it.
    let senders = f64::from((from.ranks() / from.replication()).max(1));
    let lo = from.first.min(to.first);
    let hi = (from.first + from.ranks()).max(to.first + to.ranks()) - 1;
    Some(Movement {
        busiest: busiest_in.max(total / senders),
        span: (lo, hi),
    })
}

/// The most any one server sends or receives across its network interface in moving a
/// tensor from `from` to `to`, as a fraction of the tensor (0 when nothing leaves a
/// server). Each consumer rank takes a piece from the holder [`transfers`] picks.
///
/// Cost: O(ranks of `to` × ranks of `from`); above [`EXACT_NODE_TRAFFIC`] pairs, every
/// incoming piece is counted as crossing (an upper bound).
pub(crate) fn node_busiest(from: &View, to: &View, node_of: &dyn Fn(u32) -> u32) -> f64 {
    let mut inbound: BTreeMap<u32, f64> = BTreeMap::new();
    let mut outbound: BTreeMap<u32, f64> = BTreeMap::new();
    let exact = u64::from(to.ranks()) * u64::from(from.ranks()) <= EXACT_NODE_TRAFFIC;
    for r in 0..to.ranks() {
        let need = to.rank_box(r);
        let absolute = to.first + r;
        let node = node_of(absolute);
        let own = (absolute >= from.first && absolute < from.first + from.ranks())
            .then(|| from.rank_box(absolute - from.first));
        if !exact {
            let held = own.map_or(0.0, |o| volume(&intersect(&need, &o)));
            *inbound.entry(node).or_default() += (volume(&need) - held).max(0.0);
            continue;
        }
        for (sender, fraction) in incoming(from, to, r) {
            if node_of(sender) == node {
                continue;
            }
            *inbound.entry(node).or_default() += fraction;
            *outbound.entry(node_of(sender)).or_default() += fraction;
        }
    }
    inbound
        .values()
        .chain(outbound.values())
        .copied()
        .fold(0.0, f64::max)
}

/// Consumer × producer rank pairs up to which [`node_busiest`] is exact.
const EXACT_NODE_TRAFFIC: u64 = 1 << 16;

/// The kinds the tensor of an edge from a `producer` to a `consumer` layer is held and read
/// as. An attention layer cuts by heads what its projections write for it (Q, K, V) and
/// what it writes for a dense layer (its heads merged, the output projection's input);
/// anything else it reads — a position table or a mask, broadcast over the heads, or a
/// graph input — each of its ranks reads whole, as a column-parallel dense layer reads its
/// input (its gradient a partial sum over the heads), and a table it writes for another
/// attention layer (rotary angles computed once) each of its ranks holds whole, as a
/// data-movement layer does. Idempotent: mapped kinds map to themselves.
pub fn edge_kinds(producer: Option<LayerKind>, consumer: LayerKind) -> (LayerKind, LayerKind) {
    use LayerKind::{Attention, DataMovement, Dense};
    let held = producer.unwrap_or(DataMovement);
    match (held, consumer) {
        (Attention, Attention) => (DataMovement, Dense),
        (Dense, Attention) => (Dense, Attention),
        (p, Attention) => (p, Dense),
        kinds => kinds,
    }
}

/// The kind a `consumer` layer placed as `split` reads an input as: its own, but for an
/// input only a dense layer's epilogue reads ([`Edge::epilogue`](crate::layers::Edge)),
/// an elementwise layer's — the rows and features its output holds. A column-parallel
/// layer then reads its features of SwiGLU's gate (Megatron-LM's layout, nothing
/// gathered), and a row-parallel one its rows of the residual, each adding its piece into
/// its partial sum so that the sum adds it once; with both cuts (no piece of the
/// output is one rank's) the layer's own.
pub fn epilogue_reads_as(consumer: LayerKind, split: Split, epilogue: bool) -> LayerKind {
    let both = split.attribute > 1 && split.parameter > 1;
    match consumer {
        LayerKind::Dense if epilogue && !both => LayerKind::Elementwise,
        kind => kind,
    }
}

/// One message of a redistribution: `fraction` of the tensor from rank `from` to rank `to`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Transfer {
    /// Sending rank (absolute).
    pub from: u32,
    /// Receiving rank (absolute).
    pub to: u32,
    /// Share of the whole tensor.
    pub fraction: f64,
}

/// The messages that move a tensor written by a `producer`-kind layer (split `from` on ranks
/// from `from_first`) to where a `consumer`-kind layer (split `to` from `to_first`) reads
/// it: every consumer rank receives each piece of its box it does not hold, from one holder
/// of that piece (holders of a replicated piece take turns, by consumer rank). Ordered by
/// receiving rank, then sender.
///
/// Cost: O(ranks of the consumer × ranks of the producer).
pub fn transfers(
    producer: LayerKind,
    from: (Split, u32),
    consumer: LayerKind,
    to: (Split, u32),
) -> Vec<Transfer> {
    let (producer, consumer) = edge_kinds(Some(producer), consumer);
    let held = View::output(producer, from.0, from.1);
    let needed = View::input(consumer, to.0, to.1);
    deliveries(&held, &needed)
}

/// Every rank of `to` receiving what it needs and lacks of a tensor held as `from`, each
/// piece from one holder ([`incoming`]).
fn deliveries(from: &View, to: &View) -> Vec<Transfer> {
    (0..to.ranks())
        .flat_map(|r| {
            incoming(from, to, r)
                .into_iter()
                .map(move |(sender, fraction)| Transfer {
                    from: sender,
                    to: to.first + r,
                    fraction,
                })
        })
        .collect()
}

/// The messages that return the gradient of a tensor moved as [`transfers`] says, each
/// from a consumer rank (`from`) to a producer rank (`to`). Where every producer rank holds
/// a distinct box, they are the forward's, reversed. Where producers are replicas (a
/// LayerNorm held whole over a tensor-parallel group, read in pieces by a row-parallel
/// layer), each needs its box's whole gradient: every piece it did not compute itself
/// comes from a consumer rank that did (the backward of Megatron's scatter, an
/// all-gather). Ordered by receiving rank, then sender.
///
/// Cost: O(ranks of the consumer × ranks of the producer).
pub fn gradient_transfers(
    producer: LayerKind,
    from: (Split, u32),
    consumer: LayerKind,
    to: (Split, u32),
) -> Vec<Transfer> {
    let (producer, consumer) = edge_kinds(Some(producer), consumer);
    let held = View::output(producer, from.0, from.1);
    let needed = View::input(consumer, to.0, to.1);
    if held.replication() == 1 {
        return deliveries(&held, &needed)
            .into_iter()
            .map(|t| Transfer {
                from: t.to,
                to: t.from,
                fraction: t.fraction,
            })
            .collect();
    }
    deliveries(&needed, &held)
}

/// What consumer rank index `r` of `to` receives of a tensor held as `from`: for each
/// distinct producer box meeting its need that it does not hold itself, the holder that
/// sends it (holders of a replicated piece take turns, by consumer rank) and the share.
///
/// Cost: O(producer ranks meeting the need).
fn incoming(from: &View, to: &View, r: u32) -> Vec<(u32, f64)> {
    incoming_among(from, to, r, |need| from.meeting(need))
}

/// [`incoming`], testing the producer rank indices `candidates` gives for the need (in
/// increasing order, a superset of those meeting it).
fn incoming_among<I: Iterator<Item = u32>>(
    from: &View,
    to: &View,
    r: u32,
    candidates: impl FnOnce(&RankBox) -> I,
) -> Vec<(u32, f64)> {
    let need = to.rank_box(r);
    let absolute = to.first + r;
    let own = (absolute >= from.first && absolute < from.first + from.ranks())
        .then(|| from.rank_box(absolute - from.first));
    let mut pieces: Vec<(RankBox, Vec<u32>)> = Vec::new();
    for q in candidates(&need) {
        let b = from.rank_box(q);
        if volume(&intersect(&need, &b)) < 1e-12 {
            continue;
        }
        match pieces.iter_mut().find(|(x, _)| *x == b) {
            Some((_, holders)) => holders.push(from.first + q),
            None => pieces.push((b, vec![from.first + q])),
        }
    }
    pieces
        .into_iter()
        .filter(|(b, _)| own != Some(*b))
        .filter_map(|(b, holders)| {
            let mut fraction = volume(&intersect(&need, &b));
            if let Some(o) = own {
                fraction -= volume(&intersect(&intersect(&need, &b), &o));
            }
            (fraction > 1e-12).then(|| (holders[r as usize % holders.len()], fraction))
        })
        .collect()
}

/// The ranks of rank index 0's group when moving the tensor is an all-gather inside
/// groups (copies of it cover the others): the consumer runs on the producer's ranks, each
/// producer rank holds a distinct piece, and every consumer rank of a group reads the same
/// box, which the group's pieces tile — the whole tensor, or its sample shard for a
/// tensor-parallel group. Its gradient is then a reduce-scatter over the group when the
/// consumer's input gradient is a partial sum over it ([`scatters_gradient`]).
///
/// Cost: O(ranks × group size).
pub fn gathers(
    producer: LayerKind,
    from: (Split, u32),
    consumer: LayerKind,
    to: (Split, u32),
) -> Option<Vec<u32>> {
    let (producer, consumer) = edge_kinds(Some(producer), consumer);
    gather_group(
        &View::output(producer, from.0, from.1),
        &View::input(consumer, to.0, to.1),
    )
}

/// The ranks of rank index 0's group when returning the tensor's gradient is an all-gather
/// inside groups: the producer's ranks are replicas of a box (a tensor-parallel group's
/// projection output, held whole) that its consumer reads in pieces on the same ranks
/// (the sequence pieces after Megatron's reduce-scatter), so nothing moves forward and each
/// replica gathers its box's gradient from the pieces.
pub fn gathers_gradient(
    producer: LayerKind,
    from: (Split, u32),
    consumer: LayerKind,
    to: (Split, u32),
) -> Option<Vec<u32>> {
    let (producer, consumer) = edge_kinds(Some(producer), consumer);
    let held = View::output(producer, from.0, from.1);
    let needed = View::input(consumer, to.0, to.1);
    if held.replication() < 2 || movement(&held, &needed).is_some() {
        return None;
    }
    gather_group(&needed, &held)
}

/// Rank index 0's group of an all-gather from `held` pieces into `needed` boxes on the
/// same ranks, if moving the tensor is one ([`gathers`]).
fn gather_group(held: &View, needed: &View) -> Option<Vec<u32>> {
    let n = held.ranks();
    if n < 2 || held.first != needed.first || n != needed.ranks() || held.replication() != 1 {
        return None;
    }
    let need = needed.rank_box(0);
    let group: Vec<u32> = held
        .meeting(&need)
        .filter(|&q| volume(&intersect(&need, &held.rank_box(q))) > 1e-12)
        .collect();
    let tiles = group.len() >= 2
        && group.iter().all(|&q| needed.rank_box(q) == need)
        && (group
            .iter()
            .map(|&q| volume(&held.rank_box(q)))
            .sum::<f64>()
            - volume(&need))
        .abs()
            < 1e-12;
    tiles.then(|| group.iter().map(|q| held.first + q).collect())
}

/// Whether the gradient of an all-gather over `ranks` into a `consumer`-kind layer placed
/// `to` is a reduce-scatter: its input gradient is a partial sum over exactly those ranks.
pub fn scatters_gradient(ranks: &[u32], consumer: LayerKind, to: (Split, u32)) -> bool {
    let read = input_share(consumer, to.0);
    input_gradient_sums(consumer, to.0, to.1)
        .is_some_and(|(group, share)| group == ranks && (share - read).abs() < 1e-12)
}

/// The fraction of its input each rank of a `kind` layer under `split` reads.
pub fn input_share(kind: LayerKind, split: Split) -> f64 {
    View::input(kind, split, 0).share()
}

/// The fraction of its output each rank of a `kind` layer under `split` holds.
pub fn output_share(kind: LayerKind, split: Split) -> f64 {
    View::output(kind, split, 0).share()
}

/// The ranks of the group that all-reduces the gradients of rank index 0's weights: the
/// ranks holding the same weight slice. Convolutions keep a whole weight per parameter
/// slice (replicated over samples and rows); a dense layer's weight is cut by input
/// features too, an embedding's table by vocabulary (replicated over samples only).
pub fn weight_replicas(kind: LayerKind, split: Split, first: u32) -> (Vec<u32>, f64) {
    let (s, a, p) = degrees(split);
    if matches!(kind, LayerKind::Dense | LayerKind::Embedding) {
        let ranks = (0..s).map(|si| first + si * a * p).collect();
        (ranks, 1.0 / f64::from(a * p))
    } else {
        let ranks = (0..s * a).map(|i| first + i * p).collect();
        (ranks, 1.0 / f64::from(p))
    }
}

/// The groups that must sum partial results of a row-parallel dense layer or a
/// vocabulary-parallel embedding (rank index 0's),
/// with the fraction of the output each holds; `None` when there are no partial sums.
pub fn partial_sums(kind: LayerKind, split: Split, first: u32) -> Option<(Vec<u32>, f64)> {
    let (_, a, p) = degrees(split);
    (matches!(kind, LayerKind::Dense | LayerKind::Embedding) && a > 1).then(|| {
        let ranks = (0..a).map(|ai| first + ai * p).collect();
        (ranks, View::output(kind, split, first).share())
    })
}

/// Whether a row-parallel `producer`'s partial sums may be reduce-scattered by rows for
/// `consumer` instead of all-reduced: it runs on the same ranks and each of them reads only
/// rows of the piece the scatter leaves it (Megatron-LM's sequence-parallel
/// reduce-scatter, half an all-reduce's traffic; a later gather to what reads the tensor
/// whole is the other half).
pub fn scatters_partial_sums(
    producer: LayerKind,
    from: (Split, u32),
    consumer: LayerKind,
    to: (Split, u32),
) -> bool {
    let (producer, consumer) = edge_kinds(Some(producer), consumer);
    if partial_sums(producer, from.0, from.1).is_none() {
        return false;
    }
    let output = View::output(producer, from.0, from.1);
    let scattered = View {
        rows: match output.rows {
            Cut::Context => Cut::ContextAttribute,
            _ => Cut::Attribute,
        },
        ..output
    };
    let needed = View::input(consumer, to.0, to.1);
    scattered.first == needed.first
        && scattered.ranks() == needed.ranks()
        && movement(&scattered, &needed).is_none()
}

/// The group of rank index 0 of a model's last layer whose ranks hold pieces of the same
/// rows' classes (a vocabulary-parallel LM head): they exchange the loss's statistics.
/// `None` when every rank holds whole rows.
pub fn class_pieces(kind: LayerKind, split: Split, first: u32) -> Option<Vec<u32>> {
    let view = View::output(kind, split, first);
    let (_, a, p) = view.split;
    match view.features {
        Cut::Parameter if p > 1 => Some((0..p).map(|pi| first + pi).collect()),
        Cut::Attribute if a > 1 => Some((0..a).map(|ai| first + ai * p).collect()),
        _ => None,
    }
}

/// The group over which a layer's input gradient is a partial sum, with the fraction of the
/// input each holds: a layer split by parameters reads its input whole on every parameter
/// slice, so each slice computes a part of the input's gradient (Megatron's `f` operator);
/// so does a recurrent layer split by its gates, and a context-parallel attention core
/// over its context group (each rank's queries give part of every key's and value's
/// gradient).
pub fn input_gradient_sums(kind: LayerKind, split: Split, first: u32) -> Option<(Vec<u32>, f64)> {
    let (_, a, p) = degrees(split);
    let c = split.context.max(1);
    if kind == LayerKind::Attention && c > 1 {
        let ranks = (0..c).map(|ci| first + ci * a * p).collect();
        return Some((ranks, input_share(kind, split)));
    }
    let sums = matches!(
        kind,
        LayerKind::Conv | LayerKind::Dense | LayerKind::Recurrent
    );
    (sums && p > 1).then(|| {
        let ranks = (0..p).map(|pi| first + pi).collect();
        (ranks, input_share(kind, split))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split(s: u32, a: u32, p: u32) -> Split {
        Split {
            sample: s,
            context: 1,
            attribute: a,
            parameter: p,
        }
    }

    /// Asserts that every rank of `to` receives from `from` what a scan of every producer
    /// rank finds; the ranks checked.
    fn receives_as_by_scanning(from: &View, to: &View) -> u32 {
        for r in 0..to.ranks() {
            assert_eq!(
                incoming(from, to, r),
                incoming_among(from, to, r, |_| 0..from.ranks()),
                "{from:?} to {to:?}, rank {r}"
            );
        }
        to.ranks()
    }

    #[test]
    fn a_consumer_rank_receives_the_same_pieces_as_by_scanning_every_producer() {
        let kinds = [
            LayerKind::Conv,
            LayerKind::Dense,
            LayerKind::Pool,
            LayerKind::Elementwise,
        ];
        let degrees = [1u32, 2, 3, 4, 6, 7, 8, 16];
        let mut checked = 0;
        for (i, &producer) in kinds.iter().enumerate() {
            let consumer = kinds[(i + 1) % kinds.len()];
            for &s in &degrees {
                for &a in &degrees[..5] {
                    for &p in &degrees[..5] {
                        let (s2, a2, p2) = (degrees[(s as usize + 1) % 8], p, a);
                        let from = View::output(producer, split(s, a, p), 3);
                        let to = View::input(consumer, split(s2, a2, p2), (s + a) % 5);
                        checked += receives_as_by_scanning(&from, &to);
                    }
                }
            }
        }
        assert!(checked > 10_000, "{checked}");
    }

    fn context_split(s: u32, c: u32, a: u32, p: u32) -> Split {
        Split {
            context: c,
            ..split(s, a, p)
        }
    }

    #[test]
    fn a_context_group_cuts_the_rows_of_what_works_per_token() {
        // d2 × c2 × t2, rank k = ((sᵢ·2 + cᵢ)·a + aᵢ)·p + pᵢ.
        let columns = View::output(LayerKind::Dense, context_split(2, 2, 1, 2), 0);
        assert_eq!(columns.ranks(), 8);
        assert_eq!(columns.pieces(5), [(1, 2), (0, 2), (1, 2)]);
        assert_eq!(columns.replication(), 1);
        // Sequence parallelism nested inside the context piece: piece cᵢ·a + aᵢ of c·a.
        let norm = View::output(LayerKind::LayerNorm, context_split(2, 2, 2, 1), 0);
        assert_eq!(norm.pieces(3), [(0, 2), (3, 4), (0, 1)]);
        assert_eq!(norm.replication(), 1);
        // The attention core reads each sample shard's whole sequence on both context
        // ranks and writes its piece of the queries' rows.
        let cores = context_split(2, 2, 1, 2);
        let attention = View::input(LayerKind::Attention, cores, 0);
        assert_eq!(attention.pieces(5), [(1, 2), (0, 1), (1, 2)]);
        assert_eq!(attention.replication(), 2);
        let written = View::output(LayerKind::Attention, cores, 0);
        assert_eq!(written.pieces(5), [(1, 2), (0, 2), (1, 2)]);
        assert_eq!(replicas(LayerKind::Attention, cores), 1);
        // Its input is gathered over the context group (each rank receives the other half
        // of its box), and its gradient reduce-scattered there.
        let m = movement(&columns, &attention).unwrap();
        assert!((m.busiest - 1.0 / 8.0).abs() < 1e-12, "{m:?}");
        let from = (context_split(2, 2, 1, 2), 0);
        let group = gathers(LayerKind::Dense, from, LayerKind::Attention, (cores, 0)).unwrap();
        assert_eq!(group, [0, 2]);
        assert!(scatters_gradient(&group, LayerKind::Attention, (cores, 0)));
        // A vocabulary-parallel embedding runs whole on both context ranks: the first of
        // each vocabulary piece counts its gradients, the other adds zeros.
        let embedding = context_split(1, 2, 2, 1);
        assert_eq!(replicas(LayerKind::Embedding, embedding), 2);
        let counted: Vec<u32> = (0..4)
            .filter(|&k| first_replica(LayerKind::Embedding, embedding, k))
            .collect();
        assert_eq!(counted, [0, 1]);
        // Weight gradients sum over the data and context ranks holding a slice.
        let (ranks, share) = weight_replicas(LayerKind::Dense, context_split(2, 2, 1, 2), 0);
        assert_eq!(ranks, [0, 2, 4, 6]);
        assert!((share - 0.5).abs() < 1e-12);
    }

    #[test]
    fn context_views_receive_the_same_pieces_as_by_scanning_every_producer() {
        let kinds = [
            LayerKind::Dense,
            LayerKind::LayerNorm,
            LayerKind::Attention,
            LayerKind::Embedding,
            LayerKind::Elementwise,
        ];
        let mut checked = 0;
        for (i, &producer) in kinds.iter().enumerate() {
            let consumer = kinds[(i + 2) % kinds.len()];
            for (s, c, a, p) in [(1, 2, 1, 2), (2, 2, 2, 1), (3, 4, 1, 2), (2, 3, 2, 1)] {
                for (s2, c2, a2, p2) in [(s, c, p, a), (s, 1, a, p), (2 * s, c, 1, 1)] {
                    let from = View::output(producer, context_split(s, c, a, p), 0);
                    let to = View::input(consumer, context_split(s2, c2, a2, p2), 1);
                    checked += receives_as_by_scanning(&from, &to);
                }
            }
        }
        assert!(checked > 200, "{checked}");
    }

    #[test]
    fn same_layout_moves_nothing() {
        let v = View::output(LayerKind::Conv, split(8, 1, 1), 0);
        let w = View::input(LayerKind::Conv, split(8, 1, 1), 0);
        assert_eq!(movement(&v, &w), None);
    }

    #[test]
    fn gather_to_one_rank_receives_the_rest() {
        let from = View::output(LayerKind::Conv, split(8, 1, 1), 0);
        let to = View::input(LayerKind::Dense, split(1, 1, 1), 0);
        let m = movement(&from, &to).unwrap();
        assert!((m.busiest - 7.0 / 8.0).abs() < 1e-12);
        assert_eq!(m.span, (0, 7));
    }

    #[test]
    fn scatter_from_one_rank_is_sender_bound() {
        let from = View::output(LayerKind::Dense, split(1, 1, 1), 0);
        let to = View::input(LayerKind::Dense, split(4, 1, 1), 0);
        // Rank 0 keeps a quarter and sends three quarters.
        let m = movement(&from, &to).unwrap();
        assert!((m.busiest - 0.75).abs() < 1e-12, "{m:?}");
    }

    #[test]
    fn column_split_input_is_gathered_on_every_slice() {
        // Samples over 4, then a column-parallel dense layer on 4: every rank needs all.
        let from = View::output(LayerKind::Conv, split(4, 1, 1), 0);
        let to = View::input(LayerKind::Dense, split(1, 1, 4), 0);
        let m = movement(&from, &to).unwrap();
        assert!((m.busiest - 0.75).abs() < 1e-12, "{m:?}");
        // Column then row (Megatron): the row-parallel layer reads exactly what it holds.
        let col = View::output(LayerKind::Dense, split(1, 1, 4), 0);
        let row = View::input(LayerKind::Dense, split(1, 4, 1), 0);
        assert_eq!(movement(&col, &row), None);
    }

    #[test]
    fn disjoint_stages_move_everything() {
        let from = View::output(LayerKind::Conv, split(2, 1, 1), 0);
        let to = View::input(LayerKind::Conv, split(4, 1, 1), 2);
        let m = movement(&from, &to).unwrap();
        // Each consumer needs a quarter; each producer sends a half.
        assert!((m.busiest - 0.5).abs() < 1e-12, "{m:?}");
        assert_eq!(m.span, (0, 5));
    }

    #[test]
    fn transfers_match_the_movement() {
        let cases = [
            (
                (LayerKind::Conv, split(8, 1, 1), 0),
                (LayerKind::Dense, split(1, 1, 1), 0),
            ),
            (
                (LayerKind::Conv, split(2, 1, 1), 0),
                (LayerKind::Conv, split(4, 1, 1), 2),
            ),
            (
                (LayerKind::Conv, split(4, 1, 1), 0),
                (LayerKind::Dense, split(1, 1, 4), 0),
            ),
            (
                (LayerKind::Dense, split(1, 1, 4), 0),
                (LayerKind::Dense, split(1, 4, 1), 0),
            ),
            (
                (LayerKind::Dense, split(2, 2, 1), 0),
                (LayerKind::Conv, split(4, 1, 1), 0),
            ),
        ];
        for ((pk, ps, pf), (ck, cs, cf)) in cases {
            let list = transfers(pk, (ps, pf), ck, (cs, cf));
            let m = movement(&View::output(pk, ps, pf), &View::input(ck, cs, cf));
            let mut incoming = std::collections::BTreeMap::<u32, f64>::new();
            for t in &list {
                assert_ne!(t.from, t.to);
                *incoming.entry(t.to).or_default() += t.fraction;
            }
            let busiest_in = incoming.values().copied().fold(0.0, f64::max);
            match m {
                None => assert!(list.is_empty(), "{list:?}"),
                Some(m) => assert!(busiest_in <= m.busiest + 1e-12, "{list:?} vs {m:?}"),
            }
        }
    }

    #[test]
    fn groups_follow_the_rank_numbering() {
        let (ranks, share) = weight_replicas(LayerKind::Conv, split(2, 1, 4), 8);
        assert_eq!((ranks, share), (vec![8, 12], 0.25));
        let (ranks, share) = weight_replicas(LayerKind::Dense, split(2, 2, 2), 0);
        assert_eq!((ranks, share), (vec![0, 4], 0.25));
        assert_eq!(
            partial_sums(LayerKind::Dense, split(1, 4, 1), 0),
            Some((vec![0, 1, 2, 3], 1.0))
        );
        assert_eq!(partial_sums(LayerKind::Conv, split(1, 4, 1), 0), None);
        assert_eq!(
            input_gradient_sums(LayerKind::Dense, split(2, 1, 4), 0),
            Some((vec![0, 1, 2, 3], 0.5))
        );
    }

    #[test]
    fn a_layer_held_whole_by_a_tensor_parallel_group_has_replicas_and_one_counts() {
        // LayerNorm on 2 samples × 4 replicas: ranks 0–3 hold samples 0, 4–7 samples 1.
        let held = split(2, 4, 1);
        assert_eq!(replicas(LayerKind::Norm, held), 4);
        let counted: Vec<u32> = (0..8)
            .filter(|&k| first_replica(LayerKind::Norm, held, k))
            .collect();
        assert_eq!(counted, [0, 4]);
        // Dense layers and attention cores divide their work instead.
        assert_eq!(replicas(LayerKind::Dense, split(2, 4, 1)), 1);
        assert_eq!(replicas(LayerKind::Attention, split(2, 1, 4)), 1);
        assert!((0..8).all(|k| first_replica(LayerKind::Attention, split(2, 1, 4), k)));
        // An attention core's heads follow its QKV projection's columns: nothing moves.
        let qkv = View::output(LayerKind::Dense, split(2, 1, 4), 0);
        let core = View::input(LayerKind::Attention, split(2, 1, 4), 0);
        assert_eq!(movement(&qkv, &core), None);
    }
}
