//! `ralpc run PLAN --backend cpu [--steps N] [--seed S] [--data FILE] [--json]`.

use std::fmt::Write;
use std::path::PathBuf;
use std::time::Duration;

use ralpc::args::BadArgument;
use ralpc::runtime::cpu::exec::{Fault, FaultKind, RankError, RunError};
use ralpc::runtime::cpu::train::Loss;
use ralpc::runtime::dist::Placement;
use ralpc::RunOptions;

pub const EXAMPLES: &str = "\
Examples:
  ralpc fixtures/train/cnn.onnx --gpus 4 --batch 8 -o cnn.ralpc
  ralpc run cnn.ralpc --steps 5              # 4 ranks as threads of this process
  ralpc run cnn.ralpc/plan.json --json       # {\"losses\": [...], \"samples_per_s\": ...}
  ralpc run cnn.ralpc --data batch.json      # your inputs and labels
  ralpc run cnn.ralpc --steps 100 --checkpoint-every 10     # cnn.ralpc/checkpoint.safetensors
  ralpc run cnn.ralpc --steps 100 --resume cnn.ralpc/checkpoint.safetensors
  ralpc launch cnn.ralpc --steps 5           # the same, one process per rank
  torchrun --nproc-per-node 4 --no-python ralpc run cnn.ralpc   # any launcher

Under a launcher (RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT as torchrun sets them, or
Slurm's or Open MPI's variables) each process runs its own rank and talks to the
others over TCP; rank 0 prints the results.

The CPU backend runs the exact plan a GPU cluster would: every rank's forward and
backward on its share of each layer, every message and collective, then SGD with
momentum. Its numbers equal single-device training, so a plan can be checked before
GPU time is spent on it. A model without weights (structure only) is initialized from
--seed, and so are inputs and labels unless --data gives them:
  {\"inputs\": {\"<input name>\": [values, row-major, whole batch]}, \"labels\": [...]}
(labels: one class per output row for cross-entropy, one target per element for mse).
The batch and input shapes are the plan's: set them when planning, e.g.
  ralpc plan model.onnx --gpus 4 --input x=8,512,16 -o m.ralpc && ralpc run m.ralpc";

/// Arguments of `ralpc run`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The plan: a directory `ralpc plan` wrote, or its plan.json.
    pub plan: PathBuf,
    /// Where every rank's layers compute: `cpu`, or `cuda` (GPU 0, or under a launcher
    /// the GPU of the process's LOCAL_RANK; tensors stay on the GPU, and a data-parallel
    /// plan sums its gradients there).
    #[arg(long, default_value = "cpu", value_parser = ["cpu", "cuda"])]
    pub backend: String,
    /// The model [default: the path the plan was made from].
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// Training iterations.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    pub steps: u32,
    /// Seeds weights the model lacks, and inputs and labels without --data.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Inputs and labels for the global batch (JSON).
    #[arg(long, value_name = "FILE")]
    pub data: Option<PathBuf>,
    /// The loss added on the model's first output (auto: cross-entropy where it has
    /// classes along an axis of their own, mse where it is one value per sample).
    #[arg(long, default_value = "auto", value_parser = ["auto", "cross-entropy", "mse"])]
    pub loss: String,
    /// SGD learning rate (finite, >= 0).
    #[arg(long, default_value_t = 0.01, value_parser = super::parse_learning_rate)]
    pub lr: f32,
    /// SGD momentum, in [0, 1).
    #[arg(long, default_value_t = 0.9, value_parser = super::parse_momentum)]
    pub momentum: f32,
    /// Seconds a rank waits for another before every rank stops with an error (at most a
    /// year).
    #[arg(long, default_value_t = 60, value_parser = super::parse_seconds)]
    pub timeout: u64,
    /// Write the weights and optimizer state after every N steps (atomically).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub checkpoint_every: Option<u32>,
    /// The checkpoint file [default: checkpoint.safetensors beside the plan].
    #[arg(long, value_name = "FILE")]
    pub checkpoint: Option<PathBuf>,
    /// Continue from a checkpoint of this plan: the same losses as an uninterrupted run.
    #[arg(long, value_name = "FILE")]
    pub resume: Option<PathBuf>,
    /// Print one JSON object: losses (one per step), samples/s and the run's shape.
    #[arg(long)]
    pub json: bool,
    /// Inject a fault: RANK:INSTRUCTION[:panic|hang|exit] (for testing failure handling).
    #[arg(long, hide = true, value_parser = parse_fault)]
    pub fault: Option<Fault>,
}

/// Environment variable `ralpc launch` sets: a directory where each failing process
/// leaves its error (`rank-R.txt`), so the launcher can name the cause.
pub const LAUNCH_REPORTS: &str = "RALPC_LAUNCH_REPORTS";

/// Under a launcher: leaves this rank's error for `ralpc launch`, or — for an injected
/// `exit` fault — exits at once with no word, as a killed process would.
fn report_to_launcher(rank: u32, fault: Option<Fault>, e: &ralpc::Error) {
    // The error and its causes on one line: the launcher reads it back to name the cause.
    let mut message = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        let _ = write!(message, ": {s}");
        source = s.source();
    }
    let killed = matches!(
        e,
        ralpc::Error::Ranks(r) if matches!(
            **r,
            RunError::Rank { ref cause, .. } if matches!(**cause, RankError::Killed)
        )
    );
    if fault.is_some_and(|f| f.rank == rank && f.kind == FaultKind::Exit) && killed {
        std::process::exit(137);
    }
    if let Some(dir) = std::env::var_os(LAUNCH_REPORTS) {
        let _ = std::fs::write(
            std::path::Path::new(&dir).join(format!("rank-{rank}.txt")),
            message,
        );
    }
}

/// Parses `RANK:INSTRUCTION[:panic|hang|exit]`.
fn parse_fault(s: &str) -> Result<Fault, BadArgument> {
    let parts: Vec<&str> = s.split(':').collect();
    let number = |p: &str| {
        p.parse::<u64>()
            .map_err(|_| BadArgument(format!("'{p}' is not a number")))
    };
    let (rank, instruction) = match parts.as_slice() {
        [r, i] | [r, i, _] => (number(r)?, number(i)?),
        _ => {
            return Err(BadArgument(
                "expected RANK:INSTRUCTION[:panic|hang|exit]".to_owned(),
            ))
        }
    };
    let kind = match parts.get(2).copied().unwrap_or("panic") {
        "panic" => FaultKind::Panic,
        "hang" => FaultKind::Hang,
        "exit" => FaultKind::Exit,
        other => return Err(BadArgument(format!("'{other}' is not panic, hang or exit"))),
    };
    Ok(Fault {
        rank: u32::try_from(rank).map_err(|_| BadArgument("the rank is too large".to_owned()))?,
        instruction: instruction as usize,
        kind,
    })
}

pub fn run(args: &Args) -> Result<(), ralpc::Error> {
    let options = RunOptions {
        plan: args.plan.clone(),
        model: args.model.clone(),
        steps: args.steps,
        seed: args.seed,
        lr: args.lr,
        momentum: args.momentum,
        loss: Loss::parse(&args.loss),
        timeout: Duration::from_secs(args.timeout),
        data: args.data.clone(),
        checkpoint_every: args.checkpoint_every,
        checkpoint: args.checkpoint.clone(),
        resume: args.resume.clone(),
        fault: args.fault,
        backend: if args.backend == "cuda" {
            ralpc::Backend::Cuda
        } else {
            ralpc::Backend::Cpu
        },
        placement: Placement::from_env().map_err(|e| ralpc::Error::Join {
            rank: None,
            source: Box::new(e),
        })?,
        // The summary shows the losses: no host copies of the model.
        report_tensors: false,
    };
    if options.backend == ralpc::Backend::Cuda {
        use ralpc::runtime::cuda::libs::{self, Lib};
        // NCCL when it is anywhere: processes on distinct GPUs sum gradients with it.
        let mut wanted = Lib::ONE_GPU.to_vec();
        if libs::locate(&[Lib::Nccl]).is_ok() {
            wanted.push(Lib::Nccl);
        }
        super::restart_with(&wanted)?;
    }
    // Under a launcher every process runs this; rank 0 speaks for the run.
    let speaks = options.placement.as_ref().is_none_or(|p| p.rank == 0);
    let spinner = super::spinner(
        format!(
            "training {} step(s) on the {}",
            args.steps,
            if options.backend == ralpc::Backend::Cuda {
                "GPU"
            } else {
                "CPU"
            }
        ),
        speaks,
    );
    let result = ralpc::run(&options);
    spinner.finish_and_clear();
    let out = match result {
        Ok(out) => out,
        Err(e) => {
            if let Some(p) = &options.placement {
                report_to_launcher(p.rank, args.fault, &e);
            }
            return Err(e);
        }
    };
    if !speaks {
        return Ok(());
    }
    if out.seeded_weights > 0 && args.data.is_none() {
        eprintln!(
            "note: the model carries no data for {} weight tensor(s); they, the inputs and the \
             labels are seeded (--seed {})",
            out.seeded_weights, args.seed
        );
    } else if out.seeded_weights > 0 {
        eprintln!(
            "note: the model carries no data for {} weight tensor(s); they are seeded (--seed {})",
            out.seeded_weights, args.seed
        );
    }
    let text = if args.json {
        let summary = ralpc::formats::RunSummary {
            format: ralpc::formats::RUN,
            losses: out.report.losses.clone(),
            samples_per_s: out.samples_per_s,
            seconds: out.seconds,
            step_seconds: out.report.step_seconds.clone(),
            steps: args.steps,
            ranks: out.ranks,
            processes: options.placement.as_ref().map_or(1, |p| p.world),
            batch: out.batch,
            backend: args.backend.clone(),
            seeded_weights: out.seeded_weights,
            background: out.background.clone(),
            background_not_run: out.background_not_run.clone(),
        };
        serde_json::to_string_pretty(&summary).unwrap_or_default() + "\n"
    } else {
        let mut text = String::new();
        for (i, loss) in out.report.losses.iter().enumerate() {
            let _ = writeln!(text, "step {:>4}  loss {loss:.6}", i + 1);
        }
        let _ = writeln!(
            text,
            "{} step(s) of batch {} on {} {} rank(s): {:.1} samples/s ({:.3} s)",
            args.steps,
            out.batch,
            out.ranks,
            args.backend.to_uppercase(),
            out.samples_per_s,
            out.seconds
        );
        for copy in &out.background {
            let _ = writeln!(
                text,
                "background on GPU {}: {} step(s), loss {:.6} → {:.6}",
                copy.rank,
                copy.steps,
                copy.losses.first().copied().unwrap_or(f64::NAN),
                copy.losses.last().copied().unwrap_or(f64::NAN)
            );
        }
        if let Some(why) = &out.background_not_run {
            let _ = writeln!(text, "background: not run: {why}");
        }
        text
    };
    super::print_stdout(&text);
    Ok(())
}
