//! ralpc, the layer-placement compiler for deep-learning training: the library API that the
//! `ralpc` command line and build steps call.
//!
//! It covers importing an ONNX model, binding its input dimensions, verifying it and
//! accounting for every layer's parameters, compute and memory ([`inspect`]), resolving
//! clusters ([`cluster`]) and planning how every layer is spread over the GPUs ([`plan`]).
//! The layer graph, cost model, profiles and the search live in [`passes`]; the executable
//! plan ([`compile`]) in [`codegen`]; running it on the CPU ([`run`]), the single-device
//! reference ([`train_single_device`]) and CPU profiling ([`profile_cpu`]) in [`runtime`].
//!
//! ```
//! let options = ralpc::InspectOptions {
//!     model: std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/onnx/resnet50/model.onnx"),
//!     batch: Some(1),
//!     ..Default::default()
//! };
//! let report = ralpc::inspect(&options)?;
//! // torchvision's 25,557,032 with each BatchNorm folded into its convolution by the exporter
//! // (53,120 scales and shifts become 26,560 convolution biases).
//! assert_eq!(report.params, 25_530_472);
//! assert!((report.macs as f64 / 4.09e9 - 1.0).abs() < 0.03); // torchvision: 4.09 GMACs
//! # Ok::<(), ralpc::Error>(())
//! ```
#![warn(missing_docs)]
#![cfg_attr(
    not(test),
    warn(
        clippy::print_stdout,
        clippy::print_stderr,
        clippy::dbg_macro,
        clippy::todo
    )
)]

pub mod args;
mod checkpoint;
mod cluster;
mod compile;
pub mod emit;
mod error;
pub mod formats;
mod inspect;
mod output;
mod plan;
mod process;
mod profile;
mod run;
mod sweep;

pub use args::PlanArgs;
pub use cluster::{cluster, ClusterOptions};
pub use compile::{
    compile, default_out_dir, inputs_hash, up_to_date, Compiled, Options, ARTIFACTS,
};
pub use error::{Error, FileError, SetupFailure};
pub use inspect::{inspect, InspectOptions, Inspection, LayerRow};
pub use output::{
    check_writable, lock as lock_output_dir, refuse_overwriting_inputs, write_atomically,
    write_bytes_atomically, write_set_atomically, DirLock,
};
pub use plan::{
    graphviz_installed, layer_rows, plan, plan_set, render_svg, report_html, runs_placed_alike,
    simulated_facts, BackgroundOptions, BackgroundRow, CandidateRow, Executable, ParallelismRow,
    PartitionRow, PlacedLayer, PlanOptions, PlanOutput, PlanReport, SetGroup, SetModel, SetReport,
    SimulatedRow, SplitRow, StageRow, SvgSkipped, DEFAULT_BACKGROUND_BATCH, DEFAULT_BATCH,
    DEFAULT_MAX_INSTRUCTIONS, SVG_SECONDS,
};
pub use process::{die_with_parent, hand_over, keep_freed_memory};
pub use profile::{profile_cpu, profile_cuda, profile_on, ProfileOptions};
pub use ralpc_codegen as codegen;
pub use ralpc_ir as ir;
pub use ralpc_passes as passes;
pub use ralpc_runtime_min as runtime;
pub use run::{
    read_plan, run, run_with_compute, train_single_device, Backend, BackgroundRun, RunOptions,
    RunOutput,
};
pub use sweep::{
    cluster_of_gpu_type, gavel, report_html as sweep_report_html, sweep, to_csv as sweep_csv,
    SweepOptions, SweepRow,
};
