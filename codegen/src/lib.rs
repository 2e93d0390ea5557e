//! Lowering a placement strategy into ralpc's executable plan (`ralpc-plan/3`: per-rank
//! instruction streams, communicator groups, predicted durations).
//!
//! The plan schema with its validating loader ([`plan`]: instructions, communicator
//! groups, buffers with lifetimes), the lowering ([`mod@lower`]), two visualizations ([`viz`]:
//! the placed graph as Graphviz DOT, the timeline as a Chrome/Perfetto trace) and the HTML
//! report ([`report`]).
//!
//! [`lower()`] turns a priced strategy into every rank's program: the schedule's order of
//! forward, backward and recomputation passes; box-exact sends and receives where a tensor
//! changes placement (recognized as all-gathers, reduce-scatters or all-to-alls when they
//! are); partial-sum, input-gradient and bucketed gradient all-reduces; ZeRO's sharded
//! steps; and the buffers each instruction reads and writes with their lifetimes. A plan
//! is self-checking: [`Plan::parse`] validates matched sends and receives, collectives
//! entered by their whole group in one order, and the model's blake3 ([`model_hash`]).
//!
//! ```
//! use ralpc_codegen::passes::plan::{self, CostOptions, Costs, Request};
//! use ralpc_codegen::passes as ralpc_passes;
//! use ralpc_passes::ir as ralpc_ir;
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures/onnx/vgg16/model.onnx");
//! let mut model = ralpc_ir::onnx::import(&path)?;
//! let batch = ralpc_ir::Bindings { batch: Some(32), ..Default::default() };
//! ralpc_ir::bind(&mut model.graph, &batch)?;
//! let info = ralpc_ir::verify(&model.graph)?;
//! let layers = ralpc_passes::layers::build(&model.graph, &info, 32, Default::default())?;
//! let cluster = ralpc_passes::cluster::Cluster::preset("dgx-a100")?;
//! let costs = Costs::new(&layers, &cluster, 8, CostOptions::default());
//! let planned = plan::plan(&costs, &Request::default())?;
//! let model = ralpc_codegen::ModelRef {
//!     name: "vgg16".into(),
//!     path: None,
//!     blake3: ralpc_codegen::model_hash(b"the model's bytes"),
//!     layers: layers.layers.len() as u32,
//!     inputs: Default::default(),
//!     values: Default::default(),
//! };
//! let plan = ralpc_codegen::lower(&costs, &planned.chosen.strategy, model)?;
//! assert_eq!(plan.programs.len(), 8, "one program per GPU");
//! // What it writes reads back, validated.
//! assert_eq!(ralpc_codegen::Plan::parse(&plan.to_json())?, plan);
//! # Ok(()) }
//! ```
#![warn(missing_docs)]

pub mod background;
#[doc(hidden)]
pub mod fuzzing;
pub mod layout;
pub mod lower;
pub mod plan;
pub mod report;
pub mod sim;
pub mod tag;
pub mod viz;

pub use layout::Layout;
pub use lower::lower;
pub use plan::{
    model_hash, BackgroundRef, Buffer, BufferKind, Instruction, LinkClass, ModelRef, Plan,
    PlanFileError, Predicted, Site, FORMAT,
};
pub use ralpc_passes as passes;
pub use sim::{
    simulate, IdleWindow, RankTimeline, SimError, Simulation, Span, Stream, MIN_IDLE_WINDOW_US,
};
