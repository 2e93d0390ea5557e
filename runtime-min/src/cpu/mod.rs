//! The CPU backend (issue #6), so far its parts: the kernels ([`kernels`], forward and
//! backward of the layers plans are made of, on `f32` NCHW tensors) and the shared-memory
//! communication between ranks run as threads ([`comm`]). The interpreter that runs a
//! plan's ranks on them is still to come.

pub mod comm;
pub mod kernels;
