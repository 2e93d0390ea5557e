//! Command-line definitions and error rendering.

use std::io::{IsTerminal, Write};

use clap::{Parser, Subcommand};

use crate::commands;
use crate::printable;

const EXIT_CODES: &str = "\
Exit status:
  0    success
  1    the input is at fault: unreadable or malformed model, unsupported operator,
       shape mismatch, bad --batch/--input, unknown or invalid cluster, bad
       profile or strategy file, a model that fits no plan's memory, a
       --tolerance no plan meets, `plan --check` on an out-of-date directory,
       a malformed plan or one made for another model, bad --data
  2    usage error (unknown flag, bad value)
  3    an output file cannot be written (nothing partial is left behind)
  4    `ralpc run` failed: a rank failed or timed out (every rank stops), or the
       plan uses a layout the backend cannot execute
  101  internal error: a bug in ralpc (a rank of `ralpc run` panicked, or the plan
       and what a rank computes disagree); please report it with `ralpc --version`";

/// ralpc — a layer-placement compiler for deep-learning training.
///
/// It reads an ONNX model and decides, layer by layer, how training is spread over the
/// GPUs of a cluster: `ralpc plan` (or just `ralpc MODEL --gpus N`) searches data-parallel,
/// burst-parallel, SOAP and pipeline plans and writes the executable plan with its report;
/// `ralpc sweep` finds the best plan for every GPU type and count; `ralpc inspect` shows
/// per-layer parameters, MACs, FLOPs and memory; `ralpc cluster` shows the machines plans
/// are made for; `ralpc run` trains with a plan on the CPU, every rank a thread (or,
/// with `ralpc launch` or another launcher, one process per rank);
/// `ralpc profile` measures a model's ops for the cost model.
#[derive(Debug, Parser)]
#[command(name = "ralpc", version, after_help = EXIT_CODES, propagate_version = true)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// Subcommand names: anything else in first position is a model for `ralpc plan`.
pub const SUBCOMMANDS: [&str; 9] = [
    "inspect", "plan", "cluster", "sweep", "run", "launch", "profile", "doctor", "help",
];

/// `ralpc MODEL …` → `ralpc plan MODEL …` when the first word looks like a file (it
/// exists, or has a `.` or `/`); any other word stays a (mistyped) subcommand for clap to
/// reject with a usage error.
pub fn expand_shorthand(mut args: Vec<std::ffi::OsString>) -> Vec<std::ffi::OsString> {
    if let Some(first) = args.get(1) {
        let text = first.to_string_lossy();
        let is_path = std::path::Path::new(first).exists() || text.contains(['.', '/']);
        if !text.starts_with('-') && !SUBCOMMANDS.contains(&text.as_ref()) && is_path {
            args.insert(1, "plan".into());
        }
    }
    args
}

/// Subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Show a model's layers: output shapes, parameters, MACs, FLOPs and memory.
    #[command(after_help = commands::inspect::EXAMPLES)]
    Inspect(commands::inspect::Args),
    /// Plan how every layer is spread over the GPUs (`ralpc MODEL …` is short for this).
    #[command(after_help = commands::plan::EXAMPLES)]
    Plan(Box<commands::plan::Args>),
    /// The best plan for every GPU type and count: throughput, speedup, efficiency.
    #[command(after_help = commands::sweep::EXAMPLES)]
    Sweep(Box<commands::sweep::Args>),
    /// Run a plan's training steps on the CPU (or a GPU, `--backend cuda`): every rank,
    /// message and collective, with numbers equal to single-device training.
    #[command(after_help = commands::run::EXAMPLES)]
    Run(Box<commands::run::Args>),
    /// Run a plan with one process per rank on this machine (`ralpc run` under a
    /// launcher's environment).
    #[command(after_help = commands::launch::EXAMPLES)]
    Launch(Box<commands::launch::Args>),
    /// Measure a model's ops (forward and backward, per batch size) into a profile the
    /// planner reads with --profile.
    #[command(after_help = commands::profile::EXAMPLES)]
    Profile(Box<commands::profile::Args>),
    /// Check this machine for CUDA training: libraries, driver, GPUs, kernels.
    #[command(after_help = commands::doctor::EXAMPLES)]
    Doctor(commands::doctor::Args),
    /// Show a cluster: GPUs, their peaks and memory, and the links between them.
    #[command(after_help = commands::cluster::EXAMPLES)]
    Cluster(commands::cluster::Args),
}

impl Command {
    /// Whether the command was asked for JSON (`--json`): its errors are JSON too.
    pub fn json(&self) -> bool {
        match self {
            Command::Inspect(args) => args.json,
            Command::Plan(args) => args.json,
            Command::Sweep(args) => args.json,
            Command::Run(args) => args.json,
            Command::Doctor(args) => args.json,
            Command::Launch(_) | Command::Profile(_) | Command::Cluster(_) => false,
        }
    }
}

/// Prints `error: …` and its `Caused by:` chain on stderr (red `error:` on a terminal
/// unless `NO_COLOR` is set).
pub fn report_error(e: &ralpc::Error, json: bool) {
    if json {
        let report = ralpc::formats::ErrorReport::of(e);
        // Serializing strings and an integer cannot fail.
        let text = serde_json::to_string_pretty(&report).unwrap_or_default();
        let _ = writeln!(std::io::stderr().lock(), "{text}");
        return;
    }
    let stderr = std::io::stderr();
    let colour = stderr.is_terminal() && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty());
    let mut out = stderr.lock();
    let label = if colour {
        "\x1b[1;31merror\x1b[0m"
    } else {
        "error"
    };
    // Messages quote names from models and files: escaped, continuation lines indented.
    let _ = writeln!(out, "{label}: {}", printable::message(&e.to_string(), "  "));
    let mut source = std::error::Error::source(e);
    if source.is_some() {
        let _ = writeln!(out, "\nCaused by:");
    }
    while let Some(s) = source {
        let _ = writeln!(out, "  {}", printable::message(&s.to_string(), "  "));
        source = s.source();
    }
}
