//! Lowering a placement strategy into ralpc's executable plan (`ralpc-plan/1`: per-rank
//! instruction streams, buffers, communicator groups, predicted durations), and the plan's
//! visualizations (Graphviz, Perfetto trace, HTML report).
//!
//! Not built yet: issue #5.
#![warn(missing_docs)]

pub use ralpc_passes as passes;
