//! Machine-readable output: the format name every `--json` object carries, the outputs that
//! have no other home (`run`, `sweep`, `doctor`, errors), and the JSON Schemas of ralpc's
//! files and outputs, generated from the types that write and read them.
//!
//! `docs/schemas/` holds [`schemas`]' output; `tests/schemas.rs` checks that it is current
//! and that real outputs validate against it.

use std::collections::BTreeMap;

use serde::Serialize;
use serde_json::Value;

use crate::sweep::SweepRow;

/// `ralpc plan --json` ([`crate::PlanReport`]).
pub const PLAN_SUMMARY: &str = "ralpc-plan-summary/1";
/// `ralpc plan A B … --json`, several models at once ([`crate::SetReport`]).
pub const PLAN_SET: &str = "ralpc-plan-set/1";
/// `ralpc inspect --json` ([`crate::Inspection`]).
pub const INSPECT: &str = "ralpc-inspect/1";
/// `ralpc sweep --json` and `sweep.json` ([`SweepSummary`]).
pub const SWEEP: &str = "ralpc-sweep/1";
/// `ralpc run --json` ([`RunSummary`]).
pub const RUN: &str = "ralpc-run/1";
/// `ralpc doctor --json` ([`DoctorReport`]).
pub const DOCTOR: &str = "ralpc-doctor/1";
/// A failed command under `--json`, on stderr ([`ErrorReport`]).
pub const ERROR: &str = "ralpc-error/1";

/// `ralpc sweep --json`: every point of the GPU-type × GPU-count matrix.
#[derive(Clone, Debug, PartialEq, Serialize, schemars::JsonSchema)]
pub struct SweepSummary {
    /// Always [`SWEEP`].
    pub format: &'static str,
    /// The model path, as given.
    pub model: String,
    /// The points, GPU type by GPU type, GPU counts ascending.
    pub points: Vec<SweepRow>,
}

/// `ralpc run --json`: what a training run measured.
#[derive(Clone, Debug, PartialEq, Serialize, schemars::JsonSchema)]
pub struct RunSummary {
    /// Always [`RUN`].
    pub format: &'static str,
    /// The loss of each step.
    pub losses: Vec<f64>,
    /// Training samples per second over all steps.
    pub samples_per_s: f64,
    /// Wall-clock seconds of all steps.
    pub seconds: f64,
    /// Wall-clock seconds of each step.
    pub step_seconds: Vec<f64>,
    /// Steps run.
    pub steps: u32,
    /// Ranks of the plan.
    pub ranks: u32,
    /// Processes the ranks ran in.
    pub processes: u32,
    /// The global batch.
    pub batch: u64,
    /// The backend (`cpu`, `cuda`, …).
    pub backend: String,
    /// Weight tensors the model carried no data for, seeded instead.
    pub seeded_weights: usize,
    /// The plan's background job (`ralpc plan --background`): each GPU's copy as it ran.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub background: Vec<crate::BackgroundRun>,
    /// Why the plan's background job did not run, where it did not.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub background_not_run: Option<String>,
}

/// `ralpc doctor --json`: whether this machine can train on CUDA.
#[derive(Clone, Debug, PartialEq, Serialize, schemars::JsonSchema)]
pub struct DoctorReport {
    /// Always [`DOCTOR`].
    pub format: &'static str,
    /// Each CUDA library by name.
    pub libraries: BTreeMap<String, LibraryStatus>,
    /// The CUDA version the driver supports (`13.0`), when a driver loads.
    pub driver_cuda_version: Option<String>,
    /// The GPUs the driver sees.
    pub gpus: Vec<DoctorGpu>,
    /// The kernels compiled with NVRTC (`--compile-kernels`).
    pub kernels: Option<CompiledKernels>,
}

/// Where a CUDA library was found.
#[derive(Clone, Debug, PartialEq, Serialize, schemars::JsonSchema)]
pub struct LibraryStatus {
    /// `loads` (from the loader's path), `found` (elsewhere; ralpc links it in) or
    /// `missing`.
    pub status: &'static str,
    /// The path it was found at, or why it is missing.
    pub detail: Option<String>,
}

/// A GPU the driver sees.
#[derive(Clone, Debug, PartialEq, Serialize, schemars::JsonSchema)]
pub struct DoctorGpu {
    /// Its ordinal (`cuda:N`).
    pub ordinal: usize,
    /// Its name (`NVIDIA H100 80GB HBM3`).
    pub name: String,
    /// Compute capability, major and minor.
    pub compute_capability: (u32, u32),
    /// Memory, bytes.
    pub memory: u64,
}

/// ralpc's kernels compiled for one architecture.
#[derive(Clone, Debug, PartialEq, Serialize, schemars::JsonSchema)]
pub struct CompiledKernels {
    /// The target (`sm_90`).
    pub arch: String,
    /// NVRTC's version.
    pub nvrtc: String,
    /// The kernels' names.
    pub compiled: Vec<&'static str>,
    /// Size of the PTX, bytes.
    pub ptx_bytes: usize,
    /// Size of the cubin, bytes.
    pub cubin_bytes: usize,
    /// Compile time, seconds.
    pub seconds: f64,
}

/// A failed command under `--json`: one object on stderr (stdout stays empty).
#[derive(Clone, Debug, PartialEq, Serialize, schemars::JsonSchema)]
pub struct ErrorReport {
    /// Always [`ERROR`].
    pub format: &'static str,
    /// What failed.
    pub message: String,
    /// Why, outermost first (the `Caused by:` lines).
    pub causes: Vec<String>,
    /// The exit status (see `ralpc --help`).
    pub exit_code: u8,
}

impl ErrorReport {
    /// The report of `error`.
    pub fn of(error: &crate::Error) -> ErrorReport {
        let mut causes = Vec::new();
        let mut source = std::error::Error::source(error);
        while let Some(s) = source {
            causes.push(s.to_string());
            source = s.source();
        }
        ErrorReport {
            format: ERROR,
            message: error.to_string(),
            causes,
            exit_code: error.exit_code(),
        }
    }
}

/// One published schema.
#[derive(Clone, Debug)]
pub struct Schema {
    /// Its file in `docs/schemas/`.
    pub file: &'static str,
    /// What it describes.
    pub describes: &'static str,
    /// The JSON Schema (draft 2020-12).
    pub schema: Value,
}

/// Every file format's and `--json` output's schema.
pub fn schemas() -> Vec<Schema> {
    use ralpc_passes::{cluster, plan as file, profile};
    let formatted = |file, describes, format: &str, schema: schemars::Schema| Schema {
        file,
        describes,
        schema: pin_format(schema.to_value(), format),
    };
    vec![
        formatted(
            "plan.schema.json",
            "plan.json, the executable plan",
            ralpc_codegen::FORMAT,
            schemars::schema_for!(ralpc_codegen::Plan),
        ),
        formatted(
            "strategy.schema.json",
            "a strategy file (--write-strategy, --strategy-file)",
            file::FORMAT,
            schemars::schema_for!(file::StrategyFile),
        ),
        formatted(
            "profile.schema.json",
            "a profile (ralpc profile, --profile)",
            profile::FORMAT,
            schemars::schema_for!(profile::Profile),
        ),
        Schema {
            file: "cluster.schema.json",
            describes: "a cluster file (TOML; --cluster)",
            schema: cluster::file_schema().to_value(),
        },
        formatted(
            "plan-summary.schema.json",
            "ralpc plan --json",
            PLAN_SUMMARY,
            output::<crate::PlanReport>(),
        ),
        formatted(
            "plan-set.schema.json",
            "ralpc plan A B … --json (several models at once)",
            PLAN_SET,
            output::<crate::SetReport>(),
        ),
        formatted(
            "inspect.schema.json",
            "ralpc inspect --json",
            INSPECT,
            output::<crate::Inspection>(),
        ),
        formatted(
            "sweep.schema.json",
            "ralpc sweep --json and sweep.json",
            SWEEP,
            output::<SweepSummary>(),
        ),
        formatted(
            "run.schema.json",
            "ralpc run --json",
            RUN,
            output::<RunSummary>(),
        ),
        formatted(
            "doctor.schema.json",
            "ralpc doctor --json",
            DOCTOR,
            output::<DoctorReport>(),
        ),
        formatted(
            "error.schema.json",
            "a failed command under --json (stderr)",
            ERROR,
            output::<ErrorReport>(),
        ),
    ]
}

/// The schema of what `T` serializes to (fields it skips when empty are optional); files
/// ralpc also reads are described as it reads them.
fn output<T: schemars::JsonSchema>() -> schemars::Schema {
    schemars::generate::SchemaSettings::draft2020_12()
        .for_serialize()
        .into_generator()
        .into_root_schema_for::<T>()
}

/// `schema` with its `format` property pinned to `format` (the types hold it as a string).
fn pin_format(mut schema: Value, format: &str) -> Value {
    if let Some(object) = schema.as_object_mut() {
        object.insert("title".into(), Value::from(format));
        if let Some(Value::Object(properties)) = object.get_mut("properties") {
            properties.insert(
                "format".into(),
                serde_json::json!({ "const": format, "description": "The format and its version." }),
            );
        }
    }
    schema
}
