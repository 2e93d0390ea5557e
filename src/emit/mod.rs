//! `--emit`: a chosen plan written for another training engine.
//!
//! * [`torch_script`]: a standalone Python file that applies the plan to the user's own
//!   model class with PyTorch's distributed APIs and trains it under `torchrun`.
//! * [`megatron_arguments`]: Megatron-LM / Megatron-Core's command-line arguments for a
//!   transformer (3d) plan.
//! * [`torchtitan_config`]: a torchtitan 0.3 job configuration (a Python module of one
//!   function returning its `Trainer.Config`) for a transformer plan.

mod megatron;
mod torch;
mod torchtitan;

pub use megatron::megatron_arguments;
pub use torch::{torch_refusal, torch_script, Nearest};
pub use torchtitan::torchtitan_config;

use crate::{Compiled, Error, FileError};

/// The engines `--emit` writes for, and the file each writes into the output directory.
pub const ENGINES: [(&str, &str); 3] = [
    ("torch", "train_torch.py"),
    ("megatron", "megatron.args"),
    ("torchtitan", "torchtitan_plan.py"),
];

/// What `--emit` should tell the user about the files it writes: an engine that will refuse
/// the plan as it stands (the file is still written: it holds the plan to edit).
pub fn warnings(engines: &[String], compiled: &Compiled) -> Vec<String> {
    let mut out = Vec::new();
    if engines.iter().any(|e| e == "torch") {
        if let Some((why, nearest)) = compiled.strategy.as_ref().and_then(torch_refusal) {
            // The nearest plan ralpc.torch names: for an aligned one, the transformer's own
            // layout, else data parallelism.
            let transformer = compiled
                .report
                .candidates
                .iter()
                .any(|c| c.strategy == "3d");
            let instead = match nearest {
                Nearest::OneFOneB => "--schedule 1f1b",
                Nearest::Aligned if transformer => "--strategy 3d",
                Nearest::Aligned | Nearest::DataParallel => "--strategy dp",
            };
            out.push(format!(
                "train_torch.py: ralpc.torch will refuse this plan: {why}; {instead} plans \
                 one PyTorch runs"
            ));
        }
    }
    out
}

/// The files of `engines` (names in [`ENGINES`]) for `compiled`: (name, contents), made
/// before anything is written, so that an engine refusing the plan leaves no output.
///
/// # Errors
/// [`Error::Plan`] when the plan has no form for an engine.
pub fn render(
    engines: &[String],
    compiled: &Compiled,
) -> Result<Vec<(&'static str, String)>, Error> {
    let plan_error = |e: ralpc_passes::plan::PlanError| Error::Plan(Box::new(e));
    let refuse = |why: String| plan_error(ralpc_passes::plan::PlanError::Request(why));
    let mut files = Vec::new();
    for engine in engines {
        let Some(&(_, file)) = ENGINES.iter().find(|(e, _)| e == engine) else {
            return Err(refuse(format!(
                "--emit {engine}: not an engine (torch, megatron, torchtitan)"
            )));
        };
        let text = match engine.as_str() {
            "torch" => {
                let Some(strategy) = &compiled.strategy else {
                    return Err(refuse(format!(
                        "--emit torch: this plan has no per-layer placement: {}",
                        compiled
                            .not_lowered
                            .as_deref()
                            .unwrap_or("it was not lowered")
                    )));
                };
                torch_script(&compiled.report, strategy)
            }
            "torchtitan" => torchtitan_config(&compiled.report).map_err(plan_error)?,
            _ => megatron_arguments(&compiled.report).map_err(plan_error)?,
        };
        files.push((file, text));
    }
    Ok(files)
}

/// Writes `files` ([`render`]'s) into `dir`; their names.
///
/// # Errors
/// [`Error::Write`].
pub fn write(
    files: &[(&'static str, String)],
    dir: &std::path::Path,
) -> Result<Vec<&'static str>, Error> {
    if files.is_empty() {
        return Ok(Vec::new());
    }
    std::fs::create_dir_all(dir).map_err(|error| {
        Error::Write(Box::new(FileError {
            path: dir.display().to_string(),
            error,
        }))
    })?;
    for (file, text) in files {
        crate::output::write_atomically(&dir.join(file), text)?;
    }
    Ok(files.iter().map(|(file, _)| *file).collect())
}
