//! The GPUs the driver sees.

use cudarc::driver::CudaContext;

use super::error::SetupError;

/// One GPU.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct DeviceInfo {
    /// Its ordinal (`cuda:N`).
    pub ordinal: usize,
    /// Its name (`NVIDIA H100 80GB HBM3`).
    pub name: String,
    /// Compute capability (major, minor).
    pub compute_capability: (u32, u32),
    /// Memory in bytes.
    pub memory: u64,
}

/// The CUDA version the driver supports, as (major, minor). The caller checks that the
/// driver loads first ([`super::libs`]).
///
/// # Errors
/// The driver's error.
pub fn driver_version() -> Result<(i32, i32), SetupError> {
    let mut v = 0;
    // SAFETY: one out-parameter the driver writes.
    let status = unsafe { cudarc::driver::sys::cuDriverGetVersion(&mut v) };
    if status == cudarc::driver::sys::CUresult::CUDA_SUCCESS {
        Ok((v / 1000, (v % 1000) / 10))
    } else {
        Err(SetupError::Driver {
            call: "cuDriverGetVersion",
            source: format!("{status:?}").into(),
        })
    }
}

/// How many GPUs the driver sees. The caller checks that the driver loads first.
///
/// # Errors
/// The driver's error.
pub fn count() -> Result<usize, SetupError> {
    CudaContext::device_count()
        .map(|n| n.max(0) as usize)
        .map_err(fail("counting the GPUs"))
}

/// Every GPU. The caller checks that the driver loads first ([`super::libs`]).
///
/// # Errors
/// The driver's error (no device, a broken installation).
pub fn devices() -> Result<Vec<DeviceInfo>, SetupError> {
    (0..count()?)
        .map(|ordinal| {
            let ctx = CudaContext::new(ordinal).map_err(fail("opening a GPU"))?;
            let (major, minor) = ctx
                .compute_capability()
                .map_err(fail("reading a GPU's architecture"))?;
            Ok(DeviceInfo {
                ordinal,
                name: ctx.name().map_err(fail("reading a GPU's name"))?,
                compute_capability: (major.max(0) as u32, minor.max(0) as u32),
                memory: ctx.total_mem().map_err(fail("reading a GPU's memory"))? as u64,
            })
        })
        .collect()
}

fn fail(call: &'static str) -> impl Fn(cudarc::driver::DriverError) -> SetupError {
    move |e| SetupError::Driver {
        call,
        source: Box::new(e),
    }
}
