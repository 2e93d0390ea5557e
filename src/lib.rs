//! ralpc, the layer-placement compiler for deep-learning training: the library API that the
//! `ralpc` command line and build steps call.
//!
//! Today it covers the front end: importing an ONNX model, binding its input dimensions,
//! verifying it and accounting for every layer's parameters, compute and memory
//! ([`inspect`]), and resolving clusters ([`cluster`]). The layer graph, cost model and
//! profiles live in [`passes`]. Planning, codegen and execution arrive with later issues.
//!
//! ```
//! let options = ralpc::InspectOptions {
//!     model: std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/onnx/resnet50/model.onnx"),
//!     batch: Some(1),
//!     inputs: Default::default(),
//! };
//! let report = ralpc::inspect(&options)?;
//! assert_eq!(report.params, 25_507_944); // the file's float initializers (BatchNorm folded by the exporter)
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

mod cluster;
mod error;
mod inspect;

pub use cluster::{cluster, ClusterOptions};
pub use error::Error;
pub use inspect::{inspect, InspectOptions, Inspection, LayerRow};
pub use ralpc_ir as ir;
pub use ralpc_passes as passes;
