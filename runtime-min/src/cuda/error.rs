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
    #[error(transparent)]
    Setup(#[from] SetupError),
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

/// Why this machine cannot run the CUDA device: a library, the driver, NVRTC.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SetupError {
    /// A library found nowhere.
    #[error(transparent)]
    Missing(#[from] super::libs::Missing),
    /// The links that make found libraries loadable could not be made.
    #[error("cannot make the CUDA library links")]
    Links(#[source] std::io::Error),
    /// A found library's directory cannot go on the loader's path.
    #[error("cannot put a CUDA library's directory on the loader's path")]
    LoaderPath(#[source] std::env::JoinPathsError),
    /// Libraries found outside the loader's path, in a process that cannot restart.
    #[error(
        "{found} outside the loader's path: start the process with \
         LD_LIBRARY_PATH={library_path} (the `ralpc` command does this itself)"
    )]
    OutsidePath {
        /// Each library and where it is.
        found: String,
        /// The loader path that has them.
        library_path: String,
    },
    /// The driver failed.
    #[error("the CUDA driver failed ({call})")]
    Driver {
        /// What was asked of it.
        call: &'static str,
        /// Its error.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// NVRTC failed outside compiling the source.
    #[error("NVRTC failed ({call}): {status}")]
    Nvrtc {
        /// What was asked of it.
        call: &'static str,
        /// Its status.
        status: String,
    },
    /// NVRTC rejected the kernels' source or the architecture.
    #[error("the CUDA kernels do not compile for {arch}:\n{log}")]
    Compile {
        /// The target (`sm_90`, `compute_90`).
        arch: String,
        /// NVRTC's log, naming the line.
        log: String,
    },
    /// NVRTC's output lacks kernels the source declares.
    #[error("the kernels compiled for {arch} lack {missing:?}")]
    Incomplete {
        /// The target.
        arch: String,
        /// The kernels not in the output.
        missing: Vec<&'static str>,
    },
    /// NVRTC made no machine code for the device, and its PTX is too new for the driver.
    #[error(
        "NVRTC {}.{} is newer than the driver's CUDA {}.{}, which would reject its PTX: \
         install nvidia-cuda-nvrtc=={}.{}.*",
        nvrtc.0, nvrtc.1, driver.0, driver.1, driver.0, driver.1
    )]
    NvrtcNewer {
        /// NVRTC's version.
        nvrtc: (i32, i32),
        /// The CUDA version the driver supports.
        driver: (i32, i32),
        /// Why it made no machine code.
        #[source]
        cubin: Box<SetupError>,
    },
}

/// The CPU backend's shape rules, which the device lowers with: operands they refuse are
/// the model's, as the device's own refusals are; a disagreement is a bug.
impl From<crate::cpu::ops::OpError> for DeviceError {
    fn from(e: crate::cpu::ops::OpError) -> DeviceError {
        match e {
            crate::cpu::ops::OpError::Inconsistent(message) => DeviceError::Inconsistent(message),
            e => DeviceError::Node(e.to_string()),
        }
    }
}

/// What a forward pass kept and its backward pass needs disagree: a bug in ralpc
/// ([`DeviceError::Inconsistent`]).
pub(crate) fn inconsistent(message: impl Into<String>) -> DeviceError {
    DeviceError::Inconsistent(message.into())
}

/// A node the device cannot run as asked: the model's ([`DeviceError::Node`]).
pub(crate) fn unsupported(message: impl Into<String>) -> DeviceError {
    DeviceError::Node(message.into())
}

/// A device's result.
pub type R<T> = Result<T, DeviceError>;

#[cfg(test)]
mod tests {
    use super::*;

    /// A machine's failure stays the machine's through the device's error, and its cause
    /// (NVRTC's log here) is in the chain.
    #[test]
    fn a_setup_failure_keeps_its_cause() {
        let cubin = SetupError::Compile {
            arch: "sm_120".into(),
            log: "nvrtc: error: invalid value for --gpu-architecture".into(),
        };
        let e = DeviceError::from(SetupError::NvrtcNewer {
            nvrtc: (13, 2),
            driver: (12, 8),
            cubin: Box::new(cubin),
        });
        assert!(e.is_setup() && !e.is_bug());
        let chain = crate::error_chain(&e);
        assert!(
            chain.starts_with("NVRTC 13.2 is newer than the driver's CUDA 12.8"),
            "{chain}"
        );
        assert!(
            chain.contains("install nvidia-cuda-nvrtc==12.8.*")
                && chain.contains("do not compile for sm_120:\nnvrtc: error: invalid value"),
            "{chain}"
        );
    }
}
