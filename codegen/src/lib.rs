//! Lowering a placement strategy into ralpc's executable plan (`ralpc-plan/1`: per-rank
//! instruction streams, communicator groups, predicted durations).
//!
//! Built so far: the plan schema with its validating loader ([`plan`]) and the lowering
//! ([`lower`]). Buffers with lifetimes, collective recognition in resharding and the
//! visualizations (Graphviz, Perfetto trace, HTML report) are still to come (issue #5).
#![warn(missing_docs)]

pub mod lower;
pub mod plan;

pub use lower::lower;
pub use plan::{model_hash, Instruction, ModelRef, Plan, PlanFileError, Predicted, FORMAT};
pub use ralpc_passes as passes;
