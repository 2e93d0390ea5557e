//! The minimal plan executor: one interpreter of `ralpc-plan/1` with several backends.
//!
//! Built so far: the simulator ([`sim`]), whose instructions advance clocks by the
//! durations the plan carries, and the CPU backend ([`cpu`]), which runs the plan's ranks
//! as threads with real tensors. The CUDA/NCCL backend is issue #7. It depends on
//! codegen's plan types and on the model's layer graph (which tensors a layer reads and
//! how a split cuts them), never on the search.
#![warn(missing_docs)]

pub mod cpu;
pub mod cuda;
pub mod dist;
pub mod sim;

pub use ralpc_codegen as codegen;

pub use sim::{
    simulate, IdleWindow, RankTimeline, SimError, Simulation, Span, Stream, MIN_IDLE_WINDOW_US,
};
