//! Lowering a placement strategy into ralpc's executable plan (`ralpc-plan/1`: per-rank
//! instruction streams, communicator groups, predicted durations).
//!
//! Built so far: the plan schema with its validating loader ([`plan`]), the lowering
//! ([`lower`]) and two visualizations ([`viz`]: the placed graph as Graphviz DOT, the
//! timeline as a Chrome/Perfetto trace) and the HTML report ([`report`]). Buffers with
//! lifetimes and collective recognition in resharding are still to come (issue #5).
#![warn(missing_docs)]

pub mod lower;
pub mod plan;
pub mod report;
pub mod viz;

pub use lower::lower;
pub use plan::{model_hash, Instruction, ModelRef, Plan, PlanFileError, Predicted, FORMAT};
pub use ralpc_passes as passes;
