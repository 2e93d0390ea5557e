//! The pipeline search: consecutive stages of whole segments on disjoint groups of
//! consecutive ranks, every layer of a stage replicated over the stage's GPUs (PipeDream's
//! space, with any stage width, microbatches and a schedule).
//!
//! Stages are cut only where one tensor crosses (a single-tensor cut: between ResNet blocks,
//! after an Inception module); the layers between two cuts form a segment. Graphs with more
//! than [`MAX_SEGMENTS`] segments are coarsened to that many by merging neighbours of
//! similar compute.
//!
//! A dynamic program from the last segment backwards over (first segment `i`, GPUs of the
//! suffix `m`, stages after this one `d`): O(K² · W · G · D) for K segments, W stage widths,
//! G GPU totals and D depths. A stage's memory depends on `d` (in-flight microbatches), so
//! infeasible stages are pruned where they are built. Each suffix keeps the stages leading
//! to the fastest iteration in closed form — the sum of its stages and cuts (one
//! microbatch through them), `M − 1` times its bottleneck (the largest per-microbatch
//! stage time, with its gradient synchronization under the asynchronous schedule, or cut
//! transfer), and its slowest synchronization — a heuristic, since bottlenecks compose by
//! `max`. The evaluator then prices the winner exactly, and [`refine_cuts`] moves its cuts
//! (anywhere, not only at single-tensor cuts) while that exact price falls.

use super::costs::Costs;
use super::layered::gpu_counts;
use super::{Schedule, Stage, Strategy};
use crate::cluster::Link;
use crate::layers::{Producer, Split};

/// Segments the program works with at most (fewer on more than 64 GPUs, where the GPU
/// totals multiply the work).
pub(crate) const MAX_SEGMENTS: usize = 64;
const MAX_SEGMENTS_LARGE: usize = 32;

/// Deepest pipeline considered.
const MAX_STAGES: usize = 16;

/// Layer ranges `[start, end]` between single-tensor cuts, coarsened to at most
/// `MAX_SEGMENTS`.
pub(crate) fn segments(costs: &Costs<'_>) -> Vec<(usize, usize)> {
    let layers = &costs.graph.layers;
    let n = layers.len();
    // An edge p → q forbids every cut strictly between p and q.
    let mut blocked = vec![0i64; n + 1];
    for (q, layer) in layers.iter().enumerate() {
        for e in &layer.inputs {
            if let Producer::Layer(p) = e.from {
                let p = p.0 as usize;
                if p + 1 < q {
                    blocked[p + 1] += 1;
                    blocked[q] -= 1;
                }
            }
        }
    }
    let mut cuts = Vec::new();
    let mut open = 0;
    for (c, delta) in blocked.iter().enumerate().take(n.saturating_sub(1)) {
        open += delta;
        if open == 0 {
            cuts.push(c);
        }
    }
    let most = if costs.gpus > 64 {
        MAX_SEGMENTS_LARGE
    } else {
        MAX_SEGMENTS
    };
    if cuts.len() + 1 > most {
        cuts = coarsen(costs, &cuts, most);
    }
    let mut out = Vec::with_capacity(cuts.len() + 1);
    let mut start = 0;
    for c in cuts {
        out.push((start, c));
        start = c + 1;
    }
    out.push((start, n - 1));
    out
}

/// Keeps the cut nearest each of `most − 1` evenly spaced points of cumulative
/// single-GPU compute.
fn coarsen(costs: &Costs<'_>, cuts: &[usize], most: usize) -> Vec<usize> {
    let mut prefix = vec![0.0];
    for l in 0..costs.graph.layers.len() {
        let w = costs.work(l, Split::NONE, 0, 1);
        prefix.push(prefix[prefix.len() - 1] + w.fwd_us + w.bwd_us + 1e-9);
    }
    let total = prefix[prefix.len() - 1];
    let mut kept: Vec<usize> = Vec::new();
    for k in 1..most {
        let target = total * k as f64 / most as f64;
        let nearest = cuts
            .iter()
            .copied()
            .min_by(|&a, &b| {
                (prefix[a + 1] - target)
                    .abs()
                    .total_cmp(&(prefix[b + 1] - target).abs())
                    .then(a.cmp(&b))
            })
            .unwrap_or(0);
        if kept.last() != Some(&nearest) && kept.last().is_none_or(|&l| l < nearest) {
            kept.push(nearest);
        }
    }
    kept
}

/// Per-stage terms, from prefix sums over layers.
struct Tables {
    /// Per width index: prefix sums of per-microbatch compute.
    compute: Vec<Vec<f64>>,
    /// Per width index: prefix sums of per-microbatch backward compute.
    backward: Vec<Vec<f64>>,
    params: Vec<f64>,
    stash: Vec<f64>,
    /// Bytes entering each layer from earlier layers (for a cut before it).
    cut_bytes: Vec<f64>,
}

#[derive(Clone, Copy)]
struct Best {
    bottleneck: f64,
    sum: f64,
    sync: f64,
    stage_end: usize,
    width: u32,
}

/// The best pipeline for `schedule` and `microbatches` on up to `costs.gpus` GPUs, or
/// `None` when nothing fits.
pub(crate) fn best(costs: &Costs<'_>, schedule: Schedule, microbatches: u32) -> Option<Strategy> {
    let graph = costs.graph;
    let n_layers = graph.layers.len();
    let n = costs.gpus;
    let m_mb = microbatches.max(1);
    let segs = segments(costs);
    let k = segs.len();
    let widths: Vec<u32> = gpu_counts(n)
        .into_iter()
        .filter(|&w| u64::from(w) * u64::from(m_mb) <= graph.sample_pieces())
        .collect();
    if widths.is_empty() {
        return None;
    }
    let totals: Vec<u32> = if n <= 64 {
        (1..=n).collect()
    } else {
        gpu_counts(n)
    };
    let mut index_of_total = vec![None; n as usize + 1];
    for (i, &m) in totals.iter().enumerate() {
        index_of_total[m as usize] = Some(i);
    }
    let total_index = |m: u32| index_of_total[m as usize];
    let tables = tables(costs, &widths, m_mb);
    let opt = &costs.options;
    let state_factor = 2.0 + opt.optimizer.state_factor();
    let depth_max = k.min(MAX_STAGES).min(n as usize);
    let capacity = costs.min_capacity();
    // best[(i, mi, d)] in one flat table.
    let cell = |i: usize, mi: usize, d: usize| (i * totals.len() + mi) * depth_max + d;
    let mut table: Vec<Option<Best>> = vec![None; (k + 1) * totals.len() * depth_max];
    // Each suffix keeps its best by the iteration it leads to (a first microbatch through
    // every stage, the rest a bottleneck apart, the slowest sync): with one microbatch the
    // sum of the stages, with many their bottleneck.
    let microbatches = f64::from(m_mb);
    let objective = |b: &Best| {
        (
            b.sum + (microbatches - 1.0) * b.bottleneck + b.sync,
            b.bottleneck,
        )
    };
    for i in (0..k).rev() {
        let start = segs[i].0;
        for (mi, &m) in totals.iter().enumerate() {
            // The suffix sits on ranks n−m..n.
            let first = n - m;
            for d in 0..depth_max {
                let in_flight = schedule.in_flight(m_mb, d + 1, 0);
                let versions = if schedule == Schedule::Async {
                    in_flight - 1
                } else {
                    0
                };
                let mut chosen: Option<Best> = None;
                for (wi, &w) in widths.iter().enumerate() {
                    if w > m {
                        continue;
                    }
                    let (latency, per_byte) = costs.replicas_sync(first, w);
                    // The links into this stage (from the rank before) and out of it.
                    let link_in = costs.cluster.link(first.saturating_sub(1), first + w - 1);
                    let link_out = costs.cluster.link(first + w - 1, (first + w).min(n - 1));
                    // A cut's tensor each way between stages of `w` and `other` GPUs: the
                    // narrower side's GPUs carry all of it.
                    let hop = |link: Link, bytes: f64, other: u32| {
                        2.0 * link.transfer_us(bytes / f64::from(w.min(other)) / f64::from(m_mb))
                    };
                    // (The stage before is not placed yet: its send prices the cut whole.)
                    let receive = if i > 0 {
                        hop(link_in, tables.cut_bytes[start], w)
                    } else {
                        0.0
                    };
                    let compute = &tables.compute[wi];
                    let backward = &tables.backward[wi];
                    // Segment-sized gradient buckets launched during the last backward:
                    // the all-reduces outlast it by max over q of (all-reduce time of
                    // segments i..=q − backward of segments i..q) (see `evaluate`).
                    let (mut all_reduced, mut backward_before, mut overlapped) =
                        (0.0, 0.0, f64::NEG_INFINITY);
                    for j in i..k {
                        let end = segs[j].1;
                        let seg_params = tables.params[end + 1] - tables.params[segs[j].0];
                        if w > 1 && seg_params > 0.0 {
                            all_reduced += latency + per_byte * seg_params;
                        }
                        overlapped = f64::max(overlapped, all_reduced - backward_before);
                        backward_before += backward[end + 1] - backward[segs[j].0];
                        let last = j + 1 == k;
                        if last != (d == 0) || (last && w != m) {
                            continue;
                        }
                        let rest = if last {
                            None
                        } else {
                            let Some(ri) = total_index(m - w) else {
                                continue;
                            };
                            let Some(r) = table[cell(j + 1, ri, d - 1)] else {
                                continue;
                            };
                            Some(r)
                        };
                        let params = tables.params[end + 1] - tables.params[start];
                        let stash =
                            (tables.stash[end + 1] - tables.stash[start]) / f64::from(w * m_mb);
                        let memory = params * (state_factor + f64::from(versions))
                            + stash * f64::from(in_flight)
                            + costs.workspace();
                        if memory > capacity {
                            continue;
                        }
                        let t = compute[end + 1] - compute[start];
                        let one_bucket = if w > 1 && params > 0.0 {
                            latency + per_byte * params
                        } else {
                            0.0
                        };
                        let sync =
                            one_bucket.min(overlapped.max(0.0)) + costs.step_us(params, first);
                        let send = match rest {
                            Some(r) => hop(link_out, tables.cut_bytes[end + 1], r.width),
                            None => 0.0,
                        };
                        let own = if schedule == Schedule::Async {
                            t + sync
                        } else {
                            t
                        };
                        let mut candidate = Best {
                            bottleneck: own.max(receive).max(send),
                            sum: t + send,
                            sync,
                            stage_end: j,
                            width: w,
                        };
                        if let Some(r) = rest {
                            candidate.bottleneck = candidate.bottleneck.max(r.bottleneck);
                            candidate.sum += r.sum;
                            candidate.sync = candidate.sync.max(r.sync);
                        }
                        let better = chosen.is_none_or(|c| {
                            let (a, b) = (objective(&candidate), objective(&c));
                            a.0 < b.0 || (a.0 == b.0 && a.1 < b.1)
                        });
                        if better {
                            chosen = Some(candidate);
                        }
                    }
                }
                table[cell(i, mi, d)] = chosen;
            }
        }
    }
    // The best over GPU totals and depths by the schedules' iteration: the first
    // microbatch through every stage, the rest one bottleneck apart, then the last sync
    // (under the asynchronous schedule every microbatch's own, already in its stage's
    // time: its executable plan fills and drains the pipeline every iteration as the
    // synchronous ones do).
    let m = f64::from(m_mb);
    let score = |b: &Best| b.sum + (m - 1.0) * b.bottleneck + b.sync;
    let mut top: Option<(f64, usize, usize)> = None;
    for mi in 0..totals.len() {
        for d in 0..depth_max {
            if let Some(b) = &table[cell(0, mi, d)] {
                let s = score(b);
                if top.is_none_or(|(t, _, _)| s < t) {
                    top = Some((s, mi, d));
                }
            }
        }
    }
    let (_, mut mi, mut d) = top?;
    let used = totals[mi];
    let mut stages = Vec::new();
    let mut i = 0;
    let mut rank = 0;
    while i < k {
        let b = table[cell(i, mi, d)]?;
        stages.push(Stage {
            first_layer: segs[i].0,
            last_layer: segs[b.stage_end].1,
            first_rank: rank,
            gpus: b.width,
        });
        rank += b.width;
        i = b.stage_end + 1;
        if i < k {
            mi = total_index(totals[mi] - b.width)?;
            d -= 1;
        }
    }
    debug_assert_eq!(rank, used);
    let mut layers = vec![Split::NONE; n_layers];
    for s in &stages {
        for slot in layers.iter_mut().take(s.last_layer + 1).skip(s.first_layer) {
            *slot = Split::samples(s.gpus);
        }
    }
    Some(Strategy {
        schedule,
        microbatches: m_mb,
        stages,
        layers,
        zero: 0,
        shard_groups: 1,
        recompute: Vec::new(),
    })
}

fn tables(costs: &Costs<'_>, widths: &[u32], microbatches: u32) -> Tables {
    let layers = &costs.graph.layers;
    let n = layers.len();
    let prefix = |f: &dyn Fn(usize) -> f64| {
        let mut p = Vec::with_capacity(n + 1);
        p.push(0.0);
        for l in 0..n {
            p.push(p[l] + f(l));
        }
        p
    };
    let compute = widths
        .iter()
        .map(|&w| {
            prefix(&|l| {
                let work = costs.work(l, Split::samples(w), 0, microbatches);
                work.fwd_us + work.bwd_us
            })
        })
        .collect();
    let backward = widths
        .iter()
        .map(|&w| prefix(&|l| costs.work(l, Split::samples(w), 0, microbatches).bwd_us))
        .collect();
    Tables {
        compute,
        backward,
        params: prefix(&|l| layers[l].param_bytes as f64),
        stash: prefix(&|l| (layers[l].stash_bytes + layers[l].kept_output_bytes) as f64),
        cut_bytes: crossing_bytes(costs),
    }
}

/// For each position q, the bytes of edges from layers before q into layers at or after q.
fn crossing_bytes(costs: &Costs<'_>) -> Vec<f64> {
    let n = costs.graph.layers.len();
    let mut delta = vec![0.0; n + 1];
    for (q, layer) in costs.graph.layers.iter().enumerate() {
        for e in &layer.inputs {
            if let Producer::Layer(p) = e.from {
                let p = p.0 as usize;
                // Crosses the cuts before p+1, …, q.
                delta[p + 1] += e.bytes as f64;
                delta[q + 1] -= e.bytes as f64;
            }
        }
    }
    let mut out = vec![0.0; n + 1];
    let mut run = 0.0;
    for q in 0..=n {
        run += delta[q];
        out[q] = run;
    }
    out
}

/// `strategy`'s cuts moved by up to [`CUT_REACH`] layers, each move kept while the exact
/// price (`price`: the evaluator) falls and the plan fits, within [`CUT_TRIALS`] prices:
/// the dynamic program above prices stages by a closed form that composes bottlenecks
/// approximately, so a nearby cut can be faster. Stage widths stay; a layer changing stage
/// takes the split of the stage it joins.
pub fn refine_cuts<E>(
    strategy: Strategy,
    mut price: impl FnMut(&Strategy) -> Option<(f64, E)>,
) -> Option<(Strategy, E)> {
    let (mut best_us, mut best_eval) = price(&strategy)?;
    let mut best = strategy;
    let mut trials = 0;
    loop {
        let mut improved = false;
        for k in 0..best.stages.len().saturating_sub(1) {
            for shift in (-CUT_REACH..=CUT_REACH).filter(|&d| d != 0) {
                if trials >= CUT_TRIALS {
                    return Some((best, best_eval));
                }
                let (a, b) = (best.stages[k], best.stages[k + 1]);
                // The new last layer of stage k; both stages keep at least one layer.
                let Some(cut) = a.last_layer.checked_add_signed(shift) else {
                    continue;
                };
                if cut < a.first_layer || cut >= b.last_layer {
                    continue;
                }
                let mut next = best.clone();
                next.stages[k].last_layer = cut;
                next.stages[k + 1].first_layer = cut + 1;
                // Layers changing stage take a layer's split of the stage they join.
                for l in (a.last_layer + 1)..=cut {
                    next.layers[l] = best.layers[a.last_layer];
                }
                for l in (cut + 1)..=a.last_layer {
                    next.layers[l] = best.layers[b.first_layer];
                }
                trials += 1;
                if let Some((us, eval)) = price(&next) {
                    if us < best_us * (1.0 - 1e-9) {
                        (best, best_us, best_eval) = (next, us, eval);
                        improved = true;
                    }
                }
            }
        }
        if !improved {
            return Some((best, best_eval));
        }
    }
}

/// How far [`refine_cuts`] moves a cut at once, layers.
const CUT_REACH: isize = 3;
/// The most prices [`refine_cuts`] spends.
const CUT_TRIALS: u32 = 400;
