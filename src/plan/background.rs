//! `--background`: a one-GPU training job in the foreground plan's idle GPU time
//! (DeepPool's GPU multiplexing), and the cluster's throughput against static partitions
//! of its GPUs between the two jobs.

use ralpc_codegen::background::{fill, per_second, BackgroundJob, Filled};
use ralpc_codegen::BackgroundRef;
use serde::Serialize;

use super::*;

/// The background's batch when none is given (and the model records none, as a PipeDream
/// graph does): DeepPool's runtime default (`runtime.py --be_batch_size`, 16;
/// seojinpark/DeepPool @ 7922cac).
pub const DEFAULT_BACKGROUND_BATCH: u64 = 16;

/// What to run in the foreground's idle time.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct BackgroundOptions {
    /// The background model (anything `ralpc plan` reads), trained on one GPU.
    pub model: PathBuf,
    /// Its batch; `None`: the one a PipeDream graph records, else
    /// [`DEFAULT_BACKGROUND_BATCH`].
    pub batch: Option<u64>,
    /// How much longer the foreground's iteration takes on GPUs that host the background
    /// (0.05: 5 % longer); not priced otherwise.
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
    /// Partitions left out, and why (the foreground planned on that many GPUs as asked
    /// does not plan).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub partitions_not_planned: Vec<String>,
}

/// One static partition of the GPUs.
#[derive(Clone, Debug, PartialEq, Serialize, schemars::JsonSchema)]
pub struct PartitionRow {
    /// GPUs given to the foreground.
    pub foreground_gpus: u32,
    /// GPUs each running the background alone: the rest, and those the foreground's plan
    /// on its GPUs leaves unused.
    pub background_gpus: u32,
    /// The foreground's iteration on its GPUs (predicted; simulated for all the GPUs), µs.
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
                "--background runs the job in the foreground's executable plan's spare time, \
                 and this plan is not lowered: {why}"
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
    one_gpu_type(options, "--background")?;
    let (job, model, batch) = background_job(options, asked)?;
    let capacity = out.report.memory_capacity_bytes as u64;
    if job.memory_bytes > capacity {
        return Err(request_error(format!(
            "--background {}: its {} at batch {batch} do not fit a GPU's {} on its own",
            asked.model.display(),
            crate::run::size(job.memory_bytes),
            crate::run::size(capacity)
        )));
    }
    // One process runs both jobs, as DeepPool's runtime does: one kernel workspace.
    let shared = ralpc_passes::cost::memory::DEFAULT_WORKSPACE_BYTES as u64;
    let filled = fill(
        out.report.gpus,
        &foreground.simulation,
        &foreground.spare_us,
        &job,
        (capacity, shared),
        asked.interference,
    );
    let foreground_samples_per_second =
        per_second(out.report.batch as f64, filled.foreground_iteration_us);
    let alone = job.alone_samples_per_second();
    let (partitions, partitions_not_planned) = partitions(options, out, foreground, alone)?;
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
        partitions_not_planned,
    };
    Ok((row, recorded))
}

/// The background's one-GPU program, planned and simulated on one GPU of the foreground's
/// cluster at the foreground's precision and optimizer; its model as its plan names it;
/// its batch.
fn background_job(
    options: &PlanOptions,
    asked: &BackgroundOptions,
) -> Result<(BackgroundJob, ralpc_codegen::ModelRef, u64), Error> {
    let shown = asked.model.display();
    let named = |e: Error| match e {
        // A bug stays one.
        Error::Internal(_) => e,
        e => request_error(format!(
            "--background {shown}: {e}{}",
            crate::run::chain(&e)
        )),
    };
    // A PipeDream graph keeps the batch it was measured at.
    let records_batch = read_input_text(&asked.model, InputKind::Text)
        .is_ok_and(|text| profile::is_pipedream_graph(&text));
    let batch = match asked.batch {
        None if records_batch => None,
        given => Some(given.unwrap_or(DEFAULT_BACKGROUND_BATCH)),
    };
    let alone = PlanOptions {
        model: asked.model.clone(),
        gpus: Some(1),
        cluster: options.cluster.clone(),
        batch,
        optimizer: options.optimizer,
        precision: options.precision,
        memory_limit: options.memory_limit,
        executable: true,
        ..PlanOptions::default()
    };
    let planned = plan_as_asked(&alone).map_err(named)?;
    let Some(executable) = planned.executable else {
        return Err(request_error(format!(
            "--background {shown}: its one-GPU plan is not lowered{}",
            planned
                .not_lowered
                .map(|why| format!(": {why}"))
                .unwrap_or_default()
        )));
    };
    let batch = executable.plan.batch;
    Ok((
        BackgroundJob::of(&executable.simulation, batch),
        executable.plan.model,
        batch,
    ))
}

/// The foreground on 1, 2, 4 and half of the GPUs (DeepPool's partitions of 8: 1 + 7,
/// 2 + 6, 4 + 4), each plan as asked and priced, the background alone on every GPU it
/// leaves; then the foreground as simulated on all of them. A partition whose foreground
/// does not plan is left out, with why.
fn partitions(
    options: &PlanOptions,
    out: &PlanOutput,
    foreground: &Executable,
    background_alone: f64,
) -> Result<(Vec<PartitionRow>, Vec<String>), Error> {
    let gpus = out.report.gpus;
    let row = |k: u32, used: u32, batch: u64, iteration_us: f64| {
        let fg = per_second(batch as f64, iteration_us);
        let bg = f64::from(gpus - used.min(gpus)) * background_alone;
        PartitionRow {
            foreground_gpus: k,
            background_gpus: gpus - used.min(gpus),
            foreground_iteration_us: iteration_us,
            foreground_samples_per_second: fg,
            background_samples_per_second: bg,
            cluster_samples_per_second: fg + bg,
        }
    };
    let mut sizes: Vec<u32> = [1, 2, 4, gpus / 2]
        .into_iter()
        .filter(|&k| k >= 1 && k < gpus)
        .collect();
    sizes.dedup();
    let (mut rows, mut not_planned) = (Vec::new(), Vec::new());
    for k in sizes {
        let fewer = PlanOptions {
            gpus: Some(k),
            background: None,
            executable: false,
            ..options.clone()
        };
        match plan_as_asked(&fewer) {
            Ok(planned) => {
                let r = &planned.report;
                rows.push(row(k, r.gpus_used, r.batch, r.iteration_time_us));
            }
            Err(Error::Internal(e)) => return Err(Error::Internal(e)),
            Err(e) => not_planned.push(format!("{k} for the plan: {e}{}", crate::run::chain(&e))),
        }
    }
    let used = foreground
        .simulation
        .ranks
        .iter()
        .filter(|t| !t.spans.is_empty())
        .count() as u32;
    rows.push(row(
        gpus,
        used,
        out.report.batch,
        foreground.simulation.iteration_time_us,
    ));
    Ok((rows, not_planned))
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
    for why in &row.partitions_not_planned {
        out.push(format!("a partition of the GPUs is not compared: {why}"));
    }
    out
}
