//! ralpc's passes over a verified graph: rewrites into the layer graph (egg), the cluster
//! and cost models, measured profiles, and the partition search that decides
//! how each layer is spread over the GPUs.
//!
//! The life of a model in this crate:
//! 1. [`layers::build`] rewrites a verified graph into placement units ([`rewrite`], egg;
//!    the rules are in `passes/RULES.md`) and returns the [`layers::LayerGraph`]: per layer
//!    its forward and backward FLOPs, bytes, parameters, stashed activations and the edges
//!    between layers. A PipeDream `graph.txt` or a DeepPool profile is read into one
//!    directly ([`profile`]).
//! 2. [`cluster`] resolves a preset or a TOML file into GPU types, ranks and the links
//!    between them.
//! 3. [`plan::Costs`] prices a layer's share of work (a measured [`profile`] where it covers
//!    the op, else the roofline), messages and collectives (α-β per link class) and memory
//!    ([`cost`]).
//! 4. [`plan::plan`] searches data, burst, SOAP and pipeline plans; every candidate, and
//!    any strategy read from a file ([`plan::StrategyFile`]), is priced by
//!    [`plan::evaluate`], so plans are compared under one set of costs. [`transformer`]
//!    plans GPT-like decoders in Megatron-LM's space instead.
//! 5. [`planner::plan`] is the one front door over both: it recognizes the model, picks the
//!    planner, and returns the plan with the costs to lower it against; a transformer plan
//!    comes priced twice, by its closed form and layer by layer, and their gap is a number
//!    the report prints.
//!
//! Invariants: a [`plan::Strategy`] is stages of consecutive layers on consecutive ranks,
//! each layer split over the first `s·a·p` ranks of its stage; the chosen plan fits every
//! GPU's memory and the GPU-time budget, or planning fails saying which did not.
//!
//! ```
//! use ralpc_passes::plan::{self, CostOptions, Costs, Request};
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
//! // SOAP splits beat data parallelism on VGG16's large dense layers.
//! assert!(planned.chosen.evaluation.iteration_time_us < planned.data_parallel.iteration_time_us);
//! # Ok(()) }
//! ```
#![warn(missing_docs)]

pub mod cluster;
pub mod cost;
#[doc(hidden)]
pub mod fuzzing;
pub mod layers;
pub mod plan;
pub mod planner;
pub mod profile;
pub mod rewrite;
pub mod set;
pub mod synthetic;
pub mod transformer;
pub mod units;

pub use ralpc_ir as ir;
