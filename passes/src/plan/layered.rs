//! The single-stage search: every layer picks its own GPU count and split (burst
//! parallelism, SOAP), all layers on ranks `0..g` of one group.
//!
//! A dynamic program over the layers in topological order. Its state after layer `i` is the
//! split of every layer whose output is still read later (the *frontier*: the cut tensors)
//! plus layer `i`'s own split (it decides whether the next layer's gradients join the same
//! all-reduce bucket). On a chain the frontier is one layer and the program is exact
//! (Viterbi over `C` choices: O(L·C²)). Branches (ResNet shortcuts, Inception modules,
//! DenseNet concatenations) widen the frontier; the state count is bounded by a beam of the
//! [`BEAM`] cheapest states (ties broken by the state's splits), so a branchy graph costs
//! O(L · BEAM · C · inputs) instead of growing exponentially with the frontier.
//!
//! Constraints enter through Lagrange multipliers (the caller searches them): the
//! objective is `time + λ·GPU-time + μ·memory of rank 0` (rank 0 holds a share of every
//! layer, the most of any rank).

use rustc_hash::FxHashMap as HashMap;

use super::costs::Costs;
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
            if !layer.grouped {
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
    /// Choice indices of the frontier layers, then the last layer's choice index.
    key: Vec<u16>,
    cost: f64,
    parent: u32,
    choice: u16,
}

/// The cheapest split of every layer under `weights`, or `None` when some layer has no
/// choice at all (a batch too small for any split).
pub(crate) fn best(costs: &Costs<'_>, choices: &Choices, weights: Weights) -> Option<Vec<Split>> {
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
    // Every layer's choice table; a following layer's choices are its producer's, mapped.
    let mut tables: Vec<Table> = Vec::with_capacity(n);
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
    let mut frontier: Vec<usize> = Vec::new();
    let mut states = vec![State {
        key: Vec::new(),
        cost: 0.0,
        parent: 0,
        choice: 0,
    }];
    let mut history: Vec<Vec<(u32, u16)>> = Vec::with_capacity(n);
    let mut matrices: Vec<Vec<f64>> = Vec::new();
    // Each frontier layer's slot in the states' keys (`usize::MAX`: not on the frontier),
    // so that a wide frontier (a thousand parallel branches) costs a lookup per slot, not
    // a search.
    let mut slot_of = vec![usize::MAX; n];
    for (i, layer) in graph.layers.iter().enumerate() {
        for (k, &j) in frontier.iter().enumerate() {
            slot_of[j] = k;
        }
        let next_frontier: Vec<usize> = frontier
            .iter()
            .copied()
            .chain(std::iter::once(i))
            .filter(|&j| last_use[j] > i)
            .collect();
        let position = |j: usize| Some(slot_of[j]).filter(|&k| k != usize::MAX);
        let me = &tables[i];
        let width = me.splits.len();
        // This layer's input edges: (producer, its frontier slot, bytes, read by the
        // epilogue alone), with a lazily filled matrix of transfer costs per (producer
        // choice, own choice).
        let inputs: Vec<(usize, usize, f64, bool)> = layer
            .inputs
            .iter()
            .filter_map(|e| match e.from {
                Producer::Layer(p) => {
                    let p = p.0 as usize;
                    Some((p, position(p)?, e.bytes as f64, e.epilogue))
                }
                Producer::Input(_) => None,
            })
            .collect();
        matrices.clear();
        for &(p, _, _, _) in &inputs {
            matrices.push(vec![f64::NAN; tables[p].splits.len() * width]);
        }
        let prev_split = |key: &[u16]| key.last().map(|&c| tables[i - 1].splits[c as usize]);
        let follows = choices[i].is_none() && costs.first_producer[i].is_some();
        let keeps_me = next_frontier.last() == Some(&i);
        // States that agree on the frontier layers that stay share a projection; the best
        // cost per (projection, choice) is kept in a dense table.
        // Numbered in the order states first reach them (a hash map finds them: a
        // wide frontier makes keys long, and an ordered map compares them a log factor
        // more often).
        let mut numbers: HashMap<Vec<u16>, usize> =
            HashMap::with_capacity_and_hasher(states.len(), Default::default());
        let mut projections: Vec<Vec<u16>> = Vec::new();
        let mut projection_of = Vec::with_capacity(states.len());
        let staying: Vec<usize> = next_frontier
            .iter()
            .filter(|&&j| j != i)
            .map(|&j| position(j).unwrap_or(0))
            .collect();
        for state in &states {
            let proj: Vec<u16> = staying.iter().map(|&k| state.key[k]).collect();
            let number = *numbers.entry(proj).or_insert_with_key(|proj| {
                projections.push(proj.clone());
                projections.len() - 1
            });
            projection_of.push(number);
        }
        let mut best_of = vec![(f64::INFINITY, 0u32); projections.len() * width];
        for (si, state) in states.iter().enumerate() {
            let prev = if i > 0 { prev_split(&state.key) } else { None };
            let (lo, hi) = if follows {
                let p = costs.first_producer[i].unwrap_or(0);
                let Some(at) = position(p) else { continue };
                let c = me.from_producer[state.key[at] as usize];
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
                for (k, &(p, slot, bytes, epilogue)) in inputs.iter().enumerate() {
                    let pc = state.key[slot] as usize;
                    let cell = &mut matrices[k][pc * width + c as usize];
                    if cell.is_nan() {
                        let from = tables[p].splits[pc];
                        let t = edges.cost(
                            costs,
                            (p, tables[p].ids[pc]),
                            (i, me.ids[c as usize]),
                            epilogue,
                            bytes,
                        );
                        let g = f64::from(split.degree().max(from.degree()));
                        *cell = t * (1.0 + weights.lambda * g);
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
        // Candidates as (cost, parent, projection, choice); keys are built only for the
        // states the beam keeps.
        let mut candidates: Vec<(f64, u32, u32, u16)> = Vec::new();
        for (index, _) in projections.iter().enumerate() {
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
        if candidates.len() > BEAM {
            // The cheapest states, plus every uniform sample split (all frontier layers
            // on the same GPUs, samples split: the data-parallel-like plans) so the beam
            // never loses them. The cut is on (cost, position), a total order, so it is
            // deterministic.
            let others: Vec<usize> = next_frontier.iter().copied().filter(|&j| j != i).collect();
            let uniform = |&(_, _, proj, c): &(f64, u32, u32, u16)| {
                let mine = me.splits[c as usize];
                mine.degree() == mine.sample
                    && others
                        .iter()
                        .zip(&projections[proj as usize])
                        .all(|(&j, &pc)| tables[j].splits[pc as usize] == mine)
            };
            let mut order: Vec<(f64, usize)> = candidates
                .iter()
                .enumerate()
                .map(|(k, c)| (c.0, k))
                .collect();
            let by = |a: &(f64, usize), b: &(f64, usize)| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1));
            order.select_nth_unstable_by(BEAM - 1, by);
            let mut keep = vec![false; candidates.len()];
            for &(_, k) in &order[..BEAM] {
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
                let mut key = projections[proj as usize].clone();
                if keeps_me {
                    key.push(c);
                }
                key.push(c);
                State {
                    key,
                    cost,
                    parent,
                    choice: c,
                }
            })
            .collect();
        history.push(kept.iter().map(|s| (s.parent, s.choice)).collect());
        states = kept;
        for &j in &frontier {
            slot_of[j] = usize::MAX;
        }
        frontier = next_frontier;
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
    use crate::layers::{Halo, Recurrence};

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
