//! Running the families, enforcing memory and the GPU-time budget, and picking the plan.
//!
//! Burst and SOAP plans are searched with Lagrange multipliers: `μ` on rank 0's memory is
//! raised ×4 from 1e-9 µs/B until the plan fits (at most 30 steps); `λ` on GPU time is found
//! by doubling then 20 bisection steps, keeping the fastest plan within the budget. Every
//! step is one run of the layered program. Pipelines prune stages that do not fit as they
//! are built, and are tried for each microbatch count (powers of two dividing the batch, or
//! the one given) and schedule.

use serde::Serialize;

use super::costs::Costs;
use super::evaluate::{evaluate, Evaluation};
use super::layered::{self, Weights};
use super::{pipeline, Family, PlanError, Schedule, Strategy};
use crate::cluster::{Cluster, NodeGroup};
use crate::cost::lower_bound_us;

/// What to plan.
#[derive(Clone, Debug, Default)]
pub struct Request {
    /// The family to search (`Auto`: all).
    pub family: Option<Family>,
    /// The pipeline schedule; `None`: the faster of 1F1B and ZB-H1 (synchronous, the
    /// least memory).
    pub schedule: Option<Schedule>,
    /// Microbatches for pipelines; `None`: searched.
    pub microbatches: Option<u32>,
    /// GPU-sec amplification allowed above 1 (`None`: unbounded).
    pub tolerance: Option<f64>,
    /// Evaluate this strategy instead of searching.
    pub strategy: Option<Strategy>,
}

/// A priced strategy.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Candidate {
    /// Where it came from.
    pub family: Family,
    /// The placement.
    pub strategy: Strategy,
    /// Its figures.
    pub evaluation: Evaluation,
}

/// The chosen plan and what it is compared with.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Planned {
    /// The plan.
    pub chosen: Candidate,
    /// Data parallelism on every GPU (priced even when it does not fit).
    pub data_parallel: Evaluation,
    /// Each family's best plan that was searched.
    pub candidates: Vec<Candidate>,
    /// One GPU's compute for the whole iteration, µs.
    pub single_gpu_time_us: f64,
    /// Total FLOPs over the combined peak of the GPUs, µs.
    pub lower_bound_us: f64,
}

/// Plans `request` against `costs`.
///
/// # Errors
/// An invalid strategy, a model that fits no plan's memory, or a budget no plan meets.
pub fn plan(costs: &Costs<'_>, request: &Request) -> Result<Planned, PlanError> {
    let graph = costs.graph;
    if graph.layers.is_empty() {
        return Err(PlanError::Request(
            "the model has no layers to place".into(),
        ));
    }
    if graph.batch == 0 {
        return Err(PlanError::Request("the batch is 0".into()));
    }
    if let Some(t) = request.tolerance {
        if !(t >= 0.0 && t.is_finite()) {
            return Err(PlanError::Request(format!(
                "tolerance {t} must be a finite number ≥ 0"
            )));
        }
    }
    let n = costs.gpus;
    let dp_strategy =
        Strategy::data_parallel(graph.layers.len(), n.min(batch_cap(graph.sample_pieces())));
    let data_parallel = evaluate(costs, &dp_strategy)?;
    let budget = request.tolerance.map(|t| 1.0 + t);
    let mut candidates: Vec<Candidate> = Vec::new();
    let mut smallest_need = f64::INFINITY;
    if let Some(s) = &request.strategy {
        let evaluation = evaluate(costs, s)?;
        let chosen = Candidate {
            family: Family::Auto,
            strategy: s.clone(),
            evaluation,
        };
        return Ok(Planned {
            candidates: vec![chosen.clone()],
            chosen,
            data_parallel,
            single_gpu_time_us: costs.single_gpu_time_us(),
            lower_bound_us: lower_bound_us(graph, costs.cluster, n, costs.options.precision),
        });
    }
    let family = request.family.unwrap_or(Family::Auto);
    if family == Family::ThreeD {
        return Err(PlanError::Request(
            "the 3d family places transformer blocks: plan it with transformer::search".into(),
        ));
    }
    let wants = |f: Family| family == Family::Auto || family == f;
    if wants(Family::Dp) {
        candidates.push(Candidate {
            family: Family::Dp,
            strategy: dp_strategy.clone(),
            evaluation: data_parallel.clone(),
        });
    }
    for (f, soap) in [(Family::Burst, false), (Family::Soap, true)] {
        if wants(f) {
            let choices = layered::choices(costs, n, soap);
            for c in layered_plans(costs, &choices, budget)? {
                candidates.push(Candidate { family: f, ..c });
            }
        }
    }
    let mut fits_over_budget = false;
    // More microbatches than samples (or none) cut nothing: refused by name rather than
    // leaving the pipeline family out of the search without a word.
    if let Some(m) = request
        .microbatches
        .filter(|&m| m == 0 || u64::from(m) > graph.batch)
    {
        return Err(PlanError::Request(format!(
            "--microbatches {m}: the batch of {} samples cuts into 1 to {} microbatches",
            graph.batch, graph.batch
        )));
    }
    if let (Some(m @ 2..), Some(why)) = (request.microbatches, &graph.fixed_batch) {
        return Err(PlanError::Request(format!(
            "{m} microbatches cut the batch, but this model's samples cannot be split: {why}"
        )));
    }
    if wants(Family::Pipeline) && request.schedule == Some(Schedule::ZeroBubbleV) {
        return Err(PlanError::Request(
            "zb-v runs two chunks of a transformer's blocks on each GPU: it plans a GPT-like \
             model's 3d plan (or a strategy file's V of stages); a layer pipeline runs 1f1b, \
             gpipe, async or zb-h1"
                .into(),
        ));
    }
    if wants(Family::Pipeline) {
        let schedules = request
            .schedule
            .map_or(vec![Schedule::OneFOneB, Schedule::ZeroBubble], |s| vec![s]);
        let counts: Vec<u32> = match request.microbatches {
            Some(m) => vec![m],
            // Up to 64: beyond, per-microbatch kernels are too small to matter.
            None => (0..7)
                .map(|e| 1u32 << e)
                .filter(|&m| {
                    u64::from(m) <= graph.sample_pieces() && graph.batch % u64::from(m) == 0
                })
                .collect(),
        };
        let mut best: Option<Candidate> = None;
        for &schedule in &schedules {
            for &m in &counts {
                let Some(strategy) = pipeline::best(costs, schedule, m) else {
                    continue;
                };
                // The cuts nudged under the exact price, among plans that fit.
                let (strategy, evaluation) = match pipeline::refine_cuts(strategy.clone(), |s| {
                    evaluate(costs, s)
                        .ok()
                        .filter(|e| e.fits)
                        .map(|e| (e.iteration_time_us, e))
                }) {
                    Some(refined) => refined,
                    None => {
                        let evaluation = evaluate(costs, &strategy)?;
                        (strategy, evaluation)
                    }
                };
                smallest_need = smallest_need.min(evaluation.peak_memory_bytes);
                // Fitting but over the budget is a budget problem, not a memory one.
                fits_over_budget |= evaluation.fits;
                if !evaluation.fits || budget.is_some_and(|b| evaluation.gpu_sec_amplification > b)
                {
                    continue;
                }
                if best
                    .as_ref()
                    .is_none_or(|b| evaluation.iteration_time_us < b.evaluation.iteration_time_us)
                {
                    best = Some(Candidate {
                        family: Family::Pipeline,
                        strategy,
                        evaluation,
                    });
                }
            }
        }
        candidates.extend(best);
    }
    // Several GPU types: each type's GPUs alone are planned too, and that plan is a
    // candidate on the whole cluster (a slow type priced into a plan can cost more than it
    // brings).
    for (first_rank, used, part) in homogeneous_parts(costs.cluster, n) {
        let part_costs = Costs::new(graph, &part, used, costs.options.clone());
        let Ok(found) = plan(&part_costs, request) else {
            continue;
        };
        let mut strategy = found.chosen.strategy;
        for stage in &mut strategy.stages {
            stage.first_rank += first_rank;
        }
        let Ok(evaluation) = evaluate(costs, &strategy) else {
            continue;
        };
        smallest_need = smallest_need.min(evaluation.peak_memory_bytes);
        candidates.push(Candidate {
            family: found.chosen.family,
            strategy,
            evaluation,
        });
    }
    // Every family contains data parallelism (one stage, every layer on every GPU): when
    // its search, which prices gradient synchronization without overlap, misses a faster
    // plan there, data parallelism is its answer.
    let dp_admissible = data_parallel.fits
        && budget.is_none_or(|b| data_parallel.gpu_sec_amplification <= b + 1e-9);
    // (A pipeline asked for with a schedule or microbatch count keeps them.)
    let free_pipeline = request.schedule.is_none() && request.microbatches.is_none();
    for f in [Family::Burst, Family::Soap, Family::Pipeline] {
        if !wants(f) || !dp_admissible || (f == Family::Pipeline && !free_pipeline) {
            continue;
        }
        let beaten = |c: &Candidate| {
            c.family == f
                && c.evaluation.fits
                && c.evaluation.iteration_time_us <= data_parallel.iteration_time_us
        };
        if !candidates.iter().any(beaten) {
            candidates.retain(|c| c.family != f);
            candidates.push(Candidate {
                family: f,
                strategy: dp_strategy.clone(),
                evaluation: data_parallel.clone(),
            });
        }
    }
    for c in &candidates {
        smallest_need = smallest_need.min(c.evaluation.peak_memory_bytes);
    }
    // The fastest plan that fits and meets the budget; ties go to the earlier family.
    let chosen = candidates
        .iter()
        .filter(|c| c.evaluation.fits)
        .filter(|c| budget.is_none_or(|b| c.evaluation.gpu_sec_amplification <= b + 1e-9))
        .min_by(|a, b| {
            a.evaluation
                .iteration_time_us
                .total_cmp(&b.evaluation.iteration_time_us)
        })
        .cloned();
    let Some(chosen) = chosen else {
        if fits_over_budget
            || candidates.iter().any(|c| c.evaluation.fits)
            || smallest_need.is_infinite()
        {
            let least = candidates
                .iter()
                .map(|c| &c.evaluation)
                .chain(std::iter::once(&data_parallel))
                .filter(|e| e.fits)
                .map(|e| e.gpu_sec_amplification)
                .fold(f64::INFINITY, f64::min);
            return Err(PlanError::OverBudget {
                family: family.name(),
                budget: budget.unwrap_or(f64::INFINITY),
                least,
            });
        }
        return Err(PlanError::OutOfMemory {
            need: smallest_need,
            capacity: costs.capacity_of(0, n),
            limited: costs.options.memory_limit.is_some(),
        });
    };
    Ok(Planned {
        chosen,
        data_parallel,
        candidates,
        single_gpu_time_us: costs.single_gpu_time_us(),
        lower_bound_us: lower_bound_us(graph, costs.cluster, n, costs.options.precision),
    })
}

/// Where the first `gpus` ranks of `cluster` hold more than one GPU type: each node
/// group's share of them as a cluster of its own (whole nodes), with its first rank and the
/// GPUs of it among the first `gpus`. Nothing on a cluster of one type.
fn homogeneous_parts(cluster: &Cluster, gpus: u32) -> Vec<(u32, u32, Cluster)> {
    let first_type = &cluster.gpu(0).name;
    if (0..gpus).all(|r| &cluster.gpu(r).name == first_type) {
        return Vec::new();
    }
    let mut parts = Vec::new();
    let mut first = 0u32;
    for group in &cluster.groups {
        let size = group.nodes.saturating_mul(group.gpus_per_node);
        let used = size.min(gpus.saturating_sub(first));
        if used > 0 {
            let nodes = used.div_ceil(group.gpus_per_node.max(1));
            parts.push((
                first,
                used,
                Cluster {
                    name: format!("{} ranks {first}..{}", cluster.name, first + used - 1),
                    groups: vec![NodeGroup {
                        nodes,
                        ..group.clone()
                    }],
                    racks: None,
                    flat: cluster.flat,
                },
            ));
        }
        first = first.saturating_add(size);
    }
    parts
}

/// GPUs a sample split can use at most.
fn batch_cap(batch: u64) -> u32 {
    u32::try_from(batch).unwrap_or(u32::MAX)
}

/// The layered search under memory and budget: the fastest plan found that fits and meets
/// the budget, plus (when none does) the plan that came closest, so the caller can report
/// the smallest memory need.
fn layered_plans(
    costs: &Costs<'_>,
    choices: &layered::Choices,
    budget: Option<f64>,
) -> Result<Vec<Candidate>, PlanError> {
    let run = |weights: Weights| -> Result<Option<Candidate>, PlanError> {
        let Some(layers) = layered::best(costs, choices, weights) else {
            return Ok(None);
        };
        let strategy = Strategy::single_stage(layers);
        let evaluation = evaluate(costs, &strategy)?;
        Ok(Some(Candidate {
            family: Family::Burst,
            strategy,
            evaluation,
        }))
    };
    // Raises μ until the plan fits.
    let fitting = |lambda: f64| -> Result<Option<Candidate>, PlanError> {
        let mut weights = Weights { lambda, mu: 0.0 };
        let mut last = None;
        for step in 0..=30 {
            let Some(c) = run(weights)? else {
                return Ok(last);
            };
            if c.evaluation.fits {
                return Ok(Some(c));
            }
            last = Some(c);
            weights.mu = if step == 0 { 1e-9 } else { weights.mu * 4.0 };
        }
        Ok(last)
    };
    let Some(first) = fitting(0.0)? else {
        return Ok(Vec::new());
    };
    let within = |c: &Candidate| {
        c.evaluation.fits && budget.is_none_or(|b| c.evaluation.gpu_sec_amplification <= b)
    };
    if !first.evaluation.fits || within(&first) {
        return Ok(vec![first]);
    }
    if budget.is_none() {
        return Ok(vec![first]);
    }
    // Doubling, then bisection on λ.
    let mut best: Option<Candidate> = None;
    let keep = |c: Candidate, best: &mut Option<Candidate>| {
        if within(&c)
            && best
                .as_ref()
                .is_none_or(|b| c.evaluation.iteration_time_us < b.evaluation.iteration_time_us)
        {
            *best = Some(c);
        }
    };
    let (mut lo, mut hi) = (0.0, 1e-3);
    while let Some(c) = fitting(hi)? {
        let ok = within(&c);
        keep(c, &mut best);
        if ok || hi > 1e6 {
            break;
        }
        lo = hi;
        hi *= 4.0;
    }
    if best.is_some() {
        for _ in 0..20 {
            let mid = 0.5 * (lo + hi);
            let Some(c) = fitting(mid)? else { break };
            if within(&c) {
                hi = mid;
            } else {
                lo = mid;
            }
            keep(c, &mut best);
        }
    }
    Ok(best.map_or_else(|| vec![first], |b| vec![b]))
}
