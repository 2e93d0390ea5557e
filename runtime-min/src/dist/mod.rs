//! What a run of one process per rank needs whatever the backend: the rank and world
//! from the launcher's environment ([`env`]), the run's secret that every connection
//! between ranks proves ([`auth`]), and a TCP rendezvous on the master address
//! ([`rendezvous`]) that hands every rank the others' blobs (the NCCL unique id, the CPU
//! transport's addresses).
pub mod auth;
pub mod env;
mod error;
pub mod rendezvous;

pub use env::{Launcher, Placement};
pub use error::DistError;
