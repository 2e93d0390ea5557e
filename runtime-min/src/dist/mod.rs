//! Communication between ranks, whatever the device:
//!
//! * [`comm`]: messages and collectives between the ranks of one process (threads) and,
//!   over TCP, of other processes, for the host device's plans;
//! * [`nccl`]: replicas on distinct GPUs summing with NCCL, and [`same_device`]: replicas
//!   sharing one GPU summing device to device;
//! * what a run of one process per rank needs to start: the rank and world from the
//!   launcher's environment ([`mod@env`]), the run's secret that every connection between
//!   ranks proves ([`auth`]), and a TCP rendezvous on the master address ([`rendezvous`])
//!   that hands every rank the others' blobs (the NCCL unique id, the TCP transport's
//!   addresses).
pub mod auth;
pub mod comm;
pub mod env;
mod error;
pub mod nccl;
pub mod rendezvous;
pub mod same_device;
#[cfg(test)]
mod testing;

pub use env::{Launcher, Placement};
pub use error::DistError;
