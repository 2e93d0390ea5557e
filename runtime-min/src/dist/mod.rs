//! Communication between ranks, whatever the device:
//!
//! * [`comm`]: messages and collectives between the ranks of one process (threads) and,
//!   over TCP, of other processes, for the host device's plans;
//! * [`replicas`]: what a data-parallel group's devices sum with, device to device:
//!   [`nccl`] across GPUs, [`same_device`] for ranks sharing one;
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
mod pending;
pub mod rendezvous;
pub mod replicas;
pub mod same_device;
#[cfg(any(test, feature = "testing"))]
#[doc(hidden)]
pub mod testing;

pub use env::{Launcher, Placement};
pub use error::DistError;
pub use replicas::Replicas;
