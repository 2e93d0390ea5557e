//! The CPU backend: ralpc's reference executor, which runs the exact plan GPUs would run —
//! every rank, transfer and collective — with real numbers.
//!
//! * [`tensor`], [`ops`], [`grad`]: host tensors and the dispatchers of the forward and
//!   backward semantics of every IR operator, each family's both passes in one module
//!   (`products`, `elementwise`, `reduce`, `normalize`, `window`, `volume`, `movement`,
//!   `resize`, `indexing`, `rearrange`, `signal`, `recurrent`), on [`kernels`] (GEMM-based
//!   convolution, pooling, normalization…);
//! * [`graph`]: any set of a graph's nodes run forward and backward; weights read or
//!   seeded ([`init`]);
//! * [`train`]: the loss, synthetic data and the single-device reference;
//! * `region`: the boxes of tensors and weights a rank holds, and copies between them;
//! * [`exec`]: the plan executor, ranks as threads or one rank per process, talking
//!   through [`crate::dist::comm`].
mod elementwise;
pub mod exec;
pub mod floats;
pub mod grad;
pub mod graph;
mod indexing;
pub mod init;
pub mod kernels;
mod movement;
mod normalize;
pub mod ops;
mod products;
mod rearrange;
mod recurrent;
mod reduce;
pub(crate) mod region;
mod resize;
mod signal;
pub mod tensor;
pub mod train;
mod volume;
mod window;
