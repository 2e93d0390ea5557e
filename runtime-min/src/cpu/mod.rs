//! The CPU backend (issue #6), so far its kernels: forward and backward of the layers
//! plans are made of, on `f32` NCHW tensors, checked against direct definitions and finite
//! differences. The interpreter that runs a plan's ranks on them is still to come.

pub mod kernels;
