//! `ralpc plan A B … --gpus N` (or `--copies K`): several models trained on one cluster at
//! once, each priced alone on counts of its GPUs and placed by
//! [`ralpc_passes::set::place`], against training them one after another and each on an
//! even share of the GPUs.

use std::collections::BTreeMap;

use ralpc_passes::set::{self, Job};
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
    /// µs (`null` where there are fewer GPUs than models or one does not plan on its
    /// share).
    pub even_split_us: Option<f64>,
    /// GPU counts each model was priced at.
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
/// An unreadable or invalid model; a model that plans on no count of the GPUs; more
/// than [`set::MAX_JOBS`] models; a cluster of several GPU types.
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
    let counts = counts(gpus, models.len() as u32);
    // Each distinct model priced once, copies sharing it.
    let mut priced: BTreeMap<&Path, BTreeMap<u32, Priced>> = BTreeMap::new();
    for model in models {
        if priced.contains_key(model.as_path()) {
            continue;
        }
        let mut at = BTreeMap::new();
        for &g in &counts {
            let alone = PlanOptions {
                model: model.clone(),
                gpus: Some(g),
                executable: false,
                background: None,
                ..options.clone()
            };
            match plan_as_asked(&alone) {
                Ok(out) => {
                    let r = &out.report;
                    at.insert(
                        g,
                        Priced {
                            batch: r.batch,
                            strategy: r.strategy,
                            iteration_us: r.iteration_time_us,
                        },
                    );
                }
                // It does not plan on that many (it does not fit, or the request fixes
                // something that count cannot take).
                Err(Error::Plan(_)) => {}
                Err(e) => return Err(e),
            }
        }
        if at.is_empty() {
            return Err(request_error(format!(
                "{} plans on none of {counts:?} of the {gpus} GPUs (plan it alone to see why)",
                model.display()
            )));
        }
        priced.insert(model.as_path(), at);
    }
    let of = |m: &PathBuf| &priced[m.as_path()];
    let jobs: Vec<Job> = models
        .iter()
        .map(|m| Job {
            iteration_us: of(m).iter().map(|(&g, p)| (g, p.iteration_us)).collect(),
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
    let share = gpus / models.len() as u32;
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
            let p = of(&models[i])[&group.gpus];
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

/// GPU counts to price each model at: every count up to 16 GPUs; above, powers of two,
/// all of them, and the even shares of the models (`gpus·j / models`).
fn counts(gpus: u32, models: u32) -> Vec<u32> {
    let mut c: Vec<u32> = if gpus <= 16 {
        (1..=gpus).collect()
    } else {
        let powers =
            std::iter::successors(Some(1u32), |g| g.checked_mul(2)).take_while(|&g| g < gpus);
        let shares = (1..models.max(1)).map(|j| gpus * j / models.max(1));
        powers
            .chain(shares)
            .chain([gpus])
            .filter(|&g| g >= 1)
            .collect()
    };
    c.sort_unstable();
    c.dedup();
    c
}

#[cfg(test)]
mod tests {
    #[test]
    fn counts_cover_small_clusters_and_shares_of_large_ones() {
        assert_eq!(super::counts(4, 3), [1, 2, 3, 4]);
        assert_eq!(super::counts(64, 3), [1, 2, 4, 8, 16, 21, 32, 42, 64]);
    }
}
