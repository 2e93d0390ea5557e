//! `ralpc sweep MODEL --gpus 1,2,4,8 [--gpu-types a100,h100,v100]`.

use std::fmt::Write;
use std::path::{Path, PathBuf};

use ralpc::gavel;
use ralpc::passes::cost::Optimizer;
use ralpc::passes::plan::Family;
use ralpc::{PlanOptions, SweepOptions, SweepRow};

pub const EXAMPLES: &str = "\
Examples:
  ralpc sweep fixtures/onnx/vgg16/model.onnx --gpus 1,2,4,8,16,32
  ralpc sweep model.onnx --gpus 1,8,64 --gpu-types a100,h100,v100 --csv > matrix.csv
  ralpc sweep model.onnx --gpus 1,2,4,8 --json -o sweep/   # sweep/report.html: curves
  ralpc sweep vgg16.onnx --gpus 1,2,4,8 --gpu-types a100,h100,v100 --gavel throughputs.json
                                     # adds vgg16's rows to Gavel's throughput file

GPU types: a100 (dgx-a100 servers), h100 (dgx-h100), v100 (p3dn-v100), or any cluster
preset or TOML file; the cluster grows to the GPU count. Each point is the best plan
(--strategy, default auto); points where no plan fits say why.";

/// The files `-o DIR` holds.
const SWEEP_FILES: [&str; 3] = ["sweep.csv", "sweep.json", "report.html"];

/// Arguments of `ralpc sweep`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// An ONNX model, or a PipeDream profiler `graph.txt`.
    pub model: PathBuf,
    /// GPU counts, comma-separated.
    #[arg(long, value_delimiter = ',', required = true,
          value_parser = clap::value_parser!(u32).range(1..=65536))]
    pub gpus: Vec<u32>,
    /// GPU types or cluster presets, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "a100")]
    pub gpu_types: Vec<String>,
    /// Global batch for ONNX models [default: the model's, or 32].
    #[arg(long, value_parser = super::parse_positive)]
    pub batch: Option<u64>,
    /// Samples per GPU instead of a global batch: each point trains this many times its
    /// GPUs (weak scaling, as Gavel's jobs do).
    #[arg(long, value_name = "B", value_parser = super::parse_positive, conflicts_with = "batch")]
    pub per_gpu_batch: Option<u64>,
    /// Full shape of one input, batch included, e.g. `input_ids=8,2048` to plan a GPT at
    /// sequence 2048 or `images=16,3,800,1333` (repeatable; the rest keep the model's own).
    #[arg(long = "input", value_name = "NAME=D0,D1,...", value_parser = super::parse_input_shape)]
    pub inputs: Vec<(String, Vec<u64>)>,
    /// Which plans to search at each point.
    #[arg(long, default_value = "auto", value_parser = ["auto", "dp", "burst", "soap", "pipeline"])]
    pub strategy: String,
    /// Allowed GPU-sec amplification above 1: plans use at most (1 + X) × the single-GPU
    /// time in GPU time (`inf`: no budget) [default: 1; inf with --gavel, whose jobs take
    /// their GPUs whatever they make of them].
    #[arg(long, value_parser = super::parse_tolerance)]
    pub tolerance: Option<f64>,
    /// Per-GPU memory limit below the GPUs' own (e.g. `16GiB`).
    #[arg(long, value_parser = ralpc::passes::units::parse_bytes)]
    pub memory_limit: Option<u64>,
    /// The optimizer, whose state counts in memory.
    #[arg(long, default_value = "momentum", value_parser = ["sgd", "momentum", "adam"])]
    pub optimizer: String,
    /// Print CSV instead of the table.
    #[arg(long, conflicts_with = "json")]
    pub csv: bool,
    /// Print JSON (an array of points) instead of the table.
    #[arg(long)]
    pub json: bool,
    /// Also write `sweep.csv`, `sweep.json` and `report.html` (scaling curves) here.
    #[arg(short = 'o', long = "out", value_name = "DIR")]
    pub out: Option<PathBuf>,
    /// Add the points to this Gavel throughput file (created if missing; other jobs'
    /// entries kept): per GPU type, the job `('NAME (batch size B)', N)` — B samples on
    /// each of its N GPUs — runs N steps per iteration, per second alone (0 where nothing
    /// fits), as Gavel counts its workers' steps.
    #[arg(
        long,
        value_name = "FILE",
        requires = "per_gpu_batch",
        conflicts_with = "batch"
    )]
    pub gavel: Option<PathBuf>,
    /// The job's name in the Gavel file [default: the model file's name, or its folder's
    /// when that is `model`].
    #[arg(long, value_name = "NAME", requires = "gavel")]
    pub gavel_job: Option<String>,
    /// Write into DIR even where a file there is the model.
    #[arg(long)]
    pub force: bool,
}

pub fn run(args: &Args) -> Result<(), ralpc::Error> {
    if let Some(dir) = &args.out {
        for name in SWEEP_FILES {
            ralpc::refuse_overwriting_inputs(&dir.join(name), &[&args.model], args.force)?;
        }
    }
    if let Some(file) = &args.gavel {
        ralpc::refuse_overwriting_inputs(file, &[&args.model], args.force)?;
    }
    let options = SweepOptions {
        base: PlanOptions {
            model: args.model.clone(),
            batch: args.batch,
            inputs: args.inputs.iter().cloned().collect(),
            family: Family::parse(&args.strategy),
            tolerance: Some(args.tolerance.unwrap_or(match args.gavel {
                Some(_) => f64::INFINITY,
                None => 1.0,
            }))
            .filter(|t| t.is_finite()),
            memory_limit: args.memory_limit,
            optimizer: Optimizer::parse(&args.optimizer).unwrap_or_default(),
            ..PlanOptions::default()
        },
        gpus: args.gpus.clone(),
        gpu_types: args.gpu_types.clone(),
        per_gpu_batch: args.per_gpu_batch,
    };
    // Drawn only when stderr is a terminal.
    let bar = super::progress(
        "planning {bar:30} {pos}/{len} points",
        Some((args.gpus.len() * args.gpu_types.len()) as u64),
        true,
    );
    let rows = ralpc::sweep(&options, &|| bar.inc(1));
    bar.finish_and_clear();
    let rows = rows?;
    let summary = ralpc::formats::SweepSummary {
        format: ralpc::formats::SWEEP,
        model: args.model.display().to_string(),
        points: rows,
    };
    let rows = &summary.points;
    let json = serde_json::to_string_pretty(&summary).unwrap_or_default() + "\n";
    let csv = ralpc::sweep_csv(rows);
    if let Some(dir) = &args.out {
        std::fs::create_dir_all(dir).map_err(|error| {
            ralpc::Error::Write(Box::new(ralpc::FileError {
                path: dir.display().to_string(),
                error,
            }))
        })?;
        let model = args.model.display().to_string();
        let html = ralpc::sweep_report_html(&model, rows);
        ralpc::write_set_atomically(
            dir,
            &[
                (SWEEP_FILES[0], &csv),
                (SWEEP_FILES[1], &json),
                (SWEEP_FILES[2], &html),
            ],
        )?;
    }
    if let Some(file) = &args.gavel {
        write_gavel(args, file, rows)?;
    }
    let text = if args.json {
        json
    } else if args.csv {
        csv
    } else {
        table(rows)
    };
    super::print_stdout(&text);
    Ok(())
}

/// Adds the sweep's points to Gavel's throughput file `file`.
fn write_gavel(args: &Args, file: &Path, rows: &[SweepRow]) -> Result<(), ralpc::Error> {
    // (`--gavel` requires `--per-gpu-batch`.)
    let per_gpu_batch = args.per_gpu_batch.unwrap_or(1);
    let job = args
        .gavel_job
        .clone()
        .unwrap_or_else(|| job_name(&args.model));
    let throughputs = gavel::add(gavel::read(file)?, &job, per_gpu_batch, rows);
    ralpc::write_atomically(file, &gavel::to_json(&throughputs))
}

/// A model's job name: its file's stem, or its folder's name when the stem says nothing
/// (`vgg16/model.onnx`).
fn job_name(model: &Path) -> String {
    let stem = model.file_stem().map(|s| s.to_string_lossy().into_owned());
    match stem.as_deref() {
        Some("model" | "graph") | None => model
            .parent()
            .and_then(|p| p.file_name())
            .map_or_else(|| "model".to_owned(), |n| n.to_string_lossy().into_owned()),
        Some(stem) => stem.to_owned(),
    }
}

fn table(rows: &[SweepRow]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:<10} {:>6} {:>6}  {:<9} {:>12} {:>12} {:>8} {:>10} {:>6} {:>10}",
        "GPU type",
        "GPUs",
        "used",
        "strategy",
        "iteration",
        "samples/s",
        "speedup",
        "efficiency",
        "ampl.",
        "memory"
    );
    for r in rows {
        let _ = match &r.error {
            Some(e) => writeln!(out, "{:<10} {:>6}  no plan: {e}", r.gpu_type, r.gpus),
            None => {
                let [used, strategy, iteration, rate, speedup, efficiency, ampl, memory] =
                    r.cells();
                writeln!(
                    out,
                    "{:<10} {:>6} {used:>6}  {strategy:<9} {iteration:>12} {rate:>12} {speedup:>8} \
                     {efficiency:>10} {ampl:>6} {memory:>10}",
                    r.gpu_type, r.gpus
                )
            }
        };
    }
    out
}
