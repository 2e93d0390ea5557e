//! Why the processes of a run could not find or trust each other.

/// A failure to join a multi-process run.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DistError {
    /// The launcher's variables are malformed or inconsistent (naming the variable), or
    /// the run's secret is missing or too short.
    #[error("{0}")]
    Environment(String),
    /// The system has no randomness for the handshakes' nonces.
    #[error("no randomness for the run's nonces")]
    Randomness(#[source] getrandom::Error),
    /// A socket could not be bound, reached, configured, read or written.
    #[error("{what}")]
    Io {
        /// What was being done, and with whom.
        what: String,
        /// The system's error.
        #[source]
        source: std::io::Error,
    },
    /// The other end does not prove it knows the run's secret, or speaks another protocol.
    #[error("{0}")]
    Refused(String),
    /// The ranks disagree (the world's size, a rank joining twice) or one broke the
    /// protocol.
    #[error("{0}")]
    Protocol(String),
    /// Ranks missing at the deadline.
    #[error("{waiting}: ranks {missing:?} did not join before the timeout")]
    Timeout {
        /// Who waited for them.
        waiting: String,
        /// The ranks that did not come.
        missing: Vec<usize>,
    },
    /// A step of joining failed, with where.
    #[error("{context}")]
    Context {
        /// Who was doing what.
        context: String,
        /// Why.
        #[source]
        source: Box<DistError>,
    },
}

impl DistError {
    /// An I/O failure while doing `what`.
    pub(crate) fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> DistError {
        let what = what.into();
        move |source| DistError::Io { what, source }
    }

    /// This error, as a step of `context`.
    pub(crate) fn within(self, context: impl Into<String>) -> DistError {
        DistError::Context {
            context: context.into(),
            source: Box::new(self),
        }
    }

    /// Whether the environment the launcher gave is at fault (an input error), rather
    /// than the network or the other ranks.
    pub fn is_environment(&self) -> bool {
        match self {
            DistError::Environment(_) => true,
            DistError::Context { source, .. } => source.is_environment(),
            _ => false,
        }
    }

    /// The message and its causes on one line, for errors that stay strings.
    pub fn chain(&self) -> String {
        crate::error_chain(self)
    }
}
