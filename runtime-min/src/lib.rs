//! The minimal plan executor of `ralpc-plan/3`.
//!
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
//! tensors between layers, and the plan's views say how a split cuts them. The simulator,
//! which times a plan without running it, is codegen's ([`ralpc_codegen::sim`]).

#![warn(missing_docs)]

pub mod cpu;
pub mod cuda;
pub mod dist;
pub use ralpc_codegen as codegen;

/// An error and its causes on one line, `: ` between them, for where an error leaves
/// the typed world (a log line, an error that is still a string).
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut message = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        message += &format!(": {s}");
        source = s.source();
    }
    message
}
