//! The search over Megatron-LM's space. The blocks are identical, so every point is priced
//! from one block ([`estimate`]) in O(p); the space — tensor degrees dividing a node and the
//! heads, every pipeline depth whose `t·p` divides the GPUs, every context-parallel degree
//! dividing what is left and cutting the sequence into `2c` chunks, every micro-batch size dividing
//! a replica's batch, interleaving depths, three recomputation levels, sequence parallelism
//! and ZeRO stages — is enumerated whole: tens of thousands of points, milliseconds.
//!
//! Each knob the user gives fixes its dimension; with all of them given the configuration is
//! only priced. ZeRO 2 and 3 shard gradients that pipeline microbatches accumulate, so they
//! are searched without pipelining (DeepSpeed's restriction).

use rayon::prelude::*;
use serde::Serialize;

use super::estimate::{estimate, Estimate, Setting};
use super::{ContextComm, Modules, Offload, Parallelism, Recompute};
use crate::cost::Optimizer;
use crate::plan::{PlanError, Schedule};

/// Dimensions the user fixed (`None`: searched).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Knobs {
    /// `--tensor-parallel`.
    pub tensor: Option<u32>,
    /// `--pipeline-parallel`.
    pub pipeline: Option<u32>,
    /// `--context-parallel`.
    pub context: Option<u32>,
    /// `--virtual-stages`.
    pub virtual_stages: Option<u32>,
    /// `--micro-batch-size`.
    pub micro_batch: Option<u64>,
    /// `--recompute`.
    pub recompute: Option<Recompute>,
    /// `--sequence-parallel` (only `Some(true)` from the command line).
    pub sequence_parallel: Option<bool>,
    /// `--zero`.
    pub zero: Option<u8>,
    /// `--schedule` (1F1B or GPipe).
    pub schedule: Option<Schedule>,
    /// `--expert-parallel`.
    pub expert: Option<u32>,
    /// `--expert-tensor-parallel`.
    pub expert_tensor: Option<u32>,
    /// `--offload-activations`: blocks whose activations are kept in host memory.
    pub offload_activations: Option<u64>,
    /// `--offload-optimizer`: percent of the optimizer state kept in host memory.
    pub offload_optimizer: Option<u8>,
    /// `--dp-replicate`: groups of data × context ranks each holding a whole sharded copy
    /// of the ZeRO state (hybrid sharding).
    pub shard_groups: Option<u32>,
    /// `--pipeline-split`: whether the embedding and the loss take a block's place each
    /// in the pipeline split.
    pub ends_as_blocks: Option<bool>,
    /// `--cp-comm-type`: how a context-parallel group exchanges keys and values.
    pub context_comm: Option<ContextComm>,
}

/// The search's result.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Searched {
    /// The fastest configuration that fits.
    pub best: Estimate,
    /// Data parallelism on every GPU (no splitting, no recomputation), priced even when it
    /// does not fit.
    pub data_parallel: Estimate,
    /// Configurations priced.
    pub evaluated: u64,
}

/// Finds the fastest configuration of `setting` within `knobs`.
///
/// # Errors
/// A knob that cannot hold (a tensor degree not dividing the heads, a pipeline deeper than
/// the blocks, …) as [`PlanError::Request`]; no configuration fitting in memory as
/// [`PlanError::OutOfMemory`] with the smallest need found.
pub fn search(setting: &Setting<'_>, knobs: &Knobs) -> Result<Searched, PlanError> {
    let model = setting.model;
    let gpus = setting.gpus.max(1);
    let batch = setting.batch;
    let gpn = setting.cluster.group_of(0).gpus_per_node.max(1);
    check_knobs(setting, knobs, gpn)?;
    let schedule = knobs.schedule.unwrap_or(Schedule::OneFOneB);
    let pieces = setting.sample_pieces.max(1);
    let data_parallel = {
        let d = divisors(gcd(u64::from(gpus), batch).max(1))
            .into_iter()
            .filter(|&d| d <= pieces)
            .max()
            .unwrap_or(1);
        estimate(
            setting,
            &Parallelism {
                tensor: 1,
                context: 1,
                context_comm: ContextComm::Ring,
                pipeline: 1,
                data: d as u32,
                micro_batch: batch / d,
                virtual_stages: 1,
                recompute: Recompute::None,
                sequence_parallel: false,
                zero: 0,
                // (One stage has no bubble to fill: 1F1B's order.)
                schedule: match schedule.splits_backward() {
                    true => Schedule::OneFOneB,
                    false => schedule,
                },
                // Every rank holds every expert.
                expert: 1,
                expert_tensor: 1,
                offload: Offload::NONE,
                shard_groups: 1,
                ends_as_blocks: false,
            },
        )
    };
    // Context parallelism splits the attention core, quadratic in the sequence: auto
    // considers it where that core does at least the dense layers' work per token
    // (`4sh ≥` the products' FLOPs). Below, it would only trade data-parallel replicas
    // for key and value exchanges; `--context-parallel` asks for it at any length.
    let attention = model.core_flops_per_token();
    let long_sequence = knobs.context.is_some()
        || knobs.context_comm.is_some()
        || attention >= model.block_flops_per_token() - attention;
    // Expert layouts over the `ranks` of a pipeline stage (Megatron-Core's parallel
    // folding): `ep` dividing the experts, `etp` the experts' inner size and a node, `ep ·
    // etp` dividing the ranks. (1, 1) for a dense model.
    let experts = |ranks: u32| -> Vec<(u32, u32)> {
        let Some(moe) = model.moe else {
            return vec![(1, 1)];
        };
        let mut layouts = Vec::new();
        for ep in divisors(u64::from(ranks)) {
            let ep = ep as u32;
            if moe.experts % u64::from(ep) != 0 || knobs.expert.is_some_and(|k| k != ep) {
                continue;
            }
            for etp in divisors(u64::from(ranks / ep)) {
                let etp = etp as u32;
                if gpn % etp == 0
                    && moe.expert_ffn % u64::from(etp) == 0
                    && knobs.expert_tensor.is_none_or(|k| k == etp)
                {
                    layouts.push((ep, etp));
                }
            }
        }
        layouts
    };
    // The zero-bubble schedules' weight passes would outlive a recomputed run's
    // activations: they run without recomputation (as the executable plan does).
    let recomputes = match schedule.splits_backward() {
        true => vec![Recompute::None],
        false => knobs
            .recompute
            .map_or_else(|| Recompute::choices(model), |given| vec![given]),
    };
    let tensors: Vec<u32> = (1..=gpn)
        .filter(|&t| gpn % t == 0 && gpus % t == 0 && model.splits_by(t))
        .filter(|&t| knobs.tensor.is_none_or(|k| k == t))
        .collect();
    // The configurations of each tensor degree and pipeline depth are priced apart, on as
    // many threads as there are cores, and taken in order: the plan one pass over them
    // would pick.
    let per_depth = |(t, p): (u32, u32)| -> Found {
        let mut best: Option<Estimate> = None;
        let mut smallest_need = f64::INFINITY;
        let mut first_need = None;
        let mut evaluated = 0u64;
        // The context-parallel forms by their exchange time, which the pipeline does not
        // change: per (c, b, recomputation) for this tensor degree and pipeline depth.
        let mut ranked: std::collections::HashMap<(u32, u64, Recompute), Vec<ContextComm>> =
            std::collections::HashMap::new();
        {
            // Context parallelism cuts each sequence over `c` ranks; Megatron-Core's
            // causal load balancing pairs chunks, so each rank holds `2` of `2c`.
            let contexts: Vec<u32> = (1..=gpus / (t * p))
                .filter(|&c| (gpus / (t * p)) % c == 0)
                .filter(|&c| c == 1 || (long_sequence && model.sequence % (2 * u64::from(c)) == 0))
                .filter(|&c| knobs.context.is_none_or(|k| k == c))
                // (A form asked for asks for context parallelism.)
                .filter(|&c| c > 1 || knobs.context_comm.is_none())
                .collect();
            // Each context-parallel degree in every form that splits its heads (or the one
            // given). A form changes only the blocks' key/value exchange, whose time depends
            // on the tensor and context degrees, the micro-batch and the recomputation alone:
            // the forms are ranked by it once per (t, c, b, recomputation) (`ranked`), and
            // each point is priced in the fastest that fits.
            let forms = |c: u32| -> Vec<ContextComm> {
                match c {
                    1 => vec![ContextComm::Ring],
                    _ => (ContextComm::ALL.into_iter())
                        .filter(|&f| knobs.context_comm.is_none_or(|k| k == f))
                        .filter(|&f| f != ContextComm::AllToAll || ulysses_splits(model, t, c))
                        // Transformer Engine runs sliding windows over a context-parallel
                        // group by all-gather or all-to-all only.
                        .filter(|&f| f != ContextComm::Ring || model.sliding_window == 0)
                        .collect(),
                }
            };
            for c in contexts {
                let d = gpus / (t * p * c);
                if batch % u64::from(d) != 0 {
                    continue;
                }
                let replica_batch = batch / u64::from(d);
                let expert_layouts = experts(t * c * d);
                for b in divisors(replica_batch) {
                    if knobs.micro_batch.is_some_and(|k| k != b) {
                        continue;
                    }
                    let m = replica_batch / b;
                    if u64::from(d) * m > pieces {
                        continue;
                    }
                    // Chunks per stage, and whether the embedding and the loss count as
                    // blocks in the split: interleaving takes chunks of equal places, as
                    // Megatron-Core requires.
                    let depths: Vec<(u32, bool)> = (1..=u32::try_from(model.layers / u64::from(p))
                        .unwrap_or(1))
                        .flat_map(|v| [(v, false), (v, true)])
                        .filter(|&(v, ends)| match schedule {
                            // ZB-V: two chunks a stage, any count of blocks each (PyTorch's
                            // pipelining splits them so).
                            Schedule::ZeroBubbleV => {
                                v == 2 && model.layers >= 2 * u64::from(p) && (p > 1 || !ends)
                            }
                            _ => {
                                let interleaves = v == 1
                                    || (schedule == Schedule::OneFOneB && m % u64::from(p) == 0);
                                interleaves && super::split_holds(model.layers, p, v, ends)
                            }
                        })
                        .filter(|&(v, _)| knobs.virtual_stages.is_none_or(|k| k == v))
                        .filter(|&(_, ends)| knobs.ends_as_blocks.is_none_or(|k| k == ends))
                        .collect();
                    for &(v, ends_as_blocks) in &depths {
                        for &recompute in &recomputes {
                            if knobs.recompute.is_some_and(|k| k != recompute) {
                                continue;
                            }
                            for sequence_parallel in [false, true] {
                                // Megatron-Core trains a mixture of experts with tensor
                                // parallelism only with sequence parallelism.
                                if (sequence_parallel && t == 1)
                                    || (!sequence_parallel && t > 1 && model.moe.is_some())
                                    || knobs
                                        .sequence_parallel
                                        .is_some_and(|k| k != sequence_parallel)
                                {
                                    continue;
                                }
                                for zero in 0..=3u8 {
                                    if knobs.zero.is_some_and(|k| k != zero)
                                        || (knobs.zero.is_none() && zero >= 2 && p > 1)
                                    {
                                        continue;
                                    }
                                    for (&(expert, expert_tensor), shard_groups) in
                                        expert_layouts.iter().flat_map(|l| {
                                            // The experts' data-parallel ranks split alike.
                                            let expert_data = t * c * d / (l.0 * l.1).max(1);
                                            hybrid_groups(knobs, zero, t, c * d, gpn)
                                                .into_iter()
                                                .filter(move |&r| expert_data % r == 0)
                                                .map(move |r| (l, r))
                                        })
                                    {
                                        // Offloading only where nothing fits without it:
                                        // it never makes a step faster.
                                        let mut fits_on_gpus = false;
                                        for offload in offloads(setting, knobs, p, recompute, zero)
                                        {
                                            // (Offload beside hybrid sharding is not tried:
                                            // one group over all ranks holds less.)
                                            if offload.any() && (fits_on_gpus || shard_groups > 1) {
                                                break;
                                            }
                                            let par = Parallelism {
                                                tensor: t,
                                                context: c,
                                                context_comm: ContextComm::Ring,
                                                pipeline: p,
                                                data: d,
                                                micro_batch: b,
                                                virtual_stages: v,
                                                recompute,
                                                sequence_parallel,
                                                zero,
                                                schedule,
                                                expert,
                                                expert_tensor,
                                                offload,
                                                shard_groups,
                                                ends_as_blocks,
                                            };
                                            let candidates = forms(c);
                                            if candidates.is_empty() {
                                                continue;
                                            }
                                            let order = match candidates.len() {
                                                1 => candidates,
                                                _ => ranked
                                                    .entry((c, b, recompute))
                                                    .or_insert_with(|| {
                                                        let mut timed: Vec<(f64, ContextComm)> =
                                                            (candidates.into_iter())
                                                                .map(|context_comm| {
                                                                    evaluated += 1;
                                                                    let e = estimate(
                                                                        setting,
                                                                        &Parallelism {
                                                                            context_comm,
                                                                            ..par
                                                                        },
                                                                    );
                                                                    (
                                                                        e.time.context_comm_us,
                                                                        context_comm,
                                                                    )
                                                                })
                                                                .collect();
                                                        timed.sort_by(|x, y| x.0.total_cmp(&y.0));
                                                        timed.into_iter().map(|(_, f)| f).collect()
                                                    })
                                                    .clone(),
                                            };
                                            // The fastest form other than the all-gather,
                                            // then the all-gather where it is faster still:
                                            // it alone holds more (the gathered keys and
                                            // values), so where the other does not fit,
                                            // neither does it.
                                            let gathered = order
                                                .iter()
                                                .position(|&f| f == ContextComm::AllGather);
                                            let other = order
                                                .iter()
                                                .position(|&f| f != ContextComm::AllGather);
                                            let first = other
                                                .or(gathered)
                                                .map_or(ContextComm::Ring, |i| order[i]);
                                            let mut e = estimate(
                                                setting,
                                                &Parallelism {
                                                    context_comm: first,
                                                    ..par
                                                },
                                            );
                                            evaluated += 1;
                                            let mut passed_over = None;
                                            if e.fits
                                                && gathered
                                                    .is_some_and(|g| other.is_some_and(|o| g < o))
                                            {
                                                let all_gather = estimate(
                                                    setting,
                                                    &Parallelism {
                                                        context_comm: ContextComm::AllGather,
                                                        ..par
                                                    },
                                                );
                                                evaluated += 1;
                                                if all_gather.fits {
                                                    // (The other form stays a choice: it may
                                                    // need fewer blocks recomputed.)
                                                    passed_over = Some(e);
                                                    e = all_gather;
                                                }
                                            }
                                            fits_on_gpus |= !offload.any() && e.fits;
                                            // A full recomputation that fits may free more
                                            // than the plan needs: then the fewest of each
                                            // chunk's blocks that fit, in the faster form.
                                            let e = match recompute == Recompute::Full
                                                && knobs.recompute.is_none()
                                                && !offload.any()
                                                && e.fits
                                            {
                                                true => {
                                                    let mut fewest = |e: Estimate| {
                                                        let par = e.parallelism;
                                                        let (fewest, tried) =
                                                            fewest_full_blocks(setting, &par, e);
                                                        evaluated += tried;
                                                        fewest
                                                    };
                                                    let chosen = fewest(e);
                                                    match passed_over.map(&mut fewest) {
                                                        Some(other)
                                                            if other.iteration_time_us
                                                                < chosen.iteration_time_us =>
                                                        {
                                                            other
                                                        }
                                                        _ => chosen,
                                                    }
                                                }
                                                false => e,
                                            };
                                            // What the GPUs need (an offload that fits them
                                            // may fail on the host's memory instead, and
                                            // counts only as the search's first need).
                                            first_need.get_or_insert(e.peak_memory_bytes);
                                            if !offload.any()
                                                || e.peak_memory_bytes > e.memory_capacity_bytes
                                            {
                                                smallest_need =
                                                    smallest_need.min(e.peak_memory_bytes);
                                            }
                                            if e.fits
                                                && best.as_ref().is_none_or(|x| {
                                                    e.iteration_time_us
                                                        < x.iteration_time_us * (1.0 - 1e-12)
                                                })
                                            {
                                                best = Some(e);
                                            }
                                        }
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
        Found {
            best,
            smallest_need,
            first_need,
            evaluated,
        }
    };
    let depths: Vec<(u32, u32)> = (tensors.iter())
        .flat_map(|&t| {
            (1..=(gpus / t).min(u32::try_from(model.layers).unwrap_or(u32::MAX)))
                .filter(move |&p| (gpus / t) % p == 0 && knobs.pipeline.is_none_or(|k| k == p))
                .map(move |p| (t, p))
        })
        .collect();
    let found: Vec<Found> = depths.par_iter().map(|&d| per_depth(d)).collect();
    let mut best: Option<Estimate> = None;
    let mut smallest_need = f64::INFINITY;
    let mut evaluated = 0u64;
    if let Some(first) = found.iter().find_map(|f| f.first_need) {
        smallest_need = first;
    }
    for f in found {
        evaluated += f.evaluated;
        smallest_need = smallest_need.min(f.smallest_need);
        if let Some(e) = f.best.filter(|e| {
            best.as_ref()
                .is_none_or(|x| e.iteration_time_us < x.iteration_time_us * (1.0 - 1e-12))
        }) {
            best = Some(e);
        }
    }
    // Data parallelism on as many GPUs as the batch feeds is a plan too (it may use fewer
    // GPUs than every configuration above, which use them all).
    if data_parallel.fits
        // (Hybrid sharding fixed to none is no choice: exports are searched so.)
        && (Knobs {
            shard_groups: None,
            ..*knobs
        }) == Knobs::default()
        && best
            .as_ref()
            .is_none_or(|b| data_parallel.iteration_time_us < b.iteration_time_us)
    {
        best = Some(data_parallel.clone());
    }
    match best {
        Some(best) => Ok(Searched {
            best,
            data_parallel,
            evaluated,
        }),
        None if evaluated == 0 => Err(PlanError::Request(format!(
            "no tensor × context × pipeline × data split of {gpus} GPUs divides the batch \
             {batch} with the options given{}",
            match knobs.shard_groups.filter(|&r| r > 1) {
                Some(r) => format!(
                    " (--dp-replicate {r} needs ZeRO, the data × context ranks cut into {r} \
                     groups of two or more, and the experts' data-parallel ranks cut alike)"
                ),
                None => String::new(),
            }
        ))),
        None => Err(PlanError::OutOfMemory {
            need: smallest_need,
            capacity: data_parallel.memory_capacity_bytes,
            limited: setting.memory_limit.is_some(),
        }),
    }
}

/// What the configurations of one tensor degree and pipeline depth gave: the fastest that
/// fits, the least memory any needs on the GPUs without offloading or beyond them, the
/// first one's need, and how many were priced.
struct Found {
    best: Option<Estimate>,
    smallest_need: f64,
    first_need: Option<f64>,
    evaluated: u64,
}

/// `full`, a full recomputation of `par` that fits, or the plan recomputing the fewest
/// blocks of each chunk in full that fits (Megatron-Core's block method): memory falls
/// and time rises with each block recomputed, so the fewest is found by bisection. With
/// the estimates made.
fn fewest_full_blocks(setting: &Setting<'_>, par: &Parallelism, full: Estimate) -> (Estimate, u64) {
    let largest = full.chunk_layers.iter().copied().max().unwrap_or(0);
    let largest = u32::try_from(largest).unwrap_or(u32::MAX);
    // Invariant: `hi` fits (`largest` is the full recomputation).
    let (mut lo, mut hi, mut best) = (1u32, largest, full);
    let mut tried = 0;
    while lo < hi {
        let n = lo + (hi - lo) / 2;
        let e = estimate(
            setting,
            &Parallelism {
                recompute: Recompute::Blocks(n),
                ..*par
            },
        );
        tried += 1;
        if e.fits {
            (hi, best) = (n, e);
        } else {
            lo = n + 1;
        }
    }
    (best, tried)
}

/// Refuses knobs that no configuration can satisfy, naming the option.
fn check_knobs(setting: &Setting<'_>, knobs: &Knobs, gpn: u32) -> Result<(), PlanError> {
    let model = setting.model;
    let bad = |m: String| Err(PlanError::Request(m));
    if let Some(t) = knobs.tensor {
        if t == 0 || gpn % t != 0 {
            return bad(format!(
                "--tensor-parallel {t}: tensor-parallel groups stay inside a node, so the \
                 degree must divide its {gpn} GPUs"
            ));
        }
        if !model.splits_by(t) {
            return bad(format!(
                "--tensor-parallel {t} does not divide the model's {} attention heads, {} \
                 key/value heads and MLP size {}",
                model.heads, model.kv_heads, model.ffn
            ));
        }
    }
    if let Some(p) = knobs.pipeline {
        if p == 0 || u64::from(p) > model.layers {
            return bad(format!(
                "--pipeline-parallel {p}: the model has {} blocks (1 to {} stages)",
                model.layers, model.layers
            ));
        }
    }
    if let Some(c) = knobs.context {
        if c == 0 || (c > 1 && model.sequence % (2 * u64::from(c)) != 0) {
            return bad(format!(
                "--context-parallel {c}: the sequence of {} positions must split into 2 × {c} \
                 chunks (each rank holds one early and one late chunk, for causal balance)",
                model.sequence
            ));
        }
    }
    let tp = [knobs.tensor, knobs.pipeline, knobs.context]
        .into_iter()
        .try_fold(1u32, |n, k| n.checked_mul(k.unwrap_or(1)))
        .unwrap_or(u32::MAX);
    if tp == 0 || setting.gpus % tp != 0 {
        return bad(format!(
            "tensor × pipeline × context = {tp} does not divide the {} GPUs",
            setting.gpus
        ));
    }
    let ends = knobs.ends_as_blocks == Some(true);
    if ends && (knobs.pipeline == Some(1) || setting.gpus < 2) {
        return bad("--pipeline-split ends needs a pipeline (--pipeline-parallel above 1)".into());
    }
    if knobs.virtual_stages.is_some_and(|v| v > 1) && knobs.schedule == Some(Schedule::GPipe) {
        return bad("--virtual-stages needs the 1f1b schedule (interleaved 1F1B)".into());
    }
    if let Some(p) = knobs.pipeline {
        let v = knobs.virtual_stages.unwrap_or(1).max(1);
        // Either split may do where the search picks it.
        let holds = |e: bool| {
            knobs.ends_as_blocks.is_none_or(|k| k == e) && super::split_holds(model.layers, p, v, e)
        };
        if (v > 1 || ends) && !holds(false) && !holds(true) {
            let places = super::split_places(model.layers, ends);
            let what = match ends {
                true => format!(
                    "{places} places ({} blocks, the embedding, the loss)",
                    model.layers
                ),
                false => format!("{places} blocks"),
            };
            let hint = !ends && super::split_holds(model.layers, p, v, true);
            let asked = match v > 1 {
                true => format!("--virtual-stages {v}"),
                false => "--pipeline-split ends".to_owned(),
            };
            return bad(format!(
                "{asked} with {p} stage(s): Megatron-Core splits the {what} only into equal \
                 chunks ({p} × {v}), and interleaving needs at least two stages{}",
                match hint {
                    true =>
                        " (--pipeline-split ends counts the embedding and the loss as \
                             a block each: then they divide)",
                    false => "",
                }
            ));
        }
    }
    if let Some(z) = knobs.zero {
        if z > 3 {
            return bad(format!("--zero {z}: stages are 0, 1, 2 and 3"));
        }
    }
    if knobs.sequence_parallel == Some(true) && knobs.tensor == Some(1) {
        return bad("--sequence-parallel needs --tensor-parallel above 1".into());
    }
    match (model.moe, knobs.expert, knobs.expert_tensor) {
        (None, Some(k), _) | (None, _, Some(k)) if k > 1 => {
            return bad(format!(
                "--expert-parallel / --expert-tensor-parallel {k}: the model has no experts"
            ));
        }
        (Some(moe), ep, etp) => {
            if let Some(ep) = ep.filter(|&ep| ep == 0 || moe.experts % u64::from(ep) != 0) {
                return bad(format!(
                    "--expert-parallel {ep} does not divide the model's {} experts",
                    moe.experts
                ));
            }
            if let Some(etp) = etp
                .filter(|&etp| etp == 0 || gpn % etp != 0 || moe.expert_ffn % u64::from(etp) != 0)
            {
                return bad(format!(
                    "--expert-tensor-parallel {etp} must divide a node's {gpn} GPUs and the \
                     experts' inner size {}",
                    moe.expert_ffn
                ));
            }
            if knobs.sequence_parallel == Some(false) && knobs.tensor.is_some_and(|t| t > 1) {
                return bad(
                    "a mixture of experts with tensor parallelism needs sequence parallelism \
                     (Megatron-Core refuses to train it without)"
                        .into(),
                );
            }
        }
        _ => {}
    }
    if let Some(Recompute::Modules(m)) = knobs.recompute {
        let (dense, experts) = model.spec().block_counts();
        let missing = [
            (Modules::MLP, dense == 0, "no block with a dense MLP"),
            (Modules::EXPERT_ACTIVATION, experts == 0, "no experts"),
            (
                Modules::LATENT_UP,
                model.latent.is_none(),
                "no latent attention",
            ),
        ]
        .into_iter()
        .find(|&(module, absent, _)| absent && m.contains(module));
        if let Some((module, _, why)) = missing {
            return bad(format!(
                "--recompute-modules {}: the model has {why}",
                module.names().join(",")
            ));
        }
    }
    let offloads_activations = knobs.offload_activations.is_some_and(|n| n > 0);
    let offloads_optimizer = knobs.offload_optimizer.is_some_and(|n| n > 0);
    if (offloads_activations || offloads_optimizer) && setting.cluster.group_of(0).host.is_none() {
        return bad(format!(
            "--offload-activations / --offload-optimizer: cluster {} gives no host memory \
             figures (add `host = {{ link = ..., memory = ..., memory_bandwidth = ... }}` to \
             its group; `ralpc cluster dgx-h100 --toml` writes a preset's)",
            setting.cluster.name
        ));
    }
    if let Some(n) = knobs.offload_activations.filter(|&n| n > 0) {
        if n >= model.layers {
            return bad(format!(
                "--offload-activations {n}: the model has {} blocks, and Megatron-Core offloads \
                 fewer than all of them",
                model.layers
            ));
        }
        if knobs.pipeline.is_some_and(|p| p > 1) {
            return bad(
                "--offload-activations with --pipeline-parallel above 1: Megatron-Core's \
                 layer-wise offload has no pipeline support"
                    .into(),
            );
        }
        if knobs.recompute.is_some_and(|r| r != Recompute::None) {
            return bad(
                "--offload-activations with recomputation: Megatron-Core's layer-wise offload \
                 refuses activation recomputation (use --recompute none, without \
                 --recompute-modules or --recompute-num-layers)"
                    .into(),
            );
        }
    }
    if let Some(percent) = knobs.offload_optimizer {
        if percent > 100 {
            return bad(format!("--offload-optimizer {percent}%: at most all of it"));
        }
        if percent > 0 && setting.optimizer != Optimizer::Adam {
            return bad(
                "--offload-optimizer: Megatron-Core's hybrid device optimizer steps Adam only \
                 (use --optimizer adam)"
                    .into(),
            );
        }
        if percent > 0 && knobs.zero.is_some_and(|z| !(1..=2).contains(&z)) {
            return bad(
                "--offload-optimizer: Megatron-Core offloads the distributed optimizer's \
                 state, ZeRO 1 or 2 (its precision-aware optimizer needs it; Megatron-FSDP \
                 keeps its weights on the GPU)"
                    .into(),
            );
        }
    }
    match (knobs.shard_groups, knobs.zero) {
        (Some(0), _) => return bad("--dp-replicate must be at least 1".into()),
        (Some(r), Some(0)) if r > 1 => {
            return bad(format!(
                "--dp-replicate {r}: hybrid sharding repeats ZeRO's shards; give --zero 1, 2 \
                 or 3"
            ))
        }
        _ => {}
    }
    if knobs.context_comm.is_some() && knobs.context == Some(1) {
        return bad(
            "--cp-comm-type is how a context-parallel group exchanges keys and values: give \
             --context-parallel above 1 (or leave it to the search)"
                .into(),
        );
    }
    if knobs.context_comm == Some(ContextComm::Ring) && model.sliding_window > 0 {
        return bad(
            "--cp-comm-type p2p: Transformer Engine runs sliding-window attention over a \
             context-parallel group by all_gather or a2a only"
                .into(),
        );
    }
    if let (Some(ContextComm::AllToAll), Some(c @ 2..)) = (knobs.context_comm, knobs.context) {
        let t = knobs.tensor.unwrap_or(1);
        if !ulysses_splits(model, t, c) {
            return bad(format!(
                "--cp-comm-type a2a splits each tensor-parallel rank's heads over the {c} \
                 context-parallel ranks: its {} query and {} key/value heads do not divide \
                 by {c} (Transformer Engine's all-to-all needs both to); use p2p or \
                 all_gather, or fewer ranks",
                model.heads / u64::from(t),
                (model.kv_heads / u64::from(t)).max(1),
            ));
        }
    }
    if knobs.micro_batch == Some(0) {
        return bad("--micro-batch-size must be at least 1".into());
    }
    if knobs.schedule == Some(Schedule::Async) {
        return bad(
            "the asynchronous schedule is not one of Megatron-LM's: use 1f1b or gpipe".into(),
        );
    }
    if let Some(schedule) = knobs.schedule.filter(|s| s.splits_backward()) {
        let name = schedule.name();
        if knobs.recompute.is_some_and(|r| r != Recompute::None) {
            return bad(format!(
                "{name} runs each weight pass after its backward, which a recomputed block's \
                 activations would have to outlive: give --recompute none, or another schedule"
            ));
        }
        if knobs.offload_activations.is_some_and(|n| n > 0)
            || knobs.offload_optimizer.is_some_and(|f| f > 0)
        {
            return bad(format!(
                "{name} is priced without offloading: drop the --offload options"
            ));
        }
        if schedule == Schedule::ZeroBubbleV && knobs.virtual_stages.is_some_and(|v| v != 2) {
            return bad("zb-v runs two chunks per stage: give --virtual-stages 2 or none".into());
        }
        if schedule == Schedule::ZeroBubble && knobs.virtual_stages.is_some_and(|v| v != 1) {
            return bad("zb-h1 runs one chunk per stage: for two, use --schedule zb-v".into());
        }
    }
    Ok(())
}

/// Whether DeepSpeed-Ulysses' all-to-alls split a tensor-parallel rank's heads over `c`
/// context-parallel ranks: its query heads and its key/value heads each divide by `c`
/// (Transformer Engine's `AttnFuncWithCPAndQKVOA2A` checks both).
fn ulysses_splits(model: &super::Transformer, t: u32, c: u32) -> bool {
    let ranks = u64::from(t) * u64::from(c);
    model.heads % ranks == 0 && model.kv_heads % ranks == 0
}

/// The hybrid shardings a point tries: one sharded copy over all `ranks` data × context
/// ranks, and, under ZeRO, one per node (each shard group a node's `gpn / t` ranks, as
/// FSDP2's HSDP and Megatron-Core's partial distributed optimizer are run), or the number
/// the user fixed.
fn hybrid_groups(knobs: &Knobs, zero: u8, t: u32, ranks: u32, gpn: u32) -> Vec<u32> {
    if let Some(r) = knobs.shard_groups {
        // Groups of at least two ranks each, under ZeRO (one group is plain ZeRO).
        let fits = r == 1 || (zero >= 1 && ranks % r == 0 && ranks / r >= 2);
        return if fits { vec![r] } else { Vec::new() };
    }
    let per_node = (gpn / t.max(1)).max(1);
    match zero >= 1 && ranks % per_node == 0 && ranks / per_node > 1 && per_node > 1 {
        true => vec![1, ranks / per_node],
        false => vec![1],
    }
}

/// The offloads a point tries, cheapest first: the one the user fixed, or nothing and then
/// what Megatron-Core allows there (layer-wise activation offload without a pipeline or
/// recomputation, of fewer blocks than the model's, over a grid of eighths of them; the
/// hybrid device optimizer with Adam inside the distributed optimizer, ZeRO 1 or 2: its
/// precision-aware optimizer needs it, and Megatron-FSDP keeps its fp32 weights on the GPU
/// whatever the optimizer does). Nothing without host figures.
fn offloads(
    setting: &Setting<'_>,
    knobs: &Knobs,
    pipeline: u32,
    recompute: Recompute,
    zero: u8,
) -> Vec<Offload> {
    let layers = setting.model.layers;
    let has_host = setting.cluster.group_of(0).host.is_some();
    // The zero-bubble schedules are priced without offloading.
    if knobs.schedule.is_some_and(Schedule::splits_backward) {
        return vec![Offload::NONE];
    }
    let activations: Vec<u64> = match knobs.offload_activations {
        Some(n) => vec![n],
        None if has_host && pipeline == 1 && recompute == Recompute::None => {
            let mut grid: Vec<u64> = (0..8).map(|j| (layers * j).div_ceil(8)).collect();
            grid.push(layers.saturating_sub(1));
            grid.retain(|&n| n < layers);
            grid.dedup();
            grid
        }
        None => vec![0],
    };
    let optimizer: Vec<u8> = match knobs.offload_optimizer {
        Some(percent) => vec![percent],
        None if has_host => vec![0, 100],
        None => vec![0],
    };
    let allowed = |o: &Offload| {
        (o.activation_layers == 0
            || (pipeline == 1 && recompute == Recompute::None && o.activation_layers < layers))
            && (o.optimizer_percent == 0
                || (setting.optimizer == Optimizer::Adam && (1..=2).contains(&zero)))
    };
    let mut all: Vec<Offload> = optimizer
        .iter()
        .flat_map(|&optimizer_percent| {
            activations.iter().map(move |&activation_layers| Offload {
                activation_layers,
                optimizer_percent,
            })
        })
        .filter(allowed)
        .collect();
    all.sort_by_key(|o| (o.any(), o.optimizer_percent, o.activation_layers));
    all
}

pub(crate) fn divisors(n: u64) -> Vec<u64> {
    let mut small = Vec::new();
    let mut large = Vec::new();
    let mut i = 1;
    while i * i <= n {
        if n % i == 0 {
            small.push(i);
            if i * i != n {
                large.push(n / i);
            }
        }
        i += 1;
    }
    small.extend(large.into_iter().rev());
    small
}

fn gcd(a: u64, b: u64) -> u64 {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}
