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

use std::collections::{BTreeMap, HashMap};

use super::costs::Costs;
use super::evaluate::bucket_sync;
use super::layout::splits_freely;
use crate::layers::{LayerKind, Producer, Split};

/// States kept per layer on branchy graphs.
pub(crate) const BEAM: usize = 256;

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

/// GPU counts worth trying on `n` GPUs: every count up to 16, then multiples of 8 spaced
/// about 1.25× apart, and `n`. Any count may be best (DeepPool's VGG puts some layers on
/// 3 or 5 GPUs); beyond 16 the spacing keeps the choice count logarithmic.
pub(crate) fn gpu_counts(n: u32) -> Vec<u32> {
    let mut counts: Vec<u32> = (1..=n.min(16)).collect();
    let mut c = 16u32;
    while c < n {
        c = ((c as f64 * 1.25).ceil() as u32).div_ceil(8) * 8;
        counts.push(c.min(n));
    }
    counts.dedup();
    counts
}

/// The splits a layer of `kind` may take on `g` GPUs: samples only, or (with `soap`) any
/// attribute × parameter degree up to `within` (one node: tensor parallelism stays on the
/// fast links) times a sample degree.
fn splits_of(kind: LayerKind, g: u32, soap: bool, within: u32, batch: u64) -> Vec<Split> {
    let mut out = Vec::new();
    let free = soap && matches!(kind, LayerKind::Conv | LayerKind::Dense);
    for a in 1..=if free { within } else { 1 } {
        for p in 1..=if free { within } else { 1 } {
            if a * p > within || g % (a * p) != 0 || !(a.is_power_of_two() && p.is_power_of_two()) {
                continue;
            }
            let s = g / (a * p);
            if u64::from(s) <= batch {
                out.push(Split {
                    sample: s,
                    attribute: a,
                    parameter: p,
                });
            }
        }
    }
    out
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
                || costs.first_producer[l].is_none();
            chooses.then(|| {
                counts
                    .iter()
                    .flat_map(|&g| splits_of(layer.kind, g, soap, within, costs.graph.batch))
                    .collect()
            })
        })
        .collect()
}

/// The split a following layer takes after its producer's.
pub(crate) fn follow(kind: LayerKind, producer: Split) -> Split {
    if splits_freely(kind) {
        producer
    } else {
        Split::samples(producer.degree())
    }
}

/// Interned splits: states hold small ids.
#[derive(Default)]
struct Splits {
    all: Vec<Split>,
    ids: HashMap<Split, u16>,
}

impl Splits {
    fn id(&mut self, s: Split) -> u16 {
        *self.ids.entry(s).or_insert_with(|| {
            self.all.push(s);
            (self.all.len() - 1) as u16
        })
    }
}

struct State {
    /// Splits of the frontier layers, then the last layer's split.
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
    let mut splits = Splits::default();
    let mut layer_costs: HashMap<(usize, u16), f64> = HashMap::new();
    let mut frontier: Vec<usize> = Vec::new();
    let mut states = vec![State {
        key: Vec::new(),
        cost: 0.0,
        parent: 0,
        choice: 0,
    }];
    let mut history: Vec<Vec<(u32, u16)>> = Vec::with_capacity(n);
    for (i, layer) in graph.layers.iter().enumerate() {
        let next_frontier: Vec<usize> = frontier
            .iter()
            .copied()
            .chain(std::iter::once(i))
            .filter(|&j| last_use[j] > i)
            .collect();
        let position = |j: usize| frontier.iter().position(|&f| f == j);
        let options: Vec<u16> = choices[i]
            .as_ref()
            .map(|c| c.iter().map(|&s| splits.id(s)).collect())
            .unwrap_or_default();
        let mut next: BTreeMap<Vec<u16>, (f64, u32, u16)> = BTreeMap::new();
        for (si, state) in states.iter().enumerate() {
            let prev = state.key.last().copied();
            let followed = match (&choices[i], costs.first_producer[i]) {
                (None, Some(p)) => {
                    let Some(at) = position(p) else { continue };
                    vec![splits.id(follow(layer.kind, splits.all[state.key[at] as usize]))]
                }
                _ => options.clone(),
            };
            for c in followed {
                let split = splits.all[c as usize];
                let own = *layer_costs.entry((i, c)).or_insert_with(|| {
                    let w = costs.work(i, split, 0, 1);
                    let g = f64::from(split.degree());
                    let t = w.fwd_us + w.bwd_us;
                    let bandwidth = costs.sync(i, split, 0).bandwidth_us;
                    (t + bandwidth) * (1.0 + weights.lambda * g)
                        + weights.mu * costs.memory(i, split, 1, 1, 0)
                });
                let mut cost = state.cost + own;
                let sync = costs.sync(i, split, 0);
                let bucket = bucket_sync(sync, prev == Some(c)) - sync.bandwidth_us.max(0.0);
                cost += bucket * (1.0 + weights.lambda * f64::from(split.degree()));
                for e in &layer.inputs {
                    let Producer::Layer(p) = e.from else { continue };
                    let p = p.0 as usize;
                    let Some(at) = position(p) else { continue };
                    let from = splits.all[state.key[at] as usize];
                    let (f, b) = costs.edge(p, (from, 0), i, (split, 0), e.bytes as f64);
                    let g = f64::from(split.degree().max(from.degree()));
                    cost += (f + b) * (1.0 + weights.lambda * g);
                }
                let mut key: Vec<u16> = next_frontier
                    .iter()
                    .map(|&j| {
                        if j == i {
                            c
                        } else {
                            state.key[position(j).unwrap_or(0)]
                        }
                    })
                    .collect();
                key.push(c);
                match next.get(&key) {
                    Some(&(old, _, _)) if old <= cost => {}
                    _ => {
                        next.insert(key, (cost, si as u32, c));
                    }
                }
            }
        }
        if next.is_empty() {
            return None;
        }
        let mut kept: Vec<State> = next
            .into_iter()
            .map(|(key, (cost, parent, choice))| State {
                key,
                cost,
                parent,
                choice,
            })
            .collect();
        if kept.len() > BEAM {
            // Stable: equal costs keep key order.
            kept.sort_by(|a, b| a.cost.total_cmp(&b.cost));
            kept.truncate(BEAM);
        }
        history.push(kept.iter().map(|s| (s.parent, s.choice)).collect());
        states = kept;
        frontier = next_frontier;
    }
    let (mut at, _) = states
        .iter()
        .enumerate()
        .min_by(|a, b| a.1.cost.total_cmp(&b.1.cost))?;
    let mut out = vec![Split::NONE; n];
    for i in (0..n).rev() {
        let (parent, choice) = history[i][at];
        out[i] = splits.all[choice as usize];
        at = parent as usize;
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_cover_small_clusters_and_thin_out_beyond() {
        assert_eq!(gpu_counts(8), (1..=8).collect::<Vec<_>>());
        let big = gpu_counts(1024);
        assert!(big.len() < 40, "{big:?}");
        assert_eq!(big.last(), Some(&1024));
        assert!(big.windows(2).all(|w| w[0] < w[1]));
    }

    #[test]
    fn soap_splits_multiply_to_the_count() {
        let s = splits_of(LayerKind::Dense, 8, true, 8, 64);
        assert!(s.iter().all(|s| s.degree() == 8));
        assert!(s.contains(&Split {
            sample: 1,
            attribute: 8,
            parameter: 1
        }));
        assert_eq!(
            splits_of(LayerKind::Pool, 8, true, 8, 64),
            vec![Split::samples(8)]
        );
        // A batch of 2 cannot be split 4 ways by samples.
        assert!(splits_of(LayerKind::Conv, 4, false, 8, 2).is_empty());
    }
}
