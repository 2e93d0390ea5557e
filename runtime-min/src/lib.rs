//! The minimal plan executor: one interpreter of `ralpc-plan/1` with several backends.
//!
//! Built so far: the simulator ([`sim`]), whose instructions advance clocks by the
//! durations the plan carries, and the CPU backend's kernels ([`cpu`]). The CPU
//! interpreter and the CUDA/NCCL backend are issues #6 and #7. It
//! depends on codegen's plan types, never on the planner: the plan carries everything.
#![warn(missing_docs)]

pub mod cpu;
pub mod sim;

pub use ralpc_codegen as codegen;

pub use sim::{
    simulate, IdleWindow, RankTimeline, SimError, Simulation, Span, Stream, MIN_IDLE_WINDOW_US,
};
