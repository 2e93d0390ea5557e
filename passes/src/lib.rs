//! ralpc's passes over a verified graph: rewrites into the layer graph (egg), the cluster
//! and cost models, measured profiles, and the partition search that decides
//! how each layer is spread over the GPUs.
#![warn(missing_docs)]

pub mod cluster;
pub mod cost;
#[doc(hidden)]
pub mod fuzzing;
pub mod layers;
pub mod plan;
pub mod profile;
pub mod rewrite;
pub mod synthetic;
pub mod transformer;
pub mod units;

pub use ralpc_ir as ir;
