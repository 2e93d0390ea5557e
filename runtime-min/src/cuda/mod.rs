//! The CUDA/NCCL backend (issue #7), compiled always: cudarc loads CUDA at run time, so
//! CPU-only machines build and test everything here that needs no GPU.
//!
//! * [`libs`]: finding the CUDA libraries (pip wheels, `libnccl.so.2`) and clear errors
//!   when one is missing, before cudarc would panic.
//! * [`kernels`]: the NVRTC kernels (elementwise, reductions, softmax and loss,
//!   normalization, pooling, im2col, SGD) and their compilation.
//! * [`backend`]: what the executor asks of a device (buffers, GEMM, a kernel
//!   [`launch`] built from the one table of kernels), [`calls`]: the kernels' checked
//!   calls, and [`train`]: training on one device, written once against them;
//! * [`gpu`]: that trait on an NVIDIA GPU (cudarc: NVRTC kernels, cuBLAS);
//! * [`on_device`]: a device computing the plan interpreter's layers, its tensors resident
//!   there, so every plan runs on GPUs through the same interpreter;
//! * replicas' sums: [`crate::dist::nccl`] across GPUs, [`crate::dist::same_device`] on
//!   one;
//! * [`device`]: the GPUs the driver sees;
//! * [`error`]: a device's failures, by whose they are (CUDA's, the machine's, the
//!   model's, the other replicas', or ralpc's own).
// The tables every device's kernels are declared in: their operation codes and their
// signatures. Textually first, so that every module below expands them.
include!("op_codes.rs");
include!("kernel_table.rs");

pub mod backend;
mod batch_stats;
pub mod calls;
pub mod conv;
pub mod cudnn;
pub mod device;
pub mod error;
pub mod gpu;
pub mod kernels;
pub mod launch;
pub mod libs;
mod node_ops;
pub mod on_device;
mod one_device;
pub mod train;
