//! `--background`: a one-GPU training job in the foreground plan's idle GPU time
//! (DeepPool's GPU multiplexing), and the cluster's throughput against static partitions
//! of its GPUs between the two jobs.

use ralpc_codegen::background::{fill, BackgroundJob, Filled};
use ralpc_codegen::BackgroundRef;
use serde::Serialize;

use super::*;

/// The background's batch when none is given: DeepPool's runtime default
/// (`runtime.py --be_batch_size`, 16; seojinpark/DeepPool @ 7922cac).
pub const DEFAULT_BACKGROUND_BATCH: u64 = 16;

/// What to run in the foreground's idle time.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct BackgroundOptions {
    /// The background model (anything `ralpc plan` reads), trained on one GPU.
    pub model: PathBuf,
    /// Its batch; `None`: [`DEFAULT_BACKGROUND_BATCH`].
    pub batch: Option<u64>,
    /// How much longer the foreground's iteration takes on GPUs that host the background
    /// (0.05: 5 % longer); ralpc's packing itself never overlaps the two.
    pub interference: f64,
}

/// The background job in the plan's report (`--json`'s `background`).
#[derive(Clone, Debug, PartialEq, Serialize, schemars::JsonSchema)]
pub struct BackgroundRow {
    /// The background model, as given.
    pub model: String,
    /// Its batch.
    pub batch: u64,
    /// Its iteration on a GPU of its own, µs.
    pub alone_iteration_us: f64,
    /// Its samples per second on a GPU of its own.
    pub alone_samples_per_second: f64,
    /// The most memory it holds, bytes.
    pub memory_bytes: u64,
    /// The foreground's slowdown factor asked for (`--interference`).
    pub interference: f64,
    /// The foreground with the background beside it, and the background's share of every
    /// GPU.
    #[serde(flatten)]
    pub filled: Filled,
    /// The foreground's samples per second beside the background.
    pub foreground_samples_per_second: f64,
    /// Foreground and background samples per second together.
    pub cluster_samples_per_second: f64,
    /// Static partitions of the GPUs: the foreground planned on some, the background alone
    /// on each of the rest (DeepPool's "cluster partition" baseline).
    pub partitions: Vec<PartitionRow>,
}

/// One static partition of the GPUs.
#[derive(Clone, Debug, PartialEq, Serialize, schemars::JsonSchema)]
pub struct PartitionRow {
    /// GPUs given to the foreground.
    pub foreground_gpus: u32,
    /// GPUs each running the background alone.
    pub background_gpus: u32,
    /// The foreground's iteration on its GPUs (simulated where lowered), µs.
    pub foreground_iteration_us: f64,
    /// The foreground's samples per second.
    pub foreground_samples_per_second: f64,
    /// The background's samples per second on its GPUs.
    pub background_samples_per_second: f64,
    /// Both together.
    pub cluster_samples_per_second: f64,
}

/// The background `asked` for in the spare time of `out`'s simulated foreground plan of
/// `options`, with the static partitions it is compared against, and what the executable
/// plan records of it for `ralpc run`.
pub(super) fn background(
    options: &PlanOptions,
    asked: &BackgroundOptions,
    out: &PlanOutput,
) -> Result<(BackgroundRow, BackgroundRef), Error> {
    let Some(foreground) = &out.executable else {
        return Err(request_error(match &out.not_lowered {
            Some(why) => format!(
                "--background packs the job into the foreground's executable plan, and this \
                 plan is not lowered: {why}"
            ),
            None => "--background needs the foreground's executable plan".into(),
        }));
    };
    if !(asked.interference.is_finite() && asked.interference >= 0.0) {
        return Err(request_error(format!(
            "--interference {}: a slowdown factor ≥ 0 (0.05: the foreground 5 % slower)",
            asked.interference
        )));
    }
    let batch = asked.batch.unwrap_or(DEFAULT_BACKGROUND_BATCH);
    let (job, model) = background_job(options, asked, batch)?;
    let capacity = out.report.memory_capacity_bytes as u64;
    if job.memory_bytes > capacity {
        return Err(request_error(format!(
            "--background {}: its {:.2} GiB at batch {batch} do not fit a GPU's {:.2} GiB on \
             its own",
            asked.model.display(),
            job.memory_bytes as f64 / GIB,
            capacity as f64 / GIB
        )));
    }
    let filled = fill(
        out.report.gpus,
        &foreground.simulation,
        &foreground.spare_us,
        &job,
        capacity,
        asked.interference,
    );
    let foreground_samples_per_second =
        per_second(out.report.batch, filled.foreground_iteration_us);
    let alone = job.alone_samples_per_second();
    let partitions = partitions(options, out, foreground, alone)?;
    let recorded = BackgroundRef {
        model,
        batch,
        iterations_per_step: filled
            .gpus
            .iter()
            .map(|g| g.iterations_per_foreground_iteration)
            .collect(),
    };
    let row = BackgroundRow {
        model: asked.model.display().to_string(),
        batch,
        alone_iteration_us: job.iteration_us,
        alone_samples_per_second: alone,
        memory_bytes: job.memory_bytes,
        interference: asked.interference,
        cluster_samples_per_second: foreground_samples_per_second + filled.samples_per_second,
        foreground_samples_per_second,
        filled,
        partitions,
    };
    Ok((row, recorded))
}

/// The background's one-GPU program, planned and simulated on one GPU of the foreground's
/// cluster at the foreground's precision and optimizer, and its model as its plan names it.
fn background_job(
    options: &PlanOptions,
    asked: &BackgroundOptions,
    batch: u64,
) -> Result<(BackgroundJob, ralpc_codegen::ModelRef), Error> {
    let alone = PlanOptions {
        model: asked.model.clone(),
        gpus: Some(1),
        cluster: options.cluster.clone(),
        batch: Some(batch),
        optimizer: options.optimizer,
        precision: options.precision,
        memory_limit: options.memory_limit,
        executable: true,
        ..PlanOptions::default()
    };
    let named = |e: Error| match e {
        Error::Plan(e) => request_error(format!("--background {}: {e}", asked.model.display())),
        other => other,
    };
    let planned = plan_as_asked(&alone).map_err(named)?;
    let Some(executable) = planned.executable else {
        return Err(request_error(format!(
            "--background {}: its one-GPU plan is not lowered{}",
            asked.model.display(),
            planned
                .not_lowered
                .map(|why| format!(": {why}"))
                .unwrap_or_default()
        )));
    };
    Ok((
        BackgroundJob::of(&executable.simulation, batch),
        executable.plan.model,
    ))
}

/// The foreground on 1, 2, 4, … of the GPUs (each plan as asked, simulated where lowered)
/// and the background alone on each of the rest, then the foreground on all of them.
/// A partition whose foreground does not plan (it does not fit fewer GPUs) is left out.
fn partitions(
    options: &PlanOptions,
    out: &PlanOutput,
    foreground: &Executable,
    background_alone: f64,
) -> Result<Vec<PartitionRow>, Error> {
    let gpus = out.report.gpus;
    let row = |k: u32, iteration_us: f64| {
        let fg = per_second(out.report.batch, iteration_us);
        let bg = f64::from(gpus - k) * background_alone;
        PartitionRow {
            foreground_gpus: k,
            background_gpus: gpus - k,
            foreground_iteration_us: iteration_us,
            foreground_samples_per_second: fg,
            background_samples_per_second: bg,
            cluster_samples_per_second: fg + bg,
        }
    };
    let mut rows = Vec::new();
    for k in std::iter::successors(Some(1u32), |k| k.checked_mul(2)).take_while(|&k| k < gpus) {
        let fewer = PlanOptions {
            gpus: Some(k),
            background: None,
            ..options.clone()
        };
        match plan_as_asked(&fewer) {
            Ok(planned) => {
                let iteration = planned
                    .executable
                    .as_ref()
                    .map_or(planned.report.iteration_time_us, |e| {
                        e.simulation.iteration_time_us
                    });
                rows.push(row(k, iteration));
            }
            Err(Error::Plan(_)) => {}
            Err(other) => return Err(other),
        }
    }
    rows.push(row(gpus, foreground.simulation.iteration_time_us));
    Ok(rows)
}

/// What a user should know about the background's figures.
pub(super) fn warnings(row: &BackgroundRow) -> Vec<String> {
    let mut out = Vec::new();
    if row.interference == 0.0 && row.filled.samples_per_second > 0.0 {
        out.push(
            "the plan's slowdown beside the background job is not priced (--interference 0): \
             ralpc knows no published measurement of a training job beside a low-priority one \
             to take it from; --interference F prices the plan F slower on GPUs hosting it"
                .to_owned(),
        );
    }
    if let Some(best) = row
        .partitions
        .iter()
        .filter(|p| p.cluster_samples_per_second > row.cluster_samples_per_second)
        .max_by(|a, b| {
            a.cluster_samples_per_second
                .total_cmp(&b.cluster_samples_per_second)
        })
    {
        out.push(format!(
            "the GPUs split between the jobs ({} for the plan, {} for the background) train \
             {:.1} samples/s, more than the background beside the plan ({:.1})",
            best.foreground_gpus,
            best.background_gpus,
            best.cluster_samples_per_second,
            row.cluster_samples_per_second
        ));
    }
    out
}

const GIB: f64 = (1u64 << 30) as f64;

fn per_second(samples: u64, iteration_us: f64) -> f64 {
    if iteration_us > 0.0 {
        samples as f64 * 1e6 / iteration_us
    } else {
        0.0
    }
}
