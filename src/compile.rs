//! The build-step entry point: a model in, every artifact of its plan out, in memory, with
//! a hash of everything that went in so that a build system can skip up-to-date work.

use std::path::{Path, PathBuf};

use ralpc_ir::input::{read_input, read_input_text, InputKind};

use crate::error::FileError;
use crate::plan::{plan, render_svg, report_html, PlanOptions, PlanReport};
use crate::Error;

/// What to compile: the planning options (see [`PlanOptions`]; the executable plan is
/// always lowered).
pub type Options = PlanOptions;

/// The artifacts `ralpc` writes into an output directory, always.
pub const ARTIFACTS: [&str; 4] = ["plan.json", "plan.dot", "timeline.json", "report.html"];

/// A compiled model: the chosen plan, its executable form and every artifact.
#[derive(Clone, Debug)]
pub struct Compiled {
    /// The summary (what `--json` prints).
    pub report: PlanReport,
    /// blake3 of the inputs (also in `plan.json` as `inputs`).
    pub inputs: String,
    /// The executable plan, simulated, and its visualizations; `None` for a transformer
    /// (3d) plan using options that are priced but not lowered yet.
    pub executable: Option<crate::Executable>,
    /// The chosen strategy (a `ralpc-strategy/1` file); `None` for a transformer plan with
    /// no layer-graph form.
    pub strategy: Option<ralpc_passes::plan::StrategyFile>,
    /// (file name, contents) of every artifact: [`ARTIFACTS`], plus `plan.svg` when
    /// Graphviz is installed; none where `executable` is `None`.
    pub files: Vec<(&'static str, String)>,
    /// Why a transformer plan was not lowered.
    pub not_lowered: Option<String>,
    /// Why `plan.svg` is not among the artifacts, when it is not.
    pub svg_skipped: Option<crate::plan::SvgSkipped>,
}

impl Compiled {
    /// Writes every artifact into `dir` (created if missing) as one set
    /// ([`crate::output::write_set_atomically`]): a file is complete or absent, also when the
    /// process is killed mid-write, and a write that fails leaves none of the new set.
    ///
    /// # Errors
    /// [`Error::Write`] when `dir` or a file cannot be written.
    pub fn write(&self, dir: &Path) -> Result<(), Error> {
        if self.files.is_empty() {
            return Ok(());
        }
        std::fs::create_dir_all(dir).map_err(|error| {
            Error::Write(Box::new(FileError {
                path: dir.display().to_string(),
                error,
            }))
        })?;
        let _lock = crate::output::lock(dir)?;
        // plan.json (first in `files`) after the others, and the record of the set last:
        // it marks the directory up to date.
        let record = SetRecord {
            inputs: self.inputs.clone(),
            files: self
                .files
                .iter()
                .map(|(name, text)| {
                    (
                        (*name).to_owned(),
                        blake3::hash(text.as_bytes()).to_hex().to_string(),
                    )
                })
                .collect(),
        };
        // Strings always serialize.
        let record = serde_json::to_string_pretty(&record).unwrap_or_default() + "\n";
        let mut set: Vec<(&str, &str)> = self
            .files
            .iter()
            .rev()
            .map(|(name, text)| (*name, text.as_str()))
            .collect();
        set.push((SET_RECORD, &record));
        crate::output::write_set_atomically(dir, &set)?;
        // A picture of an earlier plan must not stay beside this one.
        if self.svg_skipped.is_some() {
            let _ = std::fs::remove_file(dir.join("plan.svg"));
        }
        Ok(())
    }
}

/// The file, written last into an output directory, that records what the set was made
/// from and a hash of each of its files: the directory is up to date only when every file
/// is still the one written (not an edited plan, not a file of another run's set).
const SET_RECORD: &str = ".ralpc-set.json";

#[derive(serde::Serialize, serde::Deserialize)]
struct SetRecord {
    /// [`inputs_hash`] of the options.
    inputs: String,
    /// blake3 of each artifact, by name.
    files: std::collections::BTreeMap<String, String>,
}

/// Plans `options.model` and renders every artifact.
///
/// ```
/// let options = ralpc::Options {
///     model: "fixtures/onnx/vgg16/model.onnx".into(),
///     gpus: Some(8),
///     ..Default::default()
/// };
/// let compiled = ralpc::compile(&options)?;
/// assert!(compiled.report.speedup_over_dp >= 1.0);
/// let executable = compiled.executable.as_ref().expect("VGG16's plan is lowered");
/// assert_eq!(executable.plan.inputs, compiled.inputs);
/// let dir = std::env::temp_dir().join("ralpc-doctest-vgg16");
/// compiled.write(&dir)?;
/// assert!(ralpc::up_to_date(&options, &dir)?);
/// # Ok::<(), ralpc::Error>(())
/// ```
///
/// # Errors
/// Everything [`plan`](crate::plan()) reports: unreadable or invalid inputs, no plan that
/// fits.
pub fn compile(options: &Options) -> Result<Compiled, Error> {
    let options = PlanOptions {
        executable: true,
        ..options.clone()
    };
    let output = plan(&options)?;
    let inputs = inputs_hash(&options)?;
    let Some(mut executable) = output.executable else {
        if let Some(why) = output.not_lowered {
            return Ok(Compiled {
                report: output.report,
                inputs,
                executable: None,
                strategy: output.strategy,
                files: Vec::new(),
                not_lowered: Some(why),
                svg_skipped: None,
            });
        }
        return Err(Error::Internal(Box::new(
            "no executable plan was lowered".into(),
        )));
    };
    executable.plan.inputs.clone_from(&inputs);
    let mut report = output.report;
    report.simulated = Some(crate::plan::SimulatedRow::of(&executable.simulation));
    let svg = render_svg(&executable.drawing);
    let html = report_html(&report, &executable, svg.clone().ok());
    let mut files = vec![
        ("plan.json", executable.plan.to_json()),
        ("plan.dot", executable.dot.clone()),
        ("timeline.json", executable.timeline.clone()),
        ("report.html", html),
    ];
    let svg_skipped = match svg {
        Ok(svg) => {
            files.push(("plan.svg", svg));
            None
        }
        Err(why) => Some(why),
    };
    Ok(Compiled {
        report,
        inputs,
        executable: Some(executable),
        strategy: output.strategy,
        files,
        not_lowered: None,
        svg_skipped,
    })
}

/// blake3 of everything a plan depends on: ralpc's version and the fingerprint of the
/// sources it was built from (a rebuilt ralpc may plan differently), the options, and the
/// bytes of the model, the profile, the strategy file and a cluster file.
///
/// # Errors
/// [`Error::Read`] when one of those files cannot be read.
pub fn inputs_hash(options: &Options) -> Result<String, Error> {
    hash_inputs(options, env!("RALPC_SOURCE_HASH"))
}

/// [`inputs_hash`] for a ralpc built from sources of fingerprint `build`.
fn hash_inputs(options: &Options, build: &str) -> Result<String, Error> {
    let mut hasher = blake3::Hasher::new();
    let options = PlanOptions {
        executable: true,
        ..options.clone()
    };
    hasher.update(env!("CARGO_PKG_VERSION").as_bytes());
    hasher.update(build.as_bytes());
    hasher.update(format!("{options:?}").as_bytes());
    let cluster_file = options
        .cluster
        .spec
        .as_ref()
        .map(PathBuf::from)
        .filter(|p| p.is_file());
    let files = [
        (Some(options.model.clone()), InputKind::Model),
        (options.profile.clone(), InputKind::Text),
        (options.strategy_file.clone(), InputKind::Text),
        (cluster_file, InputKind::Text),
        (
            options.background.as_ref().map(|b| b.model.clone()),
            InputKind::Model,
        ),
    ];
    for (path, kind) in files {
        let Some(path) = path else { continue };
        let bytes = read_input(&path, kind).map_err(|error| {
            Error::Read(Box::new(FileError {
                path: path.display().to_string(),
                error,
            }))
        })?;
        hasher.update(&(bytes.len() as u64).to_le_bytes());
        hasher.update(&bytes);
    }
    Ok(hasher.finalize().to_hex().to_string())
}

/// Whether `dir` holds every artifact of `options`' plan, made from the same inputs:
/// with Graphviz installed, `plan.svg` too (a directory planned before Graphviz was
/// installed, or whose drawing timed out, is planned again).
///
/// # Errors
/// [`Error::Read`] when an input cannot be read.
pub fn up_to_date(options: &Options, dir: &Path) -> Result<bool, Error> {
    let inputs = inputs_hash(options)?;
    let Ok(text) = read_input_text(&dir.join(SET_RECORD), InputKind::Text) else {
        return Ok(false);
    };
    let Ok(record) = serde_json::from_str::<SetRecord>(&text) else {
        return Ok(false);
    };
    if record.inputs != inputs
        || ARTIFACTS.iter().any(|f| !record.files.contains_key(*f))
        || (!record.files.contains_key("plan.svg") && crate::plan::graphviz_installed())
    {
        return Ok(false);
    }
    for (name, hash) in &record.files {
        if Path::new(name).file_name() != Some(std::ffi::OsStr::new(name)) {
            return Ok(false);
        }
        let Ok(bytes) = read_input(&dir.join(name), InputKind::Text) else {
            return Ok(false);
        };
        if blake3::hash(&bytes).to_hex().as_str() != hash {
            return Ok(false);
        }
    }
    Ok(true)
}

/// The default output directory for `model`: `<stem>.ralpc` in the working directory.
pub fn default_out_dir(model: &Path) -> PathBuf {
    let stem = model
        .file_stem()
        .map_or_else(|| "model".into(), |s| s.to_string_lossy().into_owned());
    PathBuf::from(format!("{stem}.ralpc"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A plan made by a ralpc built from other sources is out of date, even at the same
    /// version: the planner may have changed.
    #[test]
    fn the_recorded_inputs_name_the_build() {
        let options = Options {
            model: PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fixtures/onnx/vgg16/model.onnx"),
            gpus: Some(8),
            ..Options::default()
        };
        let this = inputs_hash(&options).expect("hashes");
        assert_eq!(
            this,
            hash_inputs(&options, env!("RALPC_SOURCE_HASH")).expect("hashes")
        );
        assert_ne!(
            this,
            hash_inputs(&options, "another build").expect("hashes")
        );
        assert_eq!(env!("RALPC_SOURCE_HASH").len(), 64);
    }
}
