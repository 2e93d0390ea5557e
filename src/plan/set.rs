//! `ralpc plan A B … --gpus N` (or `--copies K`): several models trained on one cluster at
//! once, each priced alone on counts of its GPUs and placed by
//! [`ralpc_passes::set::place`], against training them one after another and each on an
//! even share of the GPUs.

use std::collections::BTreeMap;

use ralpc_passes::set::{self, Job};
use rayon::prelude::*;
use serde::Serialize;

use super::*;

/// The set's report (`--json`).
#[derive(Clone, Debug, PartialEq, Serialize, schemars::JsonSchema)]
pub struct SetReport {
    /// Always [`crate::formats::PLAN_SET`].
    pub format: &'static str,
    /// The cluster's name.
    pub cluster: String,
    /// GPUs planned for.
    pub gpus: u32,
    /// Every model of the set (each copy its own), in the order given.
    pub models: Vec<SetModel>,
    /// The groups of GPUs, by first GPU: the models of a group take turns on it, an
    /// iteration each.
    pub groups: Vec<SetGroup>,
    /// Until every model has trained its iterations, µs.
    pub makespan_us: f64,
    /// Each model on all the GPUs, one after another, µs (`null` where one does not plan
    /// on all of them).
    pub sequential_us: Option<f64>,
    /// Each model on an even share of the GPUs (`gpus / models`, rounded down) at once,
    /// each share priced as a plan from GPU 0, µs (`null` where there are fewer GPUs than
    /// models or one does not plan on its share).
    pub even_split_us: Option<f64>,
    /// GPU counts a group may have (each model was priced at each).
    pub counts_priced: Vec<u32>,
    /// Wall time of pricing and placing, µs (the one field that varies between runs).
    pub planning_time_us: u64,
}

/// One model of a set.
#[derive(Clone, Debug, PartialEq, Serialize, schemars::JsonSchema)]
pub struct SetModel {
    /// The model path, as given.
    pub model: String,
    /// Its global batch.
    pub batch: u64,
    /// Its group (an index into `groups`).
    pub group: usize,
    /// Its group's GPUs.
    pub gpus: u32,
    /// Its group's first GPU.
    pub first_gpu: u32,
    /// The family of its plan on them.
    pub strategy: &'static str,
    /// Its iteration on them, µs.
    pub iteration_time_us: f64,
    /// Its iterations.
    pub iterations: u64,
}

/// GPUs some models share.
#[derive(Clone, Debug, PartialEq, Serialize, schemars::JsonSchema)]
pub struct SetGroup {
    /// Its models (indices into `models`), in the order they take turns.
    pub models: Vec<usize>,
    /// Its GPUs.
    pub gpus: u32,
    /// Its first GPU.
    pub first_gpu: u32,
    /// Until its last model is done, µs.
    pub time_us: f64,
}

/// A model priced on `g` GPUs: its batch, family and iteration.
#[derive(Clone, Copy)]
struct Priced {
    batch: u64,
    strategy: &'static str,
    iteration_us: f64,
}

/// Plans `models` (each with `iterations`) together on the GPUs `options` asks for
/// (`options.model` is not used), each priced under the rest of `options`.
///
/// # Errors
/// An unreadable or invalid model; a model that plans on no count of the GPUs (with why it
/// does not on all of them); more than [`set::MAX_JOBS`] models; a cluster of several GPU
/// types; `--input`, `--value` or `--profile` given for several distinct models.
pub fn plan_set(
    options: &PlanOptions,
    models: &[PathBuf],
    iterations: u64,
) -> Result<SetReport, Error> {
    let started = Instant::now();
    if models.len() > set::MAX_JOBS {
        return Err(request_error(format!(
            "{} models: ralpc places at most {} at once",
            models.len(),
            set::MAX_JOBS
        )));
    }
    one_gpu_type(options, "several models")?;
    let (cluster, gpus) = cluster_for(options)?;
    // Each distinct file priced once, its copies (under any spelling of its path) sharing
    // the prices.
    let key = |m: &PathBuf| std::fs::canonicalize(m).unwrap_or_else(|_| m.clone());
    let mut distinct: Vec<(PathBuf, &PathBuf)> = Vec::new();
    for m in models {
        if !distinct.iter().any(|(k, _)| *k == key(m)) {
            distinct.push((key(m), m));
        }
    }
    if distinct.len() > 1 {
        let shaped = [
            ("--input", !options.inputs.is_empty()),
            ("--value", !options.values.is_empty()),
            ("--profile", options.profile.is_some()),
        ];
        if let Some((option, _)) = shaped.iter().find(|(_, given)| *given) {
            return Err(request_error(format!(
                "{option} describes one model; these are {} (plan them as copies of one, or \
                 each alone)",
                distinct.len()
            )));
        }
    }
    let gpus_per_node = cluster.groups.first().map_or(1, |g| g.gpus_per_node.max(1));
    let counts = counts(gpus, gpus_per_node);
    let share = gpus / models.len() as u32;
    let mut asked: Vec<u32> = counts.clone();
    if share >= 1 && !asked.contains(&share) {
        // The even split's share, priced for the comparison only.
        asked.push(share);
    }
    let pairs: Vec<(usize, u32)> = (0..distinct.len())
        .flat_map(|d| asked.iter().map(move |&g| (d, g)))
        .collect();
    let results: Vec<Result<Priced, Error>> = pairs
        .par_iter()
        .map(|&(d, g)| {
            let alone = PlanOptions {
                model: distinct[d].1.clone(),
                gpus: Some(g),
                executable: false,
                background: None,
                ..options.clone()
            };
            plan_as_asked(&alone).map(|out| Priced {
                batch: out.report.batch,
                strategy: out.report.strategy,
                iteration_us: out.report.iteration_time_us,
            })
        })
        .collect();
    let mut priced: Vec<BTreeMap<u32, Priced>> = vec![BTreeMap::new(); distinct.len()];
    let mut why_not: Vec<Option<Error>> = (0..distinct.len()).map(|_| None).collect();
    for (&(d, g), result) in pairs.iter().zip(results) {
        match result {
            Ok(p) => {
                priced[d].insert(g, p);
            }
            // It does not plan on that many (it does not fit, or the request fixes
            // something that count cannot take): the reason on the most GPUs is kept.
            Err(e @ Error::Plan(_)) => why_not[d] = Some(e),
            Err(e) => return Err(e),
        }
    }
    for (d, (_, model)) in distinct.iter().enumerate() {
        if counts.iter().all(|g| !priced[d].contains_key(g)) {
            let why = why_not[d]
                .as_ref()
                .map(|e| format!(": {e}{}", crate::run::chain(e)))
                .unwrap_or_default();
            return Err(request_error(format!(
                "{} plans on none of {counts:?} of the {gpus} GPUs{why}",
                model.display()
            )));
        }
    }
    let of = |m: &PathBuf| {
        let k = key(m);
        &priced[distinct.iter().position(|(d, _)| *d == k).unwrap_or(0)]
    };
    let jobs: Vec<Job> = models
        .iter()
        .map(|m| Job {
            iteration_us: of(m)
                .iter()
                .filter(|(g, _)| counts.contains(g))
                .map(|(&g, p)| (g, p.iteration_us))
                .collect(),
            iterations,
        })
        .collect();
    let placement = set::place(&jobs, gpus).ok_or_else(|| {
        Error::Internal(Box::new(
            "every model plans on some count of the GPUs, yet no placement was found".into(),
        ))
    })?;
    let per_iteration = |m: &PathBuf, g: u32| of(m).get(&g).map(|p| p.iteration_us);
    let sequential_us = models
        .iter()
        .map(|m| per_iteration(m, gpus))
        .sum::<Option<f64>>()
        .map(|t| t * iterations as f64);
    let even_split_us = (share >= 1)
        .then(|| {
            models
                .iter()
                .map(|m| per_iteration(m, share))
                .try_fold(0.0f64, |worst, t| t.map(|t| worst.max(t)))
        })
        .flatten()
        .map(|t| t * iterations as f64);
    let mut rows: Vec<Option<SetModel>> = vec![None; models.len()];
    for (index, group) in placement.groups.iter().enumerate() {
        for &i in &group.jobs {
            let Some(p) = of(&models[i]).get(&group.gpus).copied() else {
                continue;
            };
            rows[i] = Some(SetModel {
                model: models[i].display().to_string(),
                batch: p.batch,
                group: index,
                gpus: group.gpus,
                first_gpu: group.first_gpu,
                strategy: p.strategy,
                iteration_time_us: p.iteration_us,
                iterations,
            });
        }
    }
    Ok(SetReport {
        format: crate::formats::PLAN_SET,
        cluster: cluster.name.clone(),
        gpus,
        models: rows.into_iter().flatten().collect(),
        groups: placement
            .groups
            .iter()
            .map(|g| SetGroup {
                models: g.jobs.clone(),
                gpus: g.gpus,
                first_gpu: g.first_gpu,
                time_us: g.time_us,
            })
            .collect(),
        makespan_us: placement.makespan_us,
        sequential_us,
        even_split_us,
        counts_priced: counts,
        planning_time_us: started.elapsed().as_micros() as u64,
    })
}

/// GPU counts a group may have: powers of two within a node and whole nodes, up to all
/// of them (and all of them). Laid out largest first, each group then starts on a
/// boundary of its own size ([`set::place`]), where its plan from GPU 0 was priced.
fn counts(gpus: u32, gpus_per_node: u32) -> Vec<u32> {
    let within = std::iter::successors(Some(1u32), |g| g.checked_mul(2))
        .take_while(|&g| g <= gpus_per_node.min(gpus));
    let nodes = (1..=gpus / gpus_per_node).map(|n| n * gpus_per_node);
    let mut c: Vec<u32> = within.chain(nodes).chain([gpus]).collect();
    c.sort_unstable();
    c.dedup();
    c
}

#[cfg(test)]
mod tests {
    #[test]
    fn counts_are_powers_of_two_in_a_node_and_whole_nodes() {
        assert_eq!(super::counts(4, 8), [1, 2, 4]);
        assert_eq!(super::counts(8, 8), [1, 2, 4, 8]);
        assert_eq!(super::counts(20, 8), [1, 2, 4, 8, 16, 20]);
        assert_eq!(super::counts(32, 8), [1, 2, 4, 8, 16, 24, 32]);
    }
}
