//! The plan's background job (`ralpc plan --background`) on the host backend: each GPU's
//! copy a single-device training job of its own beside the plan's ranks, for as many
//! steps as the plan's price gives it in the plan's steps. The ranks and the copies share
//! nothing: the plan's losses are those it has alone.

use std::path::{Path, PathBuf};

use ralpc_codegen::BackgroundRef;

use super::{find_model, read, RunOptions};
use crate::Error;
use ralpc_ir::input::InputKind;

/// One GPU's copy of the background job, as it ran.
#[derive(Clone, Debug, PartialEq, serde::Serialize, schemars::JsonSchema)]
pub struct BackgroundRun {
    /// The GPU it ran on: the plan's rank there, or past the plan's ranks a GPU the plan
    /// leaves to it.
    pub rank: u32,
    /// Its steps (at the background's batch).
    pub steps: u32,
    /// Its loss before each step.
    pub losses: Vec<f64>,
}

/// What each rank's GPU trains of the plan's background in `steps` steps of the plan:
/// (rank, whole background steps), for the ranks in `ranks` that train any.
pub(super) fn copies(background: &BackgroundRef, steps: u32, ranks: &[u32]) -> Vec<(u32, u32)> {
    ranks
        .iter()
        .filter_map(|&r| {
            let per_step = *background.iterations_per_step.get(r as usize)?;
            // Finite and ≥ 0 (the plan is validated); `as` saturates a huge product.
            let k = (per_step * f64::from(steps)).floor() as u32;
            (k > 0).then_some((r, k))
        })
        .collect()
}

/// The background's model file: where the plan recorded it, else beside the plan's
/// directory; its bytes must be the ones planned.
pub(super) fn model(background: &BackgroundRef, plan_file: &Path) -> Result<PathBuf, Error> {
    let path = find_model(&background.model, plan_file, "background model", "")?;
    let bytes = read(&path, InputKind::Model)?;
    let found = ralpc_codegen::model_hash(&bytes);
    if found != background.model.blake3 {
        return Err(Error::PlanFile(Box::new(format!(
            "{}: its background model {} is not the one planned (blake3 {found}, planned {}); \
             plan again",
            plan_file.display(),
            path.display(),
            background.model.blake3
        ))));
    }
    Ok(path)
}

/// Trains one copy: `steps` single-device steps of `model` at the background's batch,
/// seeded and stepped as the plan's run is.
pub(super) fn train(
    model: &Path,
    background: &BackgroundRef,
    rank: u32,
    steps: u32,
    options: &RunOptions,
) -> Result<BackgroundRun, Error> {
    let alone = RunOptions {
        steps,
        loss: None,
        data: None,
        report_tensors: false,
        ..options.clone()
    };
    let report = super::train_single_device(model, background.batch, &alone).map_err(|e| {
        Error::PlanFile(Box::new(format!(
            "the background job ({}) on rank {rank}'s GPU: {}",
            model.display(),
            super::chain(&e)
        )))
    })?;
    Ok(BackgroundRun {
        rank,
        steps,
        losses: report.losses,
    })
}
