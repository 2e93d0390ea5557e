//! The CPU backend (issue #6): the kernels ([`kernels`], forward and backward of the layers
//! plans are made of, on `f32` NCHW tensors), the forward semantics of every IR operator
//! ([`ops`]) on host tensors ([`tensor`]), and the shared-memory communication between
//! ranks run as threads ([`comm`]).

pub mod comm;
pub mod exec;
pub mod grad;
pub mod graph;
pub mod init;
pub mod kernels;
pub mod ops;
pub mod tensor;
pub mod train;
