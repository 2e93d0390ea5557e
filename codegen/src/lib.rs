//! Lowering a placement strategy into ralpc's executable plan (`ralpc-plan/1`: per-rank
//! instruction streams, communicator groups, predicted durations).
//!
//! The plan schema with its validating loader ([`plan`]: instructions, communicator
//! groups, buffers with lifetimes), the lowering ([`lower`]), two visualizations ([`viz`]:
//! the placed graph as Graphviz DOT, the timeline as a Chrome/Perfetto trace) and the HTML
//! report ([`report`]).
#![warn(missing_docs)]

#[doc(hidden)]
pub mod fuzzing;
pub mod lower;
pub mod plan;
pub mod report;
pub mod viz;

pub use lower::lower;
pub use plan::{
    model_hash, Buffer, BufferKind, Instruction, LinkClass, ModelRef, Plan, PlanFileError,
    Predicted, Site, FORMAT,
};
pub use ralpc_passes as passes;
