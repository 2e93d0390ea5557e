//! The minimal plan executor of `ralpc-plan/3`.
//!
//! * [`sim`]: the simulator. Each instruction advances its rank's compute or communication
//!   clock by the duration the plan carries, waiting for the data it reads (from the
//!   buffers), its peer or its whole group; servers share their network interfaces. It
//!   finds deadlocks, idle windows and each rank's peak memory, and is how ralpc checks the
//!   planner's prediction.
//! * [`cpu`]: the CPU backend. Every rank a thread (or, under a launcher, a process over
//!   TCP) running its program with real tensors: its share of each layer forward and
//!   backward, every message and collective, SGD with momentum. Training equals
//!   single-device training; `cpu::ops` and `cpu::grad` are the reference kernels.
//! * [`cuda`]: the CUDA backend (cudarc, loaded at run time: NVRTC kernels, cuBLAS, cuDNN,
//!   NCCL) and the device trait it shares with the host-compiled kernels and the counting
//!   device (`runtime-min/cuda-host`).
//! * [`dist`]: the launcher environment and the authenticated TCP rendezvous.
//!
//! It reads codegen's plan and the ONNX model, nothing of the planner: the plan's
//! [`layout`](ralpc_codegen::layout) names each layer's ops, split and ranks and the
//! tensors between layers, and the plan's views say how a split cuts them.
//!
//! ```
//! use ralpc_runtime_min::codegen::passes::plan::{self, CostOptions, Costs, Request};
//! use ralpc_runtime_min::codegen::passes as ralpc_passes;
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
//! # let model = ralpc_runtime_min::codegen::ModelRef { name: "vgg16".into(), path: None,
//! #     blake3: String::new(), layers: layers.layers.len() as u32, inputs: Default::default(),
//! #     values: Default::default() };
//! let plan = ralpc_runtime_min::codegen::lower(&costs, &planned.chosen.strategy, model)?;
//! let simulated = ralpc_runtime_min::simulate(&plan)?;
//! // The simulator agrees with the planner's prediction.
//! let predicted = planned.chosen.evaluation.iteration_time_us;
//! assert!((simulated.iteration_time_us / predicted - 1.0).abs() < 0.05);
//! # Ok(()) }
//! ```
#![warn(missing_docs)]

pub mod cpu;
pub mod cuda;
pub mod dist;
pub mod sim;

pub use ralpc_codegen as codegen;

pub use sim::{
    simulate, IdleWindow, RankTimeline, SimError, Simulation, Span, Stream, MIN_IDLE_WINDOW_US,
};
