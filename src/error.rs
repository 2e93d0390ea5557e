//! The library's error type and its mapping to exit codes. Payloads are boxed so that
//! `Result<_, Error>` stays small on the happy path.

use ralpc_ir::{AccountError, BindError, ImportError, VerifyErrors};

/// Why a ralpc command failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The model could not be imported.
    #[error("cannot import the model")]
    Import(#[source] Box<ImportError>),
    /// `--batch` / `--input` do not fit the model.
    #[error("cannot bind the input dimensions")]
    Bind(#[source] Box<BindError>),
    /// The model failed verification (shapes, types, cycles).
    #[error("the model is not valid")]
    Verify(#[source] Box<VerifyErrors>),
    /// Accounting failed (unbound dimensions, overflow).
    #[error("cannot account for the model")]
    Account(#[source] Box<AccountError>),
    /// The cluster (preset name or file) is not valid.
    #[error("cannot set up the cluster")]
    Cluster(#[source] Box<ralpc_passes::cluster::ClusterError>),
    /// A profile (or PipeDream graph) could not be read.
    #[error("cannot use the profile")]
    Profile(#[source] Box<ralpc_passes::profile::ProfileError>),
    /// The layer graph could not be built.
    #[error("cannot build the layer graph")]
    Layers(#[source] Box<ralpc_passes::layers::LayerError>),
    /// Planning failed: an invalid strategy, a model that does not fit, a budget no plan
    /// meets.
    #[error("cannot plan")]
    Plan(#[source] Box<ralpc_passes::plan::PlanError>),
    /// A bug in ralpc (exit code 101).
    #[error("internal error (a bug in ralpc; please report it): {0}")]
    Internal(Box<String>),
    /// An input file could not be read.
    #[error("cannot read {}", .0.path)]
    Read(#[source] Box<FileError>),
    /// An output file could not be written (nothing partial is left behind).
    #[error("cannot write {}", .0.path)]
    Write(#[source] Box<FileError>),
    /// A plan file is malformed or was made for another model.
    #[error("cannot use the plan: {0}")]
    PlanFile(Box<String>),
    /// `--data` is malformed or does not fit the model.
    #[error("cannot use the data: {0}")]
    Data(Box<String>),
    /// A checkpoint is malformed or belongs to another plan.
    #[error("cannot use the checkpoint: {0}")]
    Checkpoint(Box<String>),
    /// A backend's libraries are missing, or the process cannot be set up to run.
    #[error(transparent)]
    Setup(Box<SetupFailure>),
    /// Running a plan failed (a rank failed, or the plan cannot run on this backend).
    #[error("the run failed: {0}")]
    Run(Box<String>),
    /// A rank of the plan's run failed, or the plan cannot run here: exit 4, or 101 when
    /// the cause is ralpc's own (a rank panicked, or the plan and the runtime disagree).
    #[error("{}", if .0.is_bug() { BUG_IN_RUN } else { "the run failed" })]
    Ranks(#[source] Box<ralpc_runtime_min::cpu::exec::RunError>),
    /// This process cannot join the launcher's run: its environment is malformed (exit 1),
    /// or the other ranks cannot be met or trusted (exit 4).
    #[error("{}", match .rank {
        Some(rank) => format!("rank {rank} cannot join the run's other ranks"),
        None => "cannot join the launcher's run".to_owned(),
    })]
    Join {
        /// This process's rank, once the environment gave it.
        rank: Option<u32>,
        /// Why.
        #[source]
        source: Box<ralpc_runtime_min::dist::DistError>,
    },
    /// An output would replace one of the command's inputs (allowed with `--force`):
    /// (the output, the input it names).
    #[error("{} is {}, an input of this command: not overwritten (name another output, or \
             give --force where the command takes it)", .0.0, .0.1)]
    OverwritesInput(Box<(String, String)>),
    /// `--check`: the output directory's plan was not made from these inputs.
    #[error("{0} is not up to date with the model, cluster, profile and options")]
    OutOfDate(Box<String>),
}

const BUG_IN_RUN: &str = "internal error: the run failed inside ralpc (a bug; please report \
     it with `ralpc --version`, the plan and the causes below)";

/// A file and the I/O error on it.
#[derive(Debug, thiserror::Error)]
#[error("{error}")]
pub struct FileError {
    /// The file.
    pub path: String,
    /// Why.
    pub error: std::io::Error,
}

impl Error {
    /// The process exit code for this error: 1 for problems with the input, 3 when an
    /// output cannot be written, 4 when a run fails, 101 for bugs in ralpc.
    pub fn exit_code(&self) -> u8 {
        match self {
            Error::Import(_)
            | Error::Bind(_)
            | Error::Verify(_)
            | Error::Account(_)
            | Error::Cluster(_)
            | Error::Profile(_)
            | Error::Layers(_)
            | Error::Plan(_)
            | Error::Read(_)
            | Error::PlanFile(_)
            | Error::Data(_)
            | Error::Checkpoint(_)
            | Error::Setup(_)
            | Error::OverwritesInput(_)
            | Error::OutOfDate(_) => 1,
            Error::Write(_) => 3,
            Error::Run(_) => 4,
            Error::Join { source, .. } if source.is_environment() => 1,
            Error::Join { .. } => 4,
            Error::Ranks(e) if e.is_bug() => 101,
            Error::Ranks(e) if e.is_environment() => 1,
            Error::Ranks(_) => 4,
            Error::Internal(_) => 101,
        }
    }
}

impl From<ImportError> for Error {
    fn from(e: ImportError) -> Error {
        Error::Import(Box::new(e))
    }
}

impl From<BindError> for Error {
    fn from(e: BindError) -> Error {
        Error::Bind(Box::new(e))
    }
}

impl From<VerifyErrors> for Error {
    fn from(e: VerifyErrors) -> Error {
        Error::Verify(Box::new(e))
    }
}

impl From<ralpc_passes::profile::ProfileError> for Error {
    fn from(e: ralpc_passes::profile::ProfileError) -> Error {
        Error::Profile(Box::new(e))
    }
}

impl From<ralpc_passes::layers::LayerError> for Error {
    fn from(e: ralpc_passes::layers::LayerError) -> Error {
        Error::Layers(Box::new(e))
    }
}

impl From<AccountError> for Error {
    fn from(e: AccountError) -> Error {
        Error::Account(Box::new(e))
    }
}

impl Error {
    /// The process cannot be set up to run as asked, for the reason `message` gives (a flag
    /// that does not fit the plan, too little memory): [`SetupFailure::Message`], exit 1.
    pub fn setup(message: impl Into<String>) -> Error {
        Error::Setup(Box::new(SetupFailure::Message(message.into())))
    }
}

/// Why the process cannot be set up to run (exit 1).
#[derive(Debug, thiserror::Error)]
pub enum SetupFailure {
    /// What ralpc found wrong (a flag that does not fit the plan, no executable to restart).
    #[error("{0}")]
    Message(String),
    /// The machine cannot run the CUDA device: a library, the driver, NVRTC.
    #[error(transparent)]
    Cuda(#[from] ralpc_runtime_min::cuda::error::SetupError),
}

impl From<ralpc_runtime_min::cuda::error::SetupError> for Error {
    fn from(e: ralpc_runtime_min::cuda::error::SetupError) -> Error {
        Error::Setup(Box::new(e.into()))
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn error_stays_small() {
        // Errors travel through every `?`: keep them a few words wide.
        assert!(
            std::mem::size_of::<super::Error>() <= 16,
            "{}",
            std::mem::size_of::<super::Error>()
        );
    }

    /// A rank that panics or finds the plan and what it holds disagreeing is ralpc's bug
    /// (exit 101, asking for a report); a node failing on its values, a peer gone and an
    /// injected fault are failed runs (exit 4). Either way the causes form a chain.
    #[test]
    fn a_runs_failure_is_a_bug_only_when_ralpc_is_inconsistent() {
        use ralpc_runtime_min::cpu::exec::{RankError, RunError};
        use ralpc_runtime_min::dist::comm::CommError;
        let failed = |cause| super::Error::Ranks(Box::new(RunError::rank(1, 7, "forward", cause)));

        for bug in [
            RankError::Inconsistent(
                "computed 'r20' of shape [2, 512] where its share is [2, 256]".into(),
            ),
            RankError::Panicked("index out of bounds".into()),
        ] {
            let e = failed(bug);
            assert_eq!(e.exit_code(), 101);
            let text = chain(&e);
            assert!(text.contains("please report"), "{text}");
            assert!(
                text.contains("rank 1, instruction 7 (forward) / "),
                "{text}"
            );
        }
        for failure in [
            RankError::Comm(CommError::Aborted("rank 0 failed".into())),
            RankError::InjectedPanic,
            RankError::Killed,
            RankError::Unsupported("a loss on class-split logits".into()),
        ] {
            let e = failed(failure);
            assert_eq!(e.exit_code(), 4);
            assert!(!chain(&e).contains("please report"), "{}", chain(&e));
        }
        let setup = super::Error::Ranks(Box::new(RunError::Setup("too many ranks".into())));
        assert_eq!(setup.exit_code(), 4);
        for failure in [
            RankError::ReadBack("cannot read a tensor back".into()),
            RankError::Checkpoint("disk full".into()),
        ] {
            assert_eq!(failed(failure).exit_code(), 4);
        }
    }

    /// A rank's device that cannot start: the machine's fault when a library, the driver
    /// or the GPU is missing (exit 1, as for a one-device run), ralpc's when it is
    /// inconsistent (101); the rank and the cause stay in the chain.
    #[test]
    fn a_ranks_device_failing_to_start_is_classified_by_its_cause() {
        use ralpc_runtime_min::cpu::exec::RunError;
        use ralpc_runtime_min::cuda::error::{DeviceError, SetupError};
        let device = |source| super::Error::Ranks(Box::new(RunError::Device { rank: 2, source }));
        let missing = device(DeviceError::Setup(SetupError::Missing(
            ralpc_runtime_min::cuda::libs::Missing {
                lib: ralpc_runtime_min::cuda::libs::Lib::Driver,
                searched: Vec::new(),
            },
        )));
        assert_eq!(missing.exit_code(), 1);
        let text = chain(&missing);
        assert!(text.contains("rank 2's device / "), "{text}");
        assert!(text.contains("libcuda.so.1"), "{text}");
        let bug = device(DeviceError::Inconsistent("a kernel is missing".into()));
        assert_eq!(bug.exit_code(), 101);
    }

    /// A device failing at a node mid-run: a library first needed there is the machine's
    /// (exit 1), an inconsistency ralpc's own (101), the rest a failed run (4), CUDA's own
    /// error kept in the chain.
    #[test]
    fn a_device_failing_at_a_node_is_classified_by_its_cause() {
        use ralpc_runtime_min::cpu::exec::{RankError, RunError};
        use ralpc_runtime_min::cpu::graph::ExecError;
        use ralpc_runtime_min::cuda::error::{DeviceError, SetupError};
        let at_node = |source| {
            let cause = RankError::Node(ExecError::Device { site: None, source });
            super::Error::Ranks(Box::new(RunError::rank(1, 3, "forward", cause)))
        };
        let missing = SetupError::Missing(ralpc_runtime_min::cuda::libs::Missing {
            lib: ralpc_runtime_min::cuda::libs::Lib::Cudnn,
            searched: Vec::new(),
        });
        assert_eq!(at_node(DeviceError::Setup(missing)).exit_code(), 1);
        let inconsistent = DeviceError::Inconsistent("gemm A: 4 needed".into());
        assert_eq!(at_node(inconsistent).exit_code(), 101);
        let lacking = DeviceError::Node("Gather is not on the CUDA backend yet".into());
        assert_eq!(at_node(lacking).exit_code(), 4);
        let call = at_node(DeviceError::Call {
            call: "kernel binary".into(),
            source: Box::new(std::io::Error::other("CUDA_ERROR_ILLEGAL_ADDRESS")),
        });
        assert_eq!(call.exit_code(), 4);
        let text = chain(&call);
        assert!(
            text.contains("kernel binary / CUDA_ERROR_ILLEGAL_ADDRESS"),
            "{text}"
        );
    }

    /// Joining a launcher's run: a malformed environment is the input's fault (exit 1); a
    /// peer that cannot be reached or does not prove the run's secret fails the run (4);
    /// the causes stay in the chain.
    /// An error and its causes, ` / ` between them.
    fn chain(e: &super::Error) -> String {
        let mut text = e.to_string();
        let mut source = std::error::Error::source(e);
        while let Some(s) = source {
            text += &format!(" / {s}");
            source = s.source();
        }
        text
    }

    #[test]
    fn joining_fails_on_the_environment_or_on_the_other_ranks() {
        use ralpc_runtime_min::dist::{DistError, Placement};
        let get = |vars: &'static [(&'static str, &'static str)]| {
            move |name: &str| {
                vars.iter()
                    .find(|(k, _)| *k == name)
                    .map(|(_, v)| (*v).to_owned())
            }
        };
        let environment = Placement::from_vars(get(&[("RANK", "x"), ("WORLD_SIZE", "2")]))
            .expect_err("a malformed rank");
        let e = super::Error::Join {
            rank: None,
            source: Box::new(environment),
        };
        assert_eq!(e.exit_code(), 1);
        assert!(chain(&e).contains("RANK='x'"), "{}", chain(&e));
        let refused = DistError::Context {
            context: "rank 1 cannot join rank 0 at 10.0.0.1:29500".into(),
            source: Box::new(DistError::Refused(
                "it does not know the run's secret".into(),
            )),
        };
        let e = super::Error::Join {
            rank: Some(1),
            source: Box::new(refused),
        };
        assert_eq!(e.exit_code(), 4);
        let text = chain(&e);
        assert!(
            text.contains("rank 1 cannot join the run's other ranks / rank 1 cannot join rank 0")
                && text.contains("secret"),
            "{text}"
        );
    }
}
