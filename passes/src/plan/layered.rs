//! The single-stage search: every layer picks its own GPU count and split (burst
//! parallelism, SOAP), all layers on ranks `0..g` of one group.
//!
//! A dynamic program over the layers in topological order. Its state after layer `i` is the
//! split of every layer whose output is still read later (the *frontier*: the cut tensors)
//! plus layer `i`'s own split (it decides whether the next layer's gradients join the same
//! all-reduce bucket). On a chain the frontier is one layer and the program is exact
//! (Viterbi over `C` choices: O(L·C²)). Branches (ResNet shortcuts, Inception modules,
//! DenseNet concatenations) widen the frontier; the state count is bounded by a beam of the
//! [`BEAM`] cheapest states (ties broken by their order), so a branchy graph costs
//! O(L · BEAM · C · inputs) instead of growing exponentially with the frontier. States are
//! hash-consed trees ([`super::frontier`]), so a state costs the layers that change, not
//! the frontier's width: a thousand parallel branches plan in about a second.
//!
//! Constraints enter through Lagrange multipliers (the caller searches them): the
//! objective is `time + λ·GPU-time + μ·memory of rank 0` (rank 0 holds a share of every
//! layer, the most of any rank).

use rustc_hash::FxHashMap as HashMap;

use super::costs::Costs;
use super::frontier::{Frontiers, Id, EMPTY};
use super::layout::{splits_attributes_into, splits_freely};
use crate::layers::{Layer, LayerKind, Producer, Split};

/// States kept per layer on branchy graphs.
pub(crate) const BEAM: usize = 64;

/// Per layer, the splits it may choose, or `None` when it follows its first producer.
pub(crate) type Choices = Vec<Option<Vec<Split>>>;

/// Weights of the relaxed constraints.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Weights {
    /// Per µs of GPU time.
    pub lambda: f64,
    /// Per byte of rank 0's memory.
    pub mu: f64,
}

/// GPU counts worth trying on `n` GPUs: every count up to 16 (any count may be best:
/// DeepPool's VGG puts some layers on 3 or 5 GPUs), then multiples of 8 spaced about 1.5×
/// apart, and `n`, so the choice count grows logarithmically.
pub(crate) fn gpu_counts(n: u32) -> Vec<u32> {
    let mut counts: Vec<u32> = (1..=n.min(16)).collect();
    let mut c = 16u32;
    while c < n {
        c = ((c as f64 * 1.5).ceil() as u32).div_ceil(8) * 8;
        counts.push(c.min(n));
    }
    counts.dedup();
    counts
}

/// The splits a layer may take on `g` GPUs: samples only, or (with `soap`) an attribute
/// or a parameter degree (a power of two up to `within`, one node: tensor parallelism
/// stays on the fast links) times a sample degree. A recurrent layer's parameters are its
/// gates' hidden units; it has no attribute to split.
fn splits_of(layer: &Layer, g: u32, soap: bool, within: u32, pieces: u64) -> Vec<Split> {
    let free = soap && matches!(layer.kind, LayerKind::Conv | LayerKind::Dense);
    let gates = soap && layer.recurrence.is_some();
    let mut degrees = vec![(1, 1)];
    if free || gates {
        let mut d = 2;
        while d <= within {
            if free && splits_attributes_into(layer, d) {
                degrees.push((d, 1));
            }
            // (Each piece of a recurrence's gates holds a hidden unit at least.)
            let units = layer
                .recurrence
                .as_ref()
                .is_none_or(|r| u64::from(d) <= r.hidden);
            if !layer.grouped && units {
                degrees.push((1, d));
            }
            d *= 2;
        }
    }
    degrees
        .into_iter()
        .filter(|&(a, p)| g % (a * p) == 0)
        .map(|(a, p)| Split {
            sample: g / (a * p),
            context: 1,
            attribute: a,
            parameter: p,
        })
        .filter(|s| u64::from(s.sample) <= pieces)
        .collect()
}

/// The choices of every layer on up to `n` GPUs: convolutions, dense layers and layers fed
/// only by graph inputs choose; pooling and elementwise layers keep their producer's split,
/// other layers its GPU count with samples split.
pub(crate) fn choices(costs: &Costs<'_>, n: u32, soap: bool) -> Choices {
    let within = costs.cluster.groups[0].gpus_per_node.clamp(1, 8).min(n);
    let counts = gpu_counts(n);
    costs
        .graph
        .layers
        .iter()
        .enumerate()
        .map(|(l, layer)| {
            let chooses = matches!(layer.kind, LayerKind::Conv | LayerKind::Dense)
                || layer.recurrence.is_some()
                || costs.first_producer[l].is_none();
            chooses.then(|| {
                counts
                    .iter()
                    .flat_map(|&g| splits_of(layer, g, soap, within, costs.graph.sample_pieces()))
                    .collect()
            })
        })
        .collect()
}

/// The split a following layer takes after its producer's: the same, or for a layer that
/// splits samples only (or cannot split the producer's attributes: a global pool after a
/// row-split convolution), the producer's GPUs (at most `pieces`, the batch's
/// [`LayerGraph::sample_pieces`](crate::layers::LayerGraph::sample_pieces)).
pub(crate) fn follow(layer: &Layer, producer: Split, pieces: u64) -> Split {
    if splits_freely(layer.kind) && splits_attributes_into(layer, producer.attribute) {
        producer
    } else {
        let cap = u32::try_from(pieces).unwrap_or(u32::MAX);
        Split::samples(producer.degree().min(cap))
    }
}

/// One layer's choices with their own costs (compute, sync bandwidth, memory, weighted).
struct Table {
    splits: Vec<Split>,
    /// Global ids of `splits` (for the edge-cost cache).
    ids: Vec<u16>,
    /// Weighted own cost per choice.
    own: Vec<f64>,
    /// Weighted bucket latency per choice (paid when the previous layer differs).
    latency: Vec<f64>,
    /// For a following layer: its choice for each of its producer's choices.
    from_producer: Vec<u16>,
}

fn table(costs: &Costs<'_>, l: usize, splits: Vec<Split>, weights: Weights) -> Table {
    let (mut own, mut latency) = (Vec::new(), Vec::new());
    for &split in &splits {
        let w = costs.work(l, split, 0, 1);
        let sync = costs.sync(l, split, 0, costs.graph.layers[l].param_bytes);
        let scale = 1.0 + weights.lambda * f64::from(split.degree());
        let layer = &costs.graph.layers[l];
        let (_, share) = super::layout::weight_replicas(layer.kind, split, 0);
        let step = costs.step_us(layer.param_bytes as f64 * share, 0);
        own.push(
            (w.fwd_us + w.bwd_us + sync.bandwidth_us + step) * scale
                + weights.mu * costs.memory(l, split, 1, 1, 0),
        );
        latency.push(if sync.bandwidth_us > 0.0 {
            sync.latency_us * scale
        } else {
            0.0
        });
    }
    Table {
        splits,
        ids: Vec::new(),
        own,
        latency,
        from_producer: Vec::new(),
    }
}

/// Transfer costs between two layers' splits are affine in the tensor's bytes (latencies
/// plus bytes over bandwidths); they are computed once per (producer split, consumer
/// split, producer kind, consumer kind, whether only the consumer's epilogue reads it) and
/// kept as (intercept, slope) in dense tables.
struct EdgeCache {
    ids: HashMap<Split, u16>,
    splits: Vec<Split>,
    tables: HashMap<(LayerKind, LayerKind, bool), Vec<(f64, f64)>>,
}

/// Distinct splits one search may see (the cache's tables are up to this squared).
const MAX_SPLITS: usize = 1024;

impl EdgeCache {
    fn id(&mut self, s: Split) -> u16 {
        *self.ids.entry(s).or_insert_with(|| {
            self.splits.push(s);
            (self.splits.len() - 1) as u16
        })
    }

    /// (fwd + bwd) µs of `bytes` moving from producer `p` (split id `a`) to consumer `c`
    /// (split id `b`), read by `c`'s epilogue alone when `epilogue`.
    fn cost(
        &mut self,
        costs: &Costs<'_>,
        (p, a): (usize, u16),
        (c, b): (usize, u16),
        epilogue: bool,
        bytes: f64,
    ) -> f64 {
        if bytes <= 0.0 {
            return 0.0;
        }
        let table = self
            .tables
            .entry((costs.kind(p), costs.kind(c), epilogue))
            .or_insert_with(|| vec![(f64::NAN, 0.0); self.splits.len() * self.splits.len()]);
        let cell = &mut table[a as usize * self.splits.len() + b as usize];
        if cell.0.is_nan() {
            let (from, to) = (self.splits[a as usize], self.splits[b as usize]);
            let at = |x: f64| {
                let reads_as = super::layout::epilogue_reads_as(costs.kind(c), to, epilogue);
                let (f, b) = costs.edge(p, (from, 0), reads_as, (to, 0), x);
                f + b
            };
            let (one, big) = (at(1.0), at(1e9));
            let slope = (big - one) / (1e9 - 1.0);
            *cell = (one - slope, slope);
        }
        cell.0 + cell.1 * bytes
    }
}

struct State {
    /// The choice of every frontier layer.
    frontier: Id,
    cost: f64,
    parent: u32,
    /// The layer's own choice.
    choice: u16,
}

/// The cheapest split of every layer under `weights`, or `None` when some layer has no
/// choice at all (a batch too small for any split).
pub(crate) fn best(costs: &Costs<'_>, choices: &Choices, weights: Weights) -> Option<Vec<Split>> {
    search(costs, choices, weights, BEAM)
}

/// Every layer's choice table (a following layer's choices are its producer's, mapped) and
/// the transfer-cost cache over their splits; `None` when a layer has no choice or the
/// splits are too many for the cache.
fn tables(
    costs: &Costs<'_>,
    choices: &Choices,
    weights: Weights,
) -> Option<(Vec<Table>, EdgeCache)> {
    let graph = costs.graph;
    let mut tables: Vec<Table> = Vec::with_capacity(graph.layers.len());
    for (l, layer) in graph.layers.iter().enumerate() {
        let t = match (&choices[l], costs.first_producer[l]) {
            (None, Some(p)) => {
                let mut splits: Vec<Split> = Vec::new();
                let from_producer = tables[p]
                    .splits
                    .iter()
                    .map(|&ps| {
                        let s = follow(layer, ps, graph.sample_pieces());
                        let at = splits.iter().position(|&x| x == s).unwrap_or_else(|| {
                            splits.push(s);
                            splits.len() - 1
                        });
                        at as u16
                    })
                    .collect();
                Table {
                    from_producer,
                    ..table(costs, l, splits, weights)
                }
            }
            (c, _) => table(costs, l, c.clone().unwrap_or_default(), weights),
        };
        if t.splits.is_empty() {
            return None;
        }
        tables.push(t);
    }
    let mut edges = EdgeCache {
        ids: HashMap::default(),
        splits: Vec::new(),
        tables: HashMap::default(),
    };
    for t in &mut tables {
        t.ids = t.splits.iter().map(|&s| edges.id(s)).collect();
    }
    if edges.splits.len() > MAX_SPLITS {
        return None;
    }
    Some((tables, edges))
}

/// The weighted cost of edge `input` of layer `c` (choice `cc`) from producer `p` (choice
/// `pc`): its transfer time, scaled by the GPU time of the wider side.
#[allow(
    clippy::too_many_arguments,
    reason = "the search and its test oracle price an edge alike"
)]
fn edge_cost(
    costs: &Costs<'_>,
    tables: &[Table],
    edges: &mut EdgeCache,
    weights: Weights,
    (p, pc): (usize, usize),
    (c, cc): (usize, usize),
    (bytes, epilogue): (f64, bool),
) -> f64 {
    let (from, to) = (tables[p].splits[pc], tables[c].splits[cc]);
    let t = edges.cost(
        costs,
        (p, tables[p].ids[pc]),
        (c, tables[c].ids[cc]),
        epilogue,
        bytes,
    );
    t * (1.0 + weights.lambda * f64::from(to.degree().max(from.degree())))
}

/// The dynamic program keeping `beam` states per layer (plus the uniform ones).
fn search(
    costs: &Costs<'_>,
    choices: &Choices,
    weights: Weights,
    beam: usize,
) -> Option<Vec<Split>> {
    let graph = costs.graph;
    let n = graph.layers.len();
    let mut last_use: Vec<usize> = (0..n).collect();
    for (l, layer) in graph.layers.iter().enumerate() {
        for e in &layer.inputs {
            if let Producer::Layer(p) = e.from {
                let p = p.0 as usize;
                last_use[p] = last_use[p].max(l);
            }
        }
    }
    // The frontier layers read for the last time by each layer, in order.
    let mut leaving: Vec<Vec<u32>> = vec![Vec::new(); n];
    for (j, &last) in last_use.iter().enumerate() {
        if last > j {
            leaving[last].push(j as u32);
        }
    }
    let (tables, mut edges) = self::tables(costs, choices, weights)?;
    let mut frontiers = Frontiers::new();
    let mut states = vec![State {
        frontier: EMPTY,
        cost: 0.0,
        parent: 0,
        choice: 0,
    }];
    let mut history: Vec<Vec<(u32, u16)>> = Vec::with_capacity(n);
    let mut matrices: Vec<Vec<f64>> = Vec::new();
    let mut projected: HashMap<Id, Id> = HashMap::default();
    for (i, layer) in graph.layers.iter().enumerate() {
        let me = &tables[i];
        let width = me.splits.len();
        // This layer's input edges from the frontier (earlier layers): (producer, bytes,
        // read by the epilogue alone), with a lazily filled matrix of transfer costs per
        // (producer choice, own choice).
        let inputs: Vec<(usize, f64, bool)> = layer
            .inputs
            .iter()
            .filter_map(|e| match e.from {
                Producer::Layer(p) if (p.0 as usize) < i => {
                    Some((p.0 as usize, e.bytes as f64, e.epilogue))
                }
                _ => None,
            })
            .collect();
        matrices.clear();
        for &(p, _, _) in &inputs {
            matrices.push(vec![f64::NAN; tables[p].splits.len() * width]);
        }
        let follows = choices[i].is_none() && costs.first_producer[i].is_some();
        let keeps_me = last_use[i] > i;
        // States that agree on the frontier layers that stay share a projection; the best
        // cost per (projection, choice) is kept in a dense table. Projections are numbered
        // in the order states first reach them.
        projected.clear();
        let mut numbers: HashMap<Id, usize> =
            HashMap::with_capacity_and_hasher(states.len(), Default::default());
        let mut projections: Vec<Id> = Vec::new();
        let mut projection_of = Vec::with_capacity(states.len());
        for state in &states {
            let proj = frontiers.remove(state.frontier, &leaving[i], &mut projected);
            let number = *numbers.entry(proj).or_insert_with(|| {
                projections.push(proj);
                projections.len() - 1
            });
            projection_of.push(number);
        }
        let mut best_of = vec![(f64::INFINITY, 0u32); projections.len() * width];
        let mut read: Vec<usize> = Vec::with_capacity(inputs.len());
        'states: for (si, state) in states.iter().enumerate() {
            let prev = (i > 0).then(|| tables[i - 1].splits[state.choice as usize]);
            read.clear();
            for &(p, _, _) in &inputs {
                let Some(pc) = frontiers.get(state.frontier, p as u32) else {
                    continue 'states;
                };
                read.push(pc as usize);
            }
            let (lo, hi) = if follows {
                let p = costs.first_producer[i].unwrap_or(0);
                let Some(at) = frontiers.get(state.frontier, p as u32) else {
                    continue;
                };
                let c = me.from_producer[at as usize];
                (c, c + 1)
            } else {
                (0, width as u16)
            };
            let row = projection_of[si] * width;
            for c in lo..hi {
                let split = me.splits[c as usize];
                let mut cost = state.cost + me.own[c as usize];
                if prev != Some(split) {
                    cost += me.latency[c as usize];
                }
                for (k, (&(p, bytes, epilogue), &pc)) in inputs.iter().zip(&read).enumerate() {
                    let cell = &mut matrices[k][pc * width + c as usize];
                    if cell.is_nan() {
                        *cell = edge_cost(
                            costs,
                            &tables,
                            &mut edges,
                            weights,
                            (p, pc),
                            (i, c as usize),
                            (bytes, epilogue),
                        );
                    }
                    cost += *cell;
                }
                let slot = &mut best_of[row + c as usize];
                // Strictly better only: the first state in order wins ties.
                if cost < slot.0 {
                    *slot = (cost, si as u32);
                }
            }
        }
        // Candidates as (cost, parent, projection, choice); frontiers are built only for
        // the states the beam keeps.
        let mut candidates: Vec<(f64, u32, u32, u16)> = Vec::new();
        for index in 0..projections.len() {
            for c in 0..width {
                let (cost, parent) = best_of[index * width + c];
                if cost.is_finite() {
                    candidates.push((cost, parent, index as u32, c as u16));
                }
            }
        }
        if candidates.is_empty() {
            return None;
        }
        if candidates.len() > beam {
            // The cheapest states, plus every uniform sample split (all frontier layers
            // on the same GPUs, samples split: the data-parallel-like plans) so the beam
            // never loses them. The cut is on (cost, position), a total order, so it is
            // deterministic.
            let uniform = |&(_, _, proj, c): &(f64, u32, u32, u16)| {
                let mine = me.splits[c as usize];
                mine.degree() == mine.sample
                    && frontiers.all_on(projections[proj as usize], me.ids[c as usize])
            };
            let mut order: Vec<(f64, usize)> = candidates
                .iter()
                .enumerate()
                .map(|(k, c)| (c.0, k))
                .collect();
            let by = |a: &(f64, usize), b: &(f64, usize)| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1));
            order.select_nth_unstable_by(beam - 1, by);
            let mut keep = vec![false; candidates.len()];
            for &(_, k) in &order[..beam] {
                keep[k] = true;
            }
            let mut k = 0;
            candidates.retain(|c| {
                k += 1;
                keep[k - 1] || uniform(c)
            });
        }
        let kept: Vec<State> = candidates
            .into_iter()
            .map(|(cost, parent, proj, c)| {
                let mut frontier = projections[proj as usize];
                if keeps_me {
                    frontier = frontiers.insert(frontier, i as u32, c, me.ids[c as usize]);
                }
                State {
                    frontier,
                    cost,
                    parent,
                    choice: c,
                }
            })
            .collect();
        history.push(kept.iter().map(|s| (s.parent, s.choice)).collect());
        states = kept;
        let mut roots: Vec<Id> = states.iter().map(|s| s.frontier).collect();
        frontiers.collect(&mut roots);
        for (state, root) in states.iter_mut().zip(roots) {
            state.frontier = root;
        }
    }
    let (mut at, _) = states
        .iter()
        .enumerate()
        .min_by(|a, b| a.1.cost.total_cmp(&b.1.cost))?;
    let mut out = vec![Split::NONE; n];
    for i in (0..n).rev() {
        let (parent, choice) = history[i][at];
        out[i] = tables[i].splits[choice as usize];
        at = parent as usize;
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::Cluster;
    use crate::layers::{Halo, Recurrence};
    use crate::plan::CostOptions;

    /// The weighted cost of one choice per layer, summed in the search's order.
    fn objective(
        costs: &Costs<'_>,
        (tables, edges): &mut (Vec<Table>, EdgeCache),
        weights: Weights,
        picked: &[usize],
    ) -> f64 {
        let mut total = 0.0;
        for (i, layer) in costs.graph.layers.iter().enumerate() {
            let c = picked[i];
            total += tables[i].own[c];
            if i == 0 || tables[i - 1].splits[picked[i - 1]] != tables[i].splits[c] {
                total += tables[i].latency[c];
            }
            for e in &layer.inputs {
                if let Producer::Layer(p) = e.from {
                    let p = p.0 as usize;
                    let edge = (e.bytes as f64, e.epilogue);
                    total += edge_cost(costs, tables, edges, weights, (p, picked[p]), (i, c), edge);
                }
            }
        }
        total
    }

    /// The cheapest objective over every choice of every layer that chooses (a following
    /// layer takes its producer's), or `None` when there are too many to try.
    fn cheapest(costs: &Costs<'_>, choices: &Choices, weights: Weights) -> Option<f64> {
        let mut prepared = tables(costs, choices, weights)?;
        let n = costs.graph.layers.len();
        let free: Vec<usize> = (0..n)
            .filter(|&l| choices[l].is_some() || costs.first_producer[l].is_none())
            .collect();
        let count: usize = free.iter().map(|&l| prepared.0[l].splits.len()).product();
        if count > 20_000 {
            return None;
        }
        let mut picked = vec![0usize; n];
        let mut best = f64::INFINITY;
        for mut code in 0..count {
            for &l in &free {
                let width = prepared.0[l].splits.len();
                picked[l] = code % width;
                code /= width;
            }
            for l in 0..n {
                if let (None, Some(p)) = (&choices[l], costs.first_producer[l]) {
                    picked[l] = prepared.0[l].from_producer[picked[p]] as usize;
                }
            }
            best = best.min(objective(costs, &mut prepared, weights, &picked));
        }
        Some(best)
    }

    #[test]
    fn without_a_beam_the_search_finds_the_cheapest_plan_of_branchy_graphs() {
        let cluster = Cluster::preset("dgx-a100x2").unwrap();
        let mut compared = 0;
        for seed in 0..40u64 {
            let graph = crate::synthetic::graph(3 + seed as usize % 5, 64, true, seed);
            for gpus in [2, 4] {
                let costs = Costs::new(&graph, &cluster, gpus, CostOptions::default());
                for soap in [false, true] {
                    let choices = choices(&costs, gpus, soap);
                    for (lambda, mu) in [(0.0, 0.0), (1e-2, 0.0), (0.0, 1e-6)] {
                        let weights = Weights { lambda, mu };
                        let Some(cheapest) = cheapest(&costs, &choices, weights) else {
                            continue;
                        };
                        let splits = search(&costs, &choices, weights, usize::MAX).unwrap();
                        let mut prepared = tables(&costs, &choices, weights).unwrap();
                        let picked: Vec<usize> = splits
                            .iter()
                            .zip(&prepared.0)
                            .map(|(s, t)| t.splits.iter().position(|x| x == s).unwrap())
                            .collect();
                        let found = objective(&costs, &mut prepared, weights, &picked);
                        assert!(
                            (found - cheapest).abs() <= 1e-9 * cheapest.abs(),
                            "seed {seed}, {gpus} GPUs, soap {soap}, {weights:?}: \
                             {found} found, {cheapest} cheapest"
                        );
                        compared += 1;
                    }
                }
            }
        }
        assert!(compared > 200, "{compared} searches compared");
    }

    #[test]
    fn counts_cover_small_clusters_and_thin_out_beyond() {
        assert_eq!(gpu_counts(8), (1..=8).collect::<Vec<_>>());
        let big = gpu_counts(1024);
        assert!(big.len() < 30, "{big:?}");
        assert_eq!(big.last(), Some(&1024));
        assert!(big.windows(2).all(|w| w[0] < w[1]));
    }

    fn layer(kind: LayerKind, recurrence: Option<Recurrence>) -> Layer {
        Layer {
            // A convolution's or pooling's 3×3 window over 16 rows, as most have.
            halo: matches!(kind, LayerKind::Conv | LayerKind::Pool).then(|| Halo {
                window: super::super::halo::Window {
                    input: 16,
                    output: 16,
                    extent: 3,
                    stride: 1,
                    pad_before: 1,
                },
                node: ralpc_ir::NodeId::from_index(0),
                inputs: Vec::new(),
            }),
            recurrence,
            ..Layer::bare(kind)
        }
    }

    /// A transposed convolution (or a global pool) of a model has no window whose halo
    /// row pieces could exchange: it splits samples and output channels, never rows, and a
    /// global pool after a row-split convolution gathers its samples instead. An imported
    /// layer (no ops) says nothing of its window: its rows split.
    #[test]
    fn a_layer_without_a_window_is_never_split_by_rows() {
        let windowless = |kind| Layer {
            halo: None,
            parts: vec![crate::layers::Part {
                node: ralpc_ir::NodeId::from_index(0),
                op: "ConvTranspose",
                signature: None,
                fwd_flops: 0,
                bytes: 0,
                launches: true,
                weight_product: true,
                steps: 1,
            }],
            ..layer(kind, None)
        };
        let imported = Layer {
            halo: None,
            ..layer(LayerKind::Conv, None)
        };
        assert!(splits_of(&imported, 4, true, 8, 64)
            .iter()
            .any(|s| s.attribute == 4));
        let transposed = windowless(LayerKind::Conv);
        let s = splits_of(&transposed, 4, true, 8, 64);
        assert!(s.iter().all(|s| s.attribute == 1), "{s:?}");
        assert!(s.iter().any(|s| s.parameter == 4), "{s:?}");
        let rows = Split {
            sample: 1,
            context: 1,
            attribute: 4,
            parameter: 1,
        };
        assert_eq!(
            follow(&windowless(LayerKind::Pool), rows, 64),
            Split::samples(4)
        );
        assert_eq!(follow(&layer(LayerKind::Pool, None), rows, 64), rows);
        // A window over one row (a 1×1 convolution after a global pool): no row pieces.
        let mut one_row = layer(LayerKind::Conv, None);
        if let Some(h) = one_row.halo.as_mut() {
            h.window.input = 1;
            h.window.output = 1;
        }
        let s = splits_of(&one_row, 4, true, 8, 64);
        assert!(s.iter().all(|s| s.attribute == 1), "{s:?}");
        assert_eq!(follow(&one_row, rows, 64), Split::samples(4));
        assert_eq!(follow(&layer(LayerKind::Elementwise, None), rows, 64), rows);
    }

    #[test]
    fn soap_splits_multiply_to_the_count() {
        let s = splits_of(&layer(LayerKind::Dense, None), 8, true, 8, 64);
        assert!(s.iter().all(|s| s.degree() == 8));
        assert!(s.contains(&Split {
            sample: 1,
            context: 1,
            attribute: 8,
            parameter: 1
        }));
        assert_eq!(
            splits_of(&layer(LayerKind::Pool, None), 8, true, 8, 64),
            vec![Split::samples(8)]
        );
        // A batch of 2 cannot be split 4 ways by samples.
        assert!(splits_of(&layer(LayerKind::Conv, None), 4, false, 8, 2).is_empty());
    }

    #[test]
    fn a_recurrent_layer_splits_by_samples_and_gates_never_by_attributes() {
        let lstm = layer(
            LayerKind::Recurrent,
            Some(Recurrence {
                steps: 16,
                hidden: 64,
                state_bytes: 4096,
                exchanges: 1,
            }),
        );
        let s = splits_of(&lstm, 4, true, 8, 64);
        assert_eq!(
            s,
            [(4, 1), (2, 2), (1, 4)]
                .map(|(sample, parameter)| Split {
                    sample,
                    context: 1,
                    attribute: 1,
                    parameter
                })
                .to_vec()
        );
        assert_eq!(splits_of(&lstm, 4, false, 8, 64), vec![Split::samples(4)]);
    }

    /// AlexNet's two-group convolutions were split by output channels, which no rank can
    /// run without cutting its input channels too: samples and rows only.
    #[test]
    fn a_grouped_convolution_is_not_split_by_channels() {
        let grouped = Layer {
            grouped: true,
            ..layer(LayerKind::Conv, None)
        };
        let s = splits_of(&grouped, 4, true, 8, 64);
        assert!(s.iter().all(|s| s.parameter == 1), "{s:?}");
        assert!(s.iter().any(|s| s.attribute == 4), "{s:?}");
        let dense = splits_of(&layer(LayerKind::Conv, None), 4, true, 8, 64);
        assert!(dense.iter().any(|s| s.parameter == 4), "{dense:?}");
    }
}
