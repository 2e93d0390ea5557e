//! Why a run stops: the typed failures of a rank and of the run, and the faults a test
//! injects.

use ralpc_ir::{Graph, NodeId};

use super::super::graph::{self, ExchangeFailed};
use crate::cuda::error::DeviceError;
use crate::dist::comm::CommError;

/// What an injected `Exit` or `Hang` fault reports for its own rank (which, in a real
/// failure, reports nothing: the other ranks' errors name it).
pub const KILLED: &str = "stopped by an injected fault";

/// Why a plan could not run.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RunError {
    /// The plan cannot run on this model with this backend.
    #[error("{0}")]
    Setup(String),
    /// A rank's device could not start (the factory of
    /// [`Executable::compute`](super::Executable::compute) failed).
    #[error("rank {rank}'s device")]
    Device {
        /// The rank.
        rank: u32,
        /// Why.
        #[source]
        source: DeviceError,
    },
    /// A rank failed.
    #[error("rank {rank}, instruction {index} ({op})")]
    Rank {
        /// The rank.
        rank: u32,
        /// The instruction's index in its program.
        index: usize,
        /// The instruction's `op`.
        op: &'static str,
        /// What went wrong (boxed: a rank's error is large and rare, its `Result`s many).
        #[source]
        cause: Box<RankError>,
    },
}

impl RunError {
    /// Rank `rank` failed at instruction `index` (`op`) because of `cause`.
    pub fn rank(rank: u32, index: usize, op: &'static str, cause: RankError) -> RunError {
        RunError::Rank {
            rank,
            index,
            op,
            cause: Box::new(cause),
        }
    }

    /// Whether the failure is ralpc's own: the plan was checked before it ran, so a rank
    /// that panics, or finds the plan and what it holds disagreeing (or a device its
    /// operands), is a bug.
    pub fn is_bug(&self) -> bool {
        match self {
            RunError::Rank { cause, .. } => match &**cause {
                RankError::Inconsistent(_)
                | RankError::Panicked(_)
                | RankError::Node(graph::ExecError::Inconsistent { .. }) => true,
                RankError::Node(graph::ExecError::Device { source, .. }) => source.is_bug(),
                _ => false,
            },
            RunError::Device { source, .. } => source.is_bug(),
            RunError::Setup(_) => false,
        }
    }

    /// Whether the machine is at fault: a device's library, driver or GPU missing, found
    /// as the rank started or as a node first needed it (cuDNN for a convolution).
    pub fn is_environment(&self) -> bool {
        match self {
            RunError::Device { source, .. } => source.is_setup(),
            RunError::Rank { cause, .. } => match &**cause {
                RankError::Node(graph::ExecError::Device { source, .. }) => source.is_setup(),
                _ => false,
            },
            RunError::Setup(_) => false,
        }
    }

    /// The order in which the ranks' failures explain a run: a rank's own failure, then a
    /// rank that timed out waiting (it names the silent rank), then the ranks the failure
    /// aborted, then a rank stopped by an injected fault (which reports nothing of itself,
    /// as a killed process could not).
    pub(super) fn precedence(&self) -> u8 {
        match self {
            RunError::Rank { cause, .. } => match &**cause {
                RankError::Killed => 3,
                RankError::Comm(CommError::Aborted(_) | CommError::Disconnected { .. }) => 2,
                RankError::Comm(CommError::Timeout { .. }) => 1,
                _ => 0,
            },
            RunError::Setup(_) | RunError::Device { .. } => 0,
        }
    }
}

/// Why one rank stopped.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RankError {
    /// A node of the model failed on the values it was given.
    #[error(transparent)]
    Node(#[from] graph::ExecError),
    /// Another rank failed or went silent.
    #[error(transparent)]
    Comm(#[from] CommError),
    /// What the plan says and what this rank holds or computes disagree (a bug).
    #[error("{0}")]
    Inconsistent(String),
    /// The plan asks for something this runtime does not execute yet.
    #[error("{0}")]
    Unsupported(String),
    /// The loss cannot be taken of the model's output and the labels.
    #[error("the loss: {0}")]
    Loss(String),
    /// The rank panicked (a bug).
    #[error("panicked: {0}")]
    Panicked(String),
    /// Panicked as an injected fault asked (`--fault R:I:panic`).
    #[error("panicked: injected fault")]
    InjectedPanic,
    /// Stopped by an injected fault (`--fault`).
    #[error("{KILLED}")]
    Killed,
    /// The checkpoint could not be kept ([`CheckpointSink`](super::CheckpointSink)).
    #[error("the checkpoint could not be written")]
    Checkpoint(#[source] super::checkpoint::SinkError),
    /// The device holding a tensor failed to read it back for the host
    /// ([`ReadBackFailed`](crate::cpu::floats::ReadBackFailed)).
    #[error("{0}")]
    ReadBack(String),
}

/// A kernel that runs collectives failed with `message`: the collective's own error when
/// one failed under it, else the node's.
pub(super) fn kernel_failure(
    collective: Option<RankError>,
    graph: &Graph,
    node: NodeId,
    message: String,
) -> RankError {
    collective.unwrap_or_else(|| {
        graph::ExecError::Node {
            site: graph.site(node),
            message,
        }
        .into()
    })
}

/// Keeps a collective's typed error in `slot` for [`kernel_failure`] and hands its message
/// to the kernel that ran it.
pub(super) fn keep(slot: &mut Option<RankError>, e: RankError) -> ExchangeFailed {
    let message = e.to_string();
    *slot = Some(e);
    ExchangeFailed(message)
}

/// What the plan says and what this rank holds or computes disagree: a bug in ralpc
/// ([`RankError::Inconsistent`]).
pub(crate) fn bug(message: impl Into<String>) -> RankError {
    RankError::Inconsistent(message.into())
}

/// A fault injected into one rank, to test that the others stop (`ralpc run --fault`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fault {
    /// The failing rank.
    pub rank: u32,
    /// The instruction (index into its program, first iteration) where it fails.
    pub instruction: usize,
    /// How it fails.
    pub kind: FaultKind,
}

/// How an injected fault fails.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FaultKind {
    /// The rank panics.
    Panic,
    /// The rank stops responding: it waits for something that never comes.
    Hang,
    /// The rank is gone without a word (a killed process).
    Exit,
}
