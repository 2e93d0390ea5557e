//! ralpc's passes over a verified graph: rewrites into the layer graph (egg), the cluster
//! and cost models, and the partition search that decides how each layer is spread over
//! the GPUs.
//!
//! Not built yet: the rewrites, cluster and cost model are issue #3, the planner issue #4.
//! This crate exists so that the dependency direction `ir ← passes ← codegen ← ralpc` is
//! fixed from the start.
#![warn(missing_docs)]

pub use ralpc_ir as ir;
