//! Why a device could not do what the CUDA executor asked of it.

/// A device's failure, by whose it is: the machine's (a CUDA call, a missing library), the
/// model's (a node the device has no lowering for), the other replicas', or ralpc's own (an
/// operand that disagrees with what a kernel was asked).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DeviceError {
    /// A call into CUDA (the driver, NVRTC, cuBLAS, cuDNN, NCCL) failed.
    #[error("{call}")]
    Call {
        /// What was being done.
        call: String,
        /// CUDA's error.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// This machine cannot run the device: a library, the driver or the GPU.
    #[error("{0}")]
    Setup(String),
    /// A node, or what it was given, that the device cannot run as asked.
    #[error("{0}")]
    Node(String),
    /// The other replicas failed, or did not come in time.
    #[error("{0}")]
    Replicas(String),
    /// Operands that disagree with what the executor asked of a kernel: a bug in ralpc.
    #[error("{0}")]
    Inconsistent(String),
}

impl DeviceError {
    /// Whether the cause is ralpc's own.
    pub fn is_bug(&self) -> bool {
        matches!(self, DeviceError::Inconsistent(_))
    }

    /// Whether the machine is at fault (a library, the driver, the GPU missing).
    pub fn is_setup(&self) -> bool {
        matches!(self, DeviceError::Setup(_))
    }

    /// Wraps CUDA's error `e` of the call `call`.
    pub(crate) fn call<E: std::error::Error + Send + Sync + 'static>(
        call: impl Into<String>,
    ) -> impl FnOnce(E) -> DeviceError {
        move |e| DeviceError::Call {
            call: call.into(),
            source: Box::new(e),
        }
    }

    /// As [`DeviceError::call`], for an error type that only has `Debug`.
    pub(crate) fn debug<E: std::fmt::Debug>(
        call: impl Into<String>,
    ) -> impl FnOnce(E) -> DeviceError {
        move |e| DeviceError::Call {
            call: call.into(),
            source: format!("{e:?}").into(),
        }
    }
}

/// A node the device cannot run as asked (the messages the lowering writes).
impl From<String> for DeviceError {
    fn from(message: String) -> DeviceError {
        DeviceError::Node(message)
    }
}

impl From<&str> for DeviceError {
    fn from(message: &str) -> DeviceError {
        DeviceError::Node(message.to_owned())
    }
}

/// A device's result.
pub type R<T> = Result<T, DeviceError>;
