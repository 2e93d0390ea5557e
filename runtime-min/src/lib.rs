//! The minimal executor of ralpc plans: one interpreter of the plan's per-rank instruction
//! streams with three backends — a simulator whose kernels advance clocks, a CPU backend
//! (threads as ranks, real numbers; the reference) and a CUDA/NCCL backend.
//!
//! It depends on `codegen` for the plan types and on `ir`, never on `passes`: every
//! instruction carries its predicted duration, so the runtime needs no cost model.
//!
//! Not built yet: issues #5 (simulator), #6 (CPU) and #7 (CUDA).
#![warn(missing_docs)]

pub use ralpc_codegen as codegen;
